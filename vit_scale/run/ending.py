"""The end record's figures, computed in one place from what the meter measured, and the
summary lines that state them.

`end_record` turns a meter's `Figures` (or none: a run stopped before its loop) into the one
`EndRecord` shape; the recipes and the session only say what differs (the status, the memory
over every rank at a clean end, the replica check, the recipe's own keys).
"""

from __future__ import annotations

import math
import os
import statistics
import time

from vit_scale.record.end import EndRecord
from vit_scale.record.health import slow_node_text

LAUNCHED_AT = "VIT_SCALE_LAUNCHED_AT"  # the launch's epoch time (s), set by the study for each run it starts


def launched_at() -> float | None:
    """When the orchestrator launched this run (epoch seconds, from LAUNCHED_AT); None when not told."""
    try:
        value = float(os.environ.get(LAUNCHED_AT, ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def time_split(figures, launched: float | None) -> dict:
    """Where this run's wall time went, now (as the end record is written), on this rank's clocks:
    `startup_s` launch to the loop's start (processes, imports, process group, model; null when the launch
    time is not known), `warmup_s` the loop's start to the timed window's opening, `timed_s` the window
    (open to closed), `rest_s` after it (end-of-run checks, gathering, profiled steps, this record), and
    `wall_s` their sum (from the loop's start when the launch time is not known). A run stopped before its
    loop is all start-up; one stopped inside the warm-up or the window has nothing after."""
    now, epoch = time.perf_counter(), time.time()
    if figures is None:
        startup = epoch - launched if launched else None
        return {"launched_at": launched, "startup_s": startup, "warmup_s": None, "timed_s": None, "rest_s": None,
                "wall_s": startup}  # fmt: skip
    started = figures.started_at
    startup = (epoch - (now - started)) - launched if launched else None
    opened, closed = figures.opened_at, figures.closed_at
    warmup = (opened if opened is not None else now) - started
    timed = ((closed if closed is not None else now) - opened) if opened is not None else 0.0
    rest = now - closed if closed is not None else 0.0
    return {
        "launched_at": launched,
        "startup_s": startup,
        "warmup_s": warmup,
        "timed_s": timed,
        "rest_s": rest,
        "wall_s": (startup or 0.0) + warmup + timed + rest,
    }


def memory_summary(device_type: str, peaks: list[dict], window: str) -> dict:
    summary = {"device_kind": device_type, "window": window}
    for key in peaks[0]:
        values = [p[key] for p in peaks]
        summary[key] = {"max": max(values), "mean": statistics.fmean(values), "per_rank": values}
    return summary


def images_per_s(step_times: list[float], images_per_step: int, window_s: float | None = None) -> dict | None:
    """images/s over the timed steps: the mean is the images of all timed steps over the timed
    window (the slowest rank's, synchronised at its ends) when there is one, else the mean of
    the per-step figures; the spread is always the per-step figures'."""
    per_step = [images_per_step / t for t in step_times if t > 0]
    if not per_step:
        return None
    mean = len(step_times) * images_per_step / window_s if window_s else statistics.fmean(per_step)
    return {
        "mean": mean,
        "std": statistics.pstdev(per_step),
        "min": min(per_step),
        "max": max(per_step),
        "median": statistics.median(per_step),
    }


def end_record(
    status: str,
    error: str | None,
    failed_rank: int | None,
    figures,
    *,
    device_type: str,
    world_size: int,
    flops_per_image: int,
    peak_tflops: float | None,
    peaks: list[dict] | None = None,
    rates: bool = True,
    replicas_agree: bool | None = None,
    replica_checksums: list | None = None,
    extra: dict | None = None,
    launched: float | None = None,
) -> EndRecord:
    """The end record. `figures`: the meter's result, None before the loop started. `peaks`: every
    rank's memory peak (a clean end gathers them); by default this rank's alone. `rates`: whether
    TFLOP/s and MFU are stated (the benchmark states them only at a clean end). `launched`: the launch's
    epoch time, for `time_split` (written first among the extra keys)."""
    extra = {"time_split": time_split(figures, launched), **(extra or {})}
    if figures is None:
        return EndRecord(status, error, failed_rank, extra=extra)
    ips = images_per_s(figures.step_times, figures.images_per_step, figures.window_s)
    tflops = flops_per_image * ips["mean"] / world_size / 1e12 if rates and ips and flops_per_image else None
    return EndRecord(
        status,
        error,
        failed_rank,
        steps_done=figures.steps_done,
        timed_steps=len(figures.step_times),
        wall_time_s=time.perf_counter() - figures.started_at,
        images_per_s=ips,
        images_per_s_per_device=ips["mean"] / world_size if ips else None,
        memory=memory_summary(device_type, peaks or [figures.memory], figures.memory_window),
        tflops_per_device=tflops,
        mfu=tflops / peak_tflops if tflops is not None and peak_tflops else None,
        replicas_agree=replicas_agree,
        replica_checksums=replica_checksums,
        final_loss=figures.last_loss,
        extra=extra,
    )


def figure_lines(end: EndRecord) -> list[str]:
    """The end record's figures as the summary's lines, after the recipe's own."""
    lines = []
    ips = end.images_per_s
    if ips:
        lines.append(
            f"  images/s {ips['mean']:.1f} ± {ips['std']:.1f} "
            f"({end.images_per_s_per_device:.1f} per device) over {end.timed_steps} timed steps"
        )
    mem = end.memory or {}
    for key, label in (
        ("peak_allocated_gib", "peak allocated"),
        ("peak_reserved_gib", "peak reserved"),
        ("peak_active_gib", "peak active"),
        ("peak_rss_gib", "peak RSS"),
    ):
        if key in mem:
            lines.append(f"  {label} per rank: max {mem[key]['max']:.2f} GiB, mean {mem[key]['mean']:.2f} GiB")
    if end.tflops_per_device is not None:
        mfu = f"{end.mfu * 100:.1f}%" if end.mfu is not None else "n/a (no peak known; set system.peak_tflops)"
        lines.append(f"  {end.tflops_per_device:.3f} TFLOP/s per device, MFU {mfu}")
    split = end.get("time_split") or {}
    if split.get("wall_s") is not None and split.get("timed_s") is not None:
        startup = f"start-up {split['startup_s']:.1f} s, " if split.get("startup_s") is not None else ""
        lines.append(
            f"  wall time {split['wall_s']:.1f} s: {startup}warm-up {split['warmup_s']:.1f} s, timed window "
            f"{split['timed_s']:.1f} s, the rest {split['rest_s']:.1f} s"
        )
    if end.replicas_agree is not None:
        lines.append(f"  replicas agree: {'yes' if end.replicas_agree else 'NO'}")
    if end.get("checkpoint"):
        lines.append(f"  checkpoint: {end.get('checkpoint')}")
    slow = slow_node_text(end.get("nodes_health"))
    if slow:  # the run's figures are that node's: docs/run_record.md, nodes_health
        lines.append(f"  {slow}")
    return lines
