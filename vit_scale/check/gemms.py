"""The compute part of `vit-scale check`: the matrix multiplies one ViT Block runs, timed on this
rank's device at the model's shapes, batch and precision (vit_scale.planning.compute.block_gemms
names them; the planner scales them to a step). Rank 0 runs it alone, before the world's process
group, as the meter does, so that nothing else computes meanwhile.

Each GEMM: a few warm-up calls, one call timed to size the windows, then timed windows of the same
number of calls into one preallocated output; the GEMM's seconds are the median window over its
calls. On a GPU each window is bracketed by device events and the host waits once, after the last
window (a wait between windows would time the launch gaps it leaves, not the GEMM); on a CPU by
time.perf_counter.
"""

from __future__ import annotations

import statistics
import time

# (warm-up calls, timed windows, seconds a window aims at): quick runs in the study's --check
SETTINGS = {"quick": (2, 3, 0.002), "full": (5, 5, 0.02)}
MAX_CALLS = 200  # a window's calls, at most (tiny GEMMs on a fast device)
DTYPES = ("fp32", "bf16", "fp16")


def operands(op: dict, dtype, device):
    """A and B of `op` (block_gemms' sizes), laid out as the library reads them: a transposed operand
    is a transposed view of a contiguous tensor, as dY^T of a Linear's weight gradient is; with batch 1
    the 2-D matrices a Linear multiplies. The output, preallocated."""
    import torch

    def matrix(rows, cols, transposed):
        lead = (op["batch"],) if op["batch"] > 1 else ()
        if transposed:
            return torch.randn(*lead, cols, rows, dtype=dtype, device=device).transpose(-1, -2)
        return torch.randn(*lead, rows, cols, dtype=dtype, device=device)

    a = matrix(op["m"], op["k"], op["a_t"])
    b = matrix(op["k"], op["n"], op["b_t"])
    out = torch.empty(*((op["batch"],) if op["batch"] > 1 else ()), op["m"], op["n"], dtype=dtype, device=device)
    return a, b, out


def time_calls(fn, gpu: bool, quick: bool) -> tuple[float, int, int]:
    """(seconds a call, calls a window, windows) of `fn`. GPU path: cannot run here (no GPU on the
    machines the tests run on); tests/test_compute_from_check.py checks its order of events and waits
    with torch.cuda's Event and synchronize replaced."""
    import torch

    warmup, windows, target = SETTINGS["quick" if quick else "full"]
    for _ in range(warmup):
        fn()
    if gpu:
        torch.cuda.synchronize()  # the warm-up done, before the one call that sizes the windows
    t0 = time.perf_counter()
    fn()
    if gpu:
        torch.cuda.synchronize()
    one = time.perf_counter() - t0
    calls = max(1, min(MAX_CALLS, int(target / max(one, 1e-9))))
    if gpu:
        # torch.cuda.Event(enable_timing=True).record() enqueues on the current stream; elapsed_time is
        # in milliseconds and needs both events done: one synchronize on the last event covers them all
        marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(windows)]
        for start, end in marks:
            start.record()
            for _ in range(calls):
                fn()
            end.record()
        marks[-1][1].synchronize()
        times = [start.elapsed_time(end) / 1e3 for start, end in marks]
    else:
        times = []
        for _ in range(windows):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) / calls, calls, windows


def time_block(model: str, batch: int, precision: str, device_type: str, quick: bool, peak: float | None) -> dict:
    """One entry of check.json's compute: every GEMM of one Block of `model` at `batch` in `precision`."""
    import torch

    from vit_scale.models import get_spec
    from vit_scale.planning.compute import block_gemms
    from vit_scale.planning.shapes import Shape

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    gpu = device_type != "cpu"
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    shape = Shape.from_spec(get_spec(model))
    ops = []
    for op in block_gemms(shape, batch):
        a, b, out = operands(op, dtype, device)
        seconds, calls, windows = time_calls(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), gpu, quick)
        del a, b, out
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
