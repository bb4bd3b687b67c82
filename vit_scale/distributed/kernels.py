"""The JIT-compiled kernels (torch C++/CUDA extensions) that DeepSpeed and ColossalAI build the
first time an optimizer or a quantizer needs them: where each is built, whether it is built
already, building it, and a build lock left behind by a build that was killed.

A kernel built inside a run puts the compiler into the run's wall time and its time limit (on an
H100, ColossalAI's cpu_adam took 40 s and fused_optim more than 80 s before the first step);
`vit-scale prepare` builds them first. Each strategy family names what it needs
(`Strategy.jit_kernels`); the names here are "<package>.<kernel>".
"""
from __future__ import annotations

import glob
import os
import sys
import time
from dataclasses import dataclass

# a build writes objects every few seconds; a lock with nothing written beside it for this long
# was left by a build that is no longer running (torch's FileBaton then waits on it forever)
STALE_LOCK_S = 300


def use_venv_tools() -> None:
    """Put this interpreter's bin/ first on PATH, so that builds use the ninja pip installed into the
    venv whether or not the venv was activated. Two ninjas (the venv's and the system's) keep build
    logs in different formats, and each then rebuilds what the other built: 40-60 s of compiling in
    a run whose kernel was already there."""
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = bindir + (os.pathsep + path if path else "")


@dataclass(frozen=True)
class Kernel:
    key: str          # deepspeed.cpu_adam
    package: str      # deepspeed | colossalai
    loader: str       # DeepSpeed op builder or ColossalAI kernel loader class
    op: str           # the extension's name, as its .so is called
    devices: tuple    # device kinds it exists for

    def build_dir(self) -> str:
        if self.package == "deepspeed":
            from torch.utils.cpp_extension import _get_build_directory

            return _get_build_directory(self.op, verbose=False)
        from colossalai.kernel.extensions.base_extension import _Extension

        return _Extension.get_jit_extension_folder_path()

    def built(self) -> bool:
        """Built already: a .so in the build directory, or (DeepSpeed) installed with the package."""
        return self.built_at() is not None

    def built_at(self) -> float | None:
        """When its .so was written (0 for an op installed with the package), None if never built."""
        if self.package == "deepspeed":
            try:
                from deepspeed.git_version_info import installed_ops

                if installed_ops.get(self.op):
                    return 0.0
            except ImportError:
                pass
        found = glob.glob(os.path.join(self.build_dir(), f"{self.op}*.so"))
        return max(os.path.getmtime(p) for p in found) if found else None

    def stale_lock(self) -> str | None:
        """The path of a build lock nobody is working under, or None."""
        lock = os.path.join(self.build_dir(), "lock")
        if not os.path.exists(lock):
            return None
        newest = max((os.path.getmtime(p) for p in glob.glob(os.path.join(self.build_dir(), "**"), recursive=True)
                      if os.path.exists(p)), default=0)
        return lock if time.time() - newest > STALE_LOCK_S else None

    def load(self) -> None:
        use_venv_tools()
        if self.package == "deepspeed":
            from deepspeed.accelerator import get_accelerator

            get_accelerator().create_op_builder(self.loader).load(verbose=False)
        else:
            from colossalai.kernel import kernel_loader

            getattr(kernel_loader, self.loader)().load()


KERNELS = {k.key: k for k in (
    Kernel("deepspeed.cpu_adam", "deepspeed", "CPUAdamBuilder", "cpu_adam", ("cpu", "cuda", "rocm")),
    Kernel("deepspeed.quantizer", "deepspeed", "QuantizerBuilder", "quantizer", ("cuda", "rocm")),
    Kernel("colossalai.cpu_adam", "colossalai", "CPUAdamLoader", "cpu_adam", ("cuda",)),  # its x86 loader needs CUDA too
    Kernel("colossalai.fused_optim", "colossalai", "FusedOptimizerLoader", "fused_optim", ("cuda",)),
)}


def kernels_for(labels, device_kind: str) -> list[Kernel]:
    """What the strategies of `labels` need on `device_kind`, each kernel once, in a stable order."""
    from vit_scale.distributed import parse_strategy, strategy_class

    keys: dict = {}
    for label in labels:
        parsed = parse_strategy(label)
        for key in strategy_class(parsed.family).jit_kernels(parsed.label, device_kind):
            if device_kind in KERNELS[key].devices:
                keys[key] = None
    return [KERNELS[key] for key in keys]


def prebuilt(label: str, device_kind: str) -> dict:
    """For the start record: each kernel this run's strategy needs, and whether it was built before
    the run started (false: the run builds it, and its first step includes the build)."""
    found = {}
    for kernel in kernels_for([label], device_kind):
        try:
            found[kernel.key] = kernel.built()
        except ImportError:
            found[kernel.key] = False
    return found
