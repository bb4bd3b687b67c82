"""A command line read as (option, value) pairs, and `--prog NAME`: the name a job script gives
the command it starts, for that command's messages. Shared by study, sweep and check."""

from __future__ import annotations

from vit_scale.errors import UserError


def option_pairs(argv: list, flags):
    """(option, value) for each option of argv, value None for one of `flags`; `--opt=value` and
    `--opt value` alike. A value may not start with `--`: `--models --steps 4` lost its value."""
    i = 0
    while i < len(argv):
        opt = argv[i]
        if opt in flags:
            yield opt, None
            i += 1
            continue
        if opt.startswith("--") and "=" in opt:
            opt, value = opt.split("=", 1)
            i += 1
        elif opt.startswith("--"):
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise UserError(f"{opt}: needs a value (see --help)")
            value = argv[i + 1]
            i += 2
        else:
            raise UserError(f"unexpected argument '{opt}'; options start with -- (see --help)")
        yield opt, value


def take_prog(argv: list, default: str) -> tuple[str, list]:
    """(the program's name, argv without `--prog NAME`): `default` when no job script named it."""
    argv = list(argv)
    if "--prog" in argv:
        i = argv.index("--prog")
        name = argv[i + 1] if i + 1 < len(argv) else default
        del argv[i : i + 2]
        return name, argv
    return default, argv
