"""Where the time goes: the Chrome traces of `profile.enabled` runs (trace_rank<k>.json.gz in a run
directory) split into compute, memory copies and sets, communication hidden behind compute, exposed
communication and idle time per step. No torch: the traces are JSON.

Classification (docs/profiling.md), that of Holistic Trace Analysis 0.5.0 (hta/utils/utils.py:
get_kernel_type), so that the figures agree with HTA's temporal breakdown and overlap:
  GPU traces: device events (kernels, memory copies and sets). Communication is a kernel whose name
    starts with nccl (or rccl) and names a Kernel; memory is a copy or a set (their categories, or a
    name starting with Memcpy, Memset or dma); every other kernel is computation.
  CPU traces (gloo): gloo runs each collective on a thread of its own, recorded as a `gloo:<op>`
    range: that is communication. Computation is the leaf operators (an operator that contains no
    other) on every other thread, so that the time the training thread waits inside a collective
    or an FSDP hook counts as neither. There is no memory class on a CPU.
Per step (the `vit_scale.step#<k>` ranges of the trainer): with C, Y and M the unions of computation,
memory and communication inside the step,
  compute = |C|, comm_overlapped = |M ∩ C| (a part of compute's time: HTA's overlap is
  |M ∩ C| / |M|), comm_exposed = |M| - |M ∩ C|, memory = |C ∪ M ∪ Y| - |C ∪ M| (copies and sets
  that neither computation nor communication covers), idle = step - |C ∪ M ∪ Y| (the device, or on
  a CPU the ranks' threads, did nothing: host overhead, launch gaps, waiting on a peer); so
  compute + memory + comm_exposed + idle = step.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # pandas only where a table is made: the breakdown itself needs none
    import pandas as pd

STEP_MARK = "vit_scale.step#"
# HTA's NCCL_KERNEL_RE and MEMORY_KERNEL_RE (hta/utils/utils.py); RCCL's kernels are named nccl* too
COMM_KERNEL = re.compile(r"^(nccl|rccl).*kernel", re.I)
MEMORY_KERNEL = re.compile(r"^(Memcpy|Memset|dma)")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset")
COLUMNS = (
    "study",
    "model",
    "strategy",
    "nodes",
    "world_size",
    "rank",
    "device",
    "steps",
    "step_ms",
    "compute_ms",
    "memory_ms",
    "comm_overlapped_ms",
    "comm_exposed_ms",
    "idle_ms",
    "run_dir",
)
PARTS = ("step_ms", "compute_ms", "memory_ms", "comm_overlapped_ms", "comm_exposed_ms", "idle_ms")


def union(intervals) -> list:
    """Sorted, merged [start, end) intervals."""
    merged: list = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def intersect(xs, ys) -> list:
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append([a, b])
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(intervals, lo: float, hi: float) -> list:
    return [[max(a, lo), min(b, hi)] for a, b in intervals if b > lo and a < hi]


class Classified(NamedTuple):
    """One trace: its step ranges and the merged intervals of each class, in µs after `origin`."""

    steps: list
    compute: list
    memory: list
    comm: list
    device: str
    origin: float


def device_class(event: dict) -> str:
    """communication, memory or compute: a GPU device event's class, as HTA's get_kernel_type."""
    name = str(event.get("name", ""))
    if event.get("cat") == "kernel" and COMM_KERNEL.match(name):
        return "comm"
    if event.get("cat") in MEMORY_CATEGORIES or MEMORY_KERNEL.match(name):
        return "memory"
    return "compute"


def classify(events) -> Classified:
    """The step ranges and class intervals of one trace's complete events."""
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    # epoch timestamps in µs leave a float64 a quarter-µs grid: ends are added after the origin is taken off
    origin = min((e["ts"] for e in complete), default=0.0)

    def span(e) -> list:
        return [e["ts"] - origin, e["ts"] - origin + e["dur"]]

    steps = sorted(span(e) for e in complete if str(e.get("name", "")).startswith(STEP_MARK))
    # cuda_sync events (a stream or the host waiting) are not work: they are left to idle
    device = [e for e in complete if e.get("cat") in DEVICE_CATEGORIES]
    if device:
        spans: dict = {"compute": [], "memory": [], "comm": []}
        for e in device:
            spans[device_class(e)].append(span(e))
        return Classified(steps, union(spans["compute"]), union(spans["memory"]), union(spans["comm"]), "gpu", origin)
    comm = [span(e) for e in complete if str(e.get("name", "")).startswith("gloo:")]
    return Classified(steps, union(cpu_leaf_operators(complete, span)), [], union(comm), "cpu", origin)


def cpu_leaf_operators(complete, span) -> list:
    """The operators that contain no other operator on their thread, collectives' waits left out."""
    ops: dict = {}
    for e in complete:
        name = str(e.get("name", ""))
        if e.get("cat") == "cpu_op" and not name.startswith(("c10d::", "record_param_comms")):
            ops.setdefault(e.get("tid"), []).append(tuple(span(e)))
    leaves = []
    for spans in ops.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        for k, (a, b) in enumerate(spans):
            # a leaf: the next operator on its thread does not start inside it
            if k + 1 == len(spans) or spans[k + 1][0] >= b:
                leaves.append([a, b])
    return leaves


def split(classes: Classified, lo: float, hi: float) -> dict:
    """Times (µs) of the classes inside [lo, hi) (µs after classes.origin):
    compute + memory + exposed + idle = step."""
    c, y, m = clip(classes.compute, lo, hi), clip(classes.memory, lo, hi), clip(classes.comm, lo, hi)
    hidden = length(intersect(c, m))
    busy_without_memory = length(union(c + m))
    busy = length(union(c + m + y))
    return {
        "step": hi - lo,
        "compute": length(c),
        "memory": busy - busy_without_memory,
        "overlapped": hidden,
        "exposed": length(m) - hidden,
        "idle": (hi - lo) - busy,
    }


def breakdown(path: str) -> dict | None:
    """Mean per-step times (ms) of one rank's trace, or None without step marks."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    classes = classify(events)
    if not classes.steps:
        return None
    totals: dict = {}
    for lo, hi in classes.steps:
        for k, v in split(classes, lo, hi).items():
            totals[k] = totals.get(k, 0.0) + v
    n = len(classes.steps)
    ms = {k: round(v / n / 1000.0, 3) for k, v in totals.items()}  # trace times are in µs
    return {
        "device": classes.device,
        "steps": n,
        "step_ms": ms["step"],
        "compute_ms": ms["compute"],
        "memory_ms": ms["memory"],
        "comm_overlapped_ms": ms["overlapped"],
        "comm_exposed_ms": ms["exposed"],
        "idle_ms": ms["idle"],
    }


def run_breakdowns(run) -> list[dict]:
    """One row per traced rank of a run (a vit_scale.record.reader RunRecord)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(run.run_dir, "trace_rank*.json*"))):
        m = re.search(r"trace_rank(\d+)\.json", os.path.basename(path))
        try:
            found = breakdown(path)
        except (OSError, ValueError, EOFError):
            found = None  # a trace cut short (the run was killed while writing it): nothing to count
        if not m or found is None:
            continue
        start = run.start
        rows.append(
            {
                "study": start.get("study"),
                "model": start["model"]["name"],
                "strategy": start["strategy"]["label"],
                "nodes": start["world"]["nodes"],
                "world_size": start["world"]["world_size"],
                "rank": int(m.group(1)),
                **found,
                "run_dir": run.run_dir,
            }
        )
    return rows


def table(runs) -> pd.DataFrame:
    """time_breakdown.csv: one row per traced rank of every run that finished ok."""
    import pandas as pd

    rows = [row for run in runs if run.status == "ok" for row in run_breakdowns(run)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def per_run(df: pd.DataFrame) -> pd.DataFrame:
    """Mean over the traced ranks of each run (the figure's bars, the report's line)."""
    keys = ["study", "model", "strategy", "nodes", "world_size", "run_dir"]
    return df.groupby(keys, as_index=False, sort=False)[list(PARTS)].mean()


def most_exposed(df: pd.DataFrame) -> str | None:
    """The report's line: the strategy with the most exposed communication at the largest node count."""
    if df.empty:
        return None
    runs = per_run(df)
    lines = []
    for model, sub in runs.groupby("model", sort=False):
        top_nodes = sub["nodes"].max()
        at = sub[sub["nodes"] == top_nodes]
        size = "world size" if at["world_size"].nunique() > 1 else None
        if size:  # one machine: the largest rank count instead
            at = at[at["world_size"] == at["world_size"].max()]
        worst = at.loc[at["comm_exposed_ms"].idxmax()]
        where = f"{int(top_nodes)} node{'s' if top_nodes > 1 else ''} ({int(worst['world_size'])} ranks)"
        share = worst["comm_exposed_ms"] / worst["step_ms"] if worst["step_ms"] else 0
        lines.append(
            f"{model} on {where}: {worst['strategy']} has the most exposed communication, "
            f"{worst['comm_exposed_ms']:.1f} ms of its {worst['step_ms']:.1f} ms step ({share:.0%}), "
            f"{worst['comm_overlapped_ms']:.1f} ms more hidden behind compute."
        )
    return " ".join(lines)
