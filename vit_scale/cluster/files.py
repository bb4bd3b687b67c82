"""Where the repository's configs/ are, and reading a YAML file of them: a file that cannot be
read is one UserError line naming the option it came from."""

from __future__ import annotations

import os

from vit_scale.errors import UserError

PACKAGE_HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def home() -> str:
    """The repository: where this package sits (a checkout), else VIT_SCALE_HOME (an installed copy)."""
    for candidate in (PACKAGE_HOME, os.environ.get("VIT_SCALE_HOME", "")):
        if candidate and os.path.isdir(os.path.join(candidate, "configs", "systems")):
            return candidate
    raise UserError("cannot find the repository's configs/; set VIT_SCALE_HOME to the vit-scale checkout")


def load_yaml(path: str, option: str = "--config") -> dict:
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as exc:
        raise UserError(f"{option}: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise UserError(
            f"{option}: {path} is not valid YAML"
            f"{f' (line {mark.line + 1})' if mark else ''}: {getattr(exc, 'problem', exc)}"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{option}: {path} must hold a mapping of keys")
    return data
