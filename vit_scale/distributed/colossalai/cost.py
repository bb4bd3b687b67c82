"""ColossalAI's planner terms, torch-free, plugin by plugin: TorchDDPPlugin as DDP, TorchFSDPPlugin as
FSDP1 FULL_SHARD with torch's defaults, LowLevelZero as DeepSpeed's ZeRO-1/2 scheme, Gemini its own
(chunked ZeRO-3). The vocabulary: vit_scale.distributed.costing; formulas: docs/plan.md. Approximate:
the plugins need a GPU, so nothing here is checked against real tensors (NOTE)."""

from __future__ import annotations

from math import ceil

from vit_scale.distributed.costing import Costs
from vit_scale.distributed.costing.memory import StateMemory, bytes_of, const, per_phase
from vit_scale.distributed.costing.timeline import UnitPlan, buckets, per_unit_colls
from vit_scale.distributed.ddp import cost as ddp_cost
from vit_scale.distributed.deepspeed import cost as zero_cost
from vit_scale.distributed.fsdp import FSDPConfig
from vit_scale.distributed.fsdp import cost as fsdp_cost
from vit_scale.distributed.layout import Layout

# ColossalAI's LowLevelZero default reduce bucket (reduce_bucket_size_in_m=12, in elements)
CAI_REDUCE_BUCKET = 12 * 1024 * 1024
NOTE = "ColossalAI memory is approximate: its plugins need a GPU, so nothing here is checked against real tensors"
DDP_PLUGINS = ("CAI_DDP", "CAI_DDP_FP16")
# TorchFSDPPlugin: FSDP1 FULL_SHARD with torch's own defaults (prefetch pre, rate limiter on), not the
# trainer's fsdp.* keys
TORCH_FSDP_SHARDING = "FULL_SHARD"


def _gemini_memory(sc, shape, N: int, precision: str) -> StateMemory:
    """ColossalAI Gemini: chunked ZeRO-3; gradients reuse the fp16 parameter chunks; static
    placement offloads the given fractions of parameters and optimizer states to the host."""
    cai = sc.colossalai
    optim_frac, param_frac = cai.offload_optim_frac, cai.offload_param_frac
    if cai.preset == "seed000":
        optim_frac = 1.0
    P, c = shape.params, bytes_of(precision)
    part = ceil(P / N)
    chunks = 2 * c * shape.block_params  # about two chunks gathered at a time
    return StateMemory(
        params=c * part * (1 - param_frac),
        optimizer=12.0 * part * (1 - optim_frac),
        grads=const(0.0),
        in_flight=per_phase(chunks, chunks, chunks, 0),
        buckets=const(0.0),
        optimizer_temporaries=0.0,
        compute_bytes=c,
        optimizer_impl="fused",
        notes=["Gemini: gradients reuse the parameter chunks; HybridAdam has no temporaries"],
    )


def memory(sc, shape, lay) -> StateMemory:
    label = lay.label
    if label in DDP_PLUGINS:
        return ddp_cost.replica_memory(sc, shape, "fp16" if label == "CAI_DDP_FP16" else sc.precision)
    if label == "CAI_FSDP":
        sharding = TORCH_FSDP_SHARDING if lay.shard > 1 else "NO_SHARD"
        fsdp_lay = Layout(label, "fsdp", "fsdp1", sharding, lay.shard, 1, lay.shard)
        return fsdp_cost.fsdp1_memory(sc, shape, fsdp_lay, sc.precision, FSDPConfig())
    if label == "CAI_LOW_LEVEL_ZERO":
        cai = sc.colossalai
        return zero_cost.zero12_memory(
            sc, shape, lay.state_shard, cai.zero_stage, sc.precision, CAI_REDUCE_BUCKET, 1, True, cai.cpu_offload
        )
    if label == "CAI_GEMINI":
        return _gemini_memory(sc, shape, lay.state_shard, sc.precision)
    raise ValueError(f"no memory model for {label}")


def traffic(sc, lay, shape, ledger) -> None:
    label, W, P = lay.label, sc.world, shape.params
    c = bytes_of(sc.precision)
    if label in DDP_PLUGINS:
        ddp_cost.traffic(sc, lay, shape, ledger)
    elif label == "CAI_FSDP":
        fsdp_cost.traffic(sc, lay, shape, ledger, sharding=TORCH_FSDP_SHARDING)
    elif label == "CAI_LOW_LEVEL_ZERO":
        ledger.add("all_reduce" if sc.colossalai.zero_stage == 1 else "reduce_scatter", c * P, W)
        ledger.add("all_gather", c * P, W)
    elif label == "CAI_GEMINI":
        ledger.add("all_gather", 2 * c * P, W)
        ledger.add("reduce_scatter", c * P, W)


def units(sc, lay, shape) -> dict | None:
    W = sc.world
    if lay.label == "CAI_FSDP":
        return fsdp_cost.units(sc, lay, shape, sharding=TORCH_FSDP_SHARDING)
    if lay.label != "CAI_GEMINI":
        return None
    c = bytes_of(sc.precision)
    out = []
    for i in range(shape.L + 1):
        params = shape.root_params if i == 0 else shape.block_params
        out.append(
            {
                "gather_forward": c * params,
                "gather_backward": c * params,
                "reduce_scatter": c * params,
                "all_reduce": 0,
            }
        )
    return {"gather": (W, "block", W), "reduce": (W, "block", W), "replicate": (1, "block", 1), "units": out}


def _gemini_plan(sc, lay, net, unit_list: list) -> UnitPlan:
    colls = units(sc, lay, sc.shape)
    # colossalai/booster/plugin/gemini_plugin.py: max_prefetch=0 by default, so a chunk is gathered
    # when a module first needs it (zero/gemini/chunk/chunk.py Chunk.access_chunk -> __gather), in
    # forward and again in backward; gradients reduce-scattered per chunk on the async reduce stream
    # (zero/gemini/gemini_ddp.py grad_handle, enable_async_reduce) of the same group
    per_unit_colls(sc, lay, net, unit_list, colls, {"gather": "world", "reduce": "world"})
    return UnitPlan(
        unit_list,
        forward_ahead=0,
        backward_prefetch="none",
        rules=[
            ("Gemini: no prefetch (max_prefetch=0): every gather exposed; chunks' reduce-scatter overlaps the backward")
        ],
    )


def step_plan(sc, lay, net, unit_list: list, c: int) -> UnitPlan:
    label, cai = lay.label, sc.colossalai
    if label in DDP_PLUGINS:
        # colossalai/booster/plugin/torch_ddp_plugin.py passes bucket_cap_mb explicitly, so torch's
        # small first bucket does not apply (_BucketCapacityConfig.create: is_using_default False)
        cap = cai.bucket_cap_mb * ddp_cost.MIB
        rule = f"TorchDDPPlugin: {cai.bucket_cap_mb} MiB buckets (bucket_cap_mb, also the first)"
        return ddp_cost.bucket_plan(sc, net, unit_list, cap, cap, rule)
    if label == "CAI_FSDP":
        return fsdp_cost.step_plan(sc, lay, net, unit_list, c, sharding=TORCH_FSDP_SHARDING, opts=FSDPConfig())
    if label == "CAI_LOW_LEVEL_ZERO":
        # colossalai/zero/low_level/low_level_optim.py: ZeRO-1/2's shape (_run_reduction per bucket on the
        # bucket store's comm stream when overlap_communication, the LowLevelZeroPlugin default; an
        # all-gather of the working parameters after step), with a 12 Mi-element bucket
        elements = CAI_REDUCE_BUCKET
        return zero_cost.zero12_plan(
            sc,
            net,
            unit_list,
            c,
            f"LowLevelZero stage {cai.zero_stage}",
            "all_reduce" if cai.zero_stage == 1 else "reduce_scatter",
            elements,
            True,
            buckets(sc, sc.shape, c, elements * c, elements * c),
        )
    if label == "CAI_GEMINI":
        return _gemini_plan(sc, lay, net, unit_list)
    raise ValueError(f"strategy {label}: no step time rule")


COSTS = Costs(memory=memory, traffic=traffic, step_plan=step_plan, units=units, note=NOTE)
