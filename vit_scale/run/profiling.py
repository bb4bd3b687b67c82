"""profile.enabled: a few more steps after the timed window, recorded with torch.profiler, one Chrome
trace per rank (trace_rank<k>.json.gz in the run directory). The timed window has ended and its
figures are taken before the profiler starts, so no figure of the run includes its overhead.

Each recorded step is wrapped in a `vit_scale.step#<k>` range: the analysis (analysis/traces.py)
splits the trace into steps by these marks.
"""

from __future__ import annotations

import gzip
import os
import shutil
import time

STEP_MARK = "vit_scale.step#"


def profiled_ranks(text: str, world_size: int) -> list[int]:
    if text == "all":
        return list(range(world_size))
    return sorted({int(r) for r in text.replace(" ", "").split(",") if int(r) < world_size})


def record_traces(session, run_step, steps: int, ranks_text: str) -> dict:
    """Run `steps` more steps (every rank: the collectives must match), traced on the chosen ranks;
    returns what the end record says of it (the same on every rank)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    world = session.world
    ranks = profiled_ranks(ranks_text, world.world_size)
    gpu = world.device_type != "cpu"
    started = time.perf_counter()
    dist.barrier()
    name = None
    if world.rank in ranks:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        with profile(activities=activities) as prof:
            for k in range(steps):
                with record_function(f"{STEP_MARK}{k + 1}"):
                    run_step(k)
                    if gpu:  # the step's kernels inside its mark, so that steps do not overlap in the trace
                        torch.cuda.synchronize()
        name = f"trace_rank{world.rank}.json.gz"
        plain = os.path.join(session.run_dir, f"trace_rank{world.rank}.json")
        prof.export_chrome_trace(plain)
        with open(plain, "rb") as src, gzip.open(plain + ".gz", "wb", compresslevel=5) as dst:
            shutil.copyfileobj(src, dst)
        os.remove(plain)
    else:
        for k in range(steps):
            run_step(k)
        if gpu:
            torch.cuda.synchronize()
    names = [None] * world.world_size
    dist.all_gather_object(names, name)
    return {
        "steps": steps,
        "ranks": ranks,
        "traces": [n for n in names if n],
        "seconds": round(time.perf_counter() - started, 3),
    }
