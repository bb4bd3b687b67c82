"""How a config key is declared: its default, its one-line description and the rules its value
must meet, all on the dataclass field, so validation, `--help` and the error read one place.

`vit_scale.config` declares its own sections with it, and each strategy family's package declares
that family's options with it (distributed/fsdp/ ...): those packages sit below config and cannot
import it. Choices are `Literal` types; a number's range or a text's shape is a `Rule`; a rule
between keys is the section's own `check()` method. No torch here.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vit_scale.errors import UserError


@dataclass(frozen=True)
class Rule:
    """A condition on one key's value. `test(value)` is true when the value passes (or raises
    UserError in its own words, as a registry lookup does); `says` is the error, {key} and {value}
    filled in; `allowed` is what --help shows, {kind} (integer, number, text) filled in."""

    allowed: str
    test: Callable[[Any], Any]
    says: str = "{key}: {value!r} is not allowed"

    def check(self, key: str, value) -> None:
        if not self.test(value):
            raise UserError(self.says.format(key=key, value=value))


AT_LEAST_1 = Rule("{kind} >= 1", lambda v: v >= 1, "{key}: must be at least 1, got {value}")
NON_NEGATIVE = Rule("{kind} >= 0", lambda v: v >= 0, "{key}: must not be negative, got {value}")
POSITIVE = Rule("{kind} > 0", lambda v: v > 0, "{key}: must be positive, got {value}")
FRACTION = Rule("{kind} from 0 to 1", lambda v: 0 <= v <= 1, "{key}: must be between 0 and 1, got {value}")
BELOW_1 = Rule("{kind} below 1", lambda v: v < 1, "{key}: must be less than 1, got {value}")


def option(default: Any = dataclasses.MISSING, help: str = "", *rules: Rule, factory: Any = dataclasses.MISSING):
    """A key: its default (or a `factory` for one), the one line --help shows, and its rules, checked
    in order (--help shows the first)."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"help": help, "rules": rules})


def description(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


def rules(f: dataclasses.Field) -> tuple:
    return f.metadata.get("rules", ())


def optional_inner(typ: Any) -> Any:
    """X of Optional[X] or X | None, or None when `typ` is not optional."""
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(typ) if a is not type(None)][0]
    return None


def choices(typ: Any) -> tuple:
    """The values a Literal type allows, in the order it names them; () for any other type."""
    return typing.get_args(typ) if typing.get_origin(typ) is typing.Literal else ()


def is_section(typ: Any) -> bool:
    return dataclasses.is_dataclass(typ)


def check_keys(section, prefix: str = "") -> None:
    """Each key of `section` (a dataclass instance) against its choices and rules, nested sections
    after the keys that hold them, in declaration order; the first failure is the error."""
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        key, value, typ = prefix + f.name, getattr(section, f.name), hints[f.name]
        if is_section(typ):
            check_keys(value, key + ".")
            continue
        if value is None and optional_inner(typ) is not None:
            continue
        allowed = choices(optional_inner(typ) or typ)
        if allowed and value not in allowed:
            raise UserError(f"{key}: {value!r} is not allowed; allowed: {', '.join(map(str, allowed))}")
        for rule in rules(f):
            rule.check(key, value)


def check_sections(section) -> None:
    """Each section's own `check()` (the rules between its keys), inner sections first, `section`'s
    own last: run after check_keys, so a check() may trust every key's own rule."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            check_sections(value)
    if hasattr(section, "check"):
        section.check()
