"""All-reduce, all-gather and reduce-scatter at the sizes the strategies use, timed the way
nccl-tests times them, within a node and across nodes.

Sizes: the latency sizes (8 B to 4 KiB), one Block's parameters in the run's precision (what
FSDP all-gathers before a Block's forward and reduce-scatters after its backward), DDP's
gradient bucket (25 MiB of fp32 gradients, torch's default bucket_cap_mb) and, in full mode, ZeRO's
bucket (DeepSpeed's reduce_bucket_size and allgather_bucket_size, at most the whole model) and a
sweep in steps of 8x from 8 B to the largest of these, so that an alpha-beta line
(vit_scale.planning.alpha_beta.fit) is fitted per collective, scope and group size from at least 8
sizes. Group sizes (full mode): every one the allocation can form (group_sizes: 2, 4, ... ranks within
a node, 2, 4, ... nodes across), the groups of a size partitioning the ranks and measuring at once;
the per-step fit over all of them (vit_scale.planning.step_fit.fit_steps, step_fits_of) is what the
planner prices a collective with.
Bounds: a size whose buffers would take more than MEMORY_SHARE of a rank's free memory is left out,
and the sweep's sizes (not the named ones) stop where a collective's share of the time budget
(Settings.sweep_budget_s) would run out; what was left out, and why, is in the measurements' list.

Bandwidths, as nccl-tests' PERFORMANCE.md defines them, for S bytes in t seconds on n ranks
(S: the all-reduce's buffer, the all-gather's whole output, the reduce-scatter's whole input):
  algbw = S / t
  busbw = algbw * 2(n-1)/n   all-reduce
  busbw = algbw * (n-1)/n    all-gather, reduce-scatter
busbw is what each rank's link carries, comparable across rank counts and with the link's speed.

Each measurement: a checking call, warm-up, `repeats` timed windows of an agreed number of
iterations (from the warm-up's time, so that a slow 25 MiB all-gather on a CPU takes a fraction
of a second and a fast one on a GPU gets many iterations), device events on a GPU and
perf_counter after a barrier on a CPU, the slowest rank's time; the median window is the time,
half the windows' range its spread (the fit's noise when it asks whether latency runs backwards).

The checking call runs the collective once on an fp32 buffer of the same length, whatever the
timed precision, and compares the result exactly. In bf16 the library rounds each ring hop's
partial sum to 8 significant bits: from 24 ranks on the true sum is off by more than 1% although
nothing is wrong (fp16 overflows past 362 ranks). fp32 is exact only on integers up to 2**24, so
what a rank sends for a sum is chosen to keep every partial sum below that at any rank count
(`check_value`): whatever order or grouping the library adds in (rings starting anywhere, in
either direction, trees), each partial sum is a sum of some ranks' positive integers, at most the
total, so it is exact. A gather adds nothing: each rank sends its group rank + 1, in order. A
wrong result on any rank makes the measurement wrong on every rank.

The size arithmetic here is torch-free; torch is imported inside the functions that measure.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

from vit_scale.text import human_bytes, human_seconds

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DDP_BUCKET_BYTES = 25 * 2**20  # torch DistributedDataParallel's bucket_cap_mb default
LATENCY_SIZES = (8, 64, 512, 4096)
QUICK_LATENCY_SIZES = (8, 4096)
# quick mode's third small size: large enough that a slow link's bandwidth shows in its time (on a 25 Mbit/s
# emulated link 20 ms, several times the latency), so that the named sizes can follow the rate it finds
QUICK_RATE_SIZE = 64 * 1024
# after the world's rendezvous, how long any collective of the check may wait for its peers
COLLECTIVE_TIMEOUT_S = 300
EXACT_FP32 = 2**24  # every integer up to this is exact in fp32


SIZE_NAMES = ("latency", "sweep", "block", "bucket", "zero_bucket")
NAMED_SIZES = ("block", "bucket", "zero_bucket")  # the strategies' own messages: measured whatever the budget
SWEEP_STEP = 8  # the sweep's sizes: 8 B, 64 B, ... (x8) up to the largest message
MEMORY_SHARE = 0.25  # of a rank's free memory, the most one measurement's buffers may take


@dataclass(frozen=True)
class Size:
    name: str  # one of SIZE_NAMES
    nbytes: int  # asked for; the measured size is rounded up to whole elements per rank
    precision: str  # element type: fp32, bf16, fp16
    what: str  # for the table: "vit_base Block", "DDP bucket", "8 B"


@dataclass(frozen=True)
class Settings:
    warmup: int
    min_iterations: int
    max_iterations: int
    budget_s: float  # about how long the timed iterations of one measurement may take
    repeats: int = 2  # timed windows per measurement: their range is the point's noise
    sweep_budget_s: float = 120.0  # about how long every collective's sweep may take, both scopes together
    # quick mode: a named size (a Block, a bucket) expected to take longer than this a call, at the rate the
    # smaller sizes found, is measured at the largest size that takes about this long instead (None: never)
    call_cap_s: float | None = None


FULL = Settings(warmup=5, min_iterations=3, max_iterations=100, budget_s=1.0, repeats=3, sweep_budget_s=120.0)
QUICK = Settings(
    warmup=1, min_iterations=2, max_iterations=20, budget_s=0.2, repeats=2, sweep_budget_s=20.0, call_cap_s=0.5
)


def bandwidths(collective: str, nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s, as nccl-tests prints them)."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * BUS_FACTOR[collective](ranks)


def block_bytes(model: str, precision: str) -> int:
    from vit_scale.models import get_spec
    from vit_scale.planning.shapes import Shape

    return Shape.from_spec(get_spec(model)).block_params * ELEMENT_BYTES[precision]


def zero_bucket_bytes(model: str, precision: str) -> int:
    """ZeRO's largest message: DeepSpeed's reduce / all-gather bucket (elements, the trainer's
    defaults), at most the whole model's parameters, in the run's precision."""
    from vit_scale.distributed.deepspeed import DeepSpeedConfig
    from vit_scale.models import get_spec
    from vit_scale.planning.shapes import Shape

    ds = DeepSpeedConfig()
    elements = min(max(ds.reduce_bucket_size, ds.allgather_bucket_size), Shape.from_spec(get_spec(model)).params)
    return elements * ELEMENT_BYTES[precision]


def sizes_for(model: str, precision: str, quick: bool) -> list[Size]:
    """Smallest first. Quick: 8 B, 4 KiB, a Block, DDP's bucket. Full: the sweep from 8 B in steps
    of SWEEP_STEP up to the largest named size, and the named sizes (a Block, DDP's bucket, ZeRO's)."""
    named = [
        Size("block", block_bytes(model, precision), precision, f"{model} Block"),
        Size("bucket", DDP_BUCKET_BYTES, "fp32", "DDP bucket"),
    ]
    if quick:
        latency = [Size("latency", n, "fp32", human_bytes(n)) for n in QUICK_LATENCY_SIZES]
        rate = [Size("sweep", QUICK_RATE_SIZE, "fp32", human_bytes(QUICK_RATE_SIZE))]
        return sorted(latency + rate + named, key=lambda size: (size.nbytes, size.name))
    named.append(Size("zero_bucket", zero_bucket_bytes(model, precision), precision, "ZeRO bucket"))
    largest = max(size.nbytes for size in named)
    sweep, n = [], LATENCY_SIZES[0]
    while n <= largest:
        sweep.append(Size("latency" if n <= LATENCY_SIZES[-1] else "sweep", n, "fp32", human_bytes(n)))
        n *= SWEEP_STEP
    taken = {size.nbytes for size in sweep}
    named = [size for size in named if size.nbytes not in taken or size.name != "zero_bucket"]
    return sorted(sweep + named, key=lambda size: (size.nbytes, size.name))


def elements(nbytes: int, element_bytes: int, ranks: int) -> int:
    """Whole elements, a multiple of the group's ranks (the all-gather's and reduce-scatter's
    pieces must be equal), at least one per rank."""
    per_rank = max(1, math.ceil(nbytes / element_bytes / ranks))
    return per_rank * ranks


def sum_cycle(ranks: int) -> int:
    """How many distinct values the ranks of a sum send (1 .. cycle, repeating over the ranks): as
    many as keep their total within EXACT_FP32."""
    return max(1, min(ranks, EXACT_FP32 // ranks))


def check_value(collective: str, rank: int, ranks: int) -> int:
    """What group rank `rank` of `ranks` sends in the checking call: its rank + 1 for a gather (the
    order is checked), for a sum a value from 1 to sum_cycle(ranks), so that the total, and so every
    partial sum, is an exact fp32 integer. Every value is at least 1: a rank left out or counted
    twice changes the total."""
    if collective == "all_gather":
        return rank + 1
    return rank % sum_cycle(ranks) + 1


def expected_sum(ranks: int) -> int:
    """The total of check_value over the group's ranks, in integers."""
    cycle = sum_cycle(ranks)
    whole, rest = divmod(ranks, cycle)
    return whole * cycle * (cycle + 1) // 2 + rest * (rest + 1) // 2


FIT_SCOPE = {"node": "intra", "world": "inter"}


def step_fits_of(measurements: list) -> list[dict]:
    """The per-step fit (vit_scale.planning.step_fit.fit_steps) of each collective in each scope from
    its right measurements at every group size: StepFit.as_dict() each, within a node before across
    nodes (an across-nodes fit takes its launch and in-node step latency from the within-node one)."""
    from vit_scale.planning.step_fit import Point, fit_steps

    points: dict = {}
    for m in measurements:
        if not m.get("correct") or not m.get("time_s"):
            continue
        nodes = int(m.get("nodes") or 1) if m["scope"] == "world" else 1
        point = Point(m["bytes"], m["time_s"], m.get("spread_s") or 0.0, m["ranks"], nodes)
        points.setdefault((m["collective"], FIT_SCOPE[m["scope"]]), []).append(point)
    out, intra = [], {}
    for scope in ("intra", "inter"):
        for collective in COLLECTIVES:
            if (collective, scope) not in points:
                continue
            mine = points[(collective, scope)]
            found = fit_steps(
                collective,
                scope,
                mine,
                intra=intra.get(collective),
                ranks_per_node=max(p.ranks // p.nodes for p in mine) if scope == "inter" else None,
            )
            if scope == "intra":
                intra[collective] = found
            out.append(found.as_dict())
    return out


def group_sizes(per_node: int, nodes: int, quick: bool) -> list[tuple[str, int, int]]:
    """(scope, ranks in a group, nodes it spans) of every group size measured: within a node 2, 4, ...
    ranks up to the node's (each dividing it, so that every rank is in one group), across nodes 2, 4, ...
    whole nodes up to all of them (each dividing the node count); quick mode only the largest of each."""

    def doublings(top: int) -> list[int]:
        out, n = [], 2
        while n < top:
            if top % n == 0:
                out.append(n)
            n *= 2
        return ([] if quick else out) + [top]

    scopes = [("node", m, 1) for m in doublings(per_node)] if per_node > 1 else []
    return scopes + ([("world", k * per_node, k) for k in doublings(nodes)] if nodes > 1 else [])


def partition(names: list, scope: str, ranks: int) -> list[list[int]]:
    """The groups of one group size, every rank in exactly one (so all ranks run the same calls, and the
    groups of a size measure at once, as the strategies' groups communicate at once): within a node,
    each node's ranks in runs of `ranks`; across nodes, the ranks of runs of ranks / per-node nodes."""
    by_node: dict = {}
    for r, name in enumerate(names):
        by_node.setdefault(name, []).append(r)
    if scope == "node":
        return [mine[i : i + ranks] for mine in by_node.values() for i in range(0, len(mine), ranks)]
    per_node = len(next(iter(by_node.values())))
    nodes = list(by_node.values())
    span = ranks // per_node
    return [sorted(r for node in nodes[i : i + span] for r in node) for i in range(0, len(nodes), span)]


def fits_of(measurements: list) -> list[dict]:
    """The alpha-beta fit (vit_scale.planning.alpha_beta.fit) of each collective in each scope at each
    group size, from its measured sizes (a wrong result is not a point), each point with its spread:
    alpha_beta.Fit.as_dict() each, in the order measured. A flagged fit is kept, flagged: the
    prediction does not use it and the check's table says why."""
    from vit_scale.planning.alpha_beta import fit

    # the world-scope fit was measured with every rank of each node in the group: its ranks per node
    # (alpha_beta.Network.link rescales its bandwidth for groups with another number)
    per_node = max((m["ranks"] for m in measurements if m.get("scope") == "node"), default=1)
    groups: dict = {}
    for m in measurements:
        if not m.get("correct") or not m.get("time_s"):
            continue
        groups.setdefault((m["collective"], m["scope"], m["ranks"]), {"ranks": m["ranks"], "points": []})[
            "points"
        ].append((m["bytes"], m["time_s"], m.get("spread_s")))
    out = []
    for (collective, scope, _), g in groups.items():
        k = g["ranks"] if scope == "node" else per_node
        found = fit(collective, FIT_SCOPE[scope], g["ranks"], g["points"], ranks_per_node=k).as_dict()
        if not (math.isfinite(found["alpha_us"]) and math.isfinite(found["max_rel_residual"])):
            continue  # no point with a time: nothing to fit (check.json stays strict JSON: no NaN)
        if not math.isfinite(found["bus_gbps"]):
            found["bus_gbps"] = 0.0  # time not growing with size: flagged "no bandwidth", never used
        out.append(found)
    return out


# ---------------------------------------------------------------- measuring (torch from here on)


def scopes_for(names: list) -> list[tuple[str, int]]:
    """(scope, ranks in it) for the node names of every rank in rank order: the same list on every
    rank, so that all of them run the same collectives (a rank deciding from its own node's size
    would wait in a collective its peers never call). Uneven placement is refused."""
    from vit_scale.errors import UserError

    counts = dict(Counter(names))
    if len(set(counts.values())) > 1:
        placed = ", ".join(f"{node} {n}" for node, n in counts.items())
        raise UserError(
            f"ranks per node: uneven placement ({placed}); allowed: the same number of ranks on every "
            f"node, as the study runs them (check the launcher's --ntasks-per-node)"
        )
    per_node, nodes = counts[names[0]], len(counts)
    scopes = [("node", per_node)] if per_node > 1 else []
    return scopes + ([("world", len(names))] if nodes > 1 else [])


def my_group(world, groups: list[list[int]]):
    """My group of `groups` (None: the whole world), made on every rank: torch needs every rank in every
    new_group call, in the same order."""
    from datetime import timedelta

    import torch.distributed as dist

    if len(groups) == 1 and len(groups[0]) == world.world_size:
        return None
    mine = None
    for ranks in groups:
        group = dist.new_group(ranks, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        if world.rank in ranks:
            mine = group
    return mine


def measure_all(world, sizes: list[Size], settings: Settings, quick: bool = False) -> tuple[list[dict], list[dict]]:
    """Every collective at every size and group size (group_sizes: within a node and across nodes;
    in quick mode the largest of each scope only): (measurements, sizes left out with why: memory or the
    time budget), the same on every rank. The groups of one size measure at once; each measurement is
    the slowest group's."""
    import torch.distributed as dist

    names = [None] * world.world_size
    dist.all_gather_object(names, world.node_name)
    scopes_for(names)  # uneven placement is refused before any group is made
    per_node, nodes = names.count(names[0]), len(set(names))
    plan = group_sizes(per_node, nodes, quick)
    room = agreed_min(free_bytes_per_rank(world), None, world.device)
    share_s = settings.sweep_budget_s / max(1, len(plan) * len(COLLECTIVES))
    results, skipped = [], []
    widest = {scope: max(r for s, r, _ in plan if s == scope) for scope, _, _ in plan}
    for scope, ranks, span in plan:
        groups = partition(names, scope, ranks)
        group = my_group(world, groups)
        # the strategies' own sizes whatever the budget at the scope's widest group (the check's lines and
        # the report's bandwidths); at narrower ones they feed the fit, within the budget like the sweep's
        named_always = ranks == widest[scope]
        for collective in COLLECTIVES:
            started, done = time.perf_counter(), []
            for size in sizes:
                left_s = share_s - (time.perf_counter() - started)
                why = left_out(collective, size, ranks, room, settings, done, left_s, named_always)
                if why:
                    skipped.append(
                        {
                            "scope": scope,
                            "collective": collective,
                            "size": size.name,
                            "ranks": ranks,
                            "bytes": size.nbytes,
                            "why": why,
                        }
                    )
                    continue
                size, cut = within_cap(size, done, settings)
                if cut:
                    skipped.append({"scope": scope, "collective": collective, "size": size.name, "ranks": ranks, **cut})
                one = measure(world, collective, size, group, ranks, settings)
                if len(groups) > 1:
                    one = slowest_node(world, one)  # every group measured at once; the slowest is reported
                done.append(one)
                results.append({"scope": scope, "nodes": span, **one})
    dist.barrier()
    return results, skipped


def buffer_bytes(collective: str, size: Size, ranks: int) -> int:
    """The most one measurement holds at once: the fp32 checking buffers (send and receive)."""
    numel = elements(size.nbytes, ELEMENT_BYTES[size.precision], ranks)
    return 4 * (numel + (0 if collective == "all_reduce" else numel // ranks))


def left_out(
    collective: str,
    size: Size,
    ranks: int,
    room: float,
    settings: Settings,
    done: list,
    left_s: float,
    named_always: bool = True,
) -> str:
    """Why this size is not measured ("" when it is): its buffers would not fit in MEMORY_SHARE of
    the rank's free memory, or (a sweep size, or any size where not named_always: the groups narrower
    than a scope's widest, whose named sizes only feed the fit) its expected time would run past the
    collective's share of the sweep's time budget. Decided from agreed figures, so every rank decides
    the same."""
    need = buffer_bytes(collective, size, ranks)
    if room > 0 and need > MEMORY_SHARE * room:
        return f"memory: {human_bytes(need)} of buffers, more than {MEMORY_SHARE:.0%} of {human_bytes(room)} free"
    if (size.name in NAMED_SIZES and named_always) or not done:
        return ""
    calls = settings.warmup + 2 + settings.min_iterations * settings.repeats
    expected = expected_seconds(done, size.nbytes) * calls
    if expected > left_s:
        return (
            f"time budget: about {human_seconds(expected)} expected, {human_seconds(max(0.0, left_s))} left of "
            f"this collective's share of {human_seconds(settings.sweep_budget_s)}"
        )
    return ""


def within_cap(size: Size, done: list, settings: Settings) -> tuple[Size, dict | None]:
    """A named size cut to what a call may take in quick mode (Settings.call_cap_s), at the rate the
    sizes measured so far found: (the size to measure, None) or (the cut size, what was cut and why). A
    fabric moves a 25 MiB bucket in milliseconds and keeps it; a 25 Mbit/s link would take seconds a
    call, times the check's calls, so the check measures there the largest power of two that fits.
    Decided from agreed figures (every rank's `done` holds the slowest group's times)."""
    cap = settings.call_cap_s
    if cap is None or size.name not in NAMED_SIZES or not done:
        return size, None
    expected = expected_seconds(done, size.nbytes)
    if expected <= cap:
        return size, None
    cut = max(m["bytes"] for m in done)
    while cut * 2 < size.nbytes and expected_seconds(done, cut * 2) <= cap:
        cut *= 2
    smaller = Size(size.name, cut, size.precision, f"{size.what}, cut to {human_bytes(cut)}")
    why = (
        f"time: about {human_seconds(expected)} a call at the rate found, more than quick mode's "
        f"{human_seconds(cap)}; measured at {human_bytes(cut)} instead"
    )
    return smaller, {"bytes": size.nbytes, "why": why, "measured_bytes": cut}


def expected_seconds(done: list, nbytes: int) -> float:
    """One call's time at nbytes, on the line through the smallest and the largest size measured so
    far (a latency-bound size costs about what the smallest did; a bandwidth-bound one grows with its
    bytes), never less than the largest's time."""
    small, large = min(done, key=lambda m: m["bytes"]), max(done, key=lambda m: m["bytes"])
    slope = max(0.0, (large["time_s"] - small["time_s"]) / max(1, large["bytes"] - small["bytes"]))
    return large["time_s"] + slope * max(0, nbytes - large["bytes"])


def free_bytes_per_rank(world) -> float:
    """Free device memory (a GPU's own), else this node's available memory over its ranks; 0 when unknown."""
    if world.device_type != "cpu":
        import torch

        return float(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / max(1, world.local_world_size)
    except OSError:
        pass
    return 0.0


def slowest_node(world, one: dict) -> dict:
    import torch
    import torch.distributed as dist

    facts = torch.tensor(
        [one["time_s"], one["spread_s"], 0.0 if one["correct"] else 1.0], dtype=torch.float64, device=world.device
    )
    dist.all_reduce(facts, op=dist.ReduceOp.MAX)
    seconds, spread, wrong = facts.tolist()
    algbw, busbw = bandwidths(one["collective"], one["bytes"], seconds, one["ranks"])
    return {**one, "time_s": seconds, "spread_s": spread, "algbw_gbs": algbw, "busbw_gbs": busbw, "correct": not wrong}


def buffers(collective: str, numel: int, piece: int, dtype, device, fill: float):
    """(send, receive) for one call; an in-place all-reduce sends and receives in one buffer."""
    import torch

    send = torch.full((piece if collective == "all_gather" else numel,), fill, dtype=dtype, device=device)
    if collective == "all_reduce":
        return send, send
    return send, torch.empty(numel if collective == "all_gather" else piece, dtype=dtype, device=device)


def call(collective: str, send, recv, group):
    import torch.distributed as dist

    if collective == "all_reduce":
        return lambda: dist.all_reduce(send, group=group)
    if collective == "all_gather":
        gather = (
            getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        )  # the newer name, where torch has it
        return lambda: gather(recv, send, group=group)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda: scatter(recv, send, group=group)


def measure(world, collective: str, size: Size, group, ranks: int, settings: Settings) -> dict:
    import torch
    import torch.distributed as dist

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[size.precision]
    device = world.device
    me = dist.get_rank(group) if group is not None else dist.get_rank()
    numel = elements(size.nbytes, ELEMENT_BYTES[size.precision], ranks)
    piece = numel // ranks
    send, recv = buffers(collective, numel, piece, torch.float32, device, float(check_value(collective, me, ranks)))
    call(collective, send, recv, group)()
    right = result_is_right(collective, recv, ranks, piece)
    # a rank that got a wrong result makes it wrong for all: rank 0 alone writes the facts
    correct = agreed_max(0.0 if right else 1.0, group, device) == 0.0
    del send, recv
    # zeros: an all-reduce repeated in place stays finite in any precision
    op = call(collective, *buffers(collective, numel, piece, dtype, device, 0.0), group)
    sync = torch.cuda.synchronize if world.device_type != "cpu" else (lambda: None)
    for _ in range(settings.warmup):
        op()
    sync()
    started = time.perf_counter()
    op()
    sync()
    one_call = agreed_max(time.perf_counter() - started, group, device)
    window_s = settings.budget_s / settings.repeats
    iterations = int(min(settings.max_iterations, max(settings.min_iterations, window_s // max(one_call, 1e-9))))
    windows = sorted(
        agreed_max(timed(op, iterations, group, world), group, device) / iterations for _ in range(settings.repeats)
    )
    seconds = windows[len(windows) // 2]
    algbw, busbw = bandwidths(collective, numel * ELEMENT_BYTES[size.precision], seconds, ranks)
    return {
        "collective": collective,
        "size": size.name,
        "what": size.what,
        "ranks": ranks,
        "bytes": numel * ELEMENT_BYTES[size.precision],
        "precision": size.precision,
        "iterations": iterations,
        "repeats": len(windows),
        "time_s": seconds,
        "spread_s": (windows[-1] - windows[0]) / 2,
        "algbw_gbs": algbw,
        "busbw_gbs": busbw,
        "correct": correct,
    }


def timed(op, iterations: int, group, world) -> float:
    """Seconds for `iterations` calls on this rank: device events on a GPU (no host work inside
    the window), the host clock after a barrier on a CPU."""
    import torch
    import torch.distributed as dist

    dist.barrier(group=group)
    if world.device_type == "cpu":
        started = time.perf_counter()
        for _ in range(iterations):
            op()
        return time.perf_counter() - started
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        op()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def agreed_max(seconds: float, group, device) -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return value.item()


def agreed_min(value: float, group, device) -> float:
    return -agreed_max(-value, group, device)


def result_is_right(collective: str, recv, ranks: int, piece: int) -> bool:
    """The checking call's fp32 result, compared exactly: a sum is expected_sum(ranks), a gather
    1, 2, ... n in order (see check_value)."""
    import torch

    if collective == "all_gather":
        expected = torch.arange(1, ranks + 1, dtype=torch.float32, device=recv.device).repeat_interleave(piece)
    else:
        expected = torch.full_like(recv, float(expected_sum(ranks)), dtype=torch.float32)
    return recv.dtype == torch.float32 and bool(torch.equal(recv, expected))
