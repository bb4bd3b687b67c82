"""Start a run's commands, wait for them, and stop the whole tree when it must end.

Each command starts in a session of its own, so that stopping a run reaches every process it
made (torchrun's ranks, a kernel build a rank started, mpirun's children) and nothing of it
outlives the run: SIGTERM to each process group first (the trainer then writes its end record,
status timeout), SIGKILL STOP_GRACE_S later to whatever is left.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

# the trainer writes its record within ~10 s of SIGTERM; a rank stuck in a collective may not
STOP_GRACE_S = float(os.environ.get("VIT_SCALE_STOP_GRACE_S", "20"))
POLL_S = 0.2


@dataclass
class Outcome:
    code: int                # the run's exit code (rank 0's, or the first that is not 0)
    timed_out: bool          # stopped at the study's --run-time-limit
    interrupted: bool        # stopped because the study itself was told to stop
    killed: bool             # something had to be SIGKILLed
    seconds: float


class Supervisor:
    """One per study: holds whether the study was told to stop (SIGTERM, SIGINT, Slurm's
    end-of-time signal) and passes that on to the run in progress."""

    def __init__(self, grace_s: int = 60):
        self.grace_s = grace_s       # after one process ends badly, how long the others get to finish
        self.interrupted = False
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        self.interrupted = True

    def run(self, launch, log_path: str, time_limit_s: float | None = None) -> Outcome:
        started = time.monotonic()
        procs = []
        with open(log_path, "a") as log:
            for argv, extra in launch.commands:
                env = {**os.environ, **launch.env, **extra}
                try:
                    procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True))
                except OSError as exc:
                    log.write(f"# could not start {argv[0]}: {exc.strerror}\n")
                    self._stop([p for p in procs if p.poll() is None], signal.SIGKILL)
                    return Outcome(127, False, False, False, time.monotonic() - started)
        failed_at = stop_at = None
        timed_out = killed = False
        while True:
            alive = [p for p in procs if p.poll() is None]
            if not alive:
                break
            now = time.monotonic()
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = now
            if stop_at is None:
                over_time = time_limit_s is not None and now - started > time_limit_s
                if self.interrupted or over_time or (failed_at is not None and now - failed_at > self.grace_s):
                    timed_out = over_time and not self.interrupted
                    stop_at = now
                    self._stop(alive, signal.SIGTERM)
            elif not killed and now - stop_at > STOP_GRACE_S:
                killed = True
                self._stop(alive, signal.SIGKILL)
            time.sleep(POLL_S)
        # the launchers have ended; anything they left in their groups goes too
        if self._stop(procs, signal.SIGKILL):
            killed = True
        codes = [p.returncode for p in procs]
        code = next((c for c in codes if c != 0), 0) if codes[0] == 0 else codes[0]
        if code < 0:
            code = 128 - code   # as a shell reports a process ended by a signal
        return Outcome(code, timed_out, self.interrupted, killed, time.monotonic() - started)

    @staticmethod
    def _stop(procs, sig) -> bool:
        """Signal each process's group; True if any group still had a process in it."""
        hit = False
        for p in procs:
            try:
                os.killpg(p.pid, sig)
                hit = True
            except (ProcessLookupError, PermissionError):
                pass
        return hit
