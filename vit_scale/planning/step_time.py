"""How long one training step takes, strategy by strategy: compute, the optimizer, and the part of
each collective that compute does not hide (exposed communication within a node and across nodes).

    step = predict_step(Scenario(model="vit_base", strategy="FULL_SHARD", nodes=2), network, compute)

A per-unit timeline, not a simulator: one compute stream runs the units' forwards, then their
backwards in reverse, then the optimizer; collectives run on one stream per process group (NCCL and
RCCL serialise a group's collectives on its stream), each starting when its data is ready, the
library has issued it, and its group's previous collective is done. Compute waits only where it
needs a collective's result; what it waits is the exposed communication. The rules for when each
library issues what are in `_unit_plan` and its helpers, each naming the function it follows.

Sizes and group layouts come from vit_scale.planning.communication (the bytes `vit-scale plan`
reports); times from vit_scale.planning.alpha_beta. Torch-free. Model and limits: docs/plan.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vit_scale.planning import communication, memory
from vit_scale.planning.alpha_beta import Network
from vit_scale.planning.scenario import CAI_REDUCE_BUCKET, Layout, Scenario, layout
from vit_scale.planning.shapes import Shape

MIB = 1024 * 1024
# torch/nn/parallel/distributed.py: _BucketCapacityConfig.create, 25 MiB buckets, the first (the
# gradients ready first in backward) capped at dist._DEFAULT_FIRST_BUCKET_BYTES when no cap is given
DDP_BUCKET_BYTES = 25 * MIB
DDP_FIRST_BUCKET_BYTES = 1 * MIB
PREFETCH_MODES = ("pre", "post", "none")
PAST = {"all_reduce": "all-reduced", "reduce_scatter": "reduce-scattered"}


# ---------------------------------------------------------------- compute


def forward_flops_per_image(shape: Shape) -> dict:
    """Forward FLOPs (2 per multiply-add, matmuls and the patch convolution only) per image:
    {"stem": patch embedding, "block": one Block, "head": the classifier on the class token}."""
    D, M, T, p = shape.D, shape.M, shape.T, shape.patch
    block = 2 * T * (4 * D * D + 2 * D * M) + 2 * 2 * T * T * D  # qkv, proj, fc1, fc2; q.k^T and attn.v
    return {"stem": 2 * (T - 1) * D * 3 * p * p, "block": block, "head": 2 * D * shape.C}


def train_flops_per_image(shape: Shape, activation_checkpointing: bool = False) -> float:
    """Forward + backward (backward twice the forward; a checkpointed Block recomputes its forward)."""
    f = forward_flops_per_image(shape)
    total = 3 * (f["stem"] + shape.L * f["block"] + f["head"])
    return total + (shape.L * f["block"] if activation_checkpointing else 0)


@dataclass(frozen=True)
class Compute:
    """One device's compute for one step of the scenario's model, batch and precision."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    source: str

    @classmethod
    def measured(
        cls, forward_backward_s: float, optimizer_s: float, source: str, activation_checkpointing: bool = False
    ) -> Compute:
        """From a measured step (a run record, the study's 1-node rung): forward and backward split
        as their FLOPs are, 1:2 (1:3 with activation checkpointing, which recomputes the forward)."""
        back = 3 if activation_checkpointing else 2
        return cls(forward_backward_s / (1 + back), forward_backward_s * back / (1 + back), optimizer_s, source)

    @classmethod
    def from_flops(cls, sc: Scenario, peak_tflops: float, efficiency: float, optimizer_s: float = 0.0) -> Compute:
        """The step from an MFU: model FLOPs over peak x efficiency. Model FLOPs are forward + backward
        without activation checkpointing's recompute, as a run's recorded MFU counts them
        (vit_scale.models.flops_per_image: torch's FlopCounterMode over one forward and backward), so an
        MFU measured under checkpointing, which spent part of its time recomputing, gives back the step it
        was measured on. The recompute is inside that step: forward and backward split as the executed
        FLOPs are (1:3 under checkpointing, else 1:2)."""
        if not peak_tflops > 0 or not 0 < efficiency <= 1:
            raise ValueError("compute: peak_tflops must be positive and efficiency in (0, 1]")
        rate = peak_tflops * 1e12 * efficiency
        f = forward_flops_per_image(sc.shape)
        fwd = f["stem"] + sc.shape.L * f["block"] + f["head"]
        total = sc.batch_size * train_flops_per_image(sc.shape) / rate
        executed = train_flops_per_image(sc.shape, sc.activation_checkpointing)
        forward = total * fwd / executed
        recompute = " (MFU: recompute inside)" if sc.activation_checkpointing else ""
        return cls(
            forward,
            total - forward,
            optimizer_s,
            f"model FLOPs / ({peak_tflops:g} TFLOP/s x {efficiency:.0%}){recompute}",
        )


def _unit_compute(sc: Scenario, compute: Compute) -> list[tuple[float, float]]:
    """(forward, backward) seconds of the units in forward order: stem, Blocks, head, by FLOPs share."""
    shape = sc.shape
    f = forward_flops_per_image(shape)
    flops = [f["stem"]] + [f["block"]] * shape.L + [f["head"]]
    total = sum(flops)
    return [(compute.forward_s * x / total, compute.backward_s * x / total) for x in flops]


# ---------------------------------------------------------------- the timeline


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
class Breakdown:
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    exposed_intra_s: float = 0.0
    exposed_inter_s: float = 0.0
    communication_s: dict = field(default_factory=lambda: {"intra": 0.0, "inter": 0.0})  # busy, hidden or not

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s + self.exposed_intra_s + self.exposed_inter_s

    def as_dict(self) -> dict:
        def r(x):
            return round(x, 9)

        return {
            "step_s": r(self.step_s),
            "forward_s": r(self.forward_s),
            "backward_s": r(self.backward_s),
            "optimizer_s": r(self.optimizer_s),
            "exposed_intra_s": r(self.exposed_intra_s),
            "exposed_inter_s": r(self.exposed_inter_s),
            "communication_s": {k: r(v) for k, v in self.communication_s.items()},
        }


class _Clock:
    def __init__(self):
        self.t = 0.0  # the compute stream
        self.free: dict = {}  # stream -> when its last collective ends
        self.out = Breakdown()

    def issue(self, c: Coll | None, ready: float):
        """Start `c` once it is ready and its stream is free; (end, scope)."""
        if c is None:
            return None
        start = max(ready, self.free.get(c.stream, 0.0))
        end = start + c.seconds
        self.free[c.stream] = end
        self.out.communication_s[c.scope] += c.seconds
        return end, c.scope

    def wait(self, *handles) -> None:
        """Compute waits for these collectives; the wait is exposed, charged to the last one's scope."""
        handles = [h for h in handles if h is not None]
        if not handles:
            return
        end, scope = max(handles)
        if end > self.t:
            if scope == "inter":
                self.out.exposed_inter_s += end - self.t
            else:
                self.out.exposed_intra_s += end - self.t
            self.t = end

    def run(self, seconds: float, phase: str) -> None:
        self.t += seconds
        setattr(self.out, phase, getattr(self.out, phase) + seconds)


def timeline(
    units: list,
    forward_ahead: int = 1,
    backward_prefetch: str = "pre",
    optimizer_s: float = 0.0,
    after_step: tuple = (),
    blocking: bool = False,
    one_reduce_in_flight: bool = False,
    backward_ahead: int = 1,
) -> Breakdown:
    """One step through `units` (forward order). Rules:

    forward_ahead = k: unit i's forward all-gather is issued when unit i-k starts its forward
      (k = 0: when unit i itself is due, so it is exposed; units before the k-th are gathered at
      the start of the step).
    backward_prefetch: the next unit's backward all-gather (next in backward order) is issued
      "pre": when this unit's backward starts, ahead of this unit's reduce-scatter;
      "post": when this unit's backward ends, still ahead of its reduce-scatter;
      "none": when the next unit is due, behind this unit's reduce-scatter on the same stream.
    after_backward collectives start when the unit's backward ends (chained ones when the one
      before them ends); the optimizer waits for all of them; after_step collectives run after it,
      exposed. blocking: every collective the units issue is waited for at once (gloo on a CPU,
      where the library's call returns when the collective is done).
    backward_ahead = k: "pre" and "post" prefetch the next k units in backward order (ZeRO-3's
      coordinator: as far ahead as in the forward).
    one_reduce_in_flight: before a unit's after_backward collectives are issued, compute waits for the
      previous unit's first one (FSDP2's reduce_scatter_max_input_buffers = 1).
    """
    if backward_prefetch not in PREFETCH_MODES:
        raise ValueError(f"backward_prefetch: {backward_prefetch!r} is not one of {', '.join(PREFETCH_MODES)}")
    if blocking:
        forward_ahead, backward_prefetch = 0, "none"
    clock = _Clock()
    n = len(units)
    starts = []
    for i, u in enumerate(units):
        if forward_ahead == 0 or i - forward_ahead >= 0:
            ready = clock.t if forward_ahead == 0 else starts[i - forward_ahead]
        else:
            ready = 0.0
        clock.wait(clock.issue(u.gather_forward, ready))
        starts.append(clock.t)
        clock.run(u.forward_s, "forward_s")
    pending, gathered, last_reduce = [], {}, None
    order = list(reversed(range(n)))
    for j, i in enumerate(order):
        u = units[i]
        if u.gather_backward is not None and i not in gathered:
            gathered[i] = clock.issue(u.gather_backward, clock.t)
        clock.wait(gathered.get(i))
        ahead = [k for k in order[j + 1 : j + 1 + backward_ahead] if units[k].gather_backward is not None]
        if backward_prefetch == "pre":
            for k in ahead:
                if k not in gathered:
                    gathered[k] = clock.issue(units[k].gather_backward, clock.t)
        clock.run(u.backward_s, "backward_s")
        if backward_prefetch == "post":
            for k in ahead:
                if k not in gathered:
                    gathered[k] = clock.issue(units[k].gather_backward, clock.t)
        if one_reduce_in_flight and u.after_backward:
            clock.wait(last_reduce)
        previous = None
        for k, c in enumerate(u.after_backward):
            ready = previous[0] if (c.chained and previous) else clock.t
            previous = clock.issue(c, ready)
            pending.append(previous)
            if k == 0:
                last_reduce = previous
            if blocking:
                clock.wait(previous)
    clock.wait(*pending)
    clock.run(optimizer_s, "optimizer_s")
    for c in after_step:
        clock.wait(clock.issue(c, clock.t))
    return clock.out


# ---------------------------------------------------------------- a scenario's units


def _group_coll(
    sc: Scenario,
    net: Network,
    collective: str,
    size: float,
    group: tuple,
    stream: str,
    name: str = "",
    chained: bool = False,
) -> Coll | None:
    n, kind, param = group
    if n < 2 or size <= 0:
        return None
    spans = communication.spans_nodes(sc, n, kind, param)
    k = communication.ranks_per_node(sc, n, kind, param)
    return Coll(net.seconds(collective, size, n, spans, k), "inter" if spans else "intra", stream, name, chained, n)


def _buckets(sc: Scenario, shape: Shape, grad_bytes: float, first_cap: float, cap: float) -> list[tuple[int, float]]:
    """Gradient buckets in reverse parameter order, as torch's _compute_bucket_assignment_by_size
    fills them (a bucket closes once it reaches its cap; the first has its own cap): (the unit whose
    backward completes the bucket, the bucket's bytes). Units: 0 stem, 1..L Blocks, L+1 head."""
    L = shape.L
    tensors = shape.module_order_tensors()
    root = shape.root_tensors()
    units = [0] * 4 + [1 + b for b in range(L) for _ in shape.block_tensors()] + [L + 1] * (len(root) - 4)
    out, size, last, limit = [], 0.0, None, first_cap
    for t, unit in zip(reversed(tensors), reversed(units), strict=True):
        numel = 1
        for d in t:
            numel *= d
        size += numel * grad_bytes
        last = unit
        if size >= limit:
            out.append((last, size))
            size, limit = 0.0, cap
    if size > 0:
        out.append((last, size))
    return out


def _ds_buckets(shape: Shape, grad_bytes: float, elements: int) -> list[tuple[int, float]]:
    """Gradient buckets as DeepSpeed fills them (deepspeed/runtime/zero/stage_1_and_2.py
    reduce_independent_p_g_buckets_and_remove_grads, stage3.py reduce_independent_p_g_buckets_and_remove_grads:
    `if bucket.elements + param.numel() > reduce_bucket_size` reduce the bucket, then add the param):
    a bucket is emptied BEFORE the gradient that would overflow it joins, by that gradient's hook, so
    it is tied to the unit of that next gradient; the rest goes in the epilogue after the backward
    (the stem, unit 0). (unit, bytes), in backward order. Units: 0 stem, 1..L Blocks, L+1 head."""
    L = shape.L
    tensors = shape.module_order_tensors()
    root = shape.root_tensors()
    units = [0] * 4 + [1 + b for b in range(L) for _ in shape.block_tensors()] + [L + 1] * (len(root) - 4)
    out, count = [], 0
    for t, unit in zip(reversed(tensors), reversed(units), strict=True):
        numel = 1
        for d in t:
            numel *= d
        if count + numel > elements and count > 0:
            out.append((unit, count * grad_bytes))
            count = 0
        count += numel
    if count > 0:
        out.append((0, count * grad_bytes))
    return out


def _attach(units: list, buckets: list, make) -> None:
    for unit, size in buckets:
        c = make(size)
        if c is not None:
            units[unit].after_backward = units[unit].after_backward + (c,)


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


def _unit_plan(sc: Scenario, lay: Layout, net: Network, compute: Compute) -> UnitPlan:
    shape = sc.shape
    W = sc.world
    c = 4 if sc.precision == "fp32" else 2
    units = [Unit(f, b) for f, b in _unit_compute(sc, compute)]
    world = (W, "block", W)
    label = lay.label

    def world_coll(collective, stream="world"):
        return lambda size: _group_coll(sc, net, collective, size, world, stream)

    # DDP: torch/nn/parallel/distributed.py (DistributedDataParallel._ddp_init_helper, bucket sizes from
    # _BucketCapacityConfig) and the C++ Reducer (torch/csrc/distributed/c10d/reducer.cpp: mark_bucket_ready
    # launches a bucket's all-reduce once all its gradients are ready, buckets in order): fp32 gradients
    # (DDP reduces the parameters' dtype, whatever autocast computed), reduced during the backward
    if lay.family == "ddp" or label in ("CAI_DDP", "CAI_DDP_FP16"):
        if lay.family == "ddp":
            first, cap = DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES
            rule = "DDP: 25 MiB gradient buckets (the first 1 MiB), each all-reduced when its gradients are ready"
        else:
            # colossalai/booster/plugin/torch_ddp_plugin.py passes bucket_cap_mb explicitly, so torch's
            # small first bucket does not apply (_BucketCapacityConfig.create: is_using_default False)
            first = cap = sc.colossalai.bucket_cap_mb * MIB
            rule = f"TorchDDPPlugin: {sc.colossalai.bucket_cap_mb} MiB buckets (bucket_cap_mb, also the first)"
        _attach(units, _buckets(sc, shape, 4, first, cap), world_coll("all_reduce"))
        return UnitPlan(units, blocking_applies=False, rules=[rule, "the last bucket's all-reduce is exposed"])

    if lay.family == "fsdp" or label == "CAI_FSDP":
        return _fsdp_plan(sc, lay, net, units, c)

    if lay.family == "deepspeed" and lay.sharding == "ZERO3":
        return _zero3_plan(sc, lay, net, units)

    if lay.family == "deepspeed" or label == "CAI_LOW_LEVEL_ZERO":
        # deepspeed/runtime/zero/stage_1_and_2.py: with overlap_comm, backward hooks
        # (reduce_independent_p_g_buckets_and_remove_grads) fill a reduce bucket of reduce_bucket_size
        # elements and reduce it (reduce_ipg_grads -> average_tensor) on the reduction stream when full,
        # the rest in overlapping_partition_gradients_reduce_epilogue; after the step,
        # all_gather_dp_groups (deepspeed/runtime/utils.py) gathers the updated bit16 partitions.
        # colossalai/zero/low_level/low_level_optim.py: the same shape (_run_reduction per bucket on the
        # bucket store's comm stream when overlap_communication, the LowLevelZeroPlugin default; an
        # all-gather of the working parameters after step), with a 12 Mi-element bucket.
        if lay.family == "deepspeed":
            elements = sc.deepspeed.reduce_bucket_size
            overlap = sc.deepspeed.overlap_comm
            # reduce_scatter=True (the trainer) with use_multi_rank_bucket_allreduce=True (the default):
            # average_tensor -> allreduce_and_scatter -> allreduce_and_copy_with_multiple_ranks ->
            # allreduce_bucket, one all-reduce of the whole bucket over the data-parallel group
            reduce = "all_reduce"
            name = f"DeepSpeed ZeRO-{lay.sharding[-1]}"
            buckets = _ds_buckets(shape, c, elements)
        else:
            elements, overlap = CAI_REDUCE_BUCKET, True
            reduce = "all_reduce" if sc.colossalai.zero_stage == 1 else "reduce_scatter"
            name = f"LowLevelZero stage {sc.colossalai.zero_stage}"
            buckets = _buckets(sc, shape, c, elements * c, elements * c)
        if not overlap:
            buckets = [(0, sum(s for _, s in buckets))]  # reduced after the backward (reduce_gradients)
        _attach(units, buckets, world_coll(reduce))
        gather = _group_coll(sc, net, "all_gather", c * shape.params, world, "world", "parameters after step")
        return UnitPlan(
            units,
            after_step=(gather,) if gather else (),
            rules=[
                f"{name}: gradients {PAST[reduce]} in buckets of {elements:,} elements during the backward"
                if overlap
                else f"{name}: gradients {PAST[reduce]} after the backward (overlap_comm off)",
                "the updated parameters all-gathered after the optimizer step, exposed",
            ],
        )

    if label == "CAI_GEMINI":
        return _gemini_plan(sc, lay, net, units)
    raise ValueError(f"strategy {label}: no step time rule")


def _per_unit_colls(sc, lay, net, units, colls: dict, streams: dict, root_backward_at_head: bool = True) -> None:
    """Attach communication.per_unit's sizes: its unit 0 (the root) gathers with the stem and reduces
    after the stem's backward (the last), its unit i with Block i (units[i]). The root's backward
    all-gather goes with the head (units[L+1]) when the root is one unit holding the head: the head's
    backward runs first, so the root is gathered at the start of the backward (FSDP2's
    FSDPParamGroup.pre_backward of the root, exposed; Gemini's chunks); ZeRO-3 regathers by module,
    and of the root only the patch embedding is ever released (zero3_backward_gathers), used last."""
    for i, entry in enumerate(colls["units"]):
        u = units[i]
        u.gather_forward = _group_coll(
            sc, net, "all_gather", entry["gather_forward"], colls["gather"], streams["gather"], "gather"
        )
        at = units[-1] if (i == 0 and root_backward_at_head) else u
        at.gather_backward = _group_coll(
            sc,
            net,
            "all_gather",
            entry["gather_backward"],
            colls.get("gather_backward", colls["gather"]),
            streams.get("gather_backward", streams["gather"]),
            "gather again",
        )
        after = [
            _group_coll(
                sc, net, "reduce_scatter", entry["reduce_scatter"], colls["reduce"], streams["reduce"], "reduce-scatter"
            )
        ]
        after.append(
            _group_coll(
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


def _fsdp_plan(sc: Scenario, lay: Layout, net: Network, units: list, c: int) -> UnitPlan:
    """FSDP (and ColossalAI TorchFSDP) step rules, in vit_scale.planning.families.fsdp."""
    from vit_scale.planning.families import fsdp

    return fsdp.step_plan(sc, lay, net, units, c)


def _zero3_plan(sc: Scenario, lay: Layout, net: Network, units: list) -> UnitPlan:
    ds, shape = sc.deepspeed, sc.shape
    colls = communication.per_unit(sc, lay, shape)
    streams = {"gather": "world", "reduce": "world", "gather_backward": "hpz" if lay.hpz else "world"}
    # gradients go through stage3.py's reduce bucket, not per unit: strip per_unit's reduce-scatter and
    # add bucketed ones below
    for entry in colls["units"]:
        entry["reduce_scatter"] = 0
    _per_unit_colls(sc, lay, net, units, colls, streams, root_backward_at_head=False)
    c = 4 if sc.precision == "fp32" else 2
    quantised = lay.hpz and ds.quantized_gradients and sc.world > sc.gpus_per_node
    grad_bytes = 0.5 if quantised else c
    # deepspeed/runtime/zero/stage3.py: reduce_partition_and_remove_grads adds each gradient to the ipg
    # bucket and __reduce_and_partition_ipg_grads reduce-scatters it (on reduce_and_partition_stream, the
    # same data-parallel group) once reduce_bucket_size elements are in; the rest at the end
    # (independent_gradient_partition_epilogue). ZeRO++ qgZ: an approximation. DeepSpeed's
    # all_to_all_quant_reduce (deepspeed/runtime/comm/coalesced_collectives.py) runs an int4 all-to-all
    # inside the node, then one across nodes; timed here as one 0.5 B reduce-scatter over all ranks.
    buckets = _ds_buckets(shape, grad_bytes, ds.reduce_bucket_size)
    _attach(
        units,
        buckets,
        lambda size: _group_coll(
            sc, net, "reduce_scatter", size, (sc.world, "block", sc.world), "world", "reduce-scatter"
        ),
    )
    # deepspeed/runtime/zero/partitioned_param_coordinator.py: fetch_sub_module all-gathers the module
    # it needs and prefetches along the recorded trace up to prefetch_bucket_size elements
    # (__prefetch_bucket_sz); the same coordinator runs the backward in reverse trace order
    small = sum(n for n in communication._numels(shape.block_tensors()) if n <= ds.param_persistence_threshold)
    gathered = max(1, shape.block_params - small)
    ahead = max(1, ds.prefetch_bucket_size // gathered)
    rules = [
        (
            f"ZeRO-3: all-gathers prefetched {ahead} Block(s) ahead (stage3_prefetch_bucket_size "
            f"{ds.prefetch_bucket_size:,} elements), in forward and again in backward for the parameters "
            "released in between (their reuse lies beyond stage3_max_reuse_distance)"
        ),
        f"gradients reduce-scattered in buckets of {ds.reduce_bucket_size:,} elements during the backward",
    ]
    # stage3.py _post_step: the persistent parameters all-gathered after the optimizer step, exposed
    persistent = _group_coll(
        sc,
        net,
        "all_gather",
        colls["after_step"],
        (sc.world, "block", sc.world),
        "world",
        "persistent parameters after step",
    )
    if lay.hpz:
        rules.append(
            f"ZeRO++ hpZ: the backward all-gathers inside the {lay.hpz}-rank secondary partition, "
            "on its own group"
            + ("; qwZ int8 weights in the forward" if ds.quantized_weights else "")
            + (
                "; qgZ approximated as an int4 reduce-scatter over all ranks (DeepSpeed's "
                "all_to_all_quant_reduce is an all-to-all within the node, then one across nodes)"
                if quantised
                else ""
            )
        )
    # the same lookahead in backward: fetch_sub_module's prefetch loop runs for backward fetches too
    # (BACKWARD_PREFETCH_SUBMIT), over the trace recorded in reverse
    return UnitPlan(
        units,
        forward_ahead=ahead,
        backward_prefetch="pre",
        rules=rules,
        after_step=(persistent,) if persistent else (),
        backward_ahead=ahead,
    )


def _gemini_plan(sc: Scenario, lay: Layout, net: Network, units: list) -> UnitPlan:
    colls = communication.per_unit(sc, lay, sc.shape)
    # colossalai/booster/plugin/gemini_plugin.py: max_prefetch=0 by default, so a chunk is gathered
    # when a module first needs it (zero/gemini/chunk/chunk.py Chunk.access_chunk -> __gather), in
    # forward and again in backward; gradients reduce-scattered per chunk on the async reduce stream
    # (zero/gemini/gemini_ddp.py grad_handle, enable_async_reduce) of the same group
    _per_unit_colls(sc, lay, net, units, colls, {"gather": "world", "reduce": "world"})
    return UnitPlan(
        units,
        forward_ahead=0,
        backward_prefetch="none",
        rules=[
            ("Gemini: no prefetch (max_prefetch=0): every gather exposed; chunks' reduce-scatter overlaps the backward")
        ],
    )


# ---------------------------------------------------------------- the prediction


@dataclass
class StepPrediction:
    model: str
    strategy: str
    nodes: int
    gpus_per_node: int
    fits: bool | None
    breakdown: Breakdown | None
    images_per_s_per_gpu: float | None
    images_per_s: float | None
    rules: list
    compute_source: str
    network_source: str
    scaling_efficiency: float | None = None
    # a group larger than any whose collectives the network's figures were measured at (Network.extrapolated)
    extrapolated: bool = False
    largest_group: int = 0
    baseline_nodes: int = 1  # the node count scaling_efficiency is against

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "strategy": self.strategy,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "fits": self.fits,
            "step": self.breakdown.as_dict() if self.breakdown else None,
            "images_per_s_per_gpu": self.images_per_s_per_gpu,
            "images_per_s": self.images_per_s,
            "scaling_efficiency": self.scaling_efficiency,
            "rules": list(self.rules),
            "compute_source": self.compute_source,
            "network_source": self.network_source,
            "extrapolated": self.extrapolated,
            "largest_group": self.largest_group,
            "baseline_nodes": self.baseline_nodes,
        }


def predict_step(sc: Scenario, network: Network, compute: Compute, blocking: bool = False) -> StepPrediction:
    """The step of one scenario. A point that does not fit in the device's memory is predicted as not
    fitting (no speed). blocking: the collectives the library issues from the training thread are
    waited for there (gloo on a CPU); DDP's reducer stays asynchronous."""
    sc.validate()
    lay = layout(sc)
    fits = None
    if sc.device_memory_gib is not None:
        fits = bool(memory.predict(sc, lay).total <= sc.device_memory_gib * memory.GIB)
    common = {
        "model": sc.model,
        "strategy": sc.strategy,
        "nodes": sc.nodes,
        "gpus_per_node": sc.gpus_per_node,
        "compute_source": compute.source,
        "network_source": network.source,
    }
    if fits is False:
        return StepPrediction(
            fits=False,
            breakdown=None,
            images_per_s_per_gpu=None,
            images_per_s=None,
            rules=["does not fit in device memory: no speed predicted"],
            **common,
        )
    plan = _unit_plan(sc, lay, network, compute)
    out = timeline(
        plan.units,
        plan.forward_ahead,
        plan.backward_prefetch,
        compute.optimizer_s,
        plan.after_step,
        blocking=blocking and plan.blocking_applies,
        one_reduce_in_flight=plan.one_reduce_in_flight,
        backward_ahead=plan.backward_ahead,
    )
    per_gpu = sc.batch_size / out.step_s if out.step_s > 0 else None
    largest = max((c.ranks for c in _colls(plan)), default=0)
    rules = plan.rules + (
        ["blocking collectives: each one waited for where it is issued"] if blocking and plan.blocking_applies else []
    )
    return StepPrediction(
        fits=fits,
        breakdown=out,
        images_per_s_per_gpu=per_gpu,
        images_per_s=None if per_gpu is None else per_gpu * sc.world,
        rules=rules,
        extrapolated=network.extrapolated(largest),
        largest_group=largest,
        **common,
    )


def _colls(plan: UnitPlan):
    for u in plan.units:
        yield from (c for c in (u.gather_forward, u.gather_backward, *u.after_backward) if c is not None)
    yield from (c for c in plan.after_step if c is not None)


def predict_curve(sc: Scenario, nodes: list, network: Network, compute: Compute, blocking: bool = False) -> list:
    """Weak scaling: the scenario on each node count, each with its images/s per GPU over its baseline's
    (1 node, or the fewest a group wider than a node fits on)."""
    import dataclasses

    from vit_scale.planning.scenario import baseline_nodes

    first = baseline_nodes(sc)
    base = predict_step(dataclasses.replace(sc, nodes=first), network, compute, blocking)
    rows = []
    for n in nodes:
        p = base if n == first else predict_step(dataclasses.replace(sc, nodes=n), network, compute, blocking)
        p.baseline_nodes = first
        if p.images_per_s_per_gpu is not None and base.images_per_s_per_gpu:
            p.scaling_efficiency = p.images_per_s_per_gpu / base.images_per_s_per_gpu
        rows.append(p)
    return rows
