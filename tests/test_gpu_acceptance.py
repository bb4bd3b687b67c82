"""benchmarks/gpu_acceptance.py, the GPU acceptance script (issue 39), without a GPU: its dry run
(every command a user would run, each under `timeout -s KILL`, within the 8-minute budget), its
argument checks, acceptance_figures.py's reading of records into figures beside their bars (on made
records), and its running of commands (timeouts, the budget running out, processes a timed-out
command left behind) with plain shell commands. What it measures needs a GPU and is not run here."""

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest

from conftest import PYTHON, ROOT
from vit_scale.distributed import all_labels

SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_acceptance.py")


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


fig = load("acceptance_figures")
ga = load("gpu_acceptance")


# ---------------------------------------------------------------- the dry run


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dry")
    out, work = tmp / "figures" / "gpu_acceptance.json", tmp / "work"
    code = (
        "import runpy, sys; sys.argv = sys.argv[1:]; "
        "rc = 0\ntry:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as e:\n    rc = e.code\n"
        "print('TORCH IMPORTED' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)"
    )
    started = time.monotonic()
    proc = subprocess.run(
        [PYTHON, "-c", code, SCRIPT, "--dry-run", "--out", str(out), "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    return proc, out, work, time.monotonic() - started


def commands_of(stdout: str) -> list[str]:
    return [line.strip() for line in stdout.splitlines() if line.strip().startswith("timeout ")]


def test_dry_run_prints_every_measurement_bounded_and_runs_nothing(dry_run):
    proc, out, work, seconds = dry_run
    assert proc.returncode == 0, proc.stderr
    commands = commands_of(proc.stdout)
    # every command is killed at its budget, and the budgets together fit 8 minutes
    assert commands and all(re.match(r"timeout -s KILL \d+ ", c) for c in commands), proc.stdout
    total = sum(int(c.split()[3]) for c in commands)
    assert total < 480, proc.stdout
    header = re.search(r"budgets (\d+) s in all", proc.stdout)
    assert header and int(header.group(1)) == total
    # the trainer against the bare loop, for every strategy of item 2, on the GPU, vit_base bf16 batch 32
    (overhead,) = [c for c in commands if "benchmarks/trainer_overhead.py" in c]
    assert "--pairs DDP,NO_SHARD,FULL_SHARD,SHARD_GRAD_OP,FSDP2" in overhead
    assert all(x in overhead for x in ("--device cuda", "--model vit_base", "--batch-size 32", "--precision bf16"))
    # the planner for DDP, each FSDP1 mode and FSDP2; compile on vit_huge both ways; the check; the trace
    plans = [c for c in commands if " -m vit_scale plan " in c]
    assert len(plans) == 2 and all("--json" in c for c in plans)
    assert any("--fsdp-version 2" in c for c in plans)
    trains = [c for c in commands if " -m vit_scale train " in c]
    compiled = [c for c in trains if "model=vit_huge" in c]
    assert len(compiled) == 2 and sum("train.compile=true" in c for c in compiled) == 1
    assert any("profile.enabled=true" in c for c in trains)
    (check,) = [c for c in commands if " -m vit_scale check " in c]
    assert "--precision bf16,fp32,fp16" in check and "--strategies DDP,NO_SHARD,FULL_SHARD,SHARD_GRAD_OP" in check
    assert any("benchmarks/trace_vs_hta.py" in c for c in commands)
    # a dry run writes nothing and needs no torch
    assert not out.exists() and not work.exists()
    assert proc.stdout.strip().endswith("no torch")
    print(f"dry run: {len(commands)} commands, {total} s of budgets, {seconds:.2f} s")


def test_the_commands_are_ones_the_tools_accept(tmp_path):
    """What would only fail on the GPU machine, caught here: each trainer command's overrides load as a
    config, the check takes its options (--which-env checks them all and runs nothing), and the planner's
    commands give a row with a peak for every strategy the memory step compares."""
    from vit_scale.config import load_config

    ctx = ga.Context(PYTHON, str(tmp_path), {"deepspeed": True, "colossalai": True})
    commands = [c for step in ga.STEPS for c in step.commands(ctx)]
    trains = [c.argv[4:] for c in commands if c.argv[1:4] == ["-m", "vit_scale", "train"]]
    assert len(trains) == 3
    for overrides in trains:
        load_config(None, overrides)
    (check,) = [c.argv for c in commands if c.argv[1:4] == ["-m", "vit_scale", "check"]]
    proc = subprocess.run([*check, "--which-env"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "env/cuda.sh", proc.stderr
    planned = {}
    for argv in (c.argv for c in commands if c.argv[1:4] == ["-m", "vit_scale", "plan"]):
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        for r in json.loads(proc.stdout)["rows"]:
            planned["FSDP2" if r["implementation"] == "fsdp2" else r["strategy"]] = r["peak_allocated_gib"]
    assert set(planned) == set(fig.PAIRS) and all(gib > 0 for gib in planned.values()), planned


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--steps", "overhead,warp"], "--steps: unknown step 'warp'"),
        (["--steps", "memory"], "--steps: memory reads the overhead step's records"),
        (["--budget", "0"], "--budget: '0' is not a positive number"),
        (["--budget", "soon"], "--budget: 'soon' is not a positive number"),
        (["--budget", "-60"], "--budget: '-60' is not a positive number"),
        (["--budget", "inf"], "--budget: 'inf' is not a positive number"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, names, capsys, tmp_path):
    code = ga.main([*argv, "--dry-run", "--out", str(tmp_path / "x.json")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"gpu_acceptance.py: {names}"), err


def test_an_output_that_cannot_be_written_is_refused(capsys, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for out in (a_file / "x.json", tmp_path):  # below a file; a directory
        assert ga.main(["--dry-run", "--out", str(out)]) == 2
        _, err = capsys.readouterr()
        assert err.count("\n") == 1 and err.startswith("gpu_acceptance.py: --out: "), err


def test_out_defaults_to_the_device_machines_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert ga.parse(["--dry-run"]).out == str(tmp_path / "gpu_acceptance.json")


# ---------------------------------------------------------------- figures beside their bars (made records)


def record(ips=None, allocated=None, active=None, planned=None) -> dict:
    memory = {k: {"max": v} for k, v in (("peak_allocated_gib", allocated), ("peak_active_gib", active)) if v}
    return {
        "start": {"plan": {"peak_allocated_gib": planned}},
        "steps": [],
        "end": {"status": "ok", "images_per_s": {"mean": ips} if ips else None, "memory": memory},
    }


def test_ratio_row_is_the_median_of_each_rounds_ratio_against_the_bar():
    r = fig.ratio_row("FULL_SHARD", [100.0, 110.0, 105.0], [record(98.0), record(99.0), record(104.0)])
    assert r["name"] == "trainer/bare FULL_SHARD" and r["bar"] == ">= 0.97"
    assert r["value"] == pytest.approx(0.98, abs=1e-4) and r["pass"] is True
    assert r["rounds"] == [0.98, 0.9, 0.9905]
    slow = fig.ratio_row("DDP", [100.0], [record(96.0)])
    assert slow["value"] == pytest.approx(0.96) and slow["pass"] is False
    # a round whose trainer run left no figure is not counted; none at all is not measured, not a pass
    partial = fig.ratio_row("DDP", [100.0, 100.0], [None, record(99.0)])
    assert partial["rounds"] == [0.99] and partial["pass"] is True
    missing = fig.ratio_row("FSDP2", [100.0], [None])
    assert missing["value"] is None and missing["pass"] is None and missing["note"]


def test_memory_rows_compare_the_plan_with_the_measured_peak():
    rows = fig.memory_rows("DDP", {"peak_allocated_gib": 3.0}, [record(allocated=3.1, planned=3.0)])
    allocated, active = rows
    assert allocated["name"] == "peak allocated DDP" and allocated["pass"] is True
    assert allocated["value"] == pytest.approx(3.0 / 3.1 - 1, abs=1e-4)
    assert allocated["predicted_gib"] == 3.0 and allocated["measured_gib"] == 3.1
    # peak active: compared only where both sides have it, and the row says which side lacks it
    assert active["pass"] is None and "vit-scale plan --json has no peak_active_gib" in active["note"]
    off, both = fig.memory_rows(
        "NO_SHARD", {"peak_allocated_gib": 3.0, "peak_active_gib": 3.3}, [record(allocated=3.4, active=3.4)]
    )
    assert off["pass"] is False and both["pass"] is True
    planned_only = fig.memory_rows("NO_SHARD", {"peak_active_gib": 3.3}, [record(allocated=3.4)])[1]
    assert "the trainer's end record has no peak_active_gib" in planned_only["note"]


def test_compile_rows_report_compiled_against_eager():
    eager = record(100.0)
    eager["steps"] = [{"step": 1, "step_time_s": 2.5}]
    eager["end"]["mfu"] = 0.40
    compiled = record(120.0)
    compiled["end"].update(mfu=0.48, compile={"first_step_s": 41.0, "graphs": 2, "graphs_in_window": 0})
    rows = {r["name"]: r for r in fig.compile_rows(eager, compiled)}
    assert rows["first step"]["value"] == 41.0 and rows["first step"]["eager_first_step_s"] == 2.5
    assert rows["images/s compiled/eager"]["value"] == pytest.approx(1.2)
    assert rows["MFU"]["value"] == 0.48 and rows["MFU"]["eager_mfu"] == 0.40
    assert rows["graphs in the timed window"]["pass"] is True
    compiled["end"]["compile"]["graphs_in_window"] = 1
    assert {r["name"]: r for r in fig.compile_rows(eager, compiled)}["graphs in the timed window"]["pass"] is False
    assert all(r["pass"] is None and "compiled" in r["note"] for r in fig.compile_rows(eager, None))


def made_check() -> dict:
    strategies = [
        {"label": "DDP", "precision": p, "status": "ok", "error": None, "replicas_agree": True} for p in fig.PRECISIONS
    ]
    strategies += [
        {"label": "NO_SHARD", "precision": "bf16", "status": "diverged", "error": "replicas differ"},
        {"label": "NO_SHARD", "precision": "fp16", "status": "refused", "error": "train.precision: no"},
        {"label": "ZERO1", "precision": "bf16", "status": "refused", "error": "a\ntraceback"},
    ]
    meter = {
        "ratio": 0.95,
        "bare_images_per_s": 1000.0,
        "trainer_images_per_s": 950.0,
        "timing_difference": -0.08,
        "event_step_s": 0.030,
        "host_step_s": 0.0326,
        "memory_error": 0.02,
        "predicted_peak_gib": 3.06,
        "measured_peak_gib": 3.0,
    }
    compute = {
        "entries": [
            {"precision": "bf16", "achieved_tflops": 600.0, "efficiency": 0.61, "peak_tflops": 989.0, "seconds": 0.01},
            {"precision": "fp32", "achieved_tflops": 1e9, "efficiency": 2e6, "peak_tflops": 67.0, "seconds": 1e-9},
        ]
    }
    return {"compute": compute, "facts": {"meter": meter, "strategies": strategies}}


def test_check_rows_judge_compute_meter_and_every_label():
    rows = {r["name"]: r for r in fig.check_rows(made_check(), {"deepspeed": True, "colossalai": False})}
    # a GEMM timed faster than the device's peak is a broken timing (the event order), not a figure
    assert rows["compute bf16"]["pass"] is True and rows["compute fp32"]["pass"] is False
    assert rows["meter overhead"]["pass"] is True and rows["meter timing"]["pass"] is False
    assert rows["meter memory"]["pass"] is True
    assert all(rows[f"DDP {p}"]["pass"] is True for p in fig.PRECISIONS)
    assert rows["NO_SHARD bf16"]["pass"] is False  # ran, but its replicas differ
    assert rows["NO_SHARD fp16"]["pass"] is True  # refused in one line
    assert rows["ZERO1 bf16"]["pass"] is False  # refused, but not in one line
    assert rows["NO_SHARD fp32"]["pass"] is None and "not run" in rows["NO_SHARD fp32"]["note"]
    assert rows["CAI_GEMINI bf16"]["pass"] is None and rows["CAI_GEMINI bf16"]["note"] == "colossalai not installed"
    labels = [name for name in rows if name.split()[-1] in fig.PRECISIONS and not name.startswith("compute")]
    # every label of the capability table in every precision, HYBRID_<g>GPU as one GPU's HYBRID_1GPU
    table = {label.replace("<g>", "1") for label in all_labels()}
    assert {name.split()[0] for name in labels} == table and len(labels) == len(table) * len(fig.PRECISIONS)
    assert fig.check_rows(None, {})[0]["pass"] is None


def test_the_json_holds_device_versions_and_every_figure_with_its_bar(tmp_path):
    facts = {
        "device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"},
        "versions": {"torch": "2.11.0", "cuda": "13.0"},
    }
    steps = [
        {
            "name": "facts",
            "status": "ok",
            "budget_s": 20,
            "commands": [],
            "rows": [fig.row("facts", "device", "H100", "", "a GPU", True, **facts)],
        },
        {
            "name": "overhead",
            "status": "timeout",
            "budget_s": 110,
            "commands": [],
            "rows": [fig.ratio_row("DDP", [100.0], [record(99.0)]), fig.ratio_row("NO_SHARD", [100.0], [None])],
        },
    ]
    args = ga.parse(["--out", str(tmp_path / "g.json")])
    doc = ga.document(args, ga.Context(PYTHON, str(tmp_path)), steps, time.monotonic())
    assert doc["device"]["name"] == "NVIDIA H100 80GB HBM3" and doc["versions"]["cuda"] == "13.0"
    assert [s["name"] for s in doc["steps"]] == ["facts", "overhead"] and "rows" not in doc["steps"][0]
    assert (doc["passed"], doc["failed"], doc["not_judged"]) == (2, 0, 1)
    assert all({"step", "name", "value", "unit", "bar", "pass"} <= set(m) for m in doc["measurements"])
    ga.write_atomically(args.out, doc)
    assert json.loads((tmp_path / "g.json").read_text())["measurements"][1]["name"] == "trainer/bare DDP"


# ---------------------------------------------------------------- running commands


def shell_step(name: str, *commands) -> "ga.Step":
    return ga.Step(name, name, "", lambda ctx: list(commands), lambda ctx, results: [])


def test_a_command_is_killed_at_its_timeout_with_what_it_left_behind(tmp_path, capsys):
    # a grandchild in a session of its own (as torchrun's workers are) is out of reach of timeout's kill
    pid_file = tmp_path / "orphan.pid"
    script = f"setsid sleep 60 & echo $! > {pid_file}; echo started; sleep 30"
    step = shell_step("slow", ga.Command("sleeps past its budget", ["bash", "-c", script], 2))
    result = ga.run_step(step, ga.Context(PYTHON, str(tmp_path)), time.monotonic() + 60, str(tmp_path))
    assert result["status"] == "timeout"
    (command,) = result["commands"]
    assert command["timed_out"] and command["seconds"] < 10 and command["leftover_processes_ended"] >= 1
    orphan = int(pid_file.read_text())
    for _ in range(50):  # SIGKILLed: gone once its parent (init) has reaped it
        if not os.path.exists(f"/proc/{orphan}") or "Z" in open(f"/proc/{orphan}/stat").read().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {orphan}, left by the timed-out command, is still running")
    assert "    | started" in capsys.readouterr().out  # its output printed as it came
    assert "started" in open(command["log"]).read()


def test_steps_the_budget_cannot_cover_are_skipped_with_a_line(tmp_path, capsys):
    step = shell_step("late", ga.Command("the long one", ["true"], 100))
    result = ga.run_step(step, ga.Context(PYTHON, str(tmp_path)), time.monotonic() + 30, str(tmp_path))
    assert result["status"] == "skipped" and result["commands"] == []
    assert result["rows"][0]["pass"] is None and "budget ran out" in result["rows"][0]["note"]
    assert re.search(r"skipped late: the long one needs up to 100 s, (29|30) s left", capsys.readouterr().out)


# ---------------------------------------------------------------- the trace against HTA


def test_trace_comparison_agrees_with_hta_on_a_made_gpu_trace(tmp_path):
    """trace_vs_hta.report on test_traces_hta's made CUDA trace (no GPU here), its steps marked as the
    trainer marks them (vit_scale.step#, no torch ProfilerStep#): every bar holds."""
    pytest.importorskip("hta")
    from test_traces_hta import RankTrace

    made = RankTrace(0).write(tmp_path)
    with gzip.open(made, "rt") as f:
        trace = json.load(f)
    for event in trace["traceEvents"]:
        event["name"] = str(event.get("name", "")).replace("ProfilerStep#", "vit_scale.step#")
    with gzip.open(tmp_path / "trace_rank0.json.gz", "wt") as f:
        json.dump(trace, f)
    os.remove(made)
    found = load("trace_vs_hta").report(str(tmp_path))
    assert set(found["comparison"]) == {"compute", "idle", "overlap"}
    assert all(c["pass"] for c in found["comparison"].values()), found["comparison"]
    rows = fig.profile_rows(found)
    assert rows[0]["name"] == "breakdown: step" and rows[0]["value"] == found["breakdown"]["step_ms"] > 0
    assert [r["pass"] for r in rows[1:]] == [True, True, True]
