"""Small wording helpers for what users read (progress lines, summaries, errors)."""


def plural(count: int, noun: str) -> str:
    """'1 rank', '2 ranks'."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def human_bytes(n: float) -> str:
    """'25 MiB', '1.5 KiB', '8 B': a buffer's size as a table or a check line prints it."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value != int(value) else f"{int(value)} {unit}"
    return f"{int(n)} B"


def human_seconds(seconds: float) -> str:
    """'1.2 s', '3.4 ms', '56 us': a time in the unit that keeps it above 1."""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"
