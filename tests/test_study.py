"""vit-scale study beyond what the Slurm tests show: a run past --run-time-limit is stopped with its
whole process tree and recorded as timeout while the study goes on; a GPU machine without Slurm
runs a ladder over its GPUs with torchrun; the plugin comparison is a study with batch size as its
axis, its kernels built by `vit-scale prepare` before the first run; prepare clears a stale lock."""

import os
import subprocess
import sys
import time

from conftest import ROOT
from jobs_support import job_env, python_hanging, runs_by_strategy_and_nodes

WEAK_SCALING = os.path.join(ROOT, "jobs", "weak_scaling.sh")
PLUGIN_COMPARISON = os.path.join(ROOT, "jobs", "plugin_comparison.sh")
FEW_STEPS = ["--models", "vit_micro", "--steps", "4", "--warmup-steps", "1", "--batch-size", "2", "--repeat", "1"]
FEW_STEPS += ["--set", "train.health_probe_s=0.1"]  # the node-health probe after each run shortened (1 s)
MARKER = "98765"  # a child the hanging run leaves: `sleep 98765`


def run(script, args, cwd, timeout=600, **env):
    return subprocess.run(
        ["bash", script, *args], cwd=cwd, env=job_env(**env), capture_output=True, text=True, timeout=timeout
    )


def left_behind(marker: str) -> list:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_run_past_the_time_limit_is_stopped_whole_and_the_study_goes_on(tmp_path):
    wrapper = python_hanging(tmp_path, MARKER)
    started = time.monotonic()
    proc = run(
        WEAK_SCALING,
        [
            *FEW_STEPS,
            "--strategies",
            "DDP,FULL_SHARD",
            "--nodes",
            "1",
            "--ranks-per-node",
            "1",
            "--study",
            "limit",
            "--out",
            "runs",
            "--run-time-limit",
            # 9 s: DDP's first step was recorded 3 s after its launch in a suite run (2026-11-28 01:10)
            "0.15",
            "--no-analysis",
        ],
        tmp_path,
        VIT_SCALE_PYTHON=wrapper,
        VIT_SCALE_STOP_GRACE_S="1",  # the run ignores SIGTERM: any grace ends in the kill
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "[1/2] vit_micro DDP n1 (1 rank) ... TIMEOUT (exit " in out, out
    assert "stopped after --run-time-limit 0.15 min; its processes did not end on SIGTERM and were killed" in out
    assert "[2/2] vit_micro FULL_SHARD n1 (1 rank) ... ok " in out, out
    assert time.monotonic() - started < 120
    # nothing of the stopped run is left: not the trainer, not the child it started
    assert left_behind(f"sleep\0{MARKER}") == [] and left_behind(str(tmp_path / "inject_hanging.py")) == []
    runs = runs_by_strategy_and_nodes(tmp_path / "runs" / "limit")
    ((start, end),) = runs[("DDP", 1)]
    assert end["status"] == "timeout" and end["steps_done"] == 1, end
    assert "--run-time-limit" in end["error"]
    assert runs[("FULL_SHARD", 1)][0][1]["status"] == "ok"
    ledger = (tmp_path / "runs" / "limit" / "study_runs.tsv").read_text().splitlines()
    assert [line.split("\t")[9] for line in ledger[1:]] == ["timeout", "ok"], ledger


def test_gpu_machine_without_slurm_runs_the_ladder_over_its_gpus(tmp_path):
    """A stand-in for what cannot exist here: CUDA_VISIBLE_DEVICES names two GPUs, which is what
    the study counts; the ranks themselves then run on this CPU (torch sees no GPU), through the
    same torchrun --standalone launch a workstation gets."""
    gpus = dict(CUDA_VISIBLE_DEVICES="0,1", VIT_SCALE_MODULES="")
    dry = run(WEAK_SCALING, ["--system", "cuda", *FEW_STEPS, "--strategies", "DDP", "--dry-run"], tmp_path, **gpus)
    assert dry.returncode == 0, dry.stderr
    assert "up to 2 GPUs on this machine, launcher: torchrun --standalone" in dry.stdout
    assert (
        "-m torch.distributed.run --standalone --nnodes=1 --nproc_per_node=2 -m vit_scale train "
        "system.launcher=torchrun model=vit_micro strategy=DDP" in dry.stdout
    ), dry.stdout
    assert not (tmp_path / "runs").exists()

    # one strategy: the ladder over GPUs and its launches are the same for every one (a second cost 2 runs)
    proc = run(
        WEAK_SCALING,
        ["--system", "cuda", *FEW_STEPS, "--strategies", "DDP", "--study", "ws", "--out", "runs"],
        tmp_path,
        **gpus,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "2 runs (1 model(s) x 1 strategy x GPUs 1,2)" in out
    for i, line in enumerate(["DDP 1 GPU ...", "DDP 2 GPUs ..."]):
        assert f"[{i + 1}/2] vit_micro {line} ok " in out, out
    assert "g1 img/s  g2 img/s" in out
    runs = runs_by_strategy_and_nodes(tmp_path / "runs" / "ws")
    starts = sorted(
        (s["strategy"]["label"], s["world"]["world_size"], s["versions"]["launched_by"])
        for found in runs.values()
        for s, _ in found
    )
    assert starts == [("DDP", 1, "single"), ("DDP", 2, "torchrun")], starts
    assert all(s["world"]["nodes"] == 1 for found in runs.values() for s, _ in found)
    report = tmp_path / "report" / "ws"
    assert (report / "weak_scaling_ips.png").is_file(), out + proc.stderr
    header = (report / "report.md").read_text()
    assert "ranks" in header


def test_plugin_comparison_is_a_study_over_batch_sizes_with_kernels_built_first(tmp_path, deepspeed_cpu_adam):
    proc = run(
        PLUGIN_COMPARISON,
        [
            "--system",
            "local",
            "--model",
            "vit_micro",
            "--batch-sizes",
            "2,4",
            "--strategies",
            "DDP,ZERO1",
            "--steps",
            "4",
            "--repeat",
            "1",
            "--out",
            "runs",
            "--set",
            "train.health_probe_s=0.1",  # the node-health probe after each run, shortened (it defaults to 1 s)
        ],
        tmp_path,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "kernels: building what the strategies need before the first run" in out
    assert "deepspeed.cpu_adam: loaded, built before in " in out, out
    assert out.index("deepspeed.cpu_adam") < out.index("[1/4]")
    for i, line in enumerate(
        [
            "DDP n1 (1 rank) batch_size=2",
            "DDP n1 (1 rank) batch_size=4",
            "ZERO1 n1 (1 rank) batch_size=2",
            "ZERO1 n1 (1 rank) batch_size=4",
        ]
    ):
        assert f"[{i + 1}/4] vit_micro {line} ... ok " in out, out
    runs = runs_by_strategy_and_nodes(tmp_path / "runs" / "plugin_comparison")
    assert sorted(s["batch"]["per_device"] for s, _ in runs[("ZERO1", 1)]) == [2, 4]
    assert all(s["kernels_prebuilt"] == {"deepspeed.cpu_adam": True} for s, _ in runs[("ZERO1", 1)])
    assert all(s["kernels_prebuilt"] == {} and s["world"]["world_size"] == 1 for s, _ in runs[("DDP", 1)])
    assert (tmp_path / "report" / "plugin_comparison" / "plugin_comparison.png").is_file(), out + proc.stderr


def test_prepare_clears_a_lock_nobody_builds_under(tmp_path, deepspeed_cpu_adam):
    code = (
        "import os, sys, time\n"
        "from vit_scale.distributed.kernels import KERNELS\n"
        "k = KERNELS['deepspeed.cpu_adam']\n"
        "lock = os.path.join(k.build_dir(), 'lock')\n"
        "open(lock, 'w').close()\n"
        "print('fresh', k.stale_lock())\n"  # a build is writing beside it: not stale
        "os.utime(lock, (time.time() - 3600,) * 2)\n"
        "import vit_scale.distributed.kernels as m; m.STALE_LOCK_S = -1e9\n"  # every file counts as old
        "print('old', k.stale_lock() == lock)\n"
        "from vit_scale.study.prepare import main\n"
        "sys.exit(main(['--strategies', 'ZERO3,DDP']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "fresh None" and lines[1] == "old True", proc.stdout
    assert "vit-scale prepare: 1 kernel(s) for cpu: deepspeed.cpu_adam" in proc.stdout
    assert "deepspeed.cpu_adam: removed a build lock nobody was working under" in proc.stdout
    assert "deepspeed.cpu_adam: loaded, built before in " in proc.stdout


def test_prepare_bad_strategy_is_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "vit_scale", "prepare", "--strategies", "ZERO4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("vit-scale prepare: --strategies: unknown strategy 'ZERO4'; allowed: DDP")
    assert len(proc.stderr.splitlines()) == 1
    # a job script names itself with --prog, as for study and check
    proc = subprocess.run(
        [sys.executable, "-m", "vit_scale", "prepare", "--prog", "weak_scaling.sh", "--strategies", "ZERO4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("weak_scaling.sh: --strategies: unknown strategy"), (
        proc.stderr
    )
