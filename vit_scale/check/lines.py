"""One line of the check's verdict, and the table they make. No torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# ok: holds; info: a fact, nothing to hold; warn: worth a look, not broken; refused: the capability
# table says the pair cannot run; fail: broken; skipped: does not apply here
STATUSES = ("ok", "info", "warn", "refused", "fail", "skipped")


@dataclass
class Line:
    check: str  # what was checked: "transport", "all_reduce", "strategy DDP fp32"
    status: str
    text: str  # what was found
    fix: str = ""  # what to do, for a line that is broken or worth a look
    needed: bool = True  # a needed line that fails or is refused fails the check

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r}; allowed: {', '.join(STATUSES)}")

    @property
    def broken(self) -> bool:
        return self.needed and self.status in ("fail", "refused")

    def one_line(self) -> str:
        """What failed and what to do, on one line."""
        text = " ".join(f"{self.check}: {self.text}".split())
        return text + (f"; {' '.join(self.fix.split())}" if self.fix else "")

    def to_dict(self) -> dict:
        return asdict(self)


def broken(lines: list) -> list:
    return [line for line in lines if line.broken]


def table(lines: list) -> list[str]:
    """One row a line: status (upper case when broken), what was checked, what was found."""
    width = max([len(line.check) for line in lines] + [5])
    rows = []
    for line in lines:
        status = line.status.upper() if line.broken or line.status == "warn" else line.status
        rows.append(f"  {status:8} {line.check:{width}}  {' '.join(line.text.split())}")
    return rows
