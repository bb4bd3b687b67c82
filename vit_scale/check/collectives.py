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

Each measurement: a checking call, warm-up, an agreed number of timed
iterations (from the warm-up's time, so that a slow 25 MiB all-gather on a CPU takes a fraction
of a second and a fast one on a GPU gets many iterations), device events on a GPU and
perf_counter after a barrier on a CPU, the slowest rank's time.

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

from vit_scale.text import human_bytes, human_seconds  # noqa: F401 - moved to text; still importable from here

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DDP_BUCKET_BYTES = 25 * 2 ** 20       # torch DistributedDataParallel's bucket_cap_mb default
LATENCY_SIZES = (8, 64, 512, 4096)
QUICK_LATENCY_SIZES = (8, 4096)
# after the world's rendezvous, how long any collective of the check may wait for its peers
COLLECTIVE_TIMEOUT_S = 300
EXACT_FP32 = 2 ** 24                  # every integer up to this is exact in fp32


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


# ---------------------------------------------------------------- measuring (torch from here on)

def scopes_for(names: list) -> list[tuple[str, int]]:
    """(scope, ranks in it) for the node names of every rank in rank order: the same list on every
    rank, so that all of them run the same collectives (a rank deciding from its own node's size
    would wait in a collective its peers never call). Uneven placement is refused."""
    from vit_scale.errors import UserError

    counts = dict(Counter(names))
    if len(set(counts.values())) > 1:
        placed = ", ".join(f"{node} {n}" for node, n in counts.items())
        raise UserError(f"ranks per node: uneven placement ({placed}); allowed: the same number of ranks on every "
                        f"node, as the study runs them (check the launcher's --ntasks-per-node)")
    per_node, nodes = counts[names[0]], len(counts)
    scopes = [("node", per_node)] if per_node > 1 else []
    return scopes + ([("world", len(names))] if nodes > 1 else [])


def node_groups(world, names: list):
    """My node's group: one group per node, made on every rank (torch needs every rank in every
    new_group call), from the node names the ranks report, so that a cyclic placement of ranks
    still groups each node's own."""
    from datetime import timedelta

    import torch.distributed as dist

    mine = None
    for node in dict.fromkeys(names):
        group = dist.new_group([r for r, name in enumerate(names) if name == node],
                               timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        if world.node_name == node:
            mine = group
    return mine


def measure_all(world, sizes: list[Size], settings: Settings) -> list[dict]:
    """Every collective at every size, within each node (when a node has several ranks) and across
    nodes (when there are several): a list of measurements, the same on every rank."""
    import torch.distributed as dist

    names = [None] * world.world_size
    dist.all_gather_object(names, world.node_name)
    scopes = scopes_for(names)
    nodes = len(set(names))
    group = node_groups(world, names) if nodes > 1 and scopes[0][0] == "node" else None
    results = []
    for scope, ranks in scopes:
        scope_group = group if scope == "node" else None
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
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the newer name, where torch has it
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
    """The checking call's fp32 result, compared exactly: a sum is expected_sum(ranks), a gather
    1, 2, ... n in order (see check_value)."""
    import torch

    if collective == "all_gather":
        expected = torch.arange(1, ranks + 1, dtype=torch.float32, device=recv.device).repeat_interleave(piece)
    else:
        expected = torch.full_like(recv, float(expected_sum(ranks)), dtype=torch.float32)
    return recv.dtype == torch.float32 and bool(torch.equal(recv, expected))
