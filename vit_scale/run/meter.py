"""The step meter: warm-up, the timed window and its memory window, step records, progress lines.

A meter owns what it measures (steps booked, the last loss, the timed steps' durations, the memory
probe) and hands it out as `result()`: the session reads it for the end record, whichever way the
run ends. Every booked step goes through one routine, `book`, whoever timed it:
- `StepMeter` (fine-tuning): the loop times each step itself, synchronised, since it needs each
  loss at once (the ranks agree on divergence and stop requests every step): `before_step()` ...
  `book(step, loss, seconds, record, progress)`.
- `EventTimedMeter` (the benchmark): `start()` ... `stop(step, loss)`, no host synchronisation inside
  the window. On a GPU two device events recorded on the stream bracket the step and its loss is
  copied to pinned host memory behind the step's kernels. Steps are booked lagged: after queueing
  step k, every earlier step whose end event the device has passed is booked (a query, no wait),
  and the host waits only for step k - LAG, so the device always has work queued and the host's
  own time per step (Python, the wrapper's hooks, launches) hides behind it. The progress line
  therefore shows the last completed step. On a CPU a step is done when it returns: host clock,
  booked at once.

The timed window opens before the first step after the warm-up, with the device synchronised and
every rank at a barrier, so all ranks enter it together; the memory probe's peak is reset there.
`window_s()` (every rank, a collective) synchronises and closes it. `window` says what its length
is: "wall" (the benchmark: the wall time from its opening to the end of the loop) or "steps"
(fine-tuning: the sum of the timed steps' own times, since evaluations and checkpoints happen in
between); either way the slowest rank's.
"""

from __future__ import annotations

import collections
import math
import sys
import time
from dataclasses import dataclass


@dataclass
class Figures:
    """What a meter has measured so far."""

    images_per_step: int  # over every rank
    steps_done: int  # steps booked by this run (a resumed run counts from its resume)
    last_step: int | None
    last_loss: float | None
    nonfinite_step: int | None  # the first booked step whose loss was not finite
    step_times: list[float]  # the timed steps' durations, warm-up left out
    started_at: float  # time.perf_counter() when the loop started: wall_time_s counts from here
    window_s: float | None  # the timed window's length; None while a wall window is open
    memory: dict | None  # this rank's peak over the memory window
    memory_window: str
    opened_at: float | None = None  # time.perf_counter() when the timed window opened (None: never)
    closed_at: float | None = None  # ... and when window_s() closed it


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far (0 when it was never used)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class StepMeter:
    """Steps timed by the loop, synchronised (see the module doc); `train` is the config's section
    (log_every, print_every, compile)."""

    window = "steps"

    def __init__(self, world, recorder, train, images_per_step: int, total_steps: int, untimed_steps: int):
        import torch

        from vit_scale.run.memory import MemoryProbe

        self.world, self.recorder, self.train = world, recorder, train
        self.images_per_step, self.total_steps, self.untimed = images_per_step, total_steps, untimed_steps
        self.probe = MemoryProbe(world.device_type)
        self.device_events = world.device_type != "cpu"
        self.sync = torch.cuda.synchronize if self.device_events else (lambda: None)
        self.started_at = time.perf_counter()
        self.steps_started = 0
        self.steps_booked = 0
        self.last_step = self.last_loss = self.nonfinite_step = None
        self.step_times: list[float] = []
        self.first_step_s = None  # train.compile: the first step holds the compilation
        self.graphs_at_open = None  # graphs torch.compile had made when the timed window opened
        self.graphs_before = compiled_graphs()  # the count is the process's: several runs may share one
        self.opened_at = None
        self.closed_at = None  # time.perf_counter() when window_s() closed the window
        self.closed_s = None  # the window's length on the slowest rank, once closed
        self.closed = False  # window_s() has run: what follows (the node-health probe) is outside the window

    # ------------------------------------------------------------ the window

    def before_step(self) -> None:
        if self.steps_started == self.untimed and self.opened_at is None:
            import torch.distributed as dist

            self.drain()
            dist.barrier()  # all ranks enter the timed window together
            self.probe.reset()
            self.graphs_at_open = compiled_graphs()
            self.opened_at = time.perf_counter()
        self.steps_started += 1

    def drain(self) -> None:
        """Synchronise: every step queued is booked."""
        self.sync()

    def window_s(self) -> float | None:
        """Close the timed window: its length on the slowest rank (every rank calls it: an all-reduce)."""
        import torch
        import torch.distributed as dist

        self.drain()
        self.probe.close()  # before the end-of-run work allocates (replica check, profiled steps)
        window = torch.tensor([self._own_window_s() or 0.0], dtype=torch.float64, device=self.world.device)
        dist.all_reduce(window, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        self.closed_s = window.item() or None
        self.closed = True
        self.closed_at = time.perf_counter()
        return self.closed_s

    def _own_window_s(self) -> float | None:
        if self.window == "steps":
            return sum(self.step_times)
        return time.perf_counter() - self.opened_at if self.opened_at is not None else None

    def compile_facts(self) -> dict | None:
        """train.compile: the first step's time (compilation included), the graphs made, and whether
        any was made inside the timed window (a recompile there is in the images/s)."""
        if not self.train.compile:
            return None
        now = compiled_graphs()
        in_window = now - self.graphs_at_open if self.graphs_at_open is not None else None
        return {
            "first_step_s": self.first_step_s,
            "graphs": now - self.graphs_before,
            "graphs_in_window": in_window,
            "recompiled_in_window": bool(in_window) if in_window is not None else None,
        }

    def result(self) -> Figures:
        """The figures so far. Before `window_s()` closed the window, a "steps" window's length is
        this rank's own sum and a "wall" window's is unknown (None): no collectives here, since an
        interrupted run may call it from the signal watcher."""
        window_s = (
            self.closed_s if self.closed_s is not None else (sum(self.step_times) if self.window == "steps" else None)
        )
        return Figures(
            self.images_per_step,
            self.steps_booked,
            self.last_step,
            self.last_loss,
            self.nonfinite_step,
            list(self.step_times),
            self.started_at,
            window_s,
            self.probe.peak(),
            self.probe.window,
            self.opened_at,
            self.closed_at,
        )

    # ------------------------------------------------------------ booking

    def book(self, step: int, loss: float, seconds: float, record: dict, progress: str) -> bool:
        """Book one finished step (`seconds`: its timed duration); True while warming up."""
        self.steps_booked += 1
        warmup = self.steps_booked <= self.untimed
        if self.steps_booked == 1:
            self.first_step_s = seconds
        self.last_step, self.last_loss = step, loss
        if not math.isfinite(loss) and self.nonfinite_step is None:
            self.nonfinite_step = step
        if not warmup:
            self.step_times.append(seconds)
        if self.recorder and step % self.train.log_every == 0:
            self.recorder.step({"step": step, "loss": loss, **record, "warmup": warmup})
        if self.world.is_main and (step % self.train.print_every == 0 or step == self.total_steps):
            print(
                f"  step {step:>6}/{self.total_steps}  loss {loss:.4f}  {progress}{'  (warm-up)' if warmup else ''}",
                flush=True,
            )
        return warmup


class EventTimedMeter(StepMeter):
    """Steps timed without host synchronisation, booked lagged (see the module doc)."""

    window = "wall"
    LAG = 2  # steps the host may run ahead of the device before it waits for the oldest

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pending = collections.deque()  # (step, start event, end event, pinned loss)
        self._start = None

    def start(self) -> None:
        """Before a step's work is queued."""
        self.before_step()
        if self.device_events:
            import torch

            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self, step: int, loss) -> None:
        """After a step's work is queued; `loss` is its 0-d tensor, still on the device."""
        if not self.device_events:
            self._book(step, loss.item(), time.perf_counter() - self._start)
            return
        import torch

        host_loss = self._to_host(loss)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((step, self._start, end, host_loss))
        self._book_done(must=len(self._pending) - self.LAG)

    @staticmethod
    def _to_host(loss):
        """A copy queued behind the step's kernels into pinned memory: valid once its end event is passed."""
        import torch

        host = torch.empty((), dtype=torch.float32, pin_memory=True)
        host.copy_(loss.detach().float(), non_blocking=True)
        return host

    def drain(self) -> None:
        """Synchronise and book every step still on the device."""
        self.sync()
        self._book_done(must=len(self._pending))

    def _book_done(self, must: int) -> None:
        while self._pending:
            step, start, end, host_loss = self._pending[0]
            if must > 0:
                end.synchronize()
                must -= 1
            elif not end.query():
                break
            self._pending.popleft()
            self._book(step, host_loss.item(), start.elapsed_time(end) / 1e3)

    def _book(self, step: int, loss: float, seconds: float) -> None:
        ips = self.images_per_step / seconds if seconds > 0 else float("nan")
        self.book(step, loss, seconds, {"step_time_s": seconds, "images_per_s": ips}, f"{ips:10.1f} img/s")
