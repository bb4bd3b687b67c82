"""Find run directories and read their metrics.jsonl (docs/run_record.md): the one reader of the
run record, torch-free, used by the analysis, the job tooling and the run session itself.

For a finished run only the first line (`start`) and the last line (`end`) are parsed: the end
record already holds every summary the analysis needs, and a study of 2,000 runs × 500 steps is a
million step lines that would otherwise dominate the time. Step lines are read for a run without
an end record, to say how far it got, and by `timed_step_ips`, which the analysis calls for the
confidence interval of a run's images/s (a scan of bytes, not a JSON parse per line).

Nothing here raises on a bad file: each file becomes either a RunRecord or a Skipped entry with
a reason a user can act on. The one exception to "go on with what can be read" is a schema newer
than this reader knows, which the caller must surface (see Collection.unknown_schema).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from vit_scale.record.writer import METRICS_FILE, STATUSES
from vit_scale.record.writer import SCHEMA_VERSION as SUPPORTED_SCHEMA

INCOMPLETE = "incomplete"  # a start record but no end record: the process was killed outright

# (dotted key in the start record, what the analysis needs it for); a start record without one
# of these cannot be placed on any plot or table, so the file is skipped with this key named.
REQUIRED_START_KEYS = (
    ("model.name", str),
    ("strategy.label", str),
    ("world.world_size", int),
    ("world.nodes", int),
    ("batch.per_device", int),
)

# An end record carries per-rank lists, so on a 1,000-rank run it can be ~100 KB; start small
# and grow the tail window until the whole last line is inside it.
_TAIL_BLOCK = 16 * 1024


@dataclass
class RunRecord:
    path: str  # the metrics.jsonl
    start: dict
    end: dict | None  # None when the run has no end record
    status: str  # end.status, or INCOMPLETE
    mtime: float
    notes: list = field(default_factory=list)  # what the reader had to work around, for the report
    last_step: int | None = None  # only for runs without an end record
    partial_ips: float | None = None  # mean images/s over the timed steps logged so far
    rank_errors: list = field(default_factory=list)  # rank<k>.error.json contents

    @property
    def run_dir(self) -> str:
        return os.path.dirname(self.path)


@dataclass
class Skipped:
    path: str
    reason: str


@dataclass
class Collection:
    inputs: list
    runs: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # files or directories that gave no run
    unknown_schema: list = field(default_factory=list)  # Skipped entries whose schema is too new
    seconds: float = 0.0

    @property
    def n_files(self) -> int:
        return len(self.runs) + len(self.skipped) + len(self.unknown_schema)


class _Skip(Exception):
    pass


class _UnknownSchema(Exception):
    pass


# ------------------------------------------------------------------------------------ finding


def find_metrics_files(root: str, skipped: list, seen_dirs: set | None = None) -> Iterator[str]:
    """Every metrics.jsonl under root (or root itself when it is such a file), skipping
    directories (and files) already in seen_dirs.

    A run directory that has config.yaml but no metrics.jsonl never wrote its start record; it
    is reported rather than ignored, since that usually means the job died at launch.
    """
    seen_dirs = set() if seen_dirs is None else seen_dirs
    if os.path.isfile(root):
        real = os.path.realpath(root)
        if real not in seen_dirs:
            seen_dirs.add(real)
            yield root
        return
    found = pruned = 0
    # followlinks: studies are often assembled from symlinked run trees; seen_dirs breaks cycles.
    for dirpath, dirnames, filenames in os.walk(
        root,
        followlinks=True,
        onerror=lambda e: skipped.append(
            Skipped(getattr(e, "filename", None) or root, f"cannot list directory: {e.strerror or e}")
        ),
    ):
        try:
            st = os.stat(dirpath)
            ident = (st.st_dev, st.st_ino)  # one stat, where realpath would lstat every component
        except OSError:
            ident = dirpath
        if ident in seen_dirs:
            dirnames[:] = []
            pruned += 1
            continue
        seen_dirs.add(ident)
        dirnames.sort()
        if METRICS_FILE in filenames:
            found += 1
            yield os.path.join(dirpath, METRICS_FILE)
        elif "config.yaml" in filenames:
            skipped.append(Skipped(dirpath, "config.yaml but no metrics.jsonl: the run never wrote its start record"))
    if found == 0 and not pruned:
        skipped.append(Skipped(root, "no runs found (no metrics.jsonl anywhere under it)"))


# ------------------------------------------------------------------------------------ reading


def _loads(line: bytes):
    try:
        return json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None


def _get(obj: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _check_start(start) -> None:
    if not isinstance(start, dict) or start.get("event") != "start":
        raise _Skip("first line is not a start record (not a vit-scale metrics file?)")
    schema = start.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise _Skip(f"start record has no integer 'schema' (got {schema!r})")
    if schema > SUPPORTED_SCHEMA:
        raise _UnknownSchema(
            f"schema {schema} is newer than this analysis reads (up to {SUPPORTED_SCHEMA}); "
            f"update the analysis to read it"
        )
    if schema < 1:
        raise _Skip(f"schema {schema} is not a released schema (this analysis reads 1 to {SUPPORTED_SCHEMA})")
    for key, typ in REQUIRED_START_KEYS:
        val = _get(start, key)
        if not isinstance(val, typ) or isinstance(val, bool):
            raise _Skip(f"start record lacks {key} ({typ.__name__}), got {val!r}")


def _last_line(f, data_start: int, size: int) -> bytes:
    """The last non-blank line at or after data_start, reading only the tail of the file."""
    block = _TAIL_BLOCK
    while True:
        lo = max(data_start, size - block)
        f.seek(lo)
        tail = f.read(size - lo).rstrip()
        cut = tail.rfind(b"\n")
        if cut >= 0:
            return tail[cut + 1 :]
        if lo == data_start:
            return tail
        block *= 4


def _scan_steps(f, data_start: int, rec: RunRecord) -> dict | None:
    """Read every line after the start record of a run whose last line is not an end record.

    Returns an end record if one turns up before trailing garbage, so a run whose file was
    appended to after it finished is still read as finished.
    """
    f.seek(data_start)
    bad = 0
    end = None
    timed = []
    for raw in f:
        if not raw.strip():
            continue
        obj = _loads(raw)
        if not isinstance(obj, dict):
            bad += 1
            continue
        event = obj.get("event")
        if event == "step":
            step = obj.get("step")
            if isinstance(step, int):
                rec.last_step = step
            ips = obj.get("images_per_s")
            if not obj.get("warmup") and isinstance(ips, (int, float)):
                timed.append(float(ips))
        elif event == "end":
            end = obj
    if timed:
        rec.partial_ips = sum(timed) / len(timed)
    if bad:
        rec.notes.append(f"{bad} unreadable line(s) (truncated or not JSON) skipped")
    return end


# The end of a timed step line as the writer formats it (json.dumps; images_per_s, then warmup, last):
# literals the regex engine and bytes.count find fast. Any other shape falls back to parsing each line.
_TIMED_IPS = re.compile(rb'"images_per_s": ([-+0-9.eE]+), "warmup": false\}')


def timed_step_ips(path: str) -> list:
    """Per-step images/s of the timed (not warm-up) steps, in the order they ran; [] when unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    timed = _TIMED_IPS.findall(data)
    if len(timed) + data.count(b', "warmup": true}') == data.count(b'"event": "step"'):
        return list(map(float, timed))
    out = []
    for raw in data.splitlines():
        obj = _loads(raw) if b'"step"' in raw else None
        if isinstance(obj, dict) and obj.get("event") == "step" and obj.get("warmup") is False:
            ips = obj.get("images_per_s")
            if isinstance(ips, (int, float)) and not isinstance(ips, bool):
                out.append(float(ips))
    return out


def rank_errors(run_dir: str) -> list:
    """rank<k>.error.json files: why a non-zero rank failed, when rank 0 could not say."""
    out = []
    try:
        names = sorted(n for n in os.listdir(run_dir) if n.startswith("rank") and n.endswith(".error.json"))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(run_dir, name), "rb") as f:
                obj = _loads(f.read())
        except OSError:
            obj = None
        if isinstance(obj, dict):
            out.append(obj)
    return out


def read_run(path: str) -> RunRecord:
    """One metrics.jsonl into a RunRecord; raises _Skip or _UnknownSchema with the reason."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mtime = os.fstat(f.fileno()).st_mtime
            if size == 0:
                raise _Skip("empty file")
            first = f.readline()
            start = _loads(first)
            if start is None:
                raise _Skip("first line is not JSON (a truncated start record or not a metrics file)")
            _check_start(start)
            data_start = f.tell()
            rec = RunRecord(path=path, start=start, end=None, status=INCOMPLETE, mtime=mtime)
            end = None
            if data_start < size:
                last = _last_line(f, data_start, size)
                obj = _loads(last) if last else None
                if isinstance(obj, dict) and obj.get("event") == "end":
                    end = obj
                else:
                    if last and obj is None:
                        rec.notes.append("last line is truncated or not JSON (job killed mid-write?)")
                    end = _scan_steps(f, data_start, rec)
            else:
                rec.last_step = 0
    except OSError as exc:
        raise _Skip(f"cannot read: {exc.strerror or exc}") from None
    if end is not None:
        status = end.get("status")
        if not isinstance(status, str):
            rec.notes.append(f"end record has no status string ({status!r}); read as failed")
            status = "failed"
        elif status not in STATUSES:
            rec.notes.append(f"unknown status {status!r} kept as is")
        rec.end, rec.status = end, status
    else:
        if rec.last_step is None:
            rec.last_step = 0
        rec.rank_errors = rank_errors(rec.run_dir)
    return rec


def read_run_dir(run_dir: str) -> RunRecord | None:
    """One run directory's record, or None when it has none that can be read."""
    try:
        return read_run(os.path.join(run_dir, METRICS_FILE))
    except (_Skip, _UnknownSchema):
        return None


def start_and_end(run_dir: str) -> tuple[dict | None, dict | None]:
    """(start, end) of one run directory; None for a part it lacks or that cannot be read."""
    rec = read_run_dir(run_dir)
    return (rec.start, rec.end) if rec else (None, None)


def collect(paths: Iterable[str], progress: Callable[[int, float], None] | None = None) -> Collection:
    """Every run under the given directories. progress(n_read, seconds) is called now and then."""
    t0 = time.perf_counter()
    paths = list(paths)
    coll = Collection(inputs=paths)
    last_report = t0
    # Shared by every root: `runs runs/study`, or a directory given twice, must not read as
    # reruns of themselves.
    seen: set = set()
    for root in paths:
        for mpath in find_metrics_files(root, coll.skipped, seen):
            try:
                coll.runs.append(read_run(mpath))
            except _Skip as exc:
                coll.skipped.append(Skipped(mpath, str(exc)))
            except _UnknownSchema as exc:
                coll.unknown_schema.append(Skipped(mpath, str(exc)))
            now = time.perf_counter()
            if progress is not None and now - last_report > 2.0:
                progress(coll.n_files, now - t0)
                last_report = now
    coll.seconds = time.perf_counter() - t0
    return coll
