"""Where the time goes: the Chrome traces of `profile.enabled` runs (trace_rank<k>.json.gz in a run
directory) split into compute, communication hidden behind compute, exposed communication and idle
time per step. No torch: the traces are JSON.

Classification (docs/profiling.md), after Holistic Trace Analysis' kernel breakdown:
  GPU traces: device kernels; a kernel whose name holds nccl or rccl is communication, every other
    kernel and memory copy/set is computation.
  CPU traces (gloo): gloo runs each collective on a thread of its own, recorded as a `gloo:<op>`
    range: that is communication. Computation is the leaf operators (an operator that contains no
    other) on every other thread, so that the time the training thread waits inside a collective
    or an FSDP hook counts as neither.
Per step (the `vit_scale.step#<k>` ranges of the trainer): with C the union of computation and M
the union of communication inside the step,
  compute = |C|, comm_overlapped = |M ∩ C| (a part of compute's time), comm_exposed = |M| - |M ∩ C|
  (HTA's non-overlapped communication), idle = step - |C ∪ M| (the device, or on a CPU the ranks'
  threads, did nothing of either: host overhead, launch gaps, waiting on a peer); so
  compute + comm_exposed + idle = step.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas only where a table is made: the breakdown itself needs none
    import pandas as pd

STEP_MARK = "vit_scale.step#"
COMM_KERNEL = re.compile(r"nccl|rccl", re.I)
COLUMNS = ("study", "model", "strategy", "nodes", "world_size", "rank", "device", "steps", "step_ms", "compute_ms",
           "comm_overlapped_ms", "comm_exposed_ms", "idle_ms", "run_dir")


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


def classify(events) -> tuple[list, list, list, str]:
    """(steps, compute intervals, communication intervals, device) of one trace's complete events."""
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    steps = sorted([e["ts"], e["ts"] + e["dur"]] for e in complete if str(e.get("name", "")).startswith(STEP_MARK))
    kernels = [e for e in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if kernels:
        comm = [[e["ts"], e["ts"] + e["dur"]] for e in kernels
                if e.get("cat") == "kernel" and COMM_KERNEL.search(str(e.get("name", "")))]
        compute = [[e["ts"], e["ts"] + e["dur"]] for e in kernels
                   if not (e.get("cat") == "kernel" and COMM_KERNEL.search(str(e.get("name", ""))))]
        return steps, union(compute), union(comm), "gpu"
    comm = [[e["ts"], e["ts"] + e["dur"]] for e in complete if str(e.get("name", "")).startswith("gloo:")]
    ops: dict = {}
    for e in complete:
        name = str(e.get("name", ""))
        if e.get("cat") == "cpu_op" and not name.startswith(("c10d::", "record_param_comms")):
            ops.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e["dur"]))
    compute = []
    for spans in ops.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        for k, (a, b) in enumerate(spans):
            # a leaf: the next operator on its thread does not start inside it
            if k + 1 == len(spans) or spans[k + 1][0] >= b:
                compute.append([a, b])
    return steps, union(compute), union(comm), "cpu"


def breakdown(path: str) -> dict | None:
    """Mean per-step times (ms) of one rank's trace, or None without step marks."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    steps, compute, comm, device = classify(events)
    if not steps:
        return None
    totals = dict(step=0.0, compute=0.0, overlapped=0.0, exposed=0.0, idle=0.0)
    for lo, hi in steps:
        c, m = clip(compute, lo, hi), clip(comm, lo, hi)
        both = length(intersect(c, m))
        totals["step"] += hi - lo
        totals["compute"] += length(c)
        totals["overlapped"] += both
        totals["exposed"] += length(m) - both
        totals["idle"] += (hi - lo) - length(union(c + m))
    n = len(steps)
    ms = {k: round(v / n / 1000.0, 3) for k, v in totals.items()}   # trace times are in µs
    return {"device": device, "steps": n, "step_ms": ms["step"], "compute_ms": ms["compute"],
            "comm_overlapped_ms": ms["overlapped"], "comm_exposed_ms": ms["exposed"], "idle_ms": ms["idle"]}


def run_breakdowns(run) -> list[dict]:
    """One row per traced rank of a run (a vit_scale.record.reader RunRecord)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(run.run_dir, "trace_rank*.json*"))):
        m = re.search(r"trace_rank(\d+)\.json", os.path.basename(path))
        try:
            found = breakdown(path)
        except (OSError, ValueError, EOFError):
            found = None   # a trace cut short (the run was killed while writing it): nothing to count
        if not m or found is None:
            continue
        start = run.start
        rows.append({"study": start.get("study"), "model": start["model"]["name"],
                     "strategy": start["strategy"]["label"], "nodes": start["world"]["nodes"],
                     "world_size": start["world"]["world_size"], "rank": int(m.group(1)), **found,
                     "run_dir": run.run_dir})
    return rows


def table(runs) -> "pd.DataFrame":
    """time_breakdown.csv: one row per traced rank of every run that finished ok."""
    import pandas as pd

    rows = [row for run in runs if run.status == "ok" for row in run_breakdowns(run)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def per_run(df: "pd.DataFrame") -> "pd.DataFrame":
    """Mean over the traced ranks of each run (the figure's bars, the report's line)."""
    keys = ["study", "model", "strategy", "nodes", "world_size", "run_dir"]
    parts = ["step_ms", "compute_ms", "comm_overlapped_ms", "comm_exposed_ms", "idle_ms"]
    return df.groupby(keys, as_index=False, sort=False)[parts].mean()


def most_exposed(df: "pd.DataFrame") -> str | None:
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
        lines.append(f"{model} on {where}: {worst['strategy']} has the most exposed communication, "
                     f"{worst['comm_exposed_ms']:.1f} ms of its {worst['step_ms']:.1f} ms step ({share:.0%}), "
                     f"{worst['comm_overlapped_ms']:.1f} ms more hidden behind compute.")
    return " ".join(lines)
