"""A real Slurm cluster for the tests of jobs/: munged, slurmctld and six slurmd (emulated nodes
n1 to n6, 2 CPUs each) on this machine, one for the whole session, started from the project's own
tools/local-slurm-cluster.sh and stopped by the PIDs it recorded. Nothing about Slurm is mocked.

Use it from a test module with `from slurm_fixture import slurm_cluster  # noqa: F401`.
"""

import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import IN_CI, ROOT, require_tool
from jobs_support import job_env

CLUSTER_SH = os.path.join(ROOT, "tools", "local-slurm-cluster.sh")


class Cluster:
    def __init__(self, directory: str):
        self.directory = directory
        self.conf = os.path.join(directory, "etc", "slurm.conf")

    def env(self, **extra) -> dict:
        """The environment for sbatch/srun/squeue, and so for the jobs (sbatch exports it):
        this cluster's config, the test's own Python for the trainer, and no Slurm job of the
        pytest process itself."""
        return job_env(SLURM_CONF=self.conf, **extra)

    def sbatch(self, args: list, cwd, **extra_env) -> str:
        proc = subprocess.run(
            ["sbatch", "--parsable", *args],
            cwd=cwd,
            env=self.env(**extra_env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    def wait(self, job_ids, timeout: float = 600) -> None:
        """Until none of the jobs is in the queue (polling is faster than sbatch --wait)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                proc = subprocess.run(
                    ["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)],
                    env=self.env(),
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
            except subprocess.TimeoutExpired:
                continue
            # an squeue that failed (slurmctld slow to answer on a loaded machine) printed nothing:
            # that is not an empty queue, and once ended a test early with its job still running
            if proc.returncode == 0 and not proc.stdout.split():
                return
            time.sleep(0.5)
        subprocess.run(["scancel", *job_ids], env=self.env())
        pytest.fail(f"jobs {job_ids} still queued or running after {timeout} s")

    def job(self, job_id: str) -> dict:
        """scontrol's facts about a job (kept MIN_JOB_AGE, an hour here, after it ends)."""
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], env=self.env(), capture_output=True, text=True, timeout=30
        ).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))


TOOLS = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch")
NOT_ROOT = "slurmd has to run as root to start job steps"


def _unmet() -> str | None:
    """Why no cluster can start here (a missing tool, not root), or None."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return NOT_ROOT if os.geteuid() != 0 else None


def _env(nodes: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    # scontrol shows a finished job for an hour: jobs submitted as the session started are read minutes later
    env.update(NODES=str(nodes), CPUS="2", MIN_JOB_AGE="3600")
    return env


def _start(nodes: int) -> Cluster:
    # not pytest's tmp_path: /tmp/pytest-of-<user> is 0700 and munged refuses a socket below it
    directory = tempfile.mkdtemp(prefix="vit-scale-slurm-", dir="/tmp")
    up = subprocess.run([CLUSTER_SH, "up", directory], env=_env(nodes), capture_output=True, text=True, timeout=120)
    if up.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        raise RuntimeError(f"local-slurm-cluster.sh up failed:\n{up.stderr[-3000:]}")
    cluster = Cluster(directory)
    cluster.nodes = nodes
    return cluster


def _stop(cluster: Cluster) -> None:
    subprocess.run([CLUSTER_SH, "down", cluster.directory], env=_env(cluster.nodes), capture_output=True, timeout=120)
    shutil.rmtree(cluster.directory, ignore_errors=True)


# ---------------------------------------------------------------- jobs submitted as the session starts

# Jobs that spend most of their time waiting for Slurm to end them (test_check_allocations' two allocation
# jobs: about 90 s, 20 of them working) are submitted as collection ends (conftest.py), when a selected test
# needs them: the six-node cluster starts and they are submitted in a thread, and their wait runs beside the
# tests before theirs instead of inside their module. A module registers its submitter here under the name of
# the fixture that uses it: EARLY_JOBS[fixture] = function(cluster, directory) -> what the fixture returns.
EARLY_JOBS: dict = {}
_early: dict = {}
_shared: dict = {}


def start_early(session) -> None:
    wanted = [name for name in EARLY_JOBS if any(name in getattr(i, "fixturenames", ()) for i in session.items)]
    if not wanted or _unmet() is not None or session.config.option.collectonly:
        return  # without a cluster the fixtures skip (or fail, in CI) as they always did
    _early["thread"] = threading.Thread(target=_submit_early, args=(wanted,), daemon=True)
    _early["thread"].start()


def _submit_early(wanted: list) -> None:
    try:
        _early["cluster"] = cluster = _start(6)
        for name in wanted:
            work = pathlib.Path(tempfile.mkdtemp(prefix=f"vit-scale-{name}-"))
            _early.setdefault("dirs", []).append(work)
            _early[name] = EARLY_JOBS[name](cluster, work)
    except Exception as exc:  # said by the fixture that needs it
        _early["error"] = f"{type(exc).__name__}: {exc}"


def early(name: str):
    """What EARLY_JOBS[name] returned when the session started, or None if it did not run then."""
    thread = _early.get("thread")
    if thread is None:
        return None
    thread.join(timeout=300)
    if thread.is_alive():  # starting another cluster beside the one still coming up would clash with it
        pytest.fail(f"submitting {name} as the session started has not ended after 300 s")
    if "error" in _early:
        pytest.fail(f"submitting {name} as the session started failed: {_early['error']}")
    return _early.get(name)


def _session_cluster() -> Cluster:
    """The session's one cluster (six nodes), started by the first test that needs it, or as the session
    started (start_early). One for all: a fixture imported into several modules is a fixture of each,
    and each had started a cluster of its own, seconds to start and to stop."""
    if "cluster" not in _shared:
        started = early("cluster")
        if started is None:
            for tool in TOOLS:
                require_tool(tool)  # skipped outside CI, failed in CI
            if os.geteuid() != 0:
                pytest.fail(NOT_ROOT) if IN_CI else pytest.skip(NOT_ROOT)
            try:
                started = _start(6)
            except RuntimeError as exc:
                pytest.fail(str(exc))
        _shared["cluster"] = started
    return _shared["cluster"]


def stop_all() -> None:
    """At the session's end (conftest.py): the cluster, and the early jobs' directories."""
    thread = _early.pop("thread", None)
    if thread is not None:
        thread.join(timeout=300)
    cluster = _shared.pop("cluster", None) or _early.pop("cluster", None)
    if cluster is not None:
        _stop(cluster)
    for work in _early.pop("dirs", []):
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_six_nodes():
    """Six emulated nodes, n1 to n6 (each claims 2 CPUs of the same machine): room for jobs that
    wait most of their time (a hung label until the allocation ends) beside others that work."""
    return _session_cluster()


@pytest.fixture(scope="session")
def slurm_cluster():
    """Two emulated nodes, n1 and n2: the first two of the session's one cluster. The tests that use it
    submit one job at a time once the six-node tests' jobs have ended, so Slurm places a job of N nodes
    on n1 to nN."""
    return _session_cluster()
