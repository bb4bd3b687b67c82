"""check.json read back: the reader lives in vit_scale.record.check_file, below the check, so the
analysis can read the file without importing the check; its names stay importable from here."""
from vit_scale.record.check_file import (
    CHECK_FILE,
    bandwidth_rows,
    headline,
    latency_rows,
    read_check,
    transport,
    verdict,
    versions,
)

__all__ = ["CHECK_FILE", "bandwidth_rows", "headline", "latency_rows", "read_check", "transport", "verdict",
           "versions"]
