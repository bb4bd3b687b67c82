"""The compute part of `vit-scale check`: the matrix multiplies one ViT Block runs, timed on this
rank's device at the model's shapes, batch and precision (vit_scale.planning.compute.block_gemms
names them; the planner scales them to a step). Rank 0 runs it alone, before the world's process
group, as the meter does, so that nothing else computes meanwhile.

Each GEMM is built and timed by vit_scale.run.gemm_timing (the rules every run's node-health probe
shares): a few warm-up calls, one call timed to size the windows, then timed windows of the same
number of calls into one preallocated output; the GEMM's seconds are the median window over its
calls. On a GPU each window is bracketed by device events and the host waits once, after the last
window; on a CPU by time.perf_counter.
"""

from __future__ import annotations

import statistics

from vit_scale.run.gemm_timing import DTYPE_NAMES, block_ops, gemm_calls, time_windows

# (warm-up calls, timed windows, seconds a window aims at): quick runs in the study's --check
SETTINGS = {"quick": (2, 3, 0.002), "full": (5, 5, 0.02)}
MAX_CALLS = 200  # a window's calls, at most (tiny GEMMs on a fast device)
DTYPES = DTYPE_NAMES


def time_calls(fn, gpu: bool, quick: bool) -> tuple[float, int, int]:
    """(seconds a call, calls a window, windows) of `fn`, by the shared rules
    (vit_scale.run.gemm_timing.time_windows) at the check's quick or full settings."""
    warmup, windows, target = SETTINGS["quick" if quick else "full"]
    calls, times = time_windows(fn, gpu, warmup, windows, target, MAX_CALLS)
    return statistics.median(times) / calls, calls, windows


def time_block(model: str, batch: int, precision: str, device_type: str, quick: bool, peak: float | None) -> dict:
    """One entry of check.json's compute: every GEMM of one Block of `model` at `batch` in `precision`."""
    import torch

    from vit_scale.models import get_spec
    from vit_scale.planning.shapes import Shape

    gpu = device_type != "cpu"
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    shape = Shape.from_spec(get_spec(model))
    ops = []
    for op, call in gemm_calls(block_ops(model, batch), precision, device):
        seconds, calls, windows = time_calls(call, gpu, quick)
        del call  # one GEMM's tensors at a time
        ops.append(
            {**op, "seconds": seconds, "tflops": op["flops"] / seconds / 1e12, "calls": calls, "windows": windows}
        )
    flops = sum(op["flops"] for op in ops)
    seconds = sum(op["seconds"] for op in ops)
    achieved = flops / seconds / 1e12
    return {
        "model": model,
        "precision": precision,
        "batch_size": batch,
        "tokens": batch * shape.T,
        "ops": ops,
        "flops": flops,
        "seconds": seconds,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        # against the profile's dense peak; without one (a CPU) the achieved rate is the figure
        "efficiency": achieved / peak if peak else None,
    }


def measure(world, spec: dict) -> dict:
    """check.json's compute: the check's model at its batch, in each of its precisions, on rank 0's device."""
    import torch

    gpu = world.device_type != "cpu"
    if gpu:
        torch.cuda.set_device(world.device_index)
    peaks = spec.get("peak_tflops") or {}
    entries = [
        time_block(spec["model"], spec["batch_size"], p, world.device_type, spec["quick"], peaks.get(p))
        for p in spec["precisions"]
    ]
    return {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "timer": "device events, one wait after the last window" if gpu else "time.perf_counter",
        "error": None,
        "entries": entries,
    }
