"""A real Slurm cluster for the tests of jobs/: munged, slurmctld and two slurmd (emulated nodes
n1 and n2, 2 CPUs each) on this machine, started from the project's own
tools/local-slurm-cluster.sh and stopped by the PIDs it recorded. Nothing about Slurm is mocked.

Use it from a test module with `from slurm_fixture import slurm_cluster  # noqa: F401`.
"""

import os
import re
import shutil
import subprocess
import tempfile
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
        """scontrol's facts about a job (kept MinJobAge=300 s after it ends)."""
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], env=self.env(), capture_output=True, text=True, timeout=30
        ).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))


def _cluster(nodes: int):
    for tool in ("slurmctld", "slurmd", "munged", "mungekey", "sbatch"):
        require_tool(tool)
    if os.geteuid() != 0:
        message = "slurmd has to run as root to start job steps"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    # not pytest's tmp_path: /tmp/pytest-of-<user> is 0700 and munged refuses a socket below it
    directory = tempfile.mkdtemp(prefix="vit-scale-slurm-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(NODES=str(nodes), CPUS="2")
    up = subprocess.run([CLUSTER_SH, "up", directory], env=env, capture_output=True, text=True, timeout=120)
    if up.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(f"local-slurm-cluster.sh up failed:\n{up.stderr[-3000:]}")
    try:
        yield Cluster(directory)
    finally:
        subprocess.run([CLUSTER_SH, "down", directory], env=env, capture_output=True, timeout=120)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    """Two emulated nodes, n1 and n2."""
    yield from _cluster(2)


@pytest.fixture(scope="session")
def slurm_six_nodes():
    """Six emulated nodes, n1 to n6 (each claims 2 CPUs of the same machine): room for jobs that
    wait most of their time (a hung label until the allocation ends) beside others that work."""
    yield from _cluster(6)
