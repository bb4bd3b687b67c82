"""A system profile (configs/systems/NAME.yaml) and what the machine or Slurm allocation gives.

Three ways a study meets its hardware:
  - inside a Slurm allocation: nodes from the allocation, ranks through srun (or torchrun, mpi);
  - a GPU machine without Slurm (a workstation, a cloud VM): one node, torchrun over 1, 2, 4 ... N
    GPUs, the figures' x axis then being GPUs;
  - the local CPU profile without Slurm: nodes emulated as groups of processes on this machine.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass, field

from vit_scale.cluster.emulation import read_spec
from vit_scale.cluster.files import home, load_yaml
from vit_scale.cluster.node_local import read_above
from vit_scale.cluster.values import as_list
from vit_scale.errors import UserError
from vit_scale.launch.world import slurm_hostnames, slurm_node_address

SYSTEM_KEYS = (
    "name",
    "description",
    "env_script",
    "ranks_per_node",
    "backend",
    "launcher",
    "launchers",
    "srun_flags",
    "torchrun_srun_flags",
    "mpi_flags",
    "master_addr",
    "peak_tflops",
    "device_memory_gib",
    "device_spread",
    "quota_burst_share",
    "needs_slurm",
    "default_study",
    "sbatch_flags",
    "inter_node_transport",
    "network",
    "emulation",
    "node_local_env_above",
    "node_local_dirs",
)


@dataclass
class SystemProfile:
    name: str
    description: str = ""
    env_script: str = ""
    ranks_per_node: str = "1"  # a number, or "gpus": one rank per GPU a node has
    backend: str = "gloo"
    launcher: str = "srun"
    launchers: list = field(default_factory=lambda: ["srun", "torchrun", "mpi"])
    srun_flags: str = ""
    torchrun_srun_flags: str = ""
    mpi_flags: str = ""
    master_addr: str = "nodeaddr"
    peak_tflops: object = None  # a number, a {precision: number} mapping, or None
    device_memory_gib: object = None
    # how far one device's speed may lie from another's of the same model in this system: a band's input
    # (vit_scale.planning.input_profile.device_spread), not used by a run
    device_spread: object = None
    # on emulated nodes with a CPU quota: the band's costly end's compute ceiling (input_profile.device_spread)
    quota_burst_share: object = None
    needs_slurm: bool = False
    default_study: str = ""
    sbatch_flags: str = ""
    inter_node_transport: list = field(default_factory=list)  # what `vit-scale check` expects between nodes
    network: object = None  # collective cost defaults: vit_scale.planning.alpha_beta.read_network
    emulation: object = None  # emulated nodes without Slurm: vit_scale.cluster.emulation.Spec, or None
    # jobs of more nodes run from a copy of the venv on node-local storage (vit_scale/cluster/node_local.py)
    node_local_env_above: int | None = None
    node_local_dirs: list = field(default_factory=lambda: ["/tmp"])  # where; the first that exists

    @property
    def one_rank_per_gpu(self) -> bool:
        return str(self.ranks_per_node) == "gpus"

    def peak_for(self, precision: str):
        if isinstance(self.peak_tflops, dict):
            return self.peak_tflops.get(precision)
        return self.peak_tflops


def known_systems() -> list[str]:
    folder = os.path.join(home(), "configs", "systems")
    return sorted(name[:-5] for name in os.listdir(folder) if name.endswith(".yaml"))


def read_system(name: str) -> SystemProfile:
    known = known_systems()
    if name not in known:
        raise UserError(f"--system: unknown system '{name}'; allowed: {', '.join(known)}")
    path = os.path.join(home(), "configs", "systems", f"{name}.yaml")
    data = load_yaml(path, "--system")
    unknown = sorted(set(data) - set(SYSTEM_KEYS))
    if unknown:
        raise UserError(f"{path}: unknown key {unknown[0]}; allowed: {', '.join(SYSTEM_KEYS)}")
    values = {k: v for k, v in data.items() if v is not None or k in ("peak_tflops", "device_memory_gib")}
    values["name"] = name
    values["launchers"] = as_list(values.get("launchers")) or ["srun", "torchrun", "mpi"]
    values["inter_node_transport"] = as_list(values.get("inter_node_transport"))
    values["ranks_per_node"] = str(values.get("ranks_per_node", 1))
    for key in ("srun_flags", "torchrun_srun_flags", "mpi_flags", "sbatch_flags"):
        values[key] = str(values.get(key) or "")
    values["emulation"] = read_spec(values.get("emulation"), path)
    values["node_local_env_above"] = read_above(data.get("node_local_env_above"), path)
    values["node_local_dirs"] = as_list(values.get("node_local_dirs")) or ["/tmp"]
    return SystemProfile(**values)


def study_file(given: str | None, system: SystemProfile) -> str:
    """The study file given, else the system's default one; it must exist."""
    path = given or os.path.join(home(), system.default_study)
    if not os.path.isfile(path):
        raise UserError(f"--config: no such file: {path}; the studies are in configs/studies/")
    return path


# ---------------------------------------------------------------- this machine, this allocation


def in_slurm() -> bool:
    return bool(os.environ.get("SLURM_JOB_ID"))


def on_frontier() -> bool:
    return os.environ.get("LMOD_SYSTEM_NAME") == "frontier" or "frontier" in socket.getfqdn()


def gpus_here() -> int:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when it is set (what torch will see),
    else the ones nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU"))


def detect_system() -> str:
    """Frontier by its Lmod name or host names; a CUDA machine by its GPUs (with or without
    Slurm); anything else runs the local CPU profile."""
    if in_slurm() and on_frontier():
        return "frontier"
    if (in_slurm() and os.environ.get("SLURM_GPUS_ON_NODE")) or gpus_here() > 0:
        return "cuda"
    return "local"


def allocation_size() -> int:
    """The allocation's node count (1 when Slurm does not say)."""
    return int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)


def slurm_gpus_per_node() -> int:
    text = os.environ.get("SLURM_GPUS_ON_NODE") or os.environ.get("SLURM_GPUS_PER_NODE") or ""
    text = text.split(":")[-1]  # SLURM_GPUS_PER_NODE may read "a100:4"
    return int(text) if re.fullmatch(r"[1-9]\d*", text) else 0


def allocation_nodes() -> list[str]:
    """The allocation's host names, in Slurm's order."""
    return slurm_hostnames(os.environ.get("SLURM_JOB_NODELIST", ""))


def node_address(node: str, how: str) -> str:
    """The rendezvous address of a node: its name, or (how = nodeaddr) what Slurm says reaches it."""
    return slurm_node_address(node) if how == "nodeaddr" else node


def allocation_minutes_left() -> float | None:
    """The minutes this Slurm job has left (squeue's TimeLeft), None when Slurm does not say or
    the job has no limit."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return slurm_minutes(out)


def slurm_minutes(text: str) -> float | None:
    """Slurm's time as squeue prints it ([D-][HH:]MM:SS, or MM) in minutes; None for UNLIMITED and the like."""
    found = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not found:
        return None
    days, *parts = found.groups()
    numbers = [int(p) for p in parts if p is not None]
    if len(numbers) == 1:
        # a bare number is minutes; after days, hours
        hours, mins, secs = (0, numbers[0], 0) if days is None else (numbers[0], 0, 0)
    elif len(numbers) == 2:
        hours, (mins, secs) = (0, numbers) if days is None else (numbers[0], (numbers[1], 0))
    else:
        hours, mins, secs = numbers
    return int(days or 0) * 1440 + hours * 60 + mins + secs / 60
