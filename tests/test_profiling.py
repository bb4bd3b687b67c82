"""profile.enabled: Chrome traces per rank after the timed window (runs in the session's launch of 2 ranks,
tests/shared_launch.py), and the analysis' torch-free breakdown of them (time_breakdown.csv, the figure,
the report's line)."""

import glob
import gzip
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

import shared_launch
from conftest import ROOT, load_runs

sys.path.insert(0, ROOT)
from analysis import traces

STEPS = ["train.steps=4", "train.warmup_steps=1", "train.batch_size=4", "model=vit_micro"]
STEPS += ["train.health_probe_s=0.1"]  # the node-health probe after the window, shortened (it defaults to 1 s)


def _profiled_runs(folder) -> list:
    out = folder / "runs"
    return [
        [*STEPS, f"strategy={s}", "profile.enabled=true", f"output.dir={out}", "output.study=prof"]
        for s in ("DDP", "FULL_SHARD")
    ]


# in the session's launch of 2 ranks (tests/shared_launch.py)
shared_launch.register("test_profiling", "profiled_runs", 2, _profiled_runs, order=0)


@pytest.fixture(scope="module")
def profiled_runs(shared_launches):
    return shared_launches.share("test_profiling", "profiled_runs").folder / "runs"


def test_ddp_and_full_shard_traces_and_their_breakdown(profiled_runs, tmp_path):
    out = profiled_runs
    runs = load_runs(out)
    assert len(runs) == 2
    for (_, strategy, _), records in runs.items():
        end = records[-1]
        # the profiled steps come after the timed window: the figures are those of train.steps alone
        assert end["status"] == "ok" and end["steps_done"] == 4 and end["timed_steps"] == 3
        assert [r["step"] for r in records if r["event"] == "step"] == [1, 2, 3, 4]
        assert end["profile"]["steps"] == 3 and end["profile"]["ranks"] == [0, 1]
        assert end["profile"]["traces"] == ["trace_rank0.json.gz", "trace_rank1.json.gz"]
        run_dir = os.path.dirname(glob.glob(str(out / "**" / strategy / "**" / "metrics.jsonl"), recursive=True)[0])
        with gzip.open(os.path.join(run_dir, "trace_rank1.json.gz"), "rt") as f:
            names = {e.get("name") for e in json.load(f)["traceEvents"]}
        assert {"vit_scale.step#1", "vit_scale.step#3"} <= names
        assert any(str(n).startswith("gloo:") for n in names), "gloo's collectives are in the trace"

    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "analysis", "weak_scaling.py"), str(out), "--out", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bd = pd.read_csv(report / "time_breakdown.csv")
    assert list(bd.columns) == list(traces.COLUMNS)
    assert sorted(zip(bd["strategy"], bd["rank"], strict=True)) == [
        ("DDP", 0),
        ("DDP", 1),
        ("FULL_SHARD", 0),
        ("FULL_SHARD", 1),
    ]
    assert (bd["steps"] == 3).all() and (bd["device"] == "cpu").all()
    parts = bd["compute_ms"] + bd["memory_ms"] + bd["comm_exposed_ms"] + bd["idle_ms"]
    assert ((parts - bd["step_ms"]).abs() < 0.01).all(), "compute, memory, exposed communication and idle make the step"
    assert (bd["memory_ms"] == 0).all(), "a CPU trace has no memory copies or sets"
    assert (bd["comm_overlapped_ms"] <= bd["compute_ms"]).all()
    fsdp = bd[bd["strategy"] == "FULL_SHARD"]
    assert (fsdp["comm_exposed_ms"] + fsdp["comm_overlapped_ms"] > 1).all(), fsdp
    assert (bd["compute_ms"] > 0).all()
    assert (report / "time_breakdown.png").is_file()
    md = (report / "report.md").read_text()
    assert "## Where the time goes (profiler traces)" in md
    assert "has the most exposed communication" in md
    print(bd.to_string())


def test_breakdown_counts_overlap_the_way_hta_does(tmp_path):
    """A GPU trace made by hand: step 0-100 µs, compute kernels 0-40 and 60-70, an NCCL kernel 30-80
    (20 hidden behind compute, 30 exposed), a Memset 35-38 under compute, a Memcpy 75-90 (its last 10
    µs covered by nothing else: memory, as HTA keeps it, not compute), a stream waiting 92-95 (no
    work), nothing at 90-100 (idle)."""
    events = [
        {"ph": "X", "name": "vit_scale.step#1", "cat": "user_annotation", "ts": 0, "dur": 100, "tid": 1},
        {"ph": "X", "name": "ampere_sgemm", "cat": "kernel", "ts": 0, "dur": 40, "tid": 7},
        {"ph": "X", "name": "vectorized_elementwise", "cat": "kernel", "ts": 60, "dur": 10, "tid": 7},
        {"ph": "X", "name": "ncclDevKernel_AllGather_RING_LL", "cat": "kernel", "ts": 30, "dur": 50, "tid": 9},
        {"ph": "X", "name": "Memset (Device)", "cat": "gpu_memset", "ts": 35, "dur": 3, "tid": 11},
        {"ph": "X", "name": "Memcpy DtoD (Device -> Device)", "cat": "gpu_memcpy", "ts": 75, "dur": 15, "tid": 11},
        {"ph": "X", "name": "Stream Wait Event", "cat": "cuda_sync", "ts": 92, "dur": 3, "tid": 9},
    ]
    path = tmp_path / "trace_rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = traces.breakdown(str(path))
    assert got == {
        "device": "gpu",
        "steps": 1,
        "step_ms": 0.1,
        "compute_ms": 0.05,
        "memory_ms": 0.01,
        "comm_overlapped_ms": 0.02,
        "comm_exposed_ms": 0.03,
        "idle_ms": 0.01,
    }, got
