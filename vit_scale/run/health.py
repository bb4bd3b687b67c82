"""Every run's node-health probe: after the timed window has closed, each rank times its Block's
forward GEMMs (as the check builds them, vit_scale.run.gemm_timing: on a GPU by the check's rules,
windows of calls bracketed by device events; on a CPU windows of a fixed length on the host clock)
and, on a GPU, its device's memory copy rate, in about `budget_s` seconds; rank 0 gathers every
rank's figures into the end record's `nodes_health` (per host its slowest rank's, and the median
node: vit_scale.record.health, which also holds the rule that calls a node slow). The timed
window's figures are taken before it runs and nothing here changes them (docs/timing.md). A
failing probe fails nothing: its rank's figures are None and its error is recorded.

`rank_figures` is this rank's measurement alone (no collective): the check's per-node part may call
it too.
"""

from __future__ import annotations

import contextlib
import statistics
import time

from vit_scale.launch.signals import RunInterrupted
from vit_scale.record.health import by_node

# shares of the budget: on a GPU the GEMM windows, then the copy windows (the rest is warm-up and
# sizing); on a CPU, which has no copy part, the GEMM windows (the rest is one warm-up call)
GEMM_SHARE, COPY_SHARE, CPU_GEMM_SHARE = 0.5, 0.2, 0.8
MAX_CALLS = 1000  # a window's calls, at most
COPY_MIB = 256  # the copied buffer, at most (a quarter of the free device memory where that is less)
GEMM_PASS = "forward"  # the probe's fixed subset of the Block's GEMMs: its forward ones


def rank_figures(
    device,
    model_name: str,
    batch_size: int,
    precision: str,
    windows: int = 3,
    budget_s: float = 1.0,
    window_s: float | None = None,
    before_window=None,
):
    """This rank's figures on `device` (a torch.device or its name): `gemm_tflops` (the median window's
    rate over the Block's forward GEMMs of `model_name` at `batch_size` in `precision`, run one after
    the other as one call), `gemm_tflops_windows` (every window's), `copy_gbps` (GB/s copied
    device-to-device on a GPU, the median window's; each byte is read and written, so the memory
    traffic is twice it; None on a CPU), `copy_gbps_windows`, `seconds` (what this took), `timer`.
    Windows aim at budget_s x GEMM_SHARE (and COPY_SHARE) over `windows`; on a CPU they last
    budget_s x CPU_GEMM_SHARE over `windows`, however many calls fit. `window_s`: the GEMM windows' length
    instead (the check's nodes part: several CPU quota periods a window); `before_window`: on a CPU, called
    before each GEMM window (the check's barrier: every rank's windows at once). A single call longer than that
    (a large model on a CPU) makes the probe longer than the budget. Raises what torch raises."""
    import torch

    from vit_scale.run.gemm_timing import block_ops, clock_windows, gemm_calls, time_windows

    started = time.perf_counter()
    device = torch.device(device)
    gpu = device.type != "cpu"
    on_device = torch.cuda.device(device) if gpu else contextlib.nullcontext()
    with on_device:
        ops = [op for op in block_ops(model_name, batch_size) if op["pass"] == GEMM_PASS]
        flops = sum(op["flops"] for op in ops)
        block = _one_call(call for _, call in gemm_calls(ops, precision, device))
        if gpu:
            target = window_s or budget_s * GEMM_SHARE / windows
            calls, times = time_windows(block, gpu, 1, windows, target, MAX_CALLS)
            timed = [(calls, t) for t in times]
        else:
            timed = clock_windows(
                block, 1, windows, window_s or budget_s * CPU_GEMM_SHARE / windows, before=before_window
            )
        del block  # its tensors, before the copy's buffers
        gemm = [flops * calls / t / 1e12 for calls, t in timed if t > 0]
        copy = _copy_rates(device, windows, budget_s * COPY_SHARE / windows) if gpu else []
    return {
        "gemm_tflops": statistics.median(gemm) if gemm else None,
        "gemm_tflops_windows": gemm,
        "copy_gbps": statistics.median(copy) if copy else None,
        "copy_gbps_windows": copy,
        "seconds": time.perf_counter() - started,
        "timer": "device events, one wait after the last window"
        if gpu
        else "time.perf_counter, windows of fixed length",
    }


def _one_call(calls):
    """One call that runs each of `calls` once, in turn (the Block's GEMMs as one pass)."""
    calls = list(calls)

    def block():
        for call in calls:
            call()

    return block


def _copy_rates(device, windows: int, target_s: float) -> list[float]:
    """GB/s of one buffer copied into another on the device, per window (event-timed: no GPU here;
    tests/test_node_health.py runs it with torch.cuda replaced)."""
    import torch

    from vit_scale.run.gemm_timing import time_windows

    free, _ = torch.cuda.mem_get_info(device)
    size = max(1 << 20, min(COPY_MIB << 20, free // 4))
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    calls, times = time_windows(lambda: dst.copy_(src), True, 1, windows, target_s, MAX_CALLS)
    return [size * calls / t / 1e9 for t in times if t > 0]


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


def nodes_health(world, model_name: str, batch_size: int, precision: str, budget_s: float) -> dict:
    """Every rank: probe, then gather the figures over the run's world group (a collective); the end
    record's `nodes_health`, the same on every rank. Raises only a stop signal's RunInterrupted: any
    other failure is its rank's `error` (or, where the gather failed, the record's)."""
    import torch.distributed as dist

    row = {"node": world.node_name, "rank": world.rank}
    try:
        figures = rank_figures(world.device, model_name, batch_size, precision, budget_s=budget_s)
        row.update({k: figures[k] for k in ("gemm_tflops", "copy_gbps", "seconds")})
    except RunInterrupted:  # a signal is the run's to handle (its end record, a requeue), not a failed probe
        raise
    except Exception as exc:  # the run's figures are taken already: a probe that fails costs it nothing
        row["error"] = one_line(exc)
    try:
        rows = [None] * world.world_size
        dist.all_gather_object(rows, row)
    except RunInterrupted:
        raise
    except Exception as exc:
        return {"hosts": {}, "median": {}, "probe": None, "error": f"not gathered: {one_line(exc)}"}
    seconds = [r["seconds"] for r in rows if isinstance(r.get("seconds"), float)]
    return {
        **by_node(rows, shared_cores=world.device_type == "cpu"),
        "probe": {
            "model": model_name,
            "batch_size": batch_size,
            "precision": precision,
            "gemms": GEMM_PASS,
            "budget_s": budget_s,
            "seconds": max(seconds) if seconds else None,
        },
        "error": None,  # a rank whose probe failed says so in its host's entry
    }
