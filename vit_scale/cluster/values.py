"""One value of an option or a study file read: whole numbers, minutes, lists, booleans. A value
that does not read is one UserError line naming the option and what is allowed. Each reader takes
the option it names first, then the text."""

from __future__ import annotations

import re

from vit_scale.errors import UserError

TRUE = ("true", "on", "yes", "1")
FALSE = ("false", "off", "no", "0")


def whole(option: str, text, minimum: int = 1) -> int:
    """A whole number of at least `minimum`, or one line naming the option."""
    if not re.fullmatch(r"\d+", str(text)) or int(text) < minimum:
        raise UserError(f"{option}: '{text}' is not allowed; allowed: a whole number of at least {minimum}")
    return int(text)


def minutes(option: str, text) -> float:
    """A time limit in minutes (fractions allowed), or one line naming `option`."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value != value or value == float("inf"):
        raise UserError(f"{option}: '{text}' is not allowed; allowed: minutes, more than 0 (e.g. 30 or 0.5)")
    return value


def as_list(value) -> list[str]:
    """YAML lists, comma-separated strings and scalars all become a list of strings."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, str):
        items = value.replace(",", " ").split()
    else:
        items = [value]
    return [str(v).lower() if isinstance(v, bool) else str(v) for v in items]


def normalise_bool(value) -> str:
    return "true" if str(value).lower() in TRUE else "false"
