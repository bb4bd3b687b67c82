"""The JIT-compiled kernels (torch C++/CUDA extensions) that DeepSpeed and ColossalAI build the
first time an optimizer or a quantizer needs them: where each is built, whether it is built
already, building it, and a build lock left behind by a build that was killed.

A kernel built inside a run puts the compiler into the run's wall time and its time limit (on an
H100, ColossalAI's cpu_adam took 40 s and fused_optim more than 80 s before the first step);
`vit-scale prepare` builds them first. Each strategy family names what it needs
(`Family.jit_kernels`); the names here are "<package>.<kernel>".
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
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
    key: str  # deepspeed.cpu_adam
    package: str  # deepspeed | colossalai
    loader: str  # DeepSpeed op builder or ColossalAI kernel loader class
    op: str  # the extension's name, as its .so is called
    devices: tuple  # device kinds it exists for
    nvcc: tuple = ()  # device kinds on which building or loading it needs the CUDA toolkit

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
        newest = max(
            (
                os.path.getmtime(p)
                for p in glob.glob(os.path.join(self.build_dir(), "**"), recursive=True)
                if os.path.exists(p)
            ),
            default=0,
        )
        return lock if time.time() - newest > STALE_LOCK_S else None

    def load(self) -> None:
        use_venv_tools()
        if self.package == "deepspeed":
            from deepspeed.accelerator import get_accelerator

            get_accelerator().create_op_builder(self.loader).load(verbose=False)
        else:
            from colossalai.kernel import kernel_loader

            getattr(kernel_loader, self.loader)().load()


# DeepSpeed's cpu_adam is a g++ build on every accelerator (accelerator/cuda_accelerator.py,
# _lazy_init_class_dict takes CPUAdamBuilder from op_builder/cpu); its quantizer is a CUDAOpBuilder,
# whose nvcc flags read the toolkit's release (op_builder/builder.py, installed_cuda_version) even
# for a kernel built before. ColossalAI's loaders check the toolkit before loading anything
# (kernel/extensions/cuda_extension.py, _CudaExtension.assert_compatible).
KERNELS = {
    k.key: k
    for k in (
        Kernel("deepspeed.cpu_adam", "deepspeed", "CPUAdamBuilder", "cpu_adam", ("cpu", "cuda", "rocm")),
        Kernel("deepspeed.quantizer", "deepspeed", "QuantizerBuilder", "quantizer", ("cuda", "rocm"), nvcc=("cuda",)),
        # its x86 loader is a CUDA extension too
        Kernel("colossalai.cpu_adam", "colossalai", "CPUAdamLoader", "cpu_adam", ("cuda",), nvcc=("cuda",)),
        Kernel(
            "colossalai.fused_optim", "colossalai", "FusedOptimizerLoader", "fused_optim", ("cuda",), nvcc=("cuda",)
        ),
    )
}


def kernels_for(labels, device_kind: str) -> list[Kernel]:
    """What the strategies of `labels` need on `device_kind`, each kernel once, in a stable order."""
    from vit_scale.distributed import FAMILIES, parse_strategy

    keys: dict = {}
    for label in labels:
        parsed = parse_strategy(label)
        for key in FAMILIES[parsed.family].jit_kernels(parsed.label, device_kind):
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


# ---------------------------------------------------------------- the CUDA toolkit that builds them


def cuda_home(environ=None) -> str | None:
    """The toolkit torch's extension builder would use, found as torch.utils.cpp_extension
    (_find_cuda_home) finds it: $CUDA_HOME or $CUDA_PATH, else two levels above `nvcc` on PATH, else
    /usr/local/cuda if it exists. Read now, not at import, so a module loaded since counts."""
    environ = os.environ if environ is None else environ
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    if home:
        return home
    nvcc = shutil.which("nvcc", path=environ.get("PATH", ""))
    if nvcc:
        return os.path.dirname(os.path.dirname(nvcc))
    return "/usr/local/cuda" if os.path.exists("/usr/local/cuda") else None


def nvcc_release(home: str) -> str | None:
    """'12.4' from `HOME/bin/nvcc --version` (the line DeepSpeed and ColossalAI parse), or None."""
    try:
        out = subprocess.run(
            [os.path.join(home, "bin", "nvcc"), "--version"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"release (\d+)\.(\d+)", out)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def toolkit_problem(torch_cuda: str | None, home: str | None, release: str | None) -> str | None:
    """What stops DeepSpeed and ColossalAI building CUDA kernels for this torch, and what to do; None
    when nothing does. A toolkit of another major version than torch's CUDA: ColossalAI refuses it
    (kernel/extensions/utils.py, check_system_pytorch_cuda_match, from assert_compatible before any
    load); DeepSpeed refuses it for ahead-of-time builds (op_builder/builder.py,
    assert_no_cuda_mismatch) but its JIT load (OpBuilder.jit_load) compiles with whatever nvcc it
    finds, against torch's CUDA. A minor difference only warns (ColossalAI; torch's
    cpp_extension._check_cuda_version)."""
    if not torch_cuda:
        return None  # not a CUDA build of torch: nothing is built with nvcc
    major = torch_cuda.split(".")[0]
    fix = (
        f"load a cuda module of CUDA {major}.x (e.g. `module load cuda/{major}`; env/cuda.sh loads "
        f"VIT_SCALE_MODULES, default `cuda`) or set CUDA_HOME to a CUDA {major} toolkit"
    )
    if home is None:
        return (
            f"no CUDA toolkit to build kernels with (CUDA_HOME and CUDA_PATH unset, no nvcc on PATH, no "
            f"/usr/local/cuda), and this torch is built with CUDA {torch_cuda}: {fix}"
        )
    if release is None:
        return f"{os.path.join(home, 'bin', 'nvcc')} did not run or report its release (CUDA_HOME={home}): {fix}"
    if release.split(".")[0] != major:
        return (
            f"the CUDA toolkit at {home} is {release} but this torch is built with CUDA {torch_cuda}, and no "
            f"kernel builds across CUDA major versions (ColossalAI refuses, DeepSpeed would compile against the "
            f"wrong CUDA): {fix}"
        )
    return None


def toolkit_problem_here(kernels, device_kind: str, torch_cuda: str | None, environ=None) -> str | None:
    """toolkit_problem for this machine, when one of `kernels` needs nvcc on `device_kind`."""
    if not any(device_kind in kernel.nvcc for kernel in kernels):
        return None
    home = cuda_home(environ)
    return toolkit_problem(torch_cuda, home, nvcc_release(home) if home else None)
