"""DeepSpeed ZeRO's planner terms, torch-free: memory per device (ZeRO-1/2's stage_1_and_2
optimizer, ZeRO-3 and ZeRO++), the bytes its collectives send, ZeRO-3's sizes unit by unit, and when
each is issued in a step, each rule naming the DeepSpeed 0.19 function it follows (the vocabulary:
vit_scale.distributed.costing; formulas: docs/plan.md). ColossalAI's LowLevelZero is the same scheme
as ZeRO-1/2 and reuses `zero12_memory` and `zero12_plan`."""

from __future__ import annotations

from math import ceil

from vit_scale.distributed.costing import Costs
from vit_scale.distributed.costing.memory import (
    B0,
    B1,
    F,
    S,
    StateMemory,
    auto_optimizer,
    bytes_of,
    const,
    numel,
    numels,
    optimizer_temporaries,
    per_phase,
)
from vit_scale.distributed.costing.timeline import UnitPlan, attach, flushed_buckets, group_coll, per_unit_colls
from vit_scale.errors import UserError

# DeepSpeed ZeRO-3 defaults the trainer does not override (deepspeed/runtime/zero/config.py,
# DeepSpeedZeroConfig: max_live_parameters, sub_group_size, max_reuse_distance)
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
DS_SUB_GROUP_SIZE = 1_000_000_000
DS_MAX_REUSE_DISTANCE = 1_000_000_000
PAST = {"all_reduce": "all-reduced", "reduce_scatter": "reduce-scattered"}
NOTE = "DeepSpeed memory follows its 0.19 ZeRO optimizer; approximate beyond the states the tests check"

# ---------------------------------------------------------------- memory


def zero12_memory(
    sc,
    shape,
    N: int,
    stage: int,
    precision: str,
    bucket_elems: int,
    n_buckets: int,
    contiguous: bool,
    offload: bool,
) -> StateMemory:
    """ZeRO-1/2 (DeepSpeed's stage_1_and_2 optimizer; ColossalAI's LowLevelZero is the same
    scheme): low-precision parameters whole on every rank, fp32 master and AdamW states
    partitioned, gradients reduced through buckets into this rank's partition."""
    P, c = shape.params, bytes_of(precision)
    part = ceil(P / N)
    impl = auto_optimizer(sc, plain_tensor_params=True)  # one flat fp32 partition per group
    if stage == 1 and not contiguous:
        grads = per_phase(0, c * shape.block_params, c * P, c * P)
    else:
        # each reduced gradient is copied into this rank's partition buffer (every parameter that
        # overlaps the partition, whole), allocated at the first copy and released after the step
        buffer = shape.whole_tensors_in_partitions(N, align=2 if c == 2 else 1)
        grads = per_phase(0, c * buffer, c * buffer, c * buffer)
    grads[S] += 4.0 * part if not offload else 0.0  # the fp32 gradient partition the step reads
    notes = []
    optimizer = 12.0 * part
    temporaries = optimizer_temporaries(impl, part, part)
    if offload:
        optimizer, temporaries = 0.0, 0.0
        notes.append("optimizer offload: fp32 master, AdamW states and fp32 gradients live on the host")
    fresh_grad = c * shape.largest_tensor  # autograd's gradient before the bucket copy
    return StateMemory(
        params=float(c * P),
        optimizer=optimizer,
        grads=grads,
        in_flight=per_phase(0, fresh_grad, fresh_grad, 0),
        # reduction buffers: allocated when the backward starts, released at its end
        buckets=per_phase(0, n_buckets * bucket_elems * c, n_buckets * bucket_elems * c, 0),
        optimizer_temporaries=temporaries,
        compute_bytes=c,
        optimizer_impl=impl,
        notes=notes,
    )


def zero3_memory(sc, shape, lay, precision: str) -> StateMemory:
    ds = sc.deepspeed
    P, c, N = shape.params, bytes_of(precision), lay.state_shard
    partitioned = sum(ceil(numel(s) / N) for s in shape.tensors())
    small = shape.small_tensor_params(ds.param_persistence_threshold)
    part = ceil(P / N)
    impl = auto_optimizer(sc, plain_tensor_params=True)
    # gathered parameters: DeepSpeed keeps those it will reuse soon (stage3_max_reuse_distance) up
    # to stage3_max_live_parameters, so across the forward/backward turn up to that many stay
    live = min(P - small, DS_MAX_LIVE_PARAMETERS)
    later = shape.block_params + ds.prefetch_bucket_size
    gathered = per_phase(c * live, c * live, c * min(P - small, later), 0)
    notes = ["ZeRO-3 gathered parameters: an upper bound (stage3_max_live_parameters)"]
    if lay.hpz:
        secondary = c * ceil(P / lay.hpz)
        for phase in (F, B0, B1):
            gathered[phase] += secondary
        notes.append(f"hpZ keeps a secondary partition over {lay.hpz} ranks between forward and backward")
    params = float(c * (partitioned + small))
    optimizer = 12.0 * part
    grads = const(float(c * part))
    grads[S] += 4.0 * min(part, DS_SUB_GROUP_SIZE)
    temporaries = optimizer_temporaries(impl, min(part, DS_SUB_GROUP_SIZE), min(part, DS_SUB_GROUP_SIZE))
    if ds.offload_params:
        params = float(c * small)
        notes.append("parameter offload: partitions live on the host")
    if ds.offload_optimizer or ds.offload_params:
        optimizer, temporaries = 0.0, 0.0
        grads[S] -= 4.0 * min(part, DS_SUB_GROUP_SIZE)
        notes.append("optimizer offload: fp32 master and AdamW states live on the host")
    return StateMemory(
        params=params,
        optimizer=optimizer,
        grads=grads,
        in_flight=gathered,
        buckets=const(float(c * ds.reduce_bucket_size)),
        optimizer_temporaries=temporaries,
        compute_bytes=c,
        optimizer_impl=impl,
        notes=notes,
    )


def memory(sc, shape, lay) -> StateMemory:
    ds = sc.deepspeed
    stage = int(lay.sharding[-1])
    if stage == 3:
        return zero3_memory(sc, shape, lay, sc.precision)
    n_buckets = (2 if ds.overlap_comm else 1) if ds.contiguous_gradients else 0
    return zero12_memory(
        sc,
        shape,
        lay.state_shard,
        stage,
        sc.precision,
        ds.reduce_bucket_size,
        n_buckets,
        ds.contiguous_gradients,
        ds.offload_optimizer,
    )


# ---------------------------------------------------------------- collectives


def _quantised_gradients(sc, lay) -> bool:
    # qgZ: int4 gradients, but only across nodes: on one node DeepSpeed reduce-scatters them
    # unquantised (stage3.py __avg_scatter_grads: qgZ when world // device_count > 1)
    return bool(lay.hpz and sc.deepspeed.quantized_gradients and sc.world > sc.gpus_per_node)


def traffic(sc, lay, shape, ledger) -> None:
    ds, W, P = sc.deepspeed, sc.world, shape.params
    c = bytes_of(sc.precision)
    if int(lay.sharding[-1]) < 3:
        # the trainer's reduce_scatter=True and DeepSpeed's default use_multi_rank_bucket_allreduce
        # take each gradient bucket through deepspeed/runtime/zero/stage_1_and_2.py average_tensor ->
        # allreduce_and_scatter -> allreduce_and_copy_with_multiple_ranks -> allreduce_bucket: a full
        # all-reduce over the data-parallel group, each rank then keeping its partition's slice
        ledger.add("all_reduce", c * P, W)
        ledger.add("all_gather", c * P, W)  # updated parameters after the step
        return
    gathered = P - shape.small_tensor_params(ds.param_persistence_threshold)
    regathered = sum(zero3_backward_gathers(shape, ds.param_persistence_threshold))
    if lay.hpz:
        weight_bytes = 1 if ds.quantized_weights else c  # qwZ: int8 weights
        grad_bytes = 0.5 if _quantised_gradients(sc, lay) else c
        ledger.add("all_gather", weight_bytes * gathered, W)  # forward, over all ranks
        ledger.add("all_gather", c * regathered, lay.hpz, "block")  # backward, inside the hpZ group
        ledger.add("reduce_scatter", grad_bytes * P, W)
    else:
        ledger.add("all_gather", c * (gathered + regathered), W)  # forward, and backward where released
        ledger.add("reduce_scatter", c * P, W)
    # the persistent parameters (whole on every rank) gathered again after each optimizer step
    # (deepspeed/runtime/zero/stage3.py: _post_step, persistent_parameters[0].all_gather)
    ledger.add("all_gather", c * shape.small_tensor_params(ds.param_persistence_threshold), W)


def units(sc, lay, shape) -> dict | None:
    """ZeRO-3's all-gathers and reduce-scatter unit by unit; None for ZeRO-1/2 (bucketed)."""
    if lay.sharding != "ZERO3":
        return None
    ds, W, L = sc.deepspeed, sc.world, shape.L
    c = bytes_of(sc.precision)
    small = ds.param_persistence_threshold
    root_g = shape.root_params - sum(n for n in numels(shape.root_tensors()) if n <= small)
    block_g = shape.block_params - sum(n for n in numels(shape.block_tensors()) if n <= small)
    weight_bytes = (1 if ds.quantized_weights else c) if lay.hpz else c
    grad_bytes = 0.5 if _quantised_gradients(sc, lay) else c
    regathered = zero3_backward_gathers(shape, small)
    out = []
    for i in range(L + 1):
        gathered, params = (root_g, shape.root_params) if i == 0 else (block_g, shape.block_params)
        out.append(
            {
                "gather_forward": weight_bytes * gathered,
                "gather_backward": c * regathered[i],
                "reduce_scatter": grad_bytes * params,
                "all_reduce": 0,
            }
        )
    backward_group = (lay.hpz, "block", lay.hpz) if lay.hpz else (W, "block", W)
    # stage3.py _post_step: the persistent parameters, gathered after the optimizer step
    return {
        "gather": (W, "block", W),
        "gather_backward": backward_group,
        "reduce": (W, "block", W),
        "replicate": (1, "block", 1),
        "units": out,
        "after_step": c * shape.small_tensor_params(small),
    }


def zero3_backward_gathers(shape, threshold: int) -> list[int]:
    """Elements ZeRO-3 all-gathers again before each unit's backward (unit 0 the root, then one per
    Block): those of the parameters it released after their forward.

    deepspeed/runtime/zero/partitioned_param_coordinator.py, release_sub_module and __params_to_release:
    once the module trace is complete, a module's parameters are kept after its forward when the trace
    reaches their next use (the module's backward) before it has passed stage3_max_reuse_distance
    elements of parameters (every module's own, persistent ones included). Between a module's forward
    and its backward lie every module after it, once in forward and once in backward, and the root
    module (cls_token, pos_embed), whose backward hook fires first. The root module itself is released
    at the end of the forward and used next, so kept. Parameters under param_persistence_threshold are
    never released. Not modelled: the prefetcher also keeps a parameter whose later use it scanned
    while the parameter was still gathered (the same function's first rule); that reaches only
    stage3_prefetch_bucket_size elements ahead, so with the defaults (5e7 < 1e9) it keeps nothing more.
    """
    root, block = shape.root_tensors(), shape.block_tensors()
    # modules holding parameters, in forward order: (unit, [numels]); timm's ViT: the model itself
    # (cls_token, pos_embed), patch_embed.proj, each Block's norm1, qkv, proj, norm2, fc1, fc2, norm, head
    modules = [(0, numels(root[0:2])), (0, numels(root[2:4]))]
    for i in range(shape.L):
        modules += [(i + 1, numels(block[j : j + 2])) for j in range(0, len(block), 2)]
    modules += [(0, numels(root[4:6])), (0, numels(root[6:8]))]
    out = [0] * (shape.L + 1)
    top = sum(modules[0][1])
    after = sum(sum(n) for _, n in modules)
    for k, (unit, sizes) in enumerate(modules):
        after -= sum(sizes)
        distance = 0 if k == 0 else 2 * after + top
        if distance >= DS_MAX_REUSE_DISTANCE:
            out[unit] += sum(n for n in sizes if n > threshold)
    return out


# ---------------------------------------------------------------- the step's timeline


def zero12_plan(sc, net, unit_list: list, c: int, name: str, reduce: str, elements: int, overlap: bool, bucket_list):
    """ZeRO-1/2's step: gradients reduced in buckets during the backward (or after it without overlap),
    the updated parameters all-gathered after the step. deepspeed/runtime/zero/stage_1_and_2.py: with
    overlap_comm, backward hooks (reduce_independent_p_g_buckets_and_remove_grads) fill a reduce bucket of
    reduce_bucket_size elements and reduce it (reduce_ipg_grads -> average_tensor) on the reduction stream
    when full, the rest in overlapping_partition_gradients_reduce_epilogue; after the step,
    all_gather_dp_groups (deepspeed/runtime/utils.py) gathers the updated bit16 partitions."""
    world = (sc.world, "block", sc.world)
    if not overlap:
        bucket_list = [(0, sum(s for _, s in bucket_list))]  # reduced after the backward (reduce_gradients)
    attach(unit_list, bucket_list, lambda size: group_coll(sc, net, reduce, size, world, "world"))
    gather = group_coll(sc, net, "all_gather", c * sc.shape.params, world, "world", "parameters after step")
    return UnitPlan(
        unit_list,
        after_step=(gather,) if gather else (),
        rules=[
            f"{name}: gradients {PAST[reduce]} in buckets of {elements:,} elements during the backward"
            if overlap
            else f"{name}: gradients {PAST[reduce]} after the backward (overlap_comm off)",
            "the updated parameters all-gathered after the optimizer step, exposed",
        ],
    )


def zero3_plan(sc, lay, net, unit_list: list) -> UnitPlan:
    ds, shape = sc.deepspeed, sc.shape
    colls = units(sc, lay, shape)
    streams = {"gather": "world", "reduce": "world", "gather_backward": "hpz" if lay.hpz else "world"}
    # gradients go through stage3.py's reduce bucket, not per unit: strip units' reduce-scatter and
    # add bucketed ones below
    for entry in colls["units"]:
        entry["reduce_scatter"] = 0
    per_unit_colls(sc, lay, net, unit_list, colls, streams, root_backward_at_head=False)
    c = bytes_of(sc.precision)
    quantised = _quantised_gradients(sc, lay)
    grad_bytes = 0.5 if quantised else c
    # deepspeed/runtime/zero/stage3.py: reduce_partition_and_remove_grads adds each gradient to the ipg
    # bucket and __reduce_and_partition_ipg_grads reduce-scatters it (on reduce_and_partition_stream, the
    # same data-parallel group) once reduce_bucket_size elements are in; the rest at the end
    # (independent_gradient_partition_epilogue). ZeRO++ qgZ: an approximation. DeepSpeed's
    # all_to_all_quant_reduce (deepspeed/runtime/comm/coalesced_collectives.py) runs an int4 all-to-all
    # inside the node, then one across nodes; timed here as one 0.5 B reduce-scatter over all ranks.
    bucket_list = flushed_buckets(shape, grad_bytes, ds.reduce_bucket_size)
    attach(
        unit_list,
        bucket_list,
        lambda size: group_coll(
            sc, net, "reduce_scatter", size, (sc.world, "block", sc.world), "world", "reduce-scatter"
        ),
    )
    # deepspeed/runtime/zero/partitioned_param_coordinator.py: fetch_sub_module all-gathers the module
    # it needs and prefetches along the recorded trace up to prefetch_bucket_size elements
    # (__prefetch_bucket_sz); the same coordinator runs the backward in reverse trace order
    small = sum(n for n in numels(shape.block_tensors()) if n <= ds.param_persistence_threshold)
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
    persistent = group_coll(
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
        unit_list,
        forward_ahead=ahead,
        backward_prefetch="pre",
        rules=rules,
        after_step=(persistent,) if persistent else (),
        backward_ahead=ahead,
    )


def step_plan(sc, lay, net, unit_list: list, c: int) -> UnitPlan:
    if lay.sharding == "ZERO3":
        return zero3_plan(sc, lay, net, unit_list)
    ds = sc.deepspeed
    # reduce_scatter=True (the trainer) with use_multi_rank_bucket_allreduce=True (the default):
    # average_tensor -> allreduce_and_scatter -> allreduce_and_copy_with_multiple_ranks ->
    # allreduce_bucket, one all-reduce of the whole bucket over the data-parallel group
    return zero12_plan(
        sc,
        net,
        unit_list,
        c,
        f"DeepSpeed ZeRO-{lay.sharding[-1]}",
        "all_reduce",
        ds.reduce_bucket_size,
        ds.overlap_comm,
        flushed_buckets(sc.shape, c, ds.reduce_bucket_size),
    )


# ---------------------------------------------------------------- the world it needs


def _hpz(sc, label) -> int:
    return (sc.deepspeed.hpz_partition_size or sc.gpus_per_node) if label.label == "ZEROPP" else 0


def check(sc, label) -> None:
    hpz = _hpz(sc, label)
    if hpz and sc.world % hpz:
        raise UserError(f"deepspeed.hpz_partition_size: {hpz} must divide the world size ({sc.world})")


def groups(sc, label) -> tuple:
    """A ZeRO++ partition set wider than a node (the default, a node, divides any world)."""
    if label.label == "ZEROPP" and sc.deepspeed.hpz_partition_size:
        return (sc.deepspeed.hpz_partition_size,)
    return ()


COSTS = Costs(memory=memory, traffic=traffic, step_plan=step_plan, units=units, check=check, groups=groups, note=NOTE)
