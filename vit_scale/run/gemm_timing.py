"""Timing a ViT Block's matrix multiplies on this rank's device: the one set of rules that the
check's compute part (vit_scale.check.gemms) and every run's node-health probe (vit_scale.run.health)
share, so that the figures they give are of the same GEMMs timed the same way.

The GEMMs are those vit_scale.planning.compute.block_gemms names for a model at a batch, each
built as the library runs it (a transposed operand is a transposed view) into one preallocated
output. A measurement: a few warm-up calls, one call timed to size the windows, then timed windows
of the same number of calls. On a GPU each window is bracketed by device events and the host waits
once, after the last window (a wait between windows would time the launch gaps it leaves, not the
GEMMs); on a CPU by time.perf_counter.
"""

from __future__ import annotations

import time

DTYPE_NAMES = ("fp32", "bf16", "fp16")


def dtype_of(precision: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


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


def block_ops(model: str, batch: int) -> list[dict]:
    """block_gemms of `model` at `batch` images (sizes and FLOPs, no tensors)."""
    from vit_scale.models import get_spec
    from vit_scale.planning.compute import block_gemms
    from vit_scale.planning.shapes import Shape

    return block_gemms(Shape.from_spec(get_spec(model)), batch)


def gemm_calls(ops: list[dict], precision: str, device):
    """(op, call) for each of `ops`: a call runs that GEMM once on `device` into its own output. The
    operands are made as each pair is handed out, so a caller that times one at a time and drops it
    holds one GEMM's tensors at a time."""
    import torch

    dtype = dtype_of(precision)
    for op in ops:
        a, b, out = operands(op, dtype, device)
        yield op, (lambda a=a, b=b, out=out: torch.matmul(a, b, out=out))
        del a, b, out


def time_windows(fn, gpu: bool, warmup: int, windows: int, target_s: float, max_calls: int) -> tuple[int, list[float]]:
    """(calls a window, each window's seconds) of `fn`: `warmup` calls, one timed call that sizes the
    windows at about `target_s` each (at least 1 call, at most `max_calls`), then the windows. GPU
    path: cannot run here (no GPU on the machines the tests run on); tests/test_compute_from_check.py
    checks its order of events and waits with torch.cuda's Event and synchronize replaced."""
    import torch

    for _ in range(warmup):
        fn()
    if gpu:
        torch.cuda.synchronize()  # the warm-up done, before the one call that sizes the windows
    t0 = time.perf_counter()
    fn()
    if gpu:
        torch.cuda.synchronize()
    one = time.perf_counter() - t0
    calls = max(1, min(max_calls, int(target_s / max(one, 1e-9))))
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
        return calls, [start.elapsed_time(end) / 1e3 for start, end in marks]
    times = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append(time.perf_counter() - t0)
    return calls, times


def clock_windows(fn, warmup: int, windows: int, window_s: float, before=None) -> list[tuple[int, float]]:
    """CPU only: (calls, seconds) of each of `windows` windows that run `fn` until `window_s` has passed
    on the host clock. The windows' length, not their calls, is fixed: ranks sharing cores (emulated
    nodes, a CPU quota) would stretch windows sized by one quick call many times over, and a window
    shorter than the scheduler's quota period would miss a throttled node. `before`: called before each
    window (a barrier, so that every rank's window i runs at once: a rank whose window ran while the
    others had finished would get their cores and read fast)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(windows):
        if before is not None:
            before()
        calls, t0 = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= window_s:
                break
        out.append((calls, elapsed))
    return out
