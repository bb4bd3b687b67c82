"""FSDP prediction rules, next to each other: its memory per device (FSDP1; FSDP2 stays in
vit_scale.planning.memory) and when it issues its collectives in a step (FSDP1 and FSDP2). Called by the
generic planners (vit_scale.planning.memory.state_memory, vit_scale.planning.step_time._unit_plan), which
own the phases, the timeline and the other families. Torch-free; docs/plan.md has the formulas.
"""

from __future__ import annotations

from vit_scale.planning import communication
from vit_scale.planning.alpha_beta import Network
from vit_scale.planning.memory import (
    StateMemory,
    _auto_optimizer,
    _bytes,
    _const,
    _optimizer_temporaries,
    _per_phase,
    _shard_pad,
)
from vit_scale.planning.scenario import Layout, Scenario
from vit_scale.planning.shapes import Shape
from vit_scale.planning.step_time import UnitPlan, _group_coll, _per_unit_colls


def fsdp1_memory(sc: Scenario, shape: Shape, lay: Layout, precision: str) -> StateMemory:
    """FSDP1 parameters, gradients, optimizer states, units in flight and what the allocator holds for
    its streams (torch/distributed/fsdp: _flat_param.py, _runtime_utils.py, _limiter_utils.py)."""
    g, L = lay.shard, shape.L
    mp = precision != "fp32"
    c = _bytes(precision)  # param_dtype = reduce_dtype in the trainer's MixedPrecision
    blk, root = _shard_pad(shape.block_params, g), _shard_pad(shape.root_params, g)
    local = L * blk + root
    opts = sc.fsdp
    impl = _auto_optimizer(sc, plain_tensor_params=True)
    # the optimizer sees one FlatParameter shard per unit, or the original parameters' views
    largest = min(local, shape.largest_tensor) if opts.use_orig_params else max(blk, root)
    temporaries = _optimizer_temporaries(impl, local, largest)
    grads = _per_phase(0, 4.0 * blk, 4.0 * local, 4.0 * local)
    notes, stream_held, pending_frees = [], _const(0.0), _const(0.0)
    if lay.sharding == "NO_SHARD":
        if mp:
            # each unit's low-precision copy, and its low-precision gradient before the fp32 cast
            unit, rootc = c * shape.block_params, c * shape.root_params
            in_flight = _per_phase(unit + rootc, 2 * unit + rootc, 2 * unit + rootc, 0)
            # FSDP1 frees both with record_stream onto the post-backward (all-reduce) stream: by the
            # end of the backward the whole model's worth waits there (calibrated: docs/plan.md)
            stream_held = _per_phase(0, 0, float(c + c) * shape.params, 0)
        else:
            in_flight = _const(0.0)
    else:
        unit, rootc = c * g * blk, c * g * root  # unsharded, padded, in param_dtype
        grad_tmp = c * g * blk + c * blk  # unsharded gradient + reduce-scatter output
        n_fwd = 2 if opts.forward_prefetch else 1
        n_bwd = 2 if opts.backward_prefetch == "pre" else 1
        if lay.sharding == "SHARD_GRAD_OP":
            # parameters stay unsharded from the forward until each unit's backward
            in_flight = _per_phase(L * unit + rootc, L * unit + rootc + grad_tmp, n_bwd * unit + rootc + grad_tmp, 0)
        else:
            # the root unit is not resharded after forward (FSDP1 keeps it for the backward)
            in_flight = _per_phase(
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
        pending_frees = _per_phase(2 * unit, 2 * unit + held_grad, 2 * unit + held_grad, 0)
        if not opts.limit_all_gathers:
            # the verdict's conservative side, as before: the host's gathers ahead counted in what must fit
            ahead = float(min(L, sc.allowance.cpu_ahead_units) * unit)
            stream_held = _per_phase(ahead, ahead, ahead, 0)
            notes.append(
                f"limit_all_gathers off: assumes the CPU runs {sc.allowance.cpu_ahead_units} units "
                "ahead, their gathered parameters held by the allocator"
            )
    params, optimizer = 4.0 * local, 8.0 * local
    if opts.cpu_offload:
        params = optimizer = 0.0
        grads = _const(0.0)
        temporaries = 0.0
        notes.append("fsdp.cpu_offload: parameters, gradients and optimizer states live on the host")
    return StateMemory(
        params=params,
        optimizer=optimizer,
        grads=grads,
        in_flight=in_flight,
        buckets=_const(0.0),
        optimizer_temporaries=temporaries,
        stream_held=stream_held,
        pending_frees=pending_frees,
        compute_bytes=c,
        optimizer_impl=impl,
        notes=notes,
    )


def step_plan(sc: Scenario, lay: Layout, net: Network, units: list, c: int) -> UnitPlan:
    """When FSDP (1 and 2) issues each unit collectives and how far ahead, each rule naming the torch
    function it follows; NO_SHARD and HYBRID_1GPU as per-unit all-reduces."""
    sharding = lay.sharding if lay.family == "fsdp" else "FULL_SHARD"
    version = 2 if lay.implementation == "fsdp2" else 1
    if sharding == "NO_SHARD" or lay.shard == 1:
        # FSDP1 NO_SHARD: torch/distributed/fsdp/_runtime_utils.py _post_backward_hook ->
        # _reduce_grad_no_shard, one all-reduce per unit when its backward ends, on the post-backward
        # stream. FSDP2 HYBRID_1GPU: _fsdp_param_group.py post_backward, the replicas' all-reduce per unit.
        shape = sc.shape
        world = (sc.world, "block", sc.world)
        sizes = [c * shape.root_params] + [c * shape.block_params] * shape.L
        for i, size in enumerate(sizes):
            coll = _group_coll(sc, net, "all_reduce", size, world, "world", "all-reduce")
            units[i].after_backward = (coll,) if coll else ()
        return UnitPlan(
            units,
            rules=[
                (
                    f"FSDP{version} {sharding}: each unit's gradients all-reduced when its backward "
                    "ends; the root's (the last) exposed"
                )
            ],
        )
    colls = communication.per_unit(sc, lay, sc.shape)
    # FSDP1 all-gathers and reduce-scatters share the shard process group, so its one NCCL stream
    # (the unshard and post-backward CUDA streams both feed it); HSDP's all-reduce runs on its own
    # stream and group (_runtime_utils.py _init_streams: _all_reduce_stream; FSDP2: FSDPCommContext
    # all_reduce_stream on the replicate group, "since collectives use different network resources")
    _per_unit_colls(sc, lay, net, units, colls, {"gather": "shard", "reduce": "shard"})
    rules = []
    if version == 2:
        # torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py: unshard() on the all-gather stream
        # while the host runs ahead, wait_for_unshard() keeping one previous all_gather_state (at most
        # the next unit's all-gather in flight); pre_backward -> _backward_prefetch: the next unit in
        # reverse post-forward order, before this unit's backward; the root is resharded after forward as
        # every unit (the trainer passes reshard_after_forward; communication._fsdp_root_regathers)
        ahead, prefetch = 1, "pre"
        rules.append("FSDP2: the next unit's all-gather overlaps this unit's forward; backward prefetches one unit")
        # post_backward: with reduce_scatter_max_input_buffers = 1 (FSDPCommContext's default) the compute
        # stream waits on the previous unit's reduce_scatter_event before this unit's foreach_reduce
        rules.append("FSDP2: one reduce-scatter in flight; each unit's reduce waits for the previous one")
    else:
        fsdp = sc.fsdp if lay.family == "fsdp" else None
        limit = fsdp.limit_all_gathers if fsdp else True  # TorchFSDPPlugin: torch's defaults
        forward_prefetch = fsdp.forward_prefetch if fsdp else False
        prefetch = fsdp.backward_prefetch if fsdp else "pre"
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
        units, forward_ahead=ahead, backward_prefetch=prefetch, rules=rules, one_reduce_in_flight=version == 2
    )
