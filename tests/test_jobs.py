"""jobs/weak_scaling.sh and jobs/submit_sweep.sh without Slurm: bad input refused in one line
before anything starts, the dry runs print what Frontier would run, and the local study (nodes
emulated as groups of processes) runs, records and reports."""

import os
import subprocess

import pytest

from conftest import ROOT
from jobs_support import job_env, python_failing, runs_by_strategy_and_nodes

WEAK_SCALING = os.path.join(ROOT, "jobs", "weak_scaling.sh")
SUBMIT_SWEEP = os.path.join(ROOT, "jobs", "submit_sweep.sh")


def run(script, args, cwd, timeout=60, **env):
    """The script as on a laptop: no Slurm (SLURM_CONF too is dropped), the tests' python."""
    return subprocess.run(
        ["bash", script, *args], cwd=cwd, env=job_env(**env), capture_output=True, text=True, timeout=timeout
    )


BAD_INPUT = [
    (WEAK_SCALING, ["--system", "summit"], "--system: unknown system 'summit'; allowed: cuda, frontier, local"),
    (
        WEAK_SCALING,
        ["--models", "vit_micro,vit_giant"],
        "--models: unknown model 'vit_giant'; allowed: vit_micro, "
        "vit_tiny, vit_small, vit_base, vit_huge, vit_1b, vit_3b, "
        "vit_5b, vit_15b",
    ),
    (WEAK_SCALING, ["--strategies", "DDP,ZERO4"], "--strategies: unknown strategy 'ZERO4'; allowed: DDP, NO_SHARD"),
    (
        WEAK_SCALING,
        ["--ranks-per-node", "4", "--strategies", "HYBRID_8GPU"],
        "--strategies: HYBRID_8GPU shards over groups of 8 ranks within a node, but system local runs 4 ranks per "
        "node; allowed: HYBRID_<g>GPU with g in 1, 2, 4",
    ),
    (WEAK_SCALING, ["--system", "frontier"], "--system: frontier runs inside a Slurm allocation"),
    (
        WEAK_SCALING,
        ["--system", "cuda", "--models", "vit_base"],
        "--system: cuda runs one rank per GPU, but this machine shows none; run it on a machine with NVIDIA",
    ),
    (WEAK_SCALING, ["--nodes", "1,two"], "--nodes: 'two' is not allowed; allowed: node counts"),
    (WEAK_SCALING, ["--steps", "4", "--warmup-steps", "4"], "--warmup-steps: 4 is not allowed; allowed: fewer than"),
    (
        WEAK_SCALING,
        ["--backward-prefetch", "pre,sideways"],
        "--backward-prefetch: 'sideways' is not allowed; allowed: none, pre, post",
    ),
    (WEAK_SCALING, ["--launcher", "ssh"], "--launcher: 'ssh' is not allowed on local; allowed: srun, torchrun, mpi"),
    (WEAK_SCALING, ["--config", "configs/studies/nope.yaml"], "--config: no such file"),
    (WEAK_SCALING, ["--gpus", "4"], "unknown option '--gpus'; allowed: --config"),
    (WEAK_SCALING, ["--models"], "--models: needs a value"),
    (
        SUBMIT_SWEEP,
        ["--system", "frontier", "--nodes", "1,2", "--strategies", "HYBRID_16GPU", "--dry-run"],
        "--strategies: HYBRID_16GPU shards over groups of 16 ranks within a node, but system frontier runs 8",
    ),
    (SUBMIT_SWEEP, ["--system", "cuda", "--nodes", "1,2", "--dry-run"], "--gpus-per-node: cuda runs one rank per GPU"),
    (
        SUBMIT_SWEEP,
        ["--system", "frontier", "--models", "vit_7b", "--nodes", "1", "--dry-run"],
        "--models: unknown model 'vit_7b'",
    ),
    (SUBMIT_SWEEP, ["--system", "frontier", "--dry-run"], "frontier_fsdp.yaml: 'ladder' needs the largest node count"),
    (WEAK_SCALING, ["--models", "--steps", "4"], "--models: needs a value"),
    (SUBMIT_SWEEP, ["--walltime", "1:00:00"], "unknown option '--walltime'"),
    # qgZ under Frontier's --gpus-per-task=1: refused when the study plans, not on the compute node
    (
        WEAK_SCALING,
        ["--system", "frontier", "--nodes", "1,2", "--strategies", "DDP,ZEROPP", "--dry-run"],
        "--strategies: ZEROPP with deepspeed.quantized_gradients=true (qgZ) cannot run on frontier, whose srun_flags "
        "give each rank 1 GPU (--gpus-per-task=1) while 8 ranks share a node, so DeepSpeed would group the wrong "
        "ranks; allowed: --set deepspeed.quantized_gradients=false",
    ),
    (
        SUBMIT_SWEEP,
        ["--system", "frontier", "--nodes", "2", "--strategies", "ZEROPP", "--dry-run"],
        "--strategies: ZEROPP with deepspeed.quantized_gradients=true (qgZ) cannot run on frontier",
    ),
]


@pytest.mark.parametrize("script,args,message", BAD_INPUT, ids=[" ".join(a) for _, a, _ in BAD_INPUT])
def test_bad_input_is_one_line_before_anything_starts(tmp_path, script, args, message):
    proc = run(script, args, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    name = os.path.basename(script)
    assert lines[0].startswith(f"{name}: ") and message in lines[0], lines[0]
    assert proc.stdout == ""
    assert sorted(os.listdir(tmp_path)) == [], "bad input must leave nothing behind"


def test_a_bad_node_local_switch_is_one_line_before_anything_starts(tmp_path):
    proc = run(WEAK_SCALING, ["--strategies", "DDP"], tmp_path, VIT_SCALE_NODE_LOCAL_ENV="yes")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        "weak_scaling.sh: VIT_SCALE_NODE_LOCAL_ENV=yes is not allowed; allowed: 1 (copy the environment to "
        "node-local storage at any node count), 0 (never), or unset (above the profile's node_local_env_above)"
    ]
    assert os.listdir(tmp_path) == []


def test_zeropp_without_qgz_or_one_rank_a_node_is_planned_on_frontier(tmp_path):
    """What the qgZ refusal allows: qgZ switched off, or one rank a node (each rank then sees its node's one GPU)."""
    off = run(
        WEAK_SCALING,
        [
            "--system",
            "frontier",
            "--nodes",
            "1,2",
            "--strategies",
            "ZEROPP",
            "--dry-run",
            "--set",
            "deepspeed.quantized_gradients=false",
        ],
        tmp_path,
    )
    assert off.returncode == 0, off.stderr
    assert "strategy=ZEROPP" in off.stdout and "deepspeed.quantized_gradients=false" in off.stdout
    one = run(
        WEAK_SCALING,
        ["--system", "frontier", "--nodes", "1,2", "--strategies", "ZEROPP", "--dry-run", "--ranks-per-node", "1"],
        tmp_path,
    )
    assert one.returncode == 0, one.stderr


def test_frontier_sweep_dry_run_prints_sbatch_and_srun_lines(tmp_path):
    proc = run(
        SUBMIT_SWEEP,
        [
            "--system",
            "frontier",
            "--nodes",
            "1,2",
            "--models",
            "vit_base,vit_5b",
            "--strategies",
            "DDP,HYBRID_8GPU",
            "--account",
            "PRJ123",
            "--time",
            "02:00:00",
            "--dry-run",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    sbatch = [line for line in out.splitlines() if line.startswith("sbatch ")]
    assert len(sbatch) == 3, out
    logs = tmp_path / "logs"
    for nodes, line in zip((1, 2), sbatch[:2], strict=True):  # the third: the analysis job
        assert line.startswith(
            f"sbatch --parsable --job-name=vit-frontier_fsdp-n{nodes} "
            f"--output={logs}/%x-%j.out --account=PRJ123 --network=disable_rdzv_get "
            f"--nodes={nodes} --time=02:00:00 "
            f"{WEAK_SCALING} --system frontier --study frontier_fsdp --out {tmp_path}/runs "
            f"--nodes {nodes} --models vit_base,vit_5b --no-analysis"
        ), line
    assert sbatch[2].startswith("sbatch --parsable --job-name=vit-frontier_fsdp-analysis ")
    assert (
        "--nodes=1 --time=00:30:00 --dependency=afterany:{vit-frontier_fsdp-n1}:{vit-frontier_fsdp-n2} " in sbatch[2]
        and "--analysis-only" in sbatch[2]
    )

    srun = [line.strip() for line in out.splitlines() if "srun " in line]
    assert len(srun) == 24, out  # 2 node counts x 2 models x 2 strategies x 3 repetitions (the study file's)
    # OLCF's binding; rendezvous gets off for RCCL's alt_read protocol (also on the allocation, above)
    flags = "--ntasks-per-node=8 --gpus-per-task=1 --gpu-bind=closest -c 7 --network=disable_rdzv_get"
    assert all(flags in line for line in srun)
    assert all("python -m vit_scale train system.launcher=srun " in line for line in srun)
    assert sum("srun --nodes=2 --ntasks=16 " in line for line in srun) == 12
    # the paper's settings from configs/studies/frontier_fsdp.yaml, MFU peak from the profile
    for setting in (
        "train.batch_size=32",
        "train.precision=bf16",
        "fsdp.backward_prefetch=pre",
        "fsdp.limit_all_gathers=true",
        "system.peak_tflops=191.5",
        "plan.device_memory_gib=64",
    ):
        assert all(setting in line for line in srun), setting
    assert "[12/12] vit_5b HYBRID_8GPU n2 (16 ranks) repetition 3/3" in out
    assert out.rstrip().endswith("dry run: nothing was submitted")
    assert not logs.exists() and not (tmp_path / "runs").exists()


def test_fsdp_grid_dry_run_is_the_figure_1_grid(tmp_path):
    proc = run(WEAK_SCALING, ["--system", "frontier", "--config", "configs/studies/fsdp_grid.yaml", "--dry-run"], ROOT)
    assert proc.returncode == 0, proc.stderr
    runs = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(runs) == 54 and runs[0].startswith("[1/54] vit_5b HYBRID_2GPU n8 (64 ranks) ")  # 3 repetitions
    for strategy in ("HYBRID_2GPU", "FULL_SHARD", "SHARD_GRAD_OP"):
        for prefetch in ("none", "pre", "post"):
            for limit in ("true", "false"):
                assert (
                    sum(
                        f"{strategy} n8 (64 ranks) backward_prefetch={prefetch} limit_all_gathers={limit}" in r
                        for r in runs
                    )
                    == 3
                )


def test_local_study_without_slurm(tmp_path):
    """The README's first command, shortened: emulated nodes as groups of processes; a run that
    fails (FULL_SHARD on 2 nodes, made to run out of memory) is recorded and the study goes on."""
    python = python_failing(tmp_path, "FULL_SHARD")
    proc = run(
        WEAK_SCALING,
        [
            "--strategies",
            "FULL_SHARD,DDP",
            "--nodes",
            "2",
            "--steps",
            "4",
            "--warmup-steps",
            "1",
            "--batch-size",
            "2",
            "--out",
            "runs",
            "--repeat",
            "1",
            "--set",
            "train.health_probe_s=0.1",  # the node-health probe after each run, shortened (it defaults to 1 s)
        ],
        tmp_path,
        timeout=600,
        VIT_SCALE_PYTHON=python,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr  # one run failed
    assert "2 ranks per node, launcher: processes started here, 2 per emulated node (no Slurm)" in out
    assert "[1/2] vit_micro FULL_SHARD n2 (4 ranks) ... OOM (exit 3" in out
    assert "[2/2] vit_micro DDP n2 (4 ranks) ... ok " in out

    runs = runs_by_strategy_and_nodes(tmp_path / "runs" / "local")
    ((start, end),) = runs[("DDP", 2)]
    assert start["hosts"] == ["local0", "local1"] and start["world"]["world_size"] == 4
    assert start["slurm"] is None and end["status"] == "ok"
    # each emulated node's health, probed after the timed window: every host, its 2 ranks, a compute rate
    health = end["nodes_health"]
    assert set(health["hosts"]) == {"local0", "local1"} and health["error"] is None
    assert all(h["ranks"] == 2 and h["gemm_tflops"] > 0 and h["copy_gbps"] is None for h in health["hosts"].values())
    assert health["median"]["gemm_tflops"] > 0 and health["probe"]["model"] == "vit_micro"
    ((start, end),) = runs[("FULL_SHARD", 2)]
    assert end["status"] == "oom" and end["failed_rank"] == 1

    report = tmp_path / "report" / "local"
    # (one node count has no scaling curve to plot; the Slurm test checks the plots)
    assert (report / "report.md").is_file() and (report / "results.csv").is_file(), out + proc.stderr
    assert f"report:      {report}/report.md" in out


def test_help_names_every_option():
    proc = run(WEAK_SCALING, ["--help"], ROOT)
    assert proc.returncode == 0
    for option in (
        "--models",
        "--strategies",
        "--nodes",
        "--batch-size",
        "--steps",
        "--system",
        "--study",
        "--out",
        "--backward-prefetch",
        "--limit-all-gathers",
        "--launcher",
        "--force",
        "--dry-run",
    ):
        assert option in proc.stdout
