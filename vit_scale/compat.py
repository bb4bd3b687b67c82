"""What differs between the machines the code runs on: timm on a CPU-only torch, and the C library.

PyPI's torchvision wheels are CUDA builds: on a CPU torch their compiled ops fail to register
and `import torchvision` dies on the fake-kernel registration for `torchvision::nms`.
timm imports torchvision, so without this a laptop or CI machine cannot build a ViT.
Defining the two op schemas that torchvision's Python code registers fake kernels for lets the
import succeed; only torchvision's compiled detection ops stay unusable, and ViT training
never calls them. Must run before anything imports torchvision (timm, transformers, colossalai).

libc(): the C library, for the few calls Python has no wrapper for (prctl, malloc_trim).
"""

import sys

_done = False


def ensure_torchvision_importable() -> None:
    global _done
    if _done or "torchvision" in sys.modules:
        _done = True
        return
    import torch

    if torch.version.cuda is None and torch.version.hip is None:
        try:
            # a torchvision with working CPU ops needs nothing; the lookup is the probe
            torch.ops.torchvision.nms  # noqa: B018
        except (AttributeError, RuntimeError):
            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
            # keep the library object alive: dropping it unregisters the schemas
            sys.modules[__name__]._torchvision_stub_lib = lib
    _done = True


def libc():
    """This process's C library (errno kept for ctypes.get_errno), or None where it cannot be loaded.
    Load it before forking: a forked child must not load libraries."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
