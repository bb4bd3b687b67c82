"""What a run does with Slurm's end-of-time signals: the policy the session is given.

`InterruptOnSignal` (the benchmark's): the signal interrupts the loop (RunInterrupted) and the run
ends as `timeout`. `SaveThenStop` (fine-tuning's): the signal is only noted; the loop finishes its
step, the ranks agree to stop, save a checkpoint and leave. Under both, the watcher thread ends a
run whose main thread stays stuck after the grace period (a collective with a dead peer), and
rank 0's watcher polls for a peer's failure.
"""

from __future__ import annotations

from vit_scale.launch.signals import SignalWatcher


class StopRequests(SignalWatcher):
    """A watcher whose handler notes the signal instead of raising in the main thread."""

    def _handler(self, signum, frame):
        self.received = signum


class InterruptOnSignal:
    grace_s = 10.0
    watcher_class = SignalWatcher

    def __init__(self):
        self.watcher: SignalWatcher | None = None

    def watch(self, on_stuck, peer_failure) -> None:
        """Install the handlers: `on_stuck(signum or None)` writes the end record when the main thread cannot."""
        self.watcher = self.watcher_class(on_stuck, grace_s=self.grace_s, peer_failure=peer_failure)

    def done(self) -> None:
        if self.watcher is not None:
            self.watcher.done()

    @property
    def received(self) -> int | None:
        """The signal this rank received, if any."""
        return self.watcher.received if self.watcher is not None else None

    def stuck_error(self, signum) -> str:
        return "stopped by a signal while blocked in a collective" if signum else "a peer rank failed"


class SaveThenStop(InterruptOnSignal):
    watcher_class = StopRequests

    def __init__(self, grace_s: float):
        super().__init__()
        self.grace_s = grace_s

    def stuck_error(self, signum) -> str:
        if not signum:
            return "a peer rank failed"
        return (
            "stopped by a signal and still blocked (in a collective or a save) after "
            f"checkpoint.signal_grace_s={self.grace_s}"
        )
