"""Small wording helpers for what users read (progress lines, summaries, errors)."""


def plural(count: int, noun: str) -> str:
    """'1 rank', '2 ranks'."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
