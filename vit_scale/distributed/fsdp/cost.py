"""FSDP's planner terms, torch-free: memory per device (FSDP1 and FSDP2), the bytes its collectives
send, their sizes unit by unit, and when FSDP issues them in a step, each rule naming the torch
function it follows (the vocabulary: vit_scale.distributed.costing; formulas: docs/plan.md).

ColossalAI's TorchFSDPPlugin runs FSDP1 FULL_SHARD with torch's defaults and reuses these through
the `sharding` and `opts` arguments (its layout names the plugin, not a sharding, and the trainer's
`fsdp.*` keys do not reach the plugin)."""

from __future__ import annotations

from math import ceil

from vit_scale.distributed.costing import Costs
from vit_scale.distributed.costing.memory import (
    StateMemory,
    auto_optimizer,
    bytes_of,
    const,
    numel,
    numels,
    optimizer_temporaries,
    per_phase,
    shard_pad,
)
from vit_scale.distributed.costing.timeline import UnitPlan, group_coll, per_unit_colls

# ---------------------------------------------------------------- memory


def fsdp1_memory(sc, shape, lay, precision: str, opts) -> StateMemory:
    """FSDP1 parameters, gradients, optimizer states, units in flight and what the allocator holds for
    its streams (torch/distributed/fsdp: _flat_param.py, _runtime_utils.py, _limiter_utils.py).
    opts: the fsdp.* options it runs with."""
    g, L = lay.shard, shape.L
    mp = precision != "fp32"
    c = bytes_of(precision)  # param_dtype = reduce_dtype in the trainer's MixedPrecision
    blk, root = shard_pad(shape.block_params, g), shard_pad(shape.root_params, g)
    local = L * blk + root
    impl = auto_optimizer(sc, plain_tensor_params=True)
    # the optimizer sees one FlatParameter shard per unit, or the original parameters' views
    largest = min(local, shape.largest_tensor) if opts.use_orig_params else max(blk, root)
    temporaries = optimizer_temporaries(impl, local, largest)
    grads = per_phase(0, 4.0 * blk, 4.0 * local, 4.0 * local)
    notes, stream_held, pending_frees = [], const(0.0), const(0.0)
    if lay.sharding == "NO_SHARD":
        if mp:
            # each unit's low-precision copy, and its low-precision gradient before the fp32 cast
            unit, rootc = c * shape.block_params, c * shape.root_params
            in_flight = per_phase(unit + rootc, 2 * unit + rootc, 2 * unit + rootc, 0)
            # FSDP1 frees both with record_stream onto the post-backward (all-reduce) stream: by the
            # end of the backward the whole model's worth waits there (calibrated: docs/plan.md)
            stream_held = per_phase(0, 0, float(c + c) * shape.params, 0)
        else:
            in_flight = const(0.0)
    else:
        unit, rootc = c * g * blk, c * g * root  # unsharded, padded, in param_dtype
        grad_tmp = c * g * blk + c * blk  # unsharded gradient + reduce-scatter output
        n_fwd = 2 if opts.forward_prefetch else 1
        n_bwd = 2 if opts.backward_prefetch == "pre" else 1
        if lay.sharding == "SHARD_GRAD_OP":
            # parameters stay unsharded from the forward until each unit's backward
            in_flight = per_phase(L * unit + rootc, L * unit + rootc + grad_tmp, n_bwd * unit + rootc + grad_tmp, 0)
        else:
            # the root unit is not resharded after forward (FSDP1 keeps it for the backward)
            in_flight = per_phase(
                n_fwd * unit + rootc, n_bwd * unit + rootc + grad_tmp, n_bwd * unit + rootc + grad_tmp, 0
            )
        # Freed but not yet reusable ("active" in the allocator's stats): FSDP1 frees a unit's unsharded
        # parameter on the host (_flat_param.py _free_unsharded_flat_param: record_stream onto the compute
        # stream, then _free_storage) while the device is still behind, and the previous unit's unsharded
        # gradient stays held by the post-backward stream until its reduce-scatter ends
        # (_runtime_utils.py _post_backward_hook -> _reduce_grad, record_stream). With limit_all_gathers the
        # host waits before a new all-gather once 2 frees are pending (_limiter_utils._FreeEventQueue,
        # _max_num_inflight_all_gathers = 2; _runtime_utils._unshard): 2 units' parameters pending. Without
        # it the host runs as far ahead as it gets ahead of the device: the allowance's cpu_ahead_units, an
        # assumption (docs/plan.md).
        held_grad = c * g * blk
        pending_frees = per_phase(2 * unit, 2 * unit + held_grad, 2 * unit + held_grad, 0)
        if not opts.limit_all_gathers:
            # the verdict's conservative side, as before: the host's gathers ahead counted in what must fit
            ahead = float(min(L, sc.allowance.cpu_ahead_units) * unit)
            stream_held = per_phase(ahead, ahead, ahead, 0)
            notes.append(
                f"limit_all_gathers off: assumes the CPU runs {sc.allowance.cpu_ahead_units} units "
                "ahead, their gathered parameters held by the allocator"
            )
    params, optimizer = 4.0 * local, 8.0 * local
    if opts.cpu_offload:
        params = optimizer = 0.0
        grads = const(0.0)
        temporaries = 0.0
        notes.append("fsdp.cpu_offload: parameters, gradients and optimizer states live on the host")
    return StateMemory(
        params=params,
        optimizer=optimizer,
        grads=grads,
        in_flight=in_flight,
        buckets=const(0.0),
        optimizer_temporaries=temporaries,
        stream_held=stream_held,
        pending_frees=pending_frees,
        compute_bytes=c,
        optimizer_impl=impl,
        notes=notes,
    )


def _fsdp2_local(tensors: list[tuple[int, ...]], g: int) -> tuple[int, int]:
    """FSDP2 shards every parameter on dim 0, padded to a multiple of g: (local, unsharded padded)."""
    local = padded = 0
    for shape in tensors:
        rest = numel(shape) // shape[0]
        rows = ceil(shape[0] / g)
        local += rows * rest
        padded += rows * g * rest
    return local, padded


def fsdp2_memory(sc, shape, lay, precision: str) -> StateMemory:
    g, L = lay.shard, shape.L
    c = bytes_of(precision)
    blk_local, blk_full = _fsdp2_local(shape.block_tensors(), g)
    root_local, root_full = _fsdp2_local(shape.root_tensors(), g)
    local = L * blk_local + root_local
    impl = auto_optimizer(sc, plain_tensor_params=True)  # DTensor is foreach-capable
    unit, rootc = c * blk_full, c * root_full
    # autograd's unsharded gradient, FSDP2's reduce-scatter input copy and its output
    grad_tmp = 2 * c * blk_full + c * blk_local
    n_fwd = 2  # FSDP2 overlaps the next unit's all-gather in forward, with or without prefetch
    if lay.sharding == "SHARD_GRAD_OP":
        in_flight = per_phase(L * unit + rootc, L * unit + rootc + grad_tmp, 2 * unit + rootc + grad_tmp, 0)
    else:
        in_flight = per_phase(n_fwd * unit + rootc, 2 * unit + rootc + grad_tmp, 2 * unit + rootc + grad_tmp, 0)
    params, optimizer = 4.0 * local, 8.0 * local
    grads = per_phase(0, 4.0 * blk_local, 4.0 * local, 4.0 * local)
    temporaries = optimizer_temporaries(impl, local, min(local, shape.largest_tensor))
    notes = []
    if sc.fsdp.cpu_offload:
        params = optimizer = temporaries = 0.0
        grads = const(0.0)
        notes.append("fsdp.cpu_offload: parameters, gradients and optimizer states live on the host")
    return StateMemory(
        params=params,
        optimizer=optimizer,
        grads=grads,
        in_flight=in_flight,
        buckets=const(0.0),
        optimizer_temporaries=temporaries,
        compute_bytes=c,
        optimizer_impl=impl,
        notes=notes,
    )


def memory(sc, shape, lay) -> StateMemory:
    if lay.implementation == "fsdp1":
        return fsdp1_memory(sc, shape, lay, sc.precision, sc.fsdp)
    return fsdp2_memory(sc, shape, lay, sc.precision)


# ---------------------------------------------------------------- collectives


def unit_sizes(shape, lay, g: int) -> tuple[int, int]:
    """Elements one Block's and the root's all-gather produces (their reduce-scatter takes): FSDP1
    pads the unit's flat parameter to a multiple of g (torch/distributed/fsdp/_flat_param.py:
    FlatParamHandle._get_shard); FSDP2 pads each parameter's dim 0 to a multiple of g
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: FSDPParam._init_sharded_param,
    _chunk_with_empty), which for the class token (1, 1, D) and position embedding (1, T, D) is g times
    their size."""
    if lay.implementation == "fsdp2":
        return _fsdp2_padded(shape.block_tensors(), g), _fsdp2_padded(shape.root_tensors(), g)
    return -(-shape.block_params // g) * g, -(-shape.root_params // g) * g


def _fsdp2_padded(tensors, g: int) -> int:
    return sum(-(-s[0] // g) * g * (n // s[0]) for s, n in zip(tensors, numels(tensors), strict=True))


def root_regathers(lay) -> bool:
    """Whether the root unit is all-gathered again for the backward (under resharding after forward).
    FSDP1 keeps the root's parameters after its forward (torch/distributed/fsdp/_runtime_utils.py:
    _post_forward_reshard skips the root). FSDP2 does so only when reshard_after_forward was left
    to its default (torch/distributed/fsdp/_fully_shard/_fsdp_state.py: FSDPState._lazy_init, under
    _auto_reshard_after_forward); the trainer passes it explicitly, so its root is resharded."""
    return lay.implementation == "fsdp2"


def traffic(sc, lay, shape, ledger, sharding: str | None = None) -> None:
    W, P, L, g = sc.world, shape.params, shape.L, lay.shard
    c = bytes_of(sc.precision)
    sharding = sharding or lay.sharding
    block, root = unit_sizes(shape, lay, g)
    blocks = L * block
    if sharding == "NO_SHARD" or g == 1:
        ledger.add("all_reduce", c * P, W)
        return
    kind = "block"
    gathers = blocks + root
    if sharding != "SHARD_GRAD_OP":
        gathers += blocks + (root if root_regathers(lay) else 0)
    ledger.add("all_gather", c * gathers, g, kind)
    ledger.add("reduce_scatter", c * (blocks + root), g, kind)
    if lay.replicate > 1:
        ledger.add("all_reduce", c * (blocks + root) / g, lay.replicate, "strided", g)


def units(sc, lay, shape, sharding: str | None = None) -> dict | None:
    """Each unit's all-gathers, reduce-scatter and (HSDP) replicas' all-reduce; None where FSDP
    all-reduces whole gradients (NO_SHARD, a 1-rank shard group)."""
    L, g = shape.L, lay.shard
    c = bytes_of(sc.precision)
    sharding = sharding or lay.sharding
    if sharding == "NO_SHARD" or g == 1:
        return None
    block, root = (c * n for n in unit_sizes(shape, lay, g))
    regather = sharding != "SHARD_GRAD_OP"
    rep = lay.replicate
    out = []
    for i in range(L + 1):
        whole = root if i == 0 else block
        again = regather and (i > 0 or root_regathers(lay))
        out.append(
            {
                "gather_forward": whole,
                "gather_backward": whole if again else 0,
                "reduce_scatter": whole,
                "all_reduce": whole / g if rep > 1 else 0,
            }
        )
    return {"gather": (g, "block", g), "reduce": (g, "block", g), "replicate": (rep, "strided", g), "units": out}


# ---------------------------------------------------------------- the step's timeline


def step_plan(sc, lay, net, unit_list: list, c: int, sharding: str | None = None, opts=None) -> UnitPlan:
    """When FSDP (1 and 2) issues each unit collectives and how far ahead, each rule naming the torch
    function it follows; NO_SHARD and HYBRID_1GPU as per-unit all-reduces."""
    sharding = sharding or lay.sharding
    opts = opts or sc.fsdp
    version = 2 if lay.implementation == "fsdp2" else 1
    if sharding == "NO_SHARD" or lay.shard == 1:
        # FSDP1 NO_SHARD: torch/distributed/fsdp/_runtime_utils.py _post_backward_hook ->
        # _reduce_grad_no_shard, one all-reduce per unit when its backward ends, on the post-backward
        # stream. FSDP2 HYBRID_1GPU: _fsdp_param_group.py post_backward, the replicas' all-reduce per unit.
        shape = sc.shape
        world = (sc.world, "block", sc.world)
        sizes = [c * shape.root_params] + [c * shape.block_params] * shape.L
        for i, size in enumerate(sizes):
            coll = group_coll(sc, net, "all_reduce", size, world, "world", "all-reduce")
            unit_list[i].after_backward = (coll,) if coll else ()
        return UnitPlan(
            unit_list,
            rules=[
                (
                    f"FSDP{version} {sharding}: each unit's gradients all-reduced when its backward "
                    "ends; the root's (the last) exposed"
                )
            ],
        )
    colls = units(sc, lay, sc.shape, sharding)
    # FSDP1 all-gathers and reduce-scatters share the shard process group, so its one NCCL stream
    # (the unshard and post-backward CUDA streams both feed it); HSDP's all-reduce runs on its own
    # stream and group (_runtime_utils.py _init_streams: _all_reduce_stream; FSDP2: FSDPCommContext
    # all_reduce_stream on the replicate group, "since collectives use different network resources")
    per_unit_colls(sc, lay, net, unit_list, colls, {"gather": "shard", "reduce": "shard"})
    rules = []
    if version == 2:
        # torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py: unshard() on the all-gather stream
        # while the host runs ahead, wait_for_unshard() keeping one previous all_gather_state (at most
        # the next unit's all-gather in flight); pre_backward -> _backward_prefetch: the next unit in
        # reverse post-forward order, before this unit's backward; the root is resharded after forward as
        # every unit (the trainer passes reshard_after_forward; root_regathers)
        ahead, prefetch = 1, "pre"
        rules.append("FSDP2: the next unit's all-gather overlaps this unit's forward; backward prefetches one unit")
        # post_backward: with reduce_scatter_max_input_buffers = 1 (FSDPCommContext's default) the compute
        # stream waits on the previous unit's reduce_scatter_event before this unit's foreach_reduce
        rules.append("FSDP2: one reduce-scatter in flight; each unit's reduce waits for the previous one")
    else:
        limit, forward_prefetch, prefetch = opts.limit_all_gathers, opts.forward_prefetch, opts.backward_prefetch
        # _runtime_utils.py _unshard + _limiter_utils.py _FreeEventQueue: with limit_all_gathers the host
        # waits for the free of the unit two back (_max_num_inflight_all_gathers = 2) before issuing an
        # all-gather, so unit i's all-gather overlaps unit i-1's forward; forward_prefetch
        # (_pre_forward_unshard -> _prefetch_handle FORWARD) issues unit i+1's right after unit i's,
        # before the limiter waits again: two units ahead. Without the limiter the host issues as far
        # ahead as it runs ahead of the device; on one NCCL stream per group that changes no collective's
        # order, and what it does to the allocator (more memory pending, so cudaMalloc retries, as the
        # seed-003 authors measured the limiter helping) is not modelled for speed: predicted as with it.
        ahead = 2 if forward_prefetch else 1
        # _pre_backward_hook -> _prefetch_handle BACKWARD (BACKWARD_PRE) before the unit's gradient
        # computation; _post_backward_hook -> _post_backward_reshard -> _prefetch_handle (BACKWARD_POST)
        # after it, ahead of _reduce_grad's reduce-scatter; none: _pre_backward_hook of the next unit
        # unshards it, behind the reduce-scatter already on the group's stream
        rules.append(
            f"FSDP1: forward all-gathers {ahead} unit(s) ahead (forward_prefetch={forward_prefetch}); "
            f"backward_prefetch={prefetch}"
        )
        if not limit:
            rules.append(
                "limit_all_gathers=False: not modelled for speed (predicted as with the limiter); "
                "its memory is (the host's gathers pending free)"
            )
    if sharding == "SHARD_GRAD_OP":
        rules.append("SHARD_GRAD_OP: parameters kept from the forward, no all-gather in backward")
    else:
        root = "the root's again at the start of the backward, with the head" if version == 2 else "the root once"
        rules.append(f"{sharding}: all-gather before each unit's forward and again before its backward ({root})")
    rules.append(
        "reduce-scatter when each unit's backward ends"
        + ("; then the replicas' all-reduce of the shard on its own stream" if lay.replicate > 1 else "")
    )
    return UnitPlan(
        unit_list, forward_ahead=ahead, backward_prefetch=prefetch, rules=rules, one_reduce_in_flight=version == 2
    )


COSTS = Costs(memory=memory, traffic=traffic, step_plan=step_plan, units=units)
