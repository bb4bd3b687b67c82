"""Launch detection: torchrun, srun and MPI environments, and a real mpirun launch."""
import glob
import os
import subprocess

import pytest

from conftest import FAST, PYTHON, ROOT, losses, require_tool, torchrun
from vit_scale.launch.world import detect_launcher, detect_world, slurm_master_port
from vit_scale.record.schema import validate_record_file

SLURM_STEP_ENV = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "3",
                  "SLURM_JOB_ID": "4242", "SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
                  "SLURMD_NODENAME": "frontier00042", "MASTER_ADDR": "10.0.0.1"}


def _clear(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("SLURM", "OMPI_", "PMI", "TORCHELASTIC")) or key in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "VIT_SCALE_NODE_NAME"):
            monkeypatch.delenv(key, raising=False)


def test_srun_environment(monkeypatch):
    _clear(monkeypatch)
    for key, value in SLURM_STEP_ENV.items():
        monkeypatch.setenv(key, value)
    world = detect_world()
    assert world.launcher == "srun"
    assert (world.rank, world.world_size, world.local_rank, world.local_world_size, world.nodes) == (5, 8, 1, 2, 4)
    assert world.node_name == "frontier00042" and world.master_addr == "10.0.0.1"
    assert world.master_port == slurm_master_port()
    # consecutive steps of one job get different ports (no TIME_WAIT clash between ladder rungs)
    monkeypatch.setenv("SLURM_STEP_ID", "4")
    assert slurm_master_port() != world.master_port and 15000 <= slurm_master_port() < 45000


def test_batch_script_alone_is_not_a_step(monkeypatch):
    """sbatch sets SLURM_PROCID for the batch shell too; only a step (SLURM_STEP_ID) is srun."""
    _clear(monkeypatch)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert detect_launcher() == "single"


def test_torchrun_wins_over_slurm(monkeypatch):
    """`srun torchrun ...`: the ranks are torchrun's, not srun's one task per node."""
    _clear(monkeypatch)
    for key, value in SLURM_STEP_ENV.items():
        monkeypatch.setenv(key, value)
    for key, value in {"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                       "GROUP_WORLD_SIZE": "4", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "x"}.items():
        monkeypatch.setenv(key, value)
    world = detect_world()
    assert (world.launcher, world.rank, world.world_size, world.nodes, world.master_port) == (
        "torchrun", 9, 16, 4, 29400)


def test_mpi_environment_is_detected(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert detect_launcher() == "mpi"


def test_mpirun_launch_trains_like_torchrun(tmp_path):
    """Real mpirun, mpi4py bootstrap (rank 0 picks the rendezvous and broadcasts it): same losses."""
    require_tool("mpirun")
    args = [*FAST, "strategy=FULL_SHARD"]
    mpi = subprocess.run(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "OMPI_MCA_btl=self,tcp",
         PYTHON, "-m", "vit_scale", "train", *args, "system.launcher=mpi", f"output.dir={tmp_path / 'mpi'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert mpi.returncode == 0, mpi.stdout[-2000:] + mpi.stderr[-3000:]
    assert "Aborted" not in mpi.stderr
    ref = torchrun(2, ["-m", "vit_scale", "train", *args, f"output.dir={tmp_path / 'torchrun'}"])
    assert ref.returncode == 0, ref.stderr[-3000:]
    (mpi_path,) = glob.glob(str(tmp_path / "mpi" / "**" / "metrics.jsonl"), recursive=True)
    (ref_path,) = glob.glob(str(tmp_path / "torchrun" / "**" / "metrics.jsonl"), recursive=True)
    mpi_records, ref_records = validate_record_file(mpi_path), validate_record_file(ref_path)
    assert mpi_records[0]["launcher"] == "mpi" and mpi_records[0]["world"]["world_size"] == 2
    assert mpi_records[-1]["status"] == "ok"
    assert losses(mpi_records) == pytest.approx(losses(ref_records), rel=1e-6)
