"""Slurm's end-of-time-limit signals (SIGTERM, or SIGUSR1 with --signal) turned into a `timeout` record.

The Python handler raises RunInterrupted in the main thread, which ends the loop and writes
the end record normally. But a main thread blocked inside a collective or a device
synchronisation never returns to Python, so its handler never runs; a watcher thread, woken
by the C-level handler through a wakeup fd, writes the record itself after a grace period and
ends the process before Slurm's SIGKILL would leave no end record at all.
"""

from __future__ import annotations

import os
import signal
import socket
import threading

WATCHED = (signal.SIGTERM, signal.SIGUSR1)


class RunInterrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(
            f"stopped by {signal.Signals(signum).name} (Slurm time limit or scancel) before the planned steps were done"
        )
        self.signum = signum


class SignalWatcher:
    def __init__(self, on_stuck, grace_s: float = 10.0, peer_failure=None, poll_s: float = 2.0):
        """`on_stuck(signum or None)` runs in the watcher thread when the main thread has not
        finished `grace_s` seconds after a signal, or after `peer_failure()` (polled every
        `poll_s` seconds) first returned true: a rank that died leaves the others waiting in a
        collective until its timeout, and a NCCL timeout aborts the process. Then exit code 5
        (signal) or 1 (peer failure)."""
        self.on_stuck = on_stuck
        self.grace_s = grace_s
        self.peer_failure = peer_failure
        self.poll_s = poll_s
        self.received: int | None = None
        self.finished = threading.Event()
        self._raised = False
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._old_wakeup = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._old_handlers = {sig: signal.signal(sig, self._handler) for sig in WATCHED}
        self._thread = threading.Thread(target=self._watch, name="vit-scale-signals", daemon=True)
        self._thread.start()

    def _handler(self, signum, frame):
        self.received = signum
        if not self._raised and not self.finished.is_set():
            self._raised = True
            raise RunInterrupted(signum)

    def _watch(self) -> None:
        try:
            self._wait_for_a_reason()
        finally:  # a process may hold many runs (the check's worker): each run's pair is closed
            self._reader.close()

    def _wait_for_a_reason(self) -> None:
        self._reader.settimeout(self.poll_s if self.peer_failure else None)
        while True:
            try:
                data = self._reader.recv(64)
            except TimeoutError:
                if self.finished.is_set():
                    return
                if self.peer_failure():
                    if not self.finished.wait(self.grace_s):
                        try:
                            self.on_stuck(None)
                        finally:
                            os._exit(1)
                    return
                continue
            except OSError:
                return
            if not data:
                return
            hits = [b for b in data if b in WATCHED]
            if not hits:
                continue
            if self.received is None:
                self.received = hits[0]
            if not self.finished.wait(self.grace_s):
                try:
                    self.on_stuck(self.received)
                finally:
                    os._exit(5)
            return

    def done(self) -> None:
        """The main thread has written its end record: the watcher has nothing left to do."""
        self.finished.set()
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        signal.set_wakeup_fd(self._old_wakeup)
        # wakes the watcher thread (its recv sees the end): else, polling nothing on ranks other
        # than 0, it would wait forever holding on_stuck and so the whole run (model, optimizer)
        self._writer.close()
        # the watcher closes the reader as it ends; it ends at once unless on_stuck is running, which
        # then ends the process. Closed here too once it has ended, never under a recv in progress.
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=1.0)
        if not self._thread.is_alive():
            self._reader.close()
