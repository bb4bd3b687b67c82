"""All-reduce, all-gather and reduce-scatter at the sizes the strategies use, timed the way
nccl-tests times them, within a node and across nodes.

Sizes: the latency sizes (8 B to 4 KiB), one Block's parameters in the run's precision (what
FSDP all-gathers before a Block's forward and reduce-scatters after its backward), and DDP's
gradient bucket (25 MiB of fp32 gradients, torch's default bucket_cap_mb).

Bandwidths, as nccl-tests' PERFORMANCE.md defines them, for S bytes in t seconds on n ranks
(S: the all-reduce's buffer, the all-gather's whole output, the reduce-scatter's whole input):
  algbw = S / t
  busbw = algbw * 2(n-1)/n   all-reduce
  busbw = algbw * (n-1)/n    all-gather, reduce-scatter
busbw is what each rank's link carries, comparable across rank counts and with the link's speed.

Each measurement: warm-up (the first call also checks the result), an agreed number of timed
iterations (from the warm-up's time, so that a slow 25 MiB all-gather on a CPU takes a fraction
of a second and a fast one on a GPU gets many iterations), device events on a GPU and
perf_counter after a barrier on a CPU, the slowest rank's time.

The size arithmetic here is torch-free; torch is imported inside the functions that measure.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DDP_BUCKET_BYTES = 25 * 2 ** 20       # torch DistributedDataParallel's bucket_cap_mb default
LATENCY_SIZES = (8, 64, 512, 4096)
QUICK_LATENCY_SIZES = (8, 4096)


@dataclass(frozen=True)
class Size:
    name: str          # "latency", "block", "bucket"
    nbytes: int        # asked for; the measured size is rounded up to whole elements per rank
    precision: str     # element type: fp32, bf16, fp16
    what: str          # for the table: "vit_base Block", "DDP bucket", "8 B"


@dataclass(frozen=True)
class Settings:
    warmup: int
    min_iterations: int
    max_iterations: int
    budget_s: float    # about how long the timed iterations of one measurement may take


FULL = Settings(warmup=5, min_iterations=5, max_iterations=100, budget_s=1.0)
QUICK = Settings(warmup=1, min_iterations=2, max_iterations=20, budget_s=0.2)


def bandwidths(collective: str, nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s, as nccl-tests prints them)."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * BUS_FACTOR[collective](ranks)


def block_bytes(model: str, precision: str) -> int:
    from vit_scale.models import get_spec
    from vit_scale.planning.shapes import Shape

    return Shape.from_spec(get_spec(model)).block_params * ELEMENT_BYTES[precision]


def sizes_for(model: str, precision: str, quick: bool) -> list[Size]:
    latency = QUICK_LATENCY_SIZES if quick else LATENCY_SIZES
    sizes = [Size("latency", n, "fp32", human_bytes(n)) for n in latency]
    sizes.append(Size("block", block_bytes(model, precision), precision, f"{model} Block"))
    sizes.append(Size("bucket", DDP_BUCKET_BYTES, "fp32", "DDP bucket"))
    return sizes


def human_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value != int(value) else f"{int(value)} {unit}"
    return f"{int(n)} B"


def human_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def elements(nbytes: int, element_bytes: int, ranks: int) -> int:
    """Whole elements, a multiple of the group's ranks (the all-gather's and reduce-scatter's
    pieces must be equal), at least one per rank."""
    per_rank = max(1, math.ceil(nbytes / element_bytes / ranks))
    return per_rank * ranks


# ---------------------------------------------------------------- measuring (torch from here on)

def node_groups(world):
    """(my node's group or None, the node names in rank order): one group per node, made on every
    rank (torch needs every rank in every new_group call), from the node names the ranks report,
    so that a cyclic placement of ranks still groups each node's own."""
    import torch.distributed as dist

    names = [None] * world.world_size
    dist.all_gather_object(names, world.node_name)
    nodes = list(dict.fromkeys(names))
    mine = None
    for node in nodes:
        ranks = [r for r, name in enumerate(names) if name == node]
        group = dist.new_group(ranks)
        if world.node_name == node:
            mine = (group, ranks)
    return mine, names


def measure_all(world, sizes: list[Size], settings: Settings) -> list[dict]:
    """Every collective at every size, within each node (when a node has several ranks) and across
    nodes (when there are several): a list of measurements, the same on every rank."""
    import torch.distributed as dist

    (group, node_ranks), names = node_groups(world)
    nodes = len(set(names))
    scopes = []
    if len(node_ranks) > 1:
        scopes.append(("node", group if nodes > 1 else None, len(node_ranks)))
    if nodes > 1:
        scopes.append(("world", None, world.world_size))
    results = []
    for scope, scope_group, ranks in scopes:
        for collective in COLLECTIVES:
            for size in sizes:
                one = measure(world, collective, size, scope_group, ranks, settings)
                if scope == "node" and nodes > 1:
                    one = slowest_node(world, one)   # every node measured at once; the slowest is reported
                results.append({"scope": scope, "nodes": 1 if scope == "node" else nodes, **one})
    dist.barrier()
    return results


def slowest_node(world, one: dict) -> dict:
    import torch
    import torch.distributed as dist

    facts = torch.tensor([one["time_s"], 0.0 if one["correct"] else 1.0], dtype=torch.float64, device=world.device)
    dist.all_reduce(facts, op=dist.ReduceOp.MAX)
    seconds, wrong = facts.tolist()
    algbw, busbw = bandwidths(one["collective"], one["bytes"], seconds, one["ranks"])
    return {**one, "time_s": seconds, "algbw_gbs": algbw, "busbw_gbs": busbw, "correct": not wrong}


def measure(world, collective: str, size: Size, group, ranks: int, settings: Settings) -> dict:
    import torch
    import torch.distributed as dist

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[size.precision]
    device = world.device
    me = dist.get_rank(group) if group is not None else dist.get_rank()
    numel = elements(size.nbytes, ELEMENT_BYTES[size.precision], ranks)
    piece = numel // ranks
    if collective == "all_reduce":
        send = torch.full((numel,), float(me + 1), dtype=dtype, device=device)
        recv = send

        def op():
            dist.all_reduce(send, group=group)
    elif collective == "all_gather":
        send = torch.full((piece,), float(me + 1), dtype=dtype, device=device)
        recv = torch.empty(numel, dtype=dtype, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the newer name, where torch has it

        def op():
            gather(recv, send, group=group)
    else:
        send = torch.full((numel,), float(me + 1), dtype=dtype, device=device)
        recv = torch.empty(piece, dtype=dtype, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

        def op():
            scatter(recv, send, group=group)

    op()
    correct = result_is_right(collective, recv, ranks, piece)
    send.zero_()   # an in-place all-reduce repeated on zeros stays finite in any precision
    sync = torch.cuda.synchronize if world.device_type != "cpu" else (lambda: None)
    for _ in range(settings.warmup):
        op()
    sync()
    started = time.perf_counter()
    op()
    sync()
    one_call = agreed_max(time.perf_counter() - started, group, device)
    iterations = int(min(settings.max_iterations, max(settings.min_iterations, settings.budget_s // max(one_call, 1e-9))))
    seconds = agreed_max(timed(op, iterations, group, world), group, device) / iterations
    algbw, busbw = bandwidths(collective, numel * ELEMENT_BYTES[size.precision], seconds, ranks)
    return {"collective": collective, "size": size.name, "what": size.what, "ranks": ranks,
            "bytes": numel * ELEMENT_BYTES[size.precision], "precision": size.precision, "iterations": iterations,
            "time_s": seconds, "algbw_gbs": algbw, "busbw_gbs": busbw, "correct": correct}


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


def result_is_right(collective: str, recv, ranks: int, piece: int) -> bool:
    """Each rank sent its group rank + 1: a sum is n(n+1)/2, a gather is 1, 2, ... n in order."""
    import torch

    values = recv.float()
    if collective == "all_gather":
        expected = torch.arange(1, ranks + 1, dtype=torch.float32, device=recv.device).repeat_interleave(piece)
    else:
        expected = torch.full_like(values, ranks * (ranks + 1) / 2)
    return bool(torch.allclose(values, expected, rtol=1e-2))
