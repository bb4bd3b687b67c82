"""What software ran: recorded in every run so a figure can be traced to its stack."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_versions() -> dict:
    import torch

    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - a build without NCCL/RCCL simply has none to report
            nccl = None
    return {"python": platform.python_version(), "torch": torch.__version__, "timm": _version("timm"),
            "deepspeed": _version("deepspeed"), "colossalai": _version("colossalai"),
            "cuda": torch.version.cuda, "hip": torch.version.hip, "nccl": nccl}


def git_revision() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None
