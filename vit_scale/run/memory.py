"""Peak memory of this rank over a measured window.

GPUs: the caching allocator's max allocated, max reserved and max active bytes. CPU: peak resident set
size (VmHWM); writing 5 to /proc/self/clear_refs resets it so warm-up is left out.
"""

from __future__ import annotations

GIB = 1024**3


class MemoryProbe:
    """`reset()` opens the measured window and `close()` ends it; `peak()` after `close()` is the
    window's peak, not the process's: what runs after the timed steps (the replica check's float64
    copy of every local tensor, the profiled steps, a checkpoint) allocates too, and is no part
    of what the figure describes."""

    def __init__(self, device_type: str):
        self.device_type = device_type
        self.window = "whole_run"
        self.closed: dict | None = None

    def reset(self) -> None:
        """Start the measured window (called after warm-up)."""
        if self.device_type == "cpu":
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                self.window = "timed_steps"
            except OSError:
                self.window = "whole_run"  # e.g. macOS: the peak then includes warm-up, and says so
        else:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self.window = "timed_steps"
        self.closed = None

    def close(self) -> None:
        """End the measured window (the device already synchronised): its peak is read now."""
        self.closed = None
        self.closed = self.peak()

    def peak(self) -> dict[str, float]:
        if self.closed is not None:
            return dict(self.closed)
        if self.device_type == "cpu":
            return {"peak_rss_gib": _peak_rss_bytes() / GIB}
        import torch

        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
            # allocated plus freed-but-not-yet-reusable (held for another stream): what the plan's
            # peak_active_gib predicts, and what the seed-003 authors plotted
            "peak_active_gib": torch.cuda.memory_stats().get("active_bytes.all.peak", 0) / GIB,
        }


def _peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def device_memory_gib(device_type: str, device_index) -> float | None:
    if device_type == "cpu":
        return None
    import torch

    return torch.cuda.get_device_properties(device_index or 0).total_memory / GIB
