"""Whether a job puts its Python environment on node-local storage, and where (docs/jobs.md,
"Start-up at scale").

Above a node count its system profile names (`node_local_env_above`), a job's ranks import torch and
the rest from a copy of the venv on each node's own storage instead of the shared file system: there,
every rank of every run opening thousands of files at once is what makes start-up slow at hundreds of
nodes (OLCF's and NERSC's advice). This module only decides; jobs/lib/node_local_env.sh makes the copy,
once per allocation, before the first run. VIT_SCALE_NODE_LOCAL_ENV=0 turns it off, =1 forces it at any
node count; VIT_SCALE_NODE_LOCAL_DIR names the directory instead of the profile's candidates.
"""

from __future__ import annotations

import os
import re

from vit_scale.errors import UserError

SWITCH = "VIT_SCALE_NODE_LOCAL_ENV"
DIRECTORY = "VIT_SCALE_NODE_LOCAL_DIR"


def read_above(value, where: str) -> int | None:
    """`node_local_env_above`: a node count (the copy is made for allocations of more nodes), or null: never
    unless forced."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(
            f"{where}: node_local_env_above: '{value}' is not allowed; allowed: a whole number of nodes (0 or "
            f"more), or null (never unless {SWITCH}=1)"
        )
    return value


def first_usable(candidates: list[str], environ) -> str | None:
    """The first candidate directory that exists here (the batch node) once its variables are filled in,
    e.g. Frontier's /mnt/bb/$USER, which exists only in a job that asked for the NVMe (-C nvme); a
    candidate naming a variable that is not set is passed over."""
    for candidate in candidates:
        path = expand(candidate, environ)
        if path and os.path.isdir(path):
            return path
    return None


def expand(text: str, environ) -> str | None:
    """$VAR and ${VAR} from `environ`; None when one of them is not set."""
    missing = []

    def value(match):
        name = match.group(1) or match.group(2)
        if not environ.get(name):
            missing.append(name)
            return ""
        return environ[name]

    path = re.sub(r"\$(?:\{(\w+)\}|(\w+))", value, text)
    return None if missing else path


def node_local_parent(system, nodes: int, environ=os.environ) -> str | None:
    """The directory under which this job copies its environment on every node; None when it runs from where
    the environment is (off, or below the profile's node count); "" when the copy is wanted but none of the
    profile's directories exists here. Only inside a Slurm allocation: without Slurm there is one machine and
    nothing to spread."""
    switch = environ.get(SWITCH, "")
    if switch not in ("", "0", "1"):
        raise UserError(
            f"{SWITCH}={switch} is not allowed; allowed: 1 (copy the environment to node-local storage at any node "
            f"count), 0 (never), or unset (above the profile's node_local_env_above)"
        )
    if switch == "0" or not environ.get("SLURM_JOB_ID"):
        return None
    above = system.node_local_env_above
    if switch != "1" and (above is None or nodes <= above):
        return None
    given = environ.get(DIRECTORY)
    if given:
        return given
    return first_usable(system.node_local_dirs, environ) or ""


def which_env_answer(env_script: str, system, nodes: int, prog: str) -> str:
    """What `--which-env` tells the job script (jobs/lib/common.sh): the env script to source and, on a second
    line, the directory to copy the environment under on every node when this job does."""
    parent = node_local_parent(system, nodes)
    if parent == "":
        import sys

        print(
            f"{prog}: note: the environment stays on the shared file system: none of node_local_dirs "
            f"({', '.join(system.node_local_dirs)}) exists on this node; set {DIRECTORY} to one that does",
            file=sys.stderr,
        )
    return env_script + (f"\n{parent}" if parent else "")
