"""One GPU run's profiler trace: analysis/traces.py's breakdown against Holistic Trace Analysis' on the
same trace and the same kernels, as tests/test_traces_hta.py compares them on made traces.

    python benchmarks/trace_vs_hta.py RUN_DIR [--json PATH]

Prints, and writes with --json, one object: our per-step breakdown of rank 0's trace
(`trace_rank0.json.gz`), and, where HTA is installed (`pip install HolisticTraceAnalysis`), our
figures over the kernels HTA analysed and HTA's window (first kernel start to last kernel end) beside
HTA's `get_temporal_breakdown` and `get_comm_comp_overlap`. Bars (docs/profiling.md): compute within
2% of HTA's, idle within 0.5% of HTA's kernel time, overlap within 0.5 points (when there is
communication). HTA_DISABLE_NS_ROUNDING=1, so that both sides see the kernels as recorded.
Without HTA `hta` is {"error": "not installed"}; no torch is needed.
"""

import argparse
import gzip
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from analysis import traces  # noqa: E402

COMPUTE_SHARE = 0.02  # |ours / HTA's - 1| for compute
IDLE_SHARE = 0.005  # |ours - HTA's| idle, as a share of HTA's kernel time
OVERLAP_POINTS = 0.5  # percentage points


def read_events(path: str) -> list:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f).get("traceEvents", [])


def ours_over(events: list, correlations: set | None = None) -> dict:
    """traces.split over the device events (those whose correlation is in `correlations`, when given),
    from the first one's start to the last one's end: µs of compute, memory, overlapped, exposed, idle."""
    device = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in traces.DEVICE_CATEGORIES
        and (correlations is None or (e.get("args") or {}).get("correlation") in correlations)
    ]
    if not device:
        raise ValueError("no device events in the trace")
    classes = traces.classify(device)
    lo, hi = min(e["ts"] for e in device), max(e["ts"] + e["dur"] for e in device)
    got = traces.split(classes, lo - classes.origin, hi - classes.origin)
    comm = got["overlapped"] + got["exposed"]
    got["overlap_pct"] = 100.0 * got["overlapped"] / comm if comm else None
    return got


def hta_figures(path: str) -> tuple[dict, set]:
    """HTA's temporal breakdown and overlap of rank 0's trace, and the correlations of the kernels it
    analysed. Raises ImportError without HTA."""
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_files={0: path}, trace_dir=os.path.dirname(path))
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank").iloc[0]
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank").iloc[0]
    df = analysis.t.traces[0]
    analysed = set(df.loc[df["stream"].ne(-1), "correlation"])
    figures = {
        "compute_us": float(temporal["compute_time(us)"]),
        "idle_us": float(temporal["idle_time(us)"]),
        "kernel_us": float(temporal["kernel_time(us)"]),
        "overlap_pct": float(overlap["comp_comm_overlap_pctg"]),
    }
    return figures, analysed


def compare(ours: dict, hta: dict) -> dict:
    """Each figure beside HTA's, with its bar and whether it holds."""
    compute_diff = ours["compute"] / hta["compute_us"] - 1 if hta["compute_us"] else None
    idle_diff = (ours["idle"] - hta["idle_us"]) / hta["kernel_us"] if hta["kernel_us"] else None
    rows = {
        "compute": {
            "ours_us": ours["compute"],
            "hta_us": hta["compute_us"],
            "difference": compute_diff,
            "bar": f"within {COMPUTE_SHARE:.0%}",
            "pass": compute_diff is not None and abs(compute_diff) <= COMPUTE_SHARE,
        },
        "idle": {
            "ours_us": ours["idle"],
            "hta_us": hta["idle_us"],
            "difference_of_kernel_time": idle_diff,
            "bar": f"within {IDLE_SHARE:.1%} of HTA's kernel time",
            "pass": idle_diff is not None and abs(idle_diff) <= IDLE_SHARE,
        },
    }
    if ours["overlap_pct"] is not None:
        points = ours["overlap_pct"] - hta["overlap_pct"]
        rows["overlap"] = {
            "ours_pct": ours["overlap_pct"],
            "hta_pct": hta["overlap_pct"],
            "difference_points": points,
            "bar": f"within {OVERLAP_POINTS} points",
            "pass": abs(points) <= OVERLAP_POINTS,
        }
    return rows


def trace_path(run_dir: str) -> str:
    for name in ("trace_rank0.json.gz", "trace_rank0.json"):
        if os.path.exists(os.path.join(run_dir, name)):
            return os.path.join(run_dir, name)
    raise FileNotFoundError(f"{run_dir}: no trace_rank0.json(.gz); was the run made with profile.enabled=true?")


def report(run_dir: str) -> dict:
    path = trace_path(run_dir)
    out = {"trace": path, "breakdown": traces.breakdown(path)}
    try:
        hta, analysed = hta_figures(path)
    except ImportError:
        out["hta"] = {"error": "not installed"}
        return out
    except Exception as exc:  # HTA's parser on a trace it does not take: the finding, not a crash of this tool
        out["hta"] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]}
        return out
    out["hta"] = hta
    out["comparison"] = compare(ours_over(read_events(path), analysed), hta)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        found = report(args.run_dir)
    except (OSError, ValueError) as exc:
        print(f"trace_vs_hta.py: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(found, indent=1)
    print(text, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
