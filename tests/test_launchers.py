"""Launch detection: torchrun, srun and MPI environments, and a real mpirun launch."""

import glob
import os
import socket
import subprocess

import pytest

from conftest import FAST, PYTHON, ROOT, losses, require_package, require_tool, torchrun
from vit_scale.launch.world import detect_launcher, detect_world, free_port, slurm_master_port
from vit_scale.record.schema import validate_record_file

SLURM_STEP_ENV = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "3",
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_NUM_NODES": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
    "SLURMD_NODENAME": "frontier00042",
    "MASTER_ADDR": "10.0.0.1",
}


def _clear(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("SLURM", "OMPI_", "PMI", "TORCHELASTIC")) or key in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "VIT_SCALE_NODE_NAME",
        ):
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
    assert slurm_master_port() != world.master_port and 15000 <= slurm_master_port() < 32768


def test_rendezvous_ports_are_below_the_ephemeral_range(monkeypatch):
    """A rendezvous port is chosen before the ranks import torch and bind it: one in the kernel's ephemeral range
    (32768 up, by default) can meanwhile be given to an outgoing connection (a Slurm test's check failed with
    EADDRINUSE on 41301 that way). Both ways of choosing one stay below it, and a free one is free to bind."""
    ports = {free_port() for _ in range(20)}
    assert all(15000 <= p < 32768 for p in ports) and len(ports) > 1
    for p in ports:
        with socket.socket() as s:
            s.bind(("", p))
    for job in range(0, 5000, 37):
        monkeypatch.setenv("SLURM_JOB_ID", str(job))
        assert 15000 <= slurm_master_port() < 32768


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
    for key, value in {
        "RANK": "9",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_WORLD_SIZE": "4",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "x",
    }.items():
        monkeypatch.setenv(key, value)
    world = detect_world()
    assert (world.launcher, world.rank, world.world_size, world.nodes, world.master_port) == (
        "torchrun",
        9,
        16,
        4,
        29400,
    )


def test_mpi_environment_is_detected(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert detect_launcher() == "mpi"


def test_mpirun_launch_trains_like_torchrun(tmp_path):
    """Real mpirun, mpi4py bootstrap (rank 0 picks the rendezvous and broadcasts it): same losses."""
    require_tool("mpirun")
    args = [*FAST, "strategy=FULL_SHARD"]
    mpi = subprocess.run(
        [
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            "2",
            "-x",
            "OMPI_MCA_btl=self,tcp",
            PYTHON,
            "-m",
            "vit_scale",
            "train",
            *args,
            "system.launcher=mpi",
            f"output.dir={tmp_path / 'mpi'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
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


# ---------------------------------------------------------------- launch flags, device, rendezvous


def _srun_argv(system_name: str, kind: str = "srun", nodes: int = 2, ranks_per_node: int = 4) -> list:
    from vit_scale.cluster import launchers
    from vit_scale.cluster.systems import read_system

    launch = launchers.build(
        kind,
        "python",
        ["model=vit_micro"],
        system=read_system(system_name),
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        nodelist="g[1-2]",
        master_addr="10.0.0.1",
        master_port=29400,
        time_limit_min=None,
        grace_s=60,
        rdzv_id="1.1",
    )
    ((argv, _),) = launch.commands
    return argv


@pytest.mark.parametrize("kind", ["srun", "mpi"])
def test_cuda_ranks_see_every_gpu_of_their_node(kind):
    """NCCL finds NVLink only between GPUs a process sees (NVIDIA/nccl#1066): no per-task GPU."""
    argv = _srun_argv("cuda", kind)
    assert "--gpus-per-node=4" in argv and "--ntasks-per-node=4" in argv
    assert not any(arg.startswith("--gpus-per-task") for arg in argv)


@pytest.mark.parametrize("kind", ["srun", "mpi"])
def test_frontier_steps_turn_off_rendezvous_gets(kind):
    """RCCL's alt_read rendezvous (env/frontier.sh) needs the step's NIC rendezvous gets off."""
    argv = _srun_argv("frontier", kind, ranks_per_node=8)
    assert "--network=disable_rdzv_get" in argv
    assert argv[argv.index("--gpus-per-task=1") + 1] == "--gpu-bind=closest"  # OLCF's binding stays


def test_device_is_the_local_rank_when_the_node_gpus_are_visible(monkeypatch):
    """choose_device with a mocked torch.cuda (no GPU here): 4 GPUs visible, local rank 3 drives
    GPU 3; one visible (Frontier's --gpus-per-task=1) drives it; more ranks than GPUs is refused."""
    import torch

    from vit_scale.errors import UserError
    from vit_scale.launch.world import World, choose_device, device_index_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.version, "hip", None)
    world = choose_device(World("srun", 7, 8, 3, 4, 2, "g2", "10.0.0.1", 29400))
    assert (world.device_type, world.device_index, world.backend) == ("cuda", 3, "nccl")
    assert device_index_for(5, 8, 1) == 0
    with pytest.raises(
        UserError,
        match=r"system.device: 8 ranks a node but each sees 4 GPUs, so ranks would "
        r"share GPUs; run at most 4 ranks a node",
    ):
        device_index_for(5, 8, 4)
    # torchrun's local rank 7 with system.ranks_per_node=4 on 4 GPUs: no GPU 7 to drive
    with pytest.raises(UserError, match=r"system.device: 8 ranks a node but each sees 4 GPUs"):
        device_index_for(7, 4, 4)


def test_mpi_rendezvous_is_an_address_other_nodes_reach(monkeypatch):
    """Rank 0's host name can resolve to a loopback address (Debian's 127.0.1.1; here too, when
    /etc/hosts says so): across nodes it publishes an address of a real interface instead."""
    from vit_scale.launch.world import interface_ipv4s, mpi_master_addr, routed_ipv4

    _clear(monkeypatch)
    assert mpi_master_addr(["h1", "h1", "h1"]) == "127.0.0.1"  # one host: the loopback is right
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    assert mpi_master_addr(["h1", "h2"]) == "10.1.2.3"
    monkeypatch.delenv("MASTER_ADDR")
    # under Slurm: rank 0's node as the srun launcher names it (its name when it resolves)
    monkeypatch.setenv("SLURMD_NODENAME", "localhost")
    assert mpi_master_addr(["h1", "h2"]) == "localhost"
    monkeypatch.delenv("SLURMD_NODENAME")
    addresses = interface_ipv4s()
    if addresses:
        # a peer on the network: the address of the interface that routes to it
        assert routed_ipv4(addresses[0]) in addresses
    else:  # a machine with the loopback alone: an interface stands in (a mock, said here)
        import vit_scale.launch.world as world_module

        addresses = ["10.9.8.7"]
        monkeypatch.setattr(world_module, "interface_ipv4s", lambda: addresses)
    # a peer only reachable through the loopback says nothing: an interface's address is taken
    published = mpi_master_addr([socket.gethostname(), "localhost"])
    assert published in addresses and not published.startswith("127.")


def test_runs_over_several_nodes_must_use_the_network_plugin(monkeypatch):
    """env/frontier.sh asks for it; the trainer gives NCCL_NET to multi-node runs only."""
    from vit_scale.launch.world import World, network_requirement

    def world(nodes, backend="nccl"):
        return World("srun", 0, 8 * nodes, 0, 8, nodes, "f1", "10.0.0.1", 29400, "rocm", 0, backend)

    env = {"VIT_SCALE_NCCL_NET_ACROSS_NODES": "AWS Libfabric"}
    assert network_requirement(world(2), env) == {"NCCL_NET": "AWS Libfabric"}
    assert network_requirement(world(1), env) == {}  # the plugin does not start on one node (OLCF)
    assert network_requirement(world(2, "gloo"), env) == {}
    assert network_requirement(world(2), {**env, "NCCL_NET": "Socket"}) == {}  # the user's choice wins
    assert network_requirement(world(2), {}) == {}


def test_deepspeed_local_rank_names_the_chosen_device(monkeypatch):
    """DeepSpeed's own check (engine._configure_with_arguments) accepts what the trainer sets under
    Open MPI, also where a rank sees one GPU (device 0, local rank 3) or inherited a stale LOCAL_RANK."""
    require_package("deepspeed", "pip install 'vit-scale[deepspeed]'")
    from deepspeed.runtime.engine import DeepSpeedEngine

    from vit_scale.launch.world import World, device_local_rank_env

    _clear(monkeypatch)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "7")
    for device_type, device_index, expected in (("cuda", 0, "0"), ("cuda", 3, "3"), ("cpu", None, "3")):
        world = World("mpi", 11, 16, 3, 8, 2, "g2", "10.0.0.1", 29400, device_type, device_index)
        env = device_local_rank_env(world)
        assert env == {"LOCAL_RANK": expected, "OMPI_COMM_WORLD_LOCAL_RANK": expected}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        engine = type("Engine", (), {})()
        DeepSpeedEngine._configure_with_arguments(engine, None, None)
        assert engine.local_rank == int(expected)
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_RANK")
    assert device_local_rank_env(World("srun", 1, 2, 1, 2, 1, "g1", "h", 1, "rocm", 0)) == {"LOCAL_RANK": "0"}


def test_the_supervisor_runs_commands_from_the_main_thread_only():
    """PR_SET_PDEATHSIG follows the thread that forked a run, not the process: a run started from a
    thread that then ends would be stopped with it. So run() refuses any thread but the main one."""
    import signal
    import threading

    from vit_scale.cluster.supervise import Supervisor

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        supervisor = Supervisor()
        raised = []

        def run():
            try:
                supervisor.run(None, os.devnull)
            except RuntimeError as exc:
                raised.append(str(exc))

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        assert raised and "main thread" in raised[0]
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
