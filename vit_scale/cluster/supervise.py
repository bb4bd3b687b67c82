"""Start a run's commands, wait for them, and stop the whole tree when it must end.

Each command starts in a session of its own, so that stopping a run reaches every process it
made (torchrun's ranks, a kernel build a rank started, mpirun's children) and nothing of it
outlives the run: SIGTERM to each process group first (the trainer then writes its end record,
status timeout), SIGKILL STOP_GRACE_S later to whatever is left.

A supervisor that is killed outright (SIGKILL, the OOM killer) cannot stop anything: each command
it starts therefore gets SIGTERM from the kernel when it dies (Linux's PR_SET_PDEATHSIG), so that a
run does not go on unattended, beside whatever the resumed study starts next on the same cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from vit_scale.compat import libc

# the trainer writes its record within ~10 s of SIGTERM; a rank stuck in a collective may not
STOP_GRACE_S = float(os.environ.get("VIT_SCALE_STOP_GRACE_S", "20"))
POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl():
    """libc's prctl, looked up in this process (a forked child must not load libraries); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    return getattr(libc(), "prctl", None)


def dies_with_this_process():
    """A preexec_fn for Popen: the child gets SIGTERM when this process dies (it runs after
    start_new_session's setsid, in the child, before exec; the setting survives exec). None where
    the kernel has no such thing."""
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def preexec():
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # died before the setting was made: nothing would send it
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@dataclass
class Outcome:
    code: int  # the run's exit code (rank 0's, or the first that is not 0)
    timed_out: bool  # stopped at the study's --run-time-limit
    interrupted: bool  # stopped because the study itself was told to stop
    killed: bool  # something had to be SIGKILLed
    seconds: float


class Supervisor:
    """One per study: holds whether the study was told to stop (SIGTERM, SIGINT, Slurm's
    end-of-time signal) and passes that on to the run in progress."""

    def __init__(self, grace_s: int = 60):
        self.grace_s = grace_s  # after one process ends badly, how long the others get to finish
        self.interrupted = False
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        self.interrupted = True

    def run(self, launch, log_path: str, time_limit_s: float | None = None, on_signal=None) -> Outcome:
        """`on_signal`: called once, before the run is stopped, when a signal tells the study to stop:
        Slurm kills KillWait seconds after its SIGTERM, which may be less than stopping takes."""
        # Only from the main thread: PR_SET_PDEATHSIG fires when the *thread* that forked the child
        # ends, not the process, so a child forked from a worker thread would be killed when that
        # thread ends; and Popen's preexec_fn is unsafe in a process with other threads (a lock
        # held by one of them at fork stays held in the child). The orchestrators start none.
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("Supervisor.run must be called from the main thread (PR_SET_PDEATHSIG, preexec_fn)")
        started = time.monotonic()
        procs = []
        preexec = dies_with_this_process()
        with open(log_path, "a") as log:
            for argv, extra in launch.commands:
                env = {**os.environ, **launch.env, **extra}
                try:
                    procs.append(
                        subprocess.Popen(
                            argv,
                            env=env,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=preexec,
                        )
                    )
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
                    if self.interrupted and on_signal is not None:
                        try:
                            on_signal()
                        except Exception as exc:  # the run must be stopped all the same
                            print(f"vit-scale: while stopping: {type(exc).__name__}: {exc}", file=sys.stderr)
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
            code = 128 - code  # as a shell reports a process ended by a signal
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
