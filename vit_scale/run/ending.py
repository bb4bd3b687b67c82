"""The end record's figures, computed in one place from what the meter measured, and the
summary lines that state them.

`end_record` turns a meter's `Figures` (or none: a run stopped before its loop) into the one
`EndRecord` shape; the recipes and the session only say what differs (the status, the memory
over every rank at a clean end, the replica check, the recipe's own keys).
"""

from __future__ import annotations

import statistics
import time

from vit_scale.record.end import EndRecord


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
) -> EndRecord:
    """The end record. `figures`: the meter's result, None before the loop started. `peaks`: every
    rank's memory peak (a clean end gathers them); by default this rank's alone. `rates`: whether
    TFLOP/s and MFU are stated (the benchmark states them only at a clean end)."""
    if figures is None:
        return EndRecord(status, error, failed_rank, extra=dict(extra or {}))
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
        extra=dict(extra or {}),
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
    if end.replicas_agree is not None:
        lines.append(f"  replicas agree: {'yes' if end.replicas_agree else 'NO'}")
    if end.get("checkpoint"):
        lines.append(f"  checkpoint: {end.get('checkpoint')}")
    return lines
