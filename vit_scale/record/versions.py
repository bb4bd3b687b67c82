"""What software ran, and on what host CPU: recorded in every run so a figure can be traced to its
stack and a report can say what the machine was."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_versions() -> dict:
    import torch

    from vit_scale.launch.world import launched_by

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": _version("timm"),
        "deepspeed": _version("deepspeed"),
        "colossalai": _version("colossalai"),
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "nccl": nccl,
        # not software, but rank 0's host facts a report needs (a GPU run's world.device_name
        # names the GPU, not the host), and what really started the ranks
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "launched_by": launched_by(),
        # where this rank's Python and toolkit come from: a job's node-local copy (docs/jobs.md, "Start-up at
        # scale") or the shared file system
        "python_executable": sys.executable,
        "python_prefix": sys.prefix,
        "vit_scale_dir": vit_scale_dir(),
    }


def vit_scale_dir() -> str:
    """The directory the vit_scale package was imported from."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model() -> str | None:
    """The host CPU's marketing name, e.g. 'AMD EPYC 7A53 64-Core Processor'."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                # x86 says "model name"; some ARM kernels only "Hardware" or "CPU part"
                if key.strip() in ("model name", "Hardware") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or None


def git_revision() -> str | None:
    """The toolkit's own commit (with -dirty when tracked files differ), or None.

    Only a git checkout whose top level is the directory holding vit_scale/ is the toolkit's: a
    copy unpacked inside another repository, or installed into a virtual environment that lives
    in one, would otherwise report that repository's commit as the toolkit's. A job's node-local copy of
    the package (jobs/lib/node_local_env.sh) is no checkout: the job script read the commit of the checkout
    it copied and passes it on in VIT_SCALE_COPIED_REVISION.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # <root>/vit_scale/record/
    try:
        top = subprocess.run(
            ["git", "-C", root, "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10
        )
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(root):
            return os.environ.get("VIT_SCALE_COPIED_REVISION") or None
        out = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if out.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None
