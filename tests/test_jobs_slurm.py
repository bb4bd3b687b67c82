"""jobs/weak_scaling.sh and jobs/submit_sweep.sh on a real Slurm cluster: two emulated nodes
with 2 CPUs each (tests/slurm_fixture.py), the local system profile, vit_micro, a few steps."""

import importlib.util
import os
import subprocess

import pytest

from conftest import IN_CI, ROOT
from jobs_support import python_failing, runs_by_strategy_and_nodes
from slurm_fixture import slurm_cluster  # noqa: F401  (the session fixture)

WEAK_SCALING = os.path.join(ROOT, "jobs", "weak_scaling.sh")
SUBMIT_SWEEP = os.path.join(ROOT, "jobs", "submit_sweep.sh")
FEW_STEPS = ["--steps", "4", "--warmup-steps", "1", "--batch-size", "2", "--repeat", "1"]
STUDY = [
    "--system",
    "local",
    "--models",
    "vit_micro",
    "--strategies",
    "DDP,FULL_SHARD,HYBRID_2GPU",
    "--study",
    "slurm",
    "--out",
    "runs",
    *FEW_STEPS,
]


@pytest.fixture(scope="module")
def ladder_job(slurm_cluster, tmp_path_factory):  # noqa: F811
    """One 2-node job over the ladder 1, 2 with three strategies; FULL_SHARD on 2 nodes is made
    to run out of memory on rank 1."""
    work = tmp_path_factory.mktemp("ladder")
    python = python_failing(work, "FULL_SHARD")
    job = slurm_cluster.sbatch(["-N", "2", WEAK_SCALING, *STUDY], cwd=work, VIT_SCALE_PYTHON=python)
    slurm_cluster.wait([job])
    output = (work / f"vit-weak-scaling-{job}.out").read_text()
    return work, job, output


def test_ladder_records_every_run_and_goes_on_after_a_failure(slurm_cluster, ladder_job):  # noqa: F811
    work, job, output = ladder_job
    runs = runs_by_strategy_and_nodes(work / "runs" / "slurm")
    assert sorted(runs) == [(s, n) for s in ("DDP", "FULL_SHARD", "HYBRID_2GPU") for n in (1, 2)], output
    for (strategy, nodes), found in runs.items():
        assert len(found) == 1, (strategy, nodes)
        start, end = found[0]
        assert start["world"]["world_size"] == 2 * nodes
        assert start["world"]["ranks_per_node"] == 2
        assert start["hosts"] == ["n1", "n2"][:nodes]
        assert start["launcher"] == "srun"
        assert start["slurm"]["job_id"] == job
        assert start["batch"]["per_device"] == 2  # weak scaling: fixed per rank
        if (strategy, nodes) == ("FULL_SHARD", 2):
            assert end["status"] == "oom" and end["failed_rank"] == 1, end
        else:
            assert end["status"] == "ok", (strategy, nodes, end)
    # every run a step of its own, one after the other
    assert sorted(int(found[0][0]["slurm"]["step_id"]) for found in runs.values()) == list(range(6))

    # what the user sees: one line a run, the failure named, the runs after it done anyway
    assert "[1/6] vit_micro DDP n1 (2 ranks) ... ok " in output
    assert "[4/6] vit_micro FULL_SHARD n2 (4 ranks) ... OOM (exit 3" in output
    assert "rank 1: MemoryError: injected by the test" in output
    assert "[6/6] vit_micro HYBRID_2GPU n2 (4 ranks) ... ok " in output
    assert "6 runs in" in output and "1 failed" in output
    table = output[output.index("n1 img/s") :]
    assert "FULL_SHARD" in table.split("\n")[2] and "oom" in table.split("\n")[2]
    # one failed run: the study completes and says so with exit code 1
    info = slurm_cluster.job(job)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", info

    report = work / "report" / "slurm"
    assert (report / "report.md").is_file() and (report / "results.csv").is_file(), output
    assert list(report.glob("*.png")), output
    assert f"report:      {report}/report.md" in output


def test_sweep_resumes_the_study_and_analysis_runs_after_the_jobs(slurm_cluster, ladder_job):  # noqa: F811
    """One job per node count on the same study: what is recorded ok is skipped, the failed run
    is run again; the chained analysis job starts once both jobs have ended."""
    work, _, _ = ladder_job
    report_md = work / "report" / "slurm" / "report.md"
    before = report_md.stat().st_mtime
    proc = subprocess.run(
        [SUBMIT_SWEEP, *STUDY, "--nodes", "1,2", "--logs", "logs"],
        cwd=work,
        env=slurm_cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    n1, n2, analysis = proc.stdout.split()
    waiting = slurm_cluster.job(analysis)
    slurm_cluster.wait([n1, n2, analysis])

    # queued behind the study jobs (the n2 job runs a training run, so it is still there)
    assert waiting["JobState"] == "PENDING" and waiting["Reason"] == "Dependency", waiting
    assert f"afterany:{n2}(unfulfilled)" in waiting["Dependency"], waiting
    jobs = {name: slurm_cluster.job(i) for name, i in (("n1", n1), ("n2", n2), ("analysis", analysis))}
    assert jobs["n1"]["NumNodes"] == "1" and jobs["n2"]["NumNodes"] == "2"
    assert jobs["analysis"]["StartTime"] >= max(jobs["n1"]["EndTime"], jobs["n2"]["EndTime"]), jobs
    assert all(j["JobState"] == "COMPLETED" for j in jobs.values()), jobs

    logs = {name: (work / "logs" / f"{j['JobName']}-{j['JobId']}.out").read_text() for name, j in jobs.items()}
    assert logs["n1"].count("ok earlier, skipped") == 3, logs["n1"]
    assert logs["n2"].count("ok earlier, skipped") == 2, logs["n2"]
    assert "[2/3] vit_micro FULL_SHARD n2 (4 ranks) ... ok " in logs["n2"]
    # the analysis job: the whole study's table, now without a failure, and a new report
    assert "6 ok" in logs["analysis"] and "oom" not in logs["analysis"], logs["analysis"]
    assert report_md.stat().st_mtime > before
    runs = runs_by_strategy_and_nodes(work / "runs" / "slurm")
    assert [end["status"] for _, end in runs[("FULL_SHARD", 2)]].count("ok") == 1


def test_mpi_launcher_through_srun_pmix(slurm_cluster, tmp_path):  # noqa: F811
    """--launcher mpi: ranks from srun --mpi=pmix, rendezvous through mpi4py."""
    if importlib.util.find_spec("mpi4py") is None:
        message = "mpi4py is not installed (pip install 'vit-scale[mpi]')"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    job = slurm_cluster.sbatch(
        [
            "-N",
            "2",
            WEAK_SCALING,
            "--system",
            "local",
            "--launcher",
            "mpi",
            "--strategies",
            "DDP",
            "--nodes",
            "2",
            "--study",
            "mpi",
            "--out",
            "runs",
            "--no-analysis",
            *FEW_STEPS,
        ],
        cwd=tmp_path,
    )
    slurm_cluster.wait([job])
    output = (tmp_path / f"vit-weak-scaling-{job}.out").read_text()
    assert "[1/1] vit_micro DDP n2 (4 ranks) ... ok " in output, output
    ((start, end),) = runs_by_strategy_and_nodes(tmp_path / "runs" / "mpi")[("DDP", 2)]
    assert start["launcher"] == "mpi" and start["hosts"] == ["n1", "n2"] and end["status"] == "ok"


def test_node_list_larger_than_the_allocation_is_refused(slurm_cluster, tmp_path):  # noqa: F811
    proc = subprocess.run(
        ["srun", "-N", "1", "bash", WEAK_SCALING, "--system", "local", "--nodes", "1,2", "--out", "runs"],
        cwd=tmp_path,
        env=slurm_cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    ours = [line for line in proc.stderr.splitlines() if not line.startswith("srun:")]
    assert proc.returncode == 2
    assert ours == [
        "weak_scaling.sh: --nodes: 2 nodes is more than this allocation's 1; allowed: 1 to 1 "
        "(or submit with sbatch -N 2)"
    ], proc.stderr
    assert not (tmp_path / "runs").exists()
