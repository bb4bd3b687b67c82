"""DDP's planner terms, torch-free: memory per device, the gradient all-reduce, and when its
buckets are reduced in a step (the vocabulary: vit_scale.distributed.costing; formulas: docs/plan.md).
ColossalAI's TorchDDPPlugin runs the same wrapper and reuses these."""

from __future__ import annotations

from vit_scale.distributed.costing import Costs
from vit_scale.distributed.costing.memory import (
    StateMemory,
    auto_optimizer,
    bytes_of,
    const,
    optimizer_temporaries,
    per_phase,
)
from vit_scale.distributed.costing.timeline import UnitPlan, attach, buckets, group_coll

MIB = 1024 * 1024
# torch/nn/parallel/distributed.py: _BucketCapacityConfig.create, 25 MiB buckets, the first (the
# gradients ready first in backward) capped at dist._DEFAULT_FIRST_BUCKET_BYTES when no cap is given
DDP_BUCKET_BYTES = 25 * MIB
DDP_FIRST_BUCKET_BYTES = 1 * MIB


def replica_memory(sc, shape, precision: str) -> StateMemory:
    """torch DDP under autocast: fp32 parameters and gradients; the Reducer's buckets hold a
    second copy of every gradient (gradient_as_bucket_view=False, the default)."""
    P, c = shape.params, bytes_of(precision)
    impl = auto_optimizer(sc, plain_tensor_params=True)
    cast = c < 4
    weights_all = c * shape.matmul_weights if cast else 0
    weights_block = c * shape.block_matmul_weights if cast else 0
    # autocast caches each weight's low-precision cast for the whole forward; without
    # checkpointing the matmuls also save them for backward, so they live until each block's backward
    in_flight = per_phase(weights_all, weights_block if sc.activation_checkpointing else weights_all, weights_block, 0)
    return StateMemory(
        params=4.0 * P,
        optimizer=8.0 * P,
        grads=per_phase(0, 4.0 * shape.block_params, 4.0 * P, 4.0 * P),
        in_flight=in_flight,
        buckets=const(4.0 * P),
        optimizer_temporaries=optimizer_temporaries(impl, P, shape.largest_tensor),
        autocast=True,
        compute_bytes=c,
        optimizer_impl=impl,
    )


def traffic(sc, lay, shape, ledger) -> None:
    ledger.add("all_reduce", 4 * shape.params, sc.world)  # fp32 gradients, whatever autocast did


def bucket_plan(sc, net, units: list, first: float, cap: float, rule: str) -> UnitPlan:
    """torch/nn/parallel/distributed.py (DistributedDataParallel._ddp_init_helper, bucket sizes from
    _BucketCapacityConfig) and the C++ Reducer (torch/csrc/distributed/c10d/reducer.cpp: mark_bucket_ready
    launches a bucket's all-reduce once all its gradients are ready, buckets in order): fp32 gradients
    (DDP reduces the parameters' dtype, whatever autocast computed), reduced during the backward."""
    world = (sc.world, "block", sc.world)
    attach(
        units,
        buckets(sc, sc.shape, 4, first, cap),
        lambda size: group_coll(sc, net, "all_reduce", size, world, "world"),
    )
    return UnitPlan(units, blocking_applies=False, rules=[rule, "the last bucket's all-reduce is exposed"])


def step_plan(sc, lay, net, units: list, c: int) -> UnitPlan:
    rule = "DDP: 25 MiB gradient buckets (the first 1 MiB), each all-reduced when its gradients are ready"
    return bucket_plan(sc, net, units, DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES, rule)


COSTS = Costs(
    memory=lambda sc, shape, lay: replica_memory(sc, shape, sc.precision),
    traffic=traffic,
    step_plan=step_plan,
)
