"""Where this process sits in the job: launcher, ranks, nodes, device and backend. The one place
that reads torchrun's, srun's and MPI's environment.

srun and MPI give ranks but no rendezvous address; torch.distributed needs MASTER_ADDR and
MASTER_PORT, which are derived here (first node of the step, a port from the job and step ids)
so that no job script has to compute them.
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
from dataclasses import dataclass, field
from datetime import timedelta

from vit_scale.errors import UserError


@dataclass
class World:
    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    nodes: int
    node_name: str
    master_addr: str
    master_port: int
    device_type: str = "cpu"  # cuda | rocm | cpu
    device_index: int | None = None
    backend: str = "gloo"
    extra: dict = field(default_factory=dict)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self):
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", self.device_index or 0)

    @property
    def torch_device_type(self) -> str:
        """The device type torch itself uses (ROCm GPUs are "cuda" to torch)."""
        return "cpu" if self.device_type == "cpu" else "cuda"


def _int_env(name: str, default: int | None = None) -> int | None:
    val = os.environ.get(name)
    if val is None or val == "":
        return default
    m = re.match(r"\d+", val)  # SLURM_TASKS_PER_NODE looks like "2(x3)"
    return int(m.group(0)) if m else default


# where an MPI launcher (Open MPI, MPICH/Hydra, PMIx, srun --mpi) puts the rank
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def _node_name() -> str:
    # emulated nodes share one host name, so prefer what the launcher says the node is
    return os.environ.get("VIT_SCALE_NODE_NAME") or os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def detect_launcher(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env):
        return "torchrun"
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and "SLURM_NTASKS" in env:
        return "srun"
    if any(k in env for k in MPI_RANK_VARS):
        return "mpi"
    return "single"


def launched_by() -> str:
    """What started this process, read from the environment it was given.

    `detect_launcher` says how the trainer finds its rank, and reads `torchrun` for any process
    given RANK and WORLD_SIZE, including those jobs/weak_scaling.sh starts itself without Slurm;
    a report needs to say which it really was (the start record's versions.launched_by).
    """
    env = os.environ
    torchrun = "TORCHELASTIC_RUN_ID" in env
    srun = "SLURM_STEP_ID" in env and "SLURM_PROCID" in env
    mpi = any(k in env for k in MPI_RANK_VARS)
    if torchrun:
        return "torchrun under srun" if srun else "torchrun"
    if mpi:
        return "srun (MPI)" if srun else "mpirun"
    if srun:
        return "srun"
    if "RANK" in env and "WORLD_SIZE" in env:
        return "env"  # processes started by a script with RANK, WORLD_SIZE, MASTER_ADDR set
    return "single"


def slurm_hostnames(nodelist: str) -> list[str]:
    """A Slurm node list ("n[1-2]") as host names, in Slurm's order."""
    if not nodelist:
        return []
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split()
        return out or nodelist.split(",")
    except (OSError, subprocess.SubprocessError):
        return nodelist.split(",")


def slurm_node_address(node: str) -> str:
    """The address to reach a node at: its name when it resolves, else the NodeAddr Slurm itself
    holds for it (emulated or private node names do not resolve)."""
    try:
        socket.getaddrinfo(node, None)
        return node
    except OSError:
        pass
    try:
        out = subprocess.run(["scontrol", "show", "node", node], capture_output=True, text=True, timeout=30).stdout
        m = re.search(r"NodeAddr=(\S+)", out)
        if m:
            return m.group(1)
    except (OSError, subprocess.SubprocessError):
        pass
    return node


def slurm_master_addr() -> str:
    """Address of the step's first node."""
    nodes = slurm_hostnames(os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or "")
    return slurm_node_address(nodes[0]) if nodes else "127.0.0.1"


# Rendezvous ports are chosen below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by
# default): a port is chosen tens of seconds (the ranks' imports) before the rendezvous listens on it, and a port
# in that range may meanwhile be handed to any outgoing connection (a suite's gloo traffic did: EADDRINUSE)
PORT_LOW = 15000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def slurm_master_port() -> int:
    """Distinct per job and per step, so consecutive steps of a ladder never meet a port in TIME_WAIT; below
    the ephemeral range (PORT_LOW up to 32767, the default range's start: the same on every node)."""
    job = _int_env("SLURM_JOB_ID", 0) or 0
    step = _int_env("SLURM_STEP_ID", 0) or 0
    return PORT_LOW + (job * 97 + step * 13) % (32768 - PORT_LOW)


def free_port() -> int:
    """A port nothing on this host listens on, below its ephemeral range (no outgoing connection is handed it
    before the rendezvous binds it); a random one (not seeded by the process), tried until one binds."""
    pick = random.SystemRandom()
    high = max(PORT_LOW + 1, _ephemeral_low())
    for _ in range(200):
        port = pick.randrange(PORT_LOW, high)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every one taken: the kernel's choice, as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def detect_world(requested_launcher: str = "auto", ranks_per_node: int = 0) -> World:
    """Ranks and rendezvous from the environment; touches no process group."""
    launcher = detect_launcher(requested_launcher)
    env = os.environ
    if launcher == "torchrun":
        rank, world_size = _int_env("RANK", 0), _int_env("WORLD_SIZE", 1)
        local_rank = _int_env("LOCAL_RANK", 0)
        local_world = _int_env("LOCAL_WORLD_SIZE", ranks_per_node or world_size)
        nodes = _int_env("GROUP_WORLD_SIZE", 0) or max(1, world_size // max(1, local_world))
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), _int_env("MASTER_PORT", 29500)
    elif launcher == "srun":
        if "SLURM_PROCID" not in env:
            raise UserError("system.launcher: srun was asked for but this process was not started by srun")
        rank, world_size = _int_env("SLURM_PROCID"), _int_env("SLURM_NTASKS", 1)
        local_rank = _int_env("SLURM_LOCALID", 0)
        local_world = (
            _int_env("SLURM_STEP_TASKS_PER_NODE")
            or _int_env("SLURM_NTASKS_PER_NODE")
            or _int_env("SLURM_TASKS_PER_NODE")
            or 1
        )
        nodes = _int_env("SLURM_STEP_NUM_NODES") or _int_env("SLURM_NNODES") or 1
        addr = env.get("MASTER_ADDR") or slurm_master_addr()
        port = _int_env("MASTER_PORT") or slurm_master_port()
    elif launcher == "mpi":
        rank, world_size, local_rank, local_world, nodes, addr, port = _mpi_bootstrap()
    elif launcher == "single":
        rank, world_size, local_rank, local_world, nodes = 0, 1, 0, 1, 1
        addr, port = "127.0.0.1", free_port()
    else:
        raise UserError(f"system.launcher: {launcher!r} is not allowed; allowed: auto, torchrun, srun, mpi, single")
    if ranks_per_node:
        local_world = ranks_per_node
        nodes = max(1, world_size // ranks_per_node)
    return World(launcher, rank, world_size, local_rank, local_world, nodes, _node_name(), addr, port)


def _mpi_bootstrap():
    try:
        from mpi4py import MPI
    except ImportError:
        raise UserError("system.launcher: mpi needs mpi4py; install the extra: pip install 'vit-scale[mpi]'") from None
    comm = MPI.COMM_WORLD
    rank, world_size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_world = local.Get_rank(), local.Get_size()
    # node names count the nodes (emulated ones share a host); host names say where rank 0 is reached
    node_names, hosts = zip(*comm.allgather((_node_name(), socket.gethostname())), strict=True)
    # rank 0 chooses the rendezvous and tells everyone: MPI has no MASTER_ADDR of its own
    if rank == 0:
        addr = mpi_master_addr(list(hosts))
        port = _int_env("MASTER_PORT") or free_port()
    else:
        addr, port = None, None
    addr, port = comm.bcast((addr, port), root=0)
    return rank, world_size, local_rank, local_world, len(set(node_names)), addr, port


def mpi_master_addr(hosts: list, environ=os.environ) -> str:
    """The address rank 0 publishes under MPI; `hosts` are every rank's host name, rank 0's first.

    Not the address rank 0's host name resolves to: Debian-style /etc/hosts map it to 127.0.1.1,
    which no other node reaches."""
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"]
    if len(set(hosts)) == 1:
        return "127.0.0.1"
    if environ.get("SLURMD_NODENAME"):
        # the node rank 0 runs on, reached as the srun launcher reaches a step's first node
        return slurm_node_address(environ["SLURMD_NODENAME"])
    peer = next(host for host in hosts if host != hosts[0])
    return routed_ipv4(peer) or (interface_ipv4s() or [hosts[0]])[0]


def _is_loopback(address: str) -> bool:
    return address.startswith("127.")


def routed_ipv4(peer: str) -> str | None:
    """This host's IPv4 address on the route to PEER (a connected UDP socket only picks the route;
    nothing is sent), or None when PEER does not resolve or the route is the loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer, 9))
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if _is_loopback(address) else address


def interface_ipv4s() -> list:
    """The IPv4 addresses of this host's interfaces, loopback left out, in interface order (Linux)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915  # Linux's ioctl for an interface's IPv4 address (what ifconfig asks)
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                reply = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
            except OSError:  # an interface without an IPv4 address
                continue
            address = socket.inet_ntoa(reply[20:24])
            if not _is_loopback(address):
                found.append(address)
    return found


def choose_device(world: World, requested: str = "auto") -> World:
    import torch

    has_gpu = torch.cuda.is_available()
    if requested == "cuda" and not has_gpu:
        raise UserError("system.device: cuda was asked for but torch sees no GPU; use system.device=cpu or auto")
    if requested in ("auto", "cuda") and has_gpu:
        world.device_type = "rocm" if torch.version.hip else "cuda"
        world.device_index = device_index_for(world.local_rank, world.local_world_size, torch.cuda.device_count())
        world.backend = "nccl"  # RCCL on ROCm builds
    else:
        world.device_type, world.device_index, world.backend = "cpu", None, "gloo"
    return world


def device_index_for(local_rank: int, local_world_size: int, visible: int) -> int:
    """Which visible GPU a rank drives. One visible (srun --gpus-per-task=1, Frontier's
    --gpu-bind=closest): that one. The node's GPUs visible (srun --gpus-per-node, torchrun, mpirun),
    as NCCL needs to find NVLink between them: the one at the rank's place on its node."""
    if visible <= 1:
        return 0
    # the launcher's local rank beyond the GPUs seen (torchrun --nproc_per_node above them, with
    # system.ranks_per_node set lower) would name a GPU that is not there
    if local_world_size > visible or local_rank >= visible:
        local_world_size = max(local_world_size, local_rank + 1)
        raise UserError(
            f"system.device: {local_world_size} ranks a node but each sees {visible} GPUs, so ranks "
            f"would share GPUs; run at most {visible} ranks a node (--ranks-per-node) or make every GPU "
            f"of the node visible to each rank"
        )
    return local_rank


def device_local_rank_env(world: World, environ=os.environ) -> dict:
    """LOCAL_RANK for DeepSpeed, which takes it as the index of its device (runtime/zero/
    partition_parameters.py: zero.Init's local_device) and, under Open MPI, requires it to equal
    OMPI_COMM_WORLD_LOCAL_RANK (runtime/engine.py: _configure_with_arguments asserts it).

    Both are set to the device the trainer chose; a LOCAL_RANK inherited from elsewhere is
    replaced. Open MPI read its own variable at MPI_Init; where a rank sees one GPU, its local
    rank is not its device index, and DeepSpeed's check is the only later reader."""
    value = str(world.device_index or 0) if world.device_type != "cpu" else str(world.local_rank)
    env = {"LOCAL_RANK": value}
    if "OMPI_COMM_WORLD_LOCAL_RANK" in environ:
        env["OMPI_COMM_WORLD_LOCAL_RANK"] = value
    return env


# Set by env/frontier.sh where an RCCL network plugin is loaded: the NCCL_NET a run over more than
# one node gets, so that RCCL fails when it cannot use the plugin instead of running over TCP sockets
NET_ACROSS_NODES = "VIT_SCALE_NCCL_NET_ACROSS_NODES"


def network_requirement(world: World, environ=os.environ) -> dict:
    """NCCL_NET for this run: the plugin's name when the run spans nodes and the environment asks
    for it. A single-node run is left alone: Frontier's network is not set up for a single node,
    so the plugin does not start there (OLCF's PyTorch guide); an NCCL_NET the user set wins."""
    wanted = environ.get(NET_ACROSS_NODES, "")
    if world.backend != "nccl" or world.nodes < 2 or not wanted or environ.get("NCCL_NET"):
        return {}
    return {"NCCL_NET": wanted}


CPU_GROUP = "VIT_SCALE_CPU_GROUP"  # an isolated emulated node's cgroup.procs (vit_scale/cluster/emulation.py)


def join_cpu_group(environ=os.environ) -> bool:
    """Move this rank into its emulated node's CPU group, when it has one. Here rather than at exec: the
    imports before it take tens of seconds of CPU at a quarter of a core, and none of it is measured;
    the process group, the model and every step run inside the quota."""
    path = environ.get(CPU_GROUP)
    if not path:
        return False
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    return True


def init_distributed(world: World, timeout_s: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = world.master_addr
    os.environ["MASTER_PORT"] = str(world.master_port)
    join_cpu_group()
    # before the process group: NCCL reads NCCL_NET when it creates its first communicator
    os.environ.update(network_requirement(world))
    kwargs = {}
    if world.device_type != "cpu":
        torch.cuda.set_device(world.device_index)
        kwargs["device_id"] = world.device
    dist.init_process_group(
        backend=world.backend,
        rank=world.rank,
        world_size=world.world_size,
        timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )


def slurm_facts() -> dict | None:
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return None
    return {
        "job_id": env.get("SLURM_JOB_ID"),
        "step_id": env.get("SLURM_STEP_ID"),
        "job_name": env.get("SLURM_JOB_NAME"),
        "nodelist": env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"),
        "partition": env.get("SLURM_JOB_PARTITION"),
        "account": env.get("SLURM_JOB_ACCOUNT"),
    }


def leave(code: int) -> None:
    """End this rank's process now, output flushed, without the interpreter's shutdown.

    Shutdown can catch gloo's worker threads mid-call (std::terminate, SIGABRT after everything
    was written, seen under torchrun and mpirun alike), and a broken process group can hang in its
    destructor; a run whose record is written has nothing left to do."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
