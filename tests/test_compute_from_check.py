"""Compute from the check's GEMMs (vit_scale.planning.compute, vit_scale.check.gemms): the Block's GEMMs
count exactly the FLOPs the planner counts; a plan given a check.json whose `compute` covers the point
takes its 1-node compute from those timings scaled to the step, says so per row, and keeps the flat
default (or what the user stated) elsewhere; bad timings are one line, exit 2. The check.json here is
written by the test (timings chosen so the arithmetic is exact); the real check's entry is asserted in
tests/test_check.py (passing_study). One real CPU timing of vit_micro's GEMMs (a few ms), and the GPU
path's order of events and waits with torch.cuda's Event and synchronize replaced: no GPU here."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT
from vit_scale import plan
from vit_scale.check.collectives import step_fits_of
from vit_scale.models import get_spec
from vit_scale.planning.compute import LABEL, block_gemms
from vit_scale.planning.shapes import Shape
from vit_scale.planning.step_time import forward_flops_per_image

MICRO = Shape.from_spec(get_spec("vit_micro"))


def measurements(per_node: int, nodes: int) -> list:
    """Interconnect measurements a full check of `nodes` x `per_node` ranks could have made (their
    values do not matter here: only the compute is asserted)."""
    from test_step_fit import measurements as ring

    return ring(per_node=per_node, nodes=nodes)


def compute_entry(model: str, precision: str, batch: int, forward_s: float = 1e-3, backward_s: float = 2e-3) -> dict:
    """check.json's compute entry with the Block's forward GEMMs summing to forward_s and its backward
    ones to backward_s (each GEMM its share by FLOPs)."""
    ops = block_gemms(Shape.from_spec(get_spec(model)), batch)
    fwd = sum(o["flops"] for o in ops if o["pass"] == "forward")
    bwd = sum(o["flops"] for o in ops if o["pass"] == "backward")
    for o in ops:
        o["seconds"] = (forward_s / fwd if o["pass"] == "forward" else backward_s / bwd) * o["flops"]
        o["tflops"] = o["flops"] / o["seconds"] / 1e12
    flops, seconds = fwd + bwd, forward_s + backward_s
    return {
        "model": model,
        "precision": precision,
        "batch_size": batch,
        "ops": ops,
        "flops": flops,
        "seconds": seconds,
        "achieved_tflops": flops / seconds / 1e12,
        "peak_tflops": None,
        "efficiency": None,
    }


def write_check(path, system: str, model: str, precision: str, entries: list | None, per_node: int = 2) -> str:
    data = {"schema": 2, "system": system, "model": model, "precisions": [precision], "nodes": 2}
    data["step_fits"] = step_fits_of(measurements(per_node, 2))
    if entries is not None:
        data["compute"] = {"device": "cpu", "timer": "time.perf_counter", "error": None, "entries": entries}
    path.write_text(json.dumps(data))
    return str(path)


def run_plan(capsys, argv: list) -> tuple[int, dict | str]:
    code = plan.main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


def rows(out: dict) -> dict:
    return {(r["model"], r["strategy"], r["nodes"]): r["prediction"] for r in out["rows"]}


# ---------------------------------------------------------------- the derivation


def test_the_blocks_gemms_count_the_planners_flops():
    for model in ("vit_micro", "vit_base", "vit_3b"):
        shape = Shape.from_spec(get_spec(model))
        ops = block_gemms(shape, 32)
        block = forward_flops_per_image(shape)["block"]
        assert sum(o["flops"] for o in ops if o["pass"] == "forward") == 32 * block
        assert sum(o["flops"] for o in ops) == 3 * 32 * block  # backward: twice the forward
        assert len(ops) == 18
    ops = {o["op"]: o for o in block_gemms(MICRO, 2)}
    tokens = 2 * MICRO.T
    # a Linear's weight gradient is dY^T X: out x tokens times tokens x in, dY read transposed
    assert (ops["fc1.grad_weight"]["m"], ops["fc1.grad_weight"]["k"], ops["fc1.grad_weight"]["n"]) == (
        MICRO.M,
        tokens,
        MICRO.D,
    )
    assert ops["fc1.grad_weight"]["a_t"] and ops["qkv.forward"]["b_t"]
    assert ops["attn.scores.forward"]["batch"] == 2 * MICRO.H


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_plans_one_node_compute_is_the_checks_gemms_scaled(tmp_path, capsys, checkpointing):
    """On this CPU's profile (no peak: no flat default exists), the check's GEMMs alone give the plan its
    compute: L Blocks of the timed GEMMs, the stem and head at their rate, the recompute under
    checkpointing."""
    fwd, bwd = 1e-3, 2.5e-3
    entry = compute_entry("vit_micro", "fp32", 8, fwd, bwd)
    check = write_check(tmp_path / "check.json", "local", "vit_micro", "fp32", [entry])
    argv = ["--system", "local", "--model", "vit_micro", "--strategy", "DDP", "--nodes", "1,2", "--batch-size", "8"]
    argv += ["--precision", "fp32", "--calibration", check, "--no-figure"]
    code, out = run_plan(capsys, argv + (["--activation-checkpointing"] if checkpointing else []))
    assert code == 0, out
    f = forward_flops_per_image(MICRO)
    rate = 3 * 8 * f["block"] / (fwd + bwd)  # the timed GEMMs' FLOP/s
    rest = 8 * (f["stem"] + f["head"]) / rate
    L = MICRO.L
    recompute = L * fwd if checkpointing else 0.0
    whole = (L * fwd + rest) + (L * bwd + 2 * rest + recompute)
    for nodes in (1, 2):
        p = rows(out)[("vit_micro", "DDP", nodes)]
        # beyond 1 node the emulated nodes' quota gives back what the waits left unspent (docs/plan.md, "The
        # compute on a quota's budget"): the same compute, scaled to max(C - E, C / 4)
        waits = p["step"]["exposed_intra_s"] + p["step"]["exposed_inter_s"]
        share = 1.0 if nodes == 1 else max(whole - waits, whole / 4) / whole
        assert p["step"]["forward_s"] == pytest.approx(share * (L * fwd + rest), rel=1e-6)
        assert p["step"]["backward_s"] == pytest.approx(share * (L * bwd + 2 * rest + recompute), rel=1e-6)
        assert p["compute_from"] == LABEL and p["compute_source"].startswith(LABEL)
    assert out["prediction"]["compute"]["kind"] == "check"
    assert out["prediction"]["compute"]["by_model"] == {"vit_micro": LABEL}
    assert "GEMMs timed by the check" in out["prediction"]["compute"]["text"]


def test_a_check_of_another_model_or_precision_is_not_used(tmp_path, capsys):
    """Frontier's profile has a peak: a model the check did not time takes the flat default, one line
    says why; an --efficiency the user states wins over the check; a check without `compute` (written
    before it) still calibrates."""
    base = [compute_entry("vit_base", "bf16", 32, 5e-3, 1e-2)]
    check = write_check(tmp_path / "check.json", "frontier", "vit_huge", "bf16", base, per_node=8)
    argv = ["--system", "frontier", "--strategy", "FULL_SHARD", "--nodes", "1", "--calibration", check]
    code, out = run_plan(capsys, [*argv, "--model", "vit_base,vit_small", "--no-figure"])
    assert code == 0, out
    got = rows(out)
    assert got[("vit_base", "FULL_SHARD", 1)]["compute_from"] == LABEL
    assert got[("vit_small", "FULL_SHARD", 1)]["compute_from"] == "flat 40% of peak (not derived)"
    compute = out["prediction"]["compute"]
    assert compute["notes"] == [
        "check's GEMMs not used for vit_small bf16 batch 32: measured for vit_base bf16 batch 32 (a check of "
        "another model, precision or batch does not carry over)"
    ]
    assert compute["notes"][0] in compute["text"]
    # the base's forward: 12 Blocks of 5 ms, plus the stem and head at the GEMMs' rate
    assert got[("vit_base", "FULL_SHARD", 1)]["step"]["forward_s"] == pytest.approx(12 * 5e-3, rel=0.01)
    code, out = run_plan(capsys, [*argv, "--model", "vit_base", "--efficiency", "0.3", "--no-figure"])
    assert code == 0 and rows(out)[("vit_base", "FULL_SHARD", 1)]["compute_from"] == "30% of peak (--efficiency)"
    assert out["prediction"]["compute"]["kind"] == "flops"
    # a 1-node rung of the same model wins over the check's GEMMs
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from analysis.synthetic import write_run

    metrics = write_run(str(tmp_path / "runs"), model="vit_base", strategy="DDP", nodes=1, ranks_per_node=8, batch=32)
    code, out = run_plan(capsys, [*argv, "--model", "vit_base", "--compute-from", str(tmp_path / "runs")])
    assert code == 0 and rows(out)[("vit_base", "FULL_SHARD", 1)]["compute_from"] == "1-node rung", (out, metrics)
    assert out["prediction"]["compute"]["kind"] == "measured"
    old = write_check(tmp_path / "old.json", "frontier", "vit_huge", "bf16", None, per_node=8)
    code, out = run_plan(capsys, [*argv[:-1], old, "--model", "vit_base", "--no-figure"])
    assert code == 0 and rows(out)[("vit_base", "FULL_SHARD", 1)]["compute_from"] == "flat 40% of peak (not derived)"


def test_without_a_peak_a_point_the_check_did_not_time_is_one_line(tmp_path, capsys):
    check = write_check(tmp_path / "check.json", "local", "vit_tiny", "bf16", [compute_entry("vit_micro", "bf16", 8)])
    code, err = run_plan(
        capsys,
        ["--system", "local", "--model", "vit_micro", "--strategy", "DDP", "--batch-size", "8", "--precision", "bf16"]
        + ["--calibration", check, "--no-figure", "--nodes", "1"],
    )
    assert code == 0, err
    code, err = run_plan(
        capsys,
        ["--system", "local", "--model", "vit_micro", "--strategy", "DDP", "--batch-size", "4", "--precision", "bf16"]
        + ["--calibration", check, "--no-figure", "--nodes", "1"],
    )
    assert code == 2 and err.count("\n") == 1, err
    assert "check's GEMMs not used for vit_micro bf16 batch 4: measured for vit_micro bf16 batch 8" in err
    assert "gives no peak TFLOP/s" in err


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("seconds", float("nan"), "seconds must be a finite number above 0, got nan"),
        ("seconds", 0.0, "seconds must be a finite number above 0, got 0.0"),
        ("flops", -1, "flops must be a finite number above 0, got -1"),
        ("seconds", float("inf"), "seconds must be a finite number above 0, got inf"),
        ("flops", "many", "flops must be a finite number above 0, got 'many'"),
    ],
)
def test_bad_timings_are_one_line_exit_2(tmp_path, capsys, key, value, words):
    entry = compute_entry("vit_micro", "fp32", 8)
    entry["ops"][3][key] = value
    check = write_check(tmp_path / "check.json", "local", "vit_micro", "fp32", [entry])
    code, err = run_plan(
        capsys,
        ["--system", "local", "--model", "vit_micro", "--strategy", "DDP", "--batch-size", "8", "--precision", "fp32"]
        + ["--calibration", check, "--nodes", "1"],
    )
    assert code == 2 and err.count("\n") == 1, err
    assert f"compute.entries[0] (vit_micro fp32 batch 8): ops[3] (proj.forward): {words}" in err
    assert "Traceback" not in err and not (tmp_path / "weak_scaling_plan.png").exists()


# ---------------------------------------------------------------- the timing (vit_scale.check.gemms)


def test_the_cpu_timing_of_vit_micros_gemms():
    """The real path on this CPU: every GEMM timed, its FLOPs the planner's; without a peak the achieved
    rate is the figure (no efficiency). The rate itself is not asserted: it is this machine's."""
    import torch

    from vit_scale.check.gemms import time_block

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the check's ranks run here (OMP_NUM_THREADS=1): no thread waiting on a busy core
    try:
        entry = time_block("vit_micro", 2, "fp32", "cpu", quick=True, peak=None)
    finally:
        torch.set_num_threads(threads)
    assert [o["op"] for o in entry["ops"]] == [o["op"] for o in block_gemms(MICRO, 2)]
    assert all(o["seconds"] > 0 and o["calls"] >= 1 and o["windows"] == 3 for o in entry["ops"])
    assert entry["flops"] == 3 * 2 * forward_flops_per_image(MICRO)["block"]
    assert entry["seconds"] == pytest.approx(sum(o["seconds"] for o in entry["ops"]))
    assert entry["efficiency"] is None and entry["achieved_tflops"] > 0


def test_the_gpu_path_waits_once_after_the_last_window(monkeypatch):
    """No GPU here: torch.cuda.Event and synchronize replaced by recorders. The windows are bracketed by
    events, the host waits for the device before sizing and once after the last window, never between."""
    import torch

    from vit_scale.check import gemms

    log = []

    class Event:
        count = 0

        def __init__(self, enable_timing=False):
            assert enable_timing
            Event.count += 1
            self.at = None

        def record(self, stream=None):
            self.at = len([x for x in log if x == "call"])
            log.append("record")

        def synchronize(self):
            log.append("wait on event")

        def elapsed_time(self, end):
            return (end.at - self.at) * 2.0  # 2 ms a call

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("synchronize"))
    seconds, calls, windows = gemms.time_calls(lambda: log.append("call"), gpu=True, quick=True)
    assert seconds == pytest.approx(2e-3) and windows == 3 and Event.count == 6
    timed = log[log.index("record") :]
    assert "synchronize" not in timed and timed[-1] == "wait on event" and timed.count("wait on event") == 1
    assert timed.count("record") == 6 and timed.count("call") == 3 * calls
    assert log[: log.index("record")].count("synchronize") == 2  # after the warm-up, around the sizing call
