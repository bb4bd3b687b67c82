"""jobs/weak_scaling.sh and jobs/submit_sweep.sh on a real Slurm cluster: two emulated nodes
with 2 CPUs each (tests/slurm_fixture.py), the local system profile, vit_micro, a few steps."""

import importlib.util
import os
import re
import subprocess

import pytest

from conftest import IN_CI, ROOT
from jobs_support import python_failing, runs_by_strategy_and_nodes, small_venv
from slurm_fixture import slurm_cluster  # noqa: F401  (the session fixture)

WEAK_SCALING = os.path.join(ROOT, "jobs", "weak_scaling.sh")
SUBMIT_SWEEP = os.path.join(ROOT, "jobs", "submit_sweep.sh")
# the node-health probe after each run shortened (it defaults to 1 s)
FEW_STEPS = ["--steps", "4", "--warmup-steps", "1", "--batch-size", "2", "--repeat", "1"]
FEW_STEPS += ["--set", "train.health_probe_s=0.1"]
STUDY = [
    "--system",
    "local",
    "--models",
    "vit_micro",
    # FULL_SHARD first: its failure on 2 nodes then has runs after it. Two strategies: a third (HYBRID_2GPU,
    # which the full check of tests/test_check_allocations.py runs across two Slurm nodes) cost 2 runs
    "--strategies",
    "FULL_SHARD,DDP",
    "--study",
    "slurm",
    "--out",
    "runs",
    *FEW_STEPS,
]


@pytest.fixture(scope="module")
def ladder_job(slurm_cluster, tmp_path_factory):  # noqa: F811
    """One 2-node job over the ladder 1, 2 with two strategies; FULL_SHARD on 2 nodes is made
    to run out of memory on rank 1. Its environment (a small venv) is copied to node-local storage
    (forced: the local profile never does it by default), and every run runs the `python` first on
    the PATH the job sets up."""
    work = tmp_path_factory.mktemp("ladder")
    python = python_failing(work, "FULL_SHARD", python="python")
    job = slurm_cluster.sbatch(
        ["-N", "2", WEAK_SCALING, *STUDY],
        cwd=work,
        VIT_SCALE_PYTHON=python,
        VIT_SCALE_VENV=small_venv(work),
        VIT_SCALE_NODE_LOCAL_ENV="1",
        VIT_SCALE_NODE_LOCAL_DIR=str(work / "node-local"),
    )
    slurm_cluster.wait([job])
    output = (work / f"vit-weak-scaling-{job}.out").read_text()
    return work, job, output


def test_ladder_records_every_run_and_goes_on_after_a_failure(slurm_cluster, ladder_job):  # noqa: F811
    work, job, output = ladder_job
    runs = runs_by_strategy_and_nodes(work / "runs" / "slurm")
    assert sorted(runs) == [(s, n) for s in ("DDP", "FULL_SHARD") for n in (1, 2)], output
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
    # every run a step of its own, one after the other (after the steps that copied the environment)
    steps = sorted(int(found[0][0]["slurm"]["step_id"]) for found in runs.values())
    assert steps == list(range(steps[0], steps[0] + 4)), steps

    # what the user sees: one line a run, the failure named, the runs after it done anyway
    assert "[1/4] vit_micro FULL_SHARD n1 (2 ranks) ... ok " in output
    assert "[2/4] vit_micro FULL_SHARD n2 (4 ranks) ... OOM (exit 3" in output
    assert "rank 1: MemoryError: injected by the test" in output
    assert "[3/4] vit_micro DDP n1 (2 ranks) ... ok " in output
    assert "[4/4] vit_micro DDP n2 (4 ranks) ... ok " in output
    assert "4 runs in" in output and "1 failed" in output
    table = output[output.index("n1 img/s") :]
    assert "FULL_SHARD" in table.split("\n")[1] and "oom" in table.split("\n")[1]
    # one failed run: the study completes and says so with exit code 1
    info = slurm_cluster.job(job)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", info

    report = work / "report" / "slurm"
    assert (report / "report.md").is_file() and (report / "results.csv").is_file(), output
    assert list(report.glob("*.png")), output
    assert f"report:      {report}/report.md" in output


def test_the_environment_is_copied_to_node_local_storage_once_and_every_rank_runs_from_it(ladder_job):
    """Start-up at scale (docs/jobs.md): once per allocation, the venv and vit_scale go to each node's
    own storage; every rank of every run imports from there; the copies are removed at the end."""
    work, job, output = ladder_job
    copy = f"{work}/node-local/vit-scale-{job}/env"
    lines = [line for line in output.splitlines() if line.startswith("weak_scaling.sh: node-local environment: ")]
    steps = [line.split(": ")[2].split()[0] for line in lines[1:]]
    # each step once in the job (so once for its four runs), in order, with its time; the wrapper the test
    # gives as VIT_SCALE_PYTHON is said to run as given (its `python` is the copy's)
    assert steps == ["prepare", "pack", "broadcast", "unpack", "verify", "note", "removed"], lines
    assert all(line.endswith(" s") for line in lines[1:] if ": note: " not in line), lines
    assert output.index("node-local environment: verify") < output.index("[1/4]")
    assert "broadcast: sbcast to 2 node(s) in " in output
    assert f"verify: python and vit_scale from {copy} on 2 node(s) in " in output
    for found in runs_by_strategy_and_nodes(work / "runs" / "slurm").values():
        ((start, _),) = found
        ranks = start["world"]["world_size"]
        assert start["python_environments"] == [
            {"python_prefix": f"{copy}/venv", "vit_scale_dir": f"{copy}/src/vit_scale", "ranks": ranks}
        ], start["python_environments"]
        assert start["versions"]["python_executable"].startswith(f"{copy}/venv/bin/")
        assert start["git_revision"] == revision()
    # removed at the end: nothing of it left on the nodes' storage
    assert (
        output.rstrip()
        .splitlines()[-1]
        .startswith("weak_scaling.sh: node-local environment: removed from every node in ")
    )
    assert os.listdir(work / "node-local") == []


def revision():
    from vit_scale.record.versions import git_revision

    return git_revision()


@pytest.fixture
def full_disk(tmp_path):
    """A real full disk: a 1 MiB tmpfs (root may mount one; where it may not, the test is skipped outside
    CI and fails in CI, which runs as root)."""
    mount = tmp_path / "full"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        message = f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("case", ["a file in the way", "a full disk"])
def test_a_failed_node_local_copy_stops_the_job_before_any_run(slurm_cluster, tmp_path, request, case):  # noqa: F811
    """The node-local directory cannot be made, or has no room for the copy: one line naming the step and
    the nodes, no run, nothing of the study touched."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "earlier.txt").write_text("an earlier study's file")
    if case == "a file in the way":
        (tmp_path / "a-file").write_text("")
        parent = tmp_path / "a-file" / "node-local"
    else:
        parent = request.getfixturevalue("full_disk")
    job = slurm_cluster.sbatch(
        ["-N", "2", WEAK_SCALING, *STUDY, "--nodes", "2", "--strategies", "DDP"],
        cwd=tmp_path,
        VIT_SCALE_VENV=small_venv(tmp_path),
        VIT_SCALE_NODE_LOCAL_ENV="1",
        VIT_SCALE_NODE_LOCAL_DIR=str(parent),
    )
    slurm_cluster.wait([job])
    output = (tmp_path / f"vit-weak-scaling-{job}.out").read_text()
    ours = [line for line in output.splitlines() if " failed on " in line]
    why = (
        f"cannot create {parent}/vit-scale-{job}: Not a directory"
        if case == "a file in the way"
        else f"{parent}/vit-scale-{job} has 1.0 MiB free, the copy needs "
    )
    assert len(ours) == 1, output
    assert ours[0].startswith(f"weak_scaling.sh: node-local environment: prepare failed on n1, n2: {why}"), output
    if case != "a file in the way":
        # what the copy needs is the venv and vit_scale's size (its bytecode too, where the suite compiled it)
        needs = re.search(r"the copy needs (\d+(?:\.\d+)?) MiB;", ours[0])
        assert needs and float(needs.group(1)) > 1.0, ours[0]
    assert ours[0].endswith("; nothing was run (VIT_SCALE_NODE_LOCAL_ENV=0 runs from the shared file system)")
    assert "[1/1]" not in output
    assert slurm_cluster.job(job)["ExitCode"] == "1:0"
    assert os.listdir(tmp_path / "runs") == ["earlier.txt"]
    assert not os.path.exists(f"{parent}/vit-scale-{job}")  # the partial copies removed


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
    assert logs["n1"].count("ok earlier, skipped") == 2, logs["n1"]
    assert logs["n2"].count("ok earlier, skipped") == 1, logs["n2"]
    assert "[1/2] vit_micro FULL_SHARD n2 (4 ranks) ... ok " in logs["n2"]
    # the analysis job: the whole study's table, now without a failure, and a new report
    assert "4 ok" in logs["analysis"] and "oom" not in logs["analysis"], logs["analysis"]
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
