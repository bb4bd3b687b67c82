"""What a family hands the step-time timeline (vit_scale.planning.step_time.timeline): its units'
collectives (Coll, Unit), how far ahead the library issues them (UnitPlan), and the helpers that
build them: a collective over a group, the two ways libraries fill gradient buckets, per-unit
collectives attached to the units. Units are in forward order: 0 the stem, 1..L the Blocks, L+1 the
head. Times come from the planner's Network (`net.seconds`), passed in."""

from __future__ import annotations

from dataclasses import dataclass, field

from vit_scale.distributed.costing.memory import numel
from vit_scale.distributed.costing.traffic import ranks_per_node, spans_nodes


@dataclass(frozen=True)
class Coll:
    """One collective as the timeline sees it: how long it runs, where, on which group's stream."""

    seconds: float
    scope: str  # "intra": the group is inside one node; "inter": it spans nodes
    stream: str  # the process group: its collectives run one after another
    name: str = ""
    chained: bool = False  # after_backward only: ready when the previous entry ends (HSDP's all-reduce)
    ranks: int = 0  # the group's size: a prediction with a group beyond the measured ones is extrapolated


@dataclass
class Unit:
    """A stretch of compute and the collectives tied to it (a wrapped Block, a bucket's span)."""

    forward_s: float
    backward_s: float
    gather_forward: Coll | None = None  # needed before the unit's forward
    gather_backward: Coll | None = None  # needed before the unit's backward
    after_backward: tuple = ()  # issued when the unit's backward ends, in order


@dataclass
class UnitPlan:
    units: list
    forward_ahead: int = 1
    backward_prefetch: str = "pre"
    after_step: tuple = ()
    blocking_applies: bool = True  # False where the library's collectives stay asynchronous on a CPU
    one_reduce_in_flight: bool = False  # compute waits for the previous unit's reduce before the next
    backward_ahead: int = 1  # units the backward prefetches ahead
    rules: list = field(default_factory=list)


def group_coll(
    sc,
    net,
    collective: str,
    size: float,
    group: tuple,
    stream: str,
    name: str = "",
    chained: bool = False,
) -> Coll | None:
    """`size` bytes of `collective` over group (ranks, kind, group_param), or None for nothing to send."""
    n, kind, param = group
    if n < 2 or size <= 0:
        return None
    spans = spans_nodes(sc, n, kind, param)
    k = ranks_per_node(sc, n, kind, param)
    return Coll(net.seconds(collective, size, n, spans, k), "inter" if spans else "intra", stream, name, chained, n)


def _tensor_units(shape) -> tuple[list, list]:
    """The model's parameters in module order and the unit each belongs to."""
    L = shape.L
    tensors = shape.module_order_tensors()
    root = shape.root_tensors()
    units = [0] * 4 + [1 + b for b in range(L) for _ in shape.block_tensors()] + [L + 1] * (len(root) - 4)
    return tensors, units


def buckets(sc, shape, grad_bytes: float, first_cap: float, cap: float) -> list[tuple[int, float]]:
    """Gradient buckets in reverse parameter order, as torch's _compute_bucket_assignment_by_size
    fills them (a bucket closes once it reaches its cap; the first has its own cap): (the unit whose
    backward completes the bucket, the bucket's bytes)."""
    tensors, units = _tensor_units(shape)
    out, size, last, limit = [], 0.0, None, first_cap
    for t, unit in zip(reversed(tensors), reversed(units), strict=True):
        size += numel(t) * grad_bytes
        last = unit
        if size >= limit:
            out.append((last, size))
            size, limit = 0.0, cap
    if size > 0:
        out.append((last, size))
    return out


def flushed_buckets(shape, grad_bytes: float, elements: int) -> list[tuple[int, float]]:
    """Gradient buckets as DeepSpeed fills them (deepspeed/runtime/zero/stage_1_and_2.py
    reduce_independent_p_g_buckets_and_remove_grads, stage3.py reduce_independent_p_g_buckets_and_remove_grads:
    `if bucket.elements + param.numel() > reduce_bucket_size` reduce the bucket, then add the param):
    a bucket is emptied BEFORE the gradient that would overflow it joins, by that gradient's hook, so
    it is tied to the unit of that next gradient; the rest goes in the epilogue after the backward
    (the stem, unit 0). (unit, bytes), in backward order."""
    tensors, units = _tensor_units(shape)
    out, count = [], 0
    for t, unit in zip(reversed(tensors), reversed(units), strict=True):
        n = numel(t)
        if count + n > elements and count > 0:
            out.append((unit, count * grad_bytes))
            count = 0
        count += n
    if count > 0:
        out.append((0, count * grad_bytes))
    return out


def attach(units: list, bucket_list: list, make) -> None:
    """Each (unit, bytes) bucket's collective (make(bytes)) issued when that unit's backward ends."""
    for unit, size in bucket_list:
        c = make(size)
        if c is not None:
            units[unit].after_backward = units[unit].after_backward + (c,)


def per_unit_colls(sc, lay, net, units, colls: dict, streams: dict, root_backward_at_head: bool = True) -> None:
    """Attach a family's per-unit sizes (Costs.units): its unit 0 (the root) gathers with the stem and
    reduces after the stem's backward (the last), its unit i with Block i (units[i]). The root's backward
    all-gather goes with the head (units[L+1]) when the root is one unit holding the head: the head's
    backward runs first, so the root is gathered at the start of the backward (FSDP2's
    FSDPParamGroup.pre_backward of the root, exposed; Gemini's chunks); ZeRO-3 regathers by module,
    and of the root only the patch embedding is ever released (zero3_backward_gathers), used last."""
    for i, entry in enumerate(colls["units"]):
        u = units[i]
        u.gather_forward = group_coll(
            sc, net, "all_gather", entry["gather_forward"], colls["gather"], streams["gather"], "gather"
        )
        at = units[-1] if (i == 0 and root_backward_at_head) else u
        at.gather_backward = group_coll(
            sc,
            net,
            "all_gather",
            entry["gather_backward"],
            colls.get("gather_backward", colls["gather"]),
            streams.get("gather_backward", streams["gather"]),
            "gather again",
        )
        after = [
            group_coll(
                sc, net, "reduce_scatter", entry["reduce_scatter"], colls["reduce"], streams["reduce"], "reduce-scatter"
            )
        ]
        after.append(
            group_coll(
                sc,
                net,
                "all_reduce",
                entry["all_reduce"],
                colls["replicate"],
                "replicate",
                "replicas' all-reduce",
                chained=True,
            )
        )
        u.after_backward = tuple(a for a in after if a is not None)
