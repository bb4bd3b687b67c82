"""What fits where, and what it costs to communicate: an analytic model of one training step.

    row = plan_row(Scenario(model="vit_3b", strategy="NO_SHARD", nodes=1, gpus_per_node=8))

`vit_scale.plan` (above this layer) is `vit-scale plan ...`; the trainer's session calls `predict_for_run`.
Nothing here imports torch. Formulas and assumptions: docs/plan.md.
"""

from __future__ import annotations

import dataclasses

from vit_scale.distributed import family_options
from vit_scale.planning import communication, memory
from vit_scale.planning.scenario import Allowance, Layout, Scenario, from_config, layout
from vit_scale.planning.shapes import Shape

SCHEMA_VERSION = 1
GIB = memory.GIB


def _gib(x: float) -> float:
    return round(x / GIB, 4)


def assumptions(sc: Scenario) -> dict:
    """The inputs every row of one plan shares."""
    return {
        "batch_size": sc.batch_size,
        "precision": sc.precision,
        "activation_checkpointing": sc.activation_checkpointing,
        "attention": sc.attention,
        "gpus_per_node": sc.gpus_per_node,
        "device_memory_gib": sc.device_memory_gib,
        "num_classes": sc.num_classes,
        "synthetic_batches": sc.synthetic_batches,
        "optimizer": sc.optimizer,
        **{name: dataclasses.asdict(getattr(sc, name)) for name in family_options()},
        "allowance": dataclasses.asdict(sc.allowance),
    }


def plan_row(sc: Scenario) -> dict:
    """One (model, strategy, nodes) row: memory per device, the verdict, communication per step."""
    sc.validate()
    shape = sc.shape
    lay = layout(sc)
    mem = memory.predict(sc, lay)
    parts = {k: _gib(v) for k, v in mem.components.items()}
    allocator = {k: _gib(v) for k, v in mem.allocator.items()}
    parts["allocator"] = round(sum(allocator.values()), 4)
    total = _gib(mem.total)
    fits = None if sc.device_memory_gib is None else bool(mem.total <= sc.device_memory_gib * GIB)
    return {
        "model": sc.model,
        "params": shape.params,
        "strategy": sc.strategy,
        "family": lay.family,
        "implementation": lay.implementation,
        "sharding": lay.sharding,
        "nodes": sc.nodes,
        "gpus_per_node": sc.gpus_per_node,
        "world_size": sc.world,
        "shard_group_size": lay.shard,
        "replicate_group_size": lay.replicate,
        "memory_gib": total,
        "peak_allocated_gib": _gib(mem.peak_allocated),
        "peak_allocated_phase": mem.peak_allocated_phase,
        # torch's active_bytes peak: allocated plus what is freed but held for another stream (what the
        # seed-003 authors plotted, and what a run's meter reads as memory_stats()["active_bytes.all.peak"])
        "peak_active_gib": _gib(mem.peak_active),
        "components_gib": parts,
        "allocator_gib": allocator,
        "peak_phase": mem.peak_phase,
        "phases_gib": {p: _gib(sum(c.values())) for p, c in mem.phases.items()},
        "device_memory_gib": sc.device_memory_gib,
        "fits": fits,
        "headroom_gib": None if sc.device_memory_gib is None else round(sc.device_memory_gib - total, 4),
        "optimizer_impl": mem.optimizer_impl,
        "communication": communication.predict(sc, lay, shape),
        "notes": mem.notes,
    }


def predict_for_run(cfg, world, device_memory_gib: float | None = None) -> dict | None:
    """The plan of the run the trainer is about to make (the start record's `plan`).

    `world` gives nodes and ranks per node; the device memory is `plan.device_memory_gib` when
    set, else `device_memory_gib`: the device's own, which the caller reads (none on a CPU, so
    `fits` is null there). The planner never asks a device: it sits below the run.
    """
    device_memory = cfg.plan.device_memory_gib
    if device_memory is None:
        device_memory = device_memory_gib
    sc = from_config(cfg, nodes=world.nodes, gpus_per_node=world.local_world_size, device_memory_gib=device_memory)
    row = plan_row(sc)
    return {"schema": SCHEMA_VERSION, **row, "assumptions": assumptions(sc)}


__all__ = [
    "Allowance",
    "Layout",
    "Scenario",
    "Shape",
    "SCHEMA_VERSION",
    "assumptions",
    "from_config",
    "layout",
    "plan_row",
    "predict_for_run",
]
