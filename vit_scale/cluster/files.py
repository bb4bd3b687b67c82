"""Where the repository's configs are, and reading them: errors are one BadInput line."""
from __future__ import annotations

import os
import re

PACKAGE_HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BadInput(Exception):
    """A user's mistake in an option or a study file: printed as one line, exit code 2."""


def home() -> str:
    """The repository: where this package sits (a checkout), else VIT_SCALE_HOME (an installed copy)."""
    for candidate in (PACKAGE_HOME, os.environ.get("VIT_SCALE_HOME", "")):
        if candidate and os.path.isdir(os.path.join(candidate, "configs", "systems")):
            return candidate
    raise BadInput("cannot find the repository's configs/; set VIT_SCALE_HOME to the vit-scale checkout")


def load_yaml(path: str, option: str = "--config") -> dict:
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as exc:
        raise BadInput(f"{option}: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BadInput(f"{option}: {path} is not valid YAML"
                       f"{f' (line {mark.line + 1})' if mark else ''}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{option}: {path} must hold a mapping of keys")
    return data


def whole(option: str, text, minimum: int = 1) -> int:
    """A whole number of at least `minimum`, or one line naming the option."""
    if not re.fullmatch(r"\d+", str(text)) or int(text) < minimum:
        raise BadInput(f"{option}: '{text}' is not allowed; allowed: a whole number of at least {minimum}")
    return int(text)


def take_prog(argv: list, default: str) -> tuple[str, list]:
    """`--prog NAME`: the job script's name, for the messages of the command it starts."""
    argv = list(argv)
    if "--prog" in argv:
        i = argv.index("--prog")
        name = argv[i + 1] if i + 1 < len(argv) else default
        del argv[i:i + 2]
        return name, argv
    return default, argv


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


TRUE = ("true", "on", "yes", "1")
FALSE = ("false", "off", "no", "0")


def normalise_bool(value) -> str:
    return "true" if str(value).lower() in TRUE else "false"


def minutes(text: str, option: str) -> float:
    """A time limit in minutes (fractions allowed), or one line naming `option`."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value != value or value == float("inf"):
        raise BadInput(f"{option}: '{text}' is not allowed; allowed: minutes, more than 0 (e.g. 30 or 0.5)")
    return value
