"""Writing the run directory and its metrics.jsonl (schema: docs/run_record.md; reading it:
reader.py). Written by global rank 0.

Every line is flushed as it is written, so a run killed mid-way still leaves its start and the
steps it finished. Exactly one end record is written, whichever of the training loop, an error
handler or the signal watcher gets there first.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time

SCHEMA_VERSION = 1
METRICS_FILE = "metrics.jsonl"
STATUSES = ("ok", "oom", "timeout", "failed", "diverged", "skipped")
EXIT_CODES = {"ok": 0, "failed": 1, "oom": 3, "diverged": 4, "timeout": 5, "skipped": 6}
EXIT_REQUEUE = 7  # stopped by a signal after saving a checkpoint: requeue the job and it resumes


def run_directory(output_dir: str, study: str, model: str, strategy: str, nodes: int, run_id: str) -> str:
    return os.path.join(output_dir, study, model, strategy, f"n{nodes}", run_id)


def make_run_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now or time.time()))
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if job:
        return f"{stamp}-j{job}.{step or 0}"
    return f"{stamp}-p{os.getpid()}"


def _clean(value):
    """JSON has no NaN/inf: write them as null rather than produce an unreadable line."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class RunRecorder:
    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, METRICS_FILE)
        # "x": a run directory is never reused, so an earlier record can never be overwritten
        self._file = open(self.path, "x", buffering=1)
        self._lock = threading.Lock()
        self.ended = False
        self.listeners = []  # called with (event, payload) after each line: tracking.backend

    def _write(self, event: str, payload: dict) -> None:
        line = json.dumps(_clean({"event": event, "time": time.time(), **payload}), allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()
        for listener in self.listeners:
            listener(event, payload)

    def start(self, payload: dict) -> None:
        with self._lock:
            self._write("start", {"schema": SCHEMA_VERSION, **payload})

    def step(self, payload: dict) -> None:
        with self._lock:
            if not self.ended:
                self._write("step", payload)

    def event(self, name: str, payload: dict) -> None:
        """A record beside start/step/end, e.g. fine-tuning's `eval` (readers skip events they do not know)."""
        with self._lock:
            if not self.ended:
                self._write(name, payload)

    def end(self, payload: dict) -> bool:
        """Write the end record unless one was written already; True if this call wrote it."""
        with self._lock:
            if self.ended:
                return False
            self.ended = True
            self._write("end", payload)
            try:
                os.fsync(self._file.fileno())
            except OSError:
                pass
            return True

    def close(self) -> None:
        with self._lock:
            self._file.close()


def write_rank_error(run_dir: str, rank: int, status: str, error: str) -> None:
    """A failing rank other than 0 leaves its reason where rank 0 (and a person) will look."""
    path = os.path.join(run_dir, f"rank{rank}.error.json")
    tmp = path + ".tmp"
    try:
        os.makedirs(run_dir, exist_ok=True)  # this rank may fail before rank 0 has made it
        with open(tmp, "w") as f:
            json.dump({"rank": rank, "status": status, "error": error, "time": time.time()}, f)
        os.replace(tmp, path)
    except OSError:
        pass
