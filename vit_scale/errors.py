"""Errors a user can fix: printed as one line, exit code 2, no traceback."""


class UserError(Exception):
    """Bad input (a config key, a flag, a file). The message names the thing and what is allowed."""

    exit_code = 2
