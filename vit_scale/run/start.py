"""The start record: what a run is, written by rank 0 before the first step (docs/run_record.md)."""

from __future__ import annotations

import json
import os
import time

from vit_scale.launch.world import slurm_facts


def device_name(world) -> str:
    if world.device_type == "cpu":
        import platform

        from vit_scale.record.versions import cpu_model

        return cpu_model() or platform.machine() or "cpu"
    import torch

    return torch.cuda.get_device_name(world.device_index)


def kernels_prebuilt(cfg, world) -> dict:
    """Each JIT kernel this strategy needs and whether `vit-scale prepare` (or an earlier run)
    built it before this run: false means this run's first step includes compiling it."""
    from vit_scale.distributed.kernels import prebuilt

    try:
        return prebuilt(cfg.strategy, world.device_type)
    except Exception as exc:  # never lose a run over this fact; say why it is missing
        return {"unknown": f"{type(exc).__name__}: {exc}"}


def emulation_nodes() -> dict | None:
    """The overrides the isolated emulation hands each rank (VIT_SCALE_EMULATION_NODES, JSON written by
    vit_scale.cluster.emulation.Emulation.wrap); None when the run is not on isolated emulated nodes."""
    text = os.environ.get("VIT_SCALE_EMULATION_NODES")
    if not text:
        return None
    try:
        nodes = json.loads(text)
    except ValueError:
        return None
    return nodes if isinstance(nodes, dict) else None


def start_record(
    cfg,
    world,
    strategy,
    run_id: str,
    hosts: list[str],
    model_info: dict,
    device: str,
    device_memory_gib,
    peak: tuple,
    plan,
    environments: list | None = None,
) -> dict:
    """The start record's payload; `peak`: (TFLOP/s per device, where the figure comes from); `environments`:
    where the ranks' Python and vit_scale came from (run.session.python_environments)."""
    from vit_scale.record.versions import git_revision, software_versions

    return {
        "run_id": run_id,
        "study": cfg.output.study,
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": cfg.to_dict(),
        "model": model_info,
        "strategy": strategy.describe(),
        "world": {
            "world_size": world.world_size,
            "nodes": world.nodes,
            "ranks_per_node": world.local_world_size,
            "device_type": world.device_type,
            "device_name": device,
            "device_memory_gib": device_memory_gib,
            "backend": world.backend,
            "peak_tflops_per_device": peak[0],
            "peak_tflops_source": peak[1],
            # emulated nodes on one machine: own namespace and CPU quota each (isolated) or all of this
            # machine's (shared); None on real nodes (vit_scale/cluster/emulation.py)
            "emulation": os.environ.get("VIT_SCALE_EMULATED") or None,
            # isolated emulated nodes: the per-node overrides of this run's hosts ({} when none; a slow node
            # on purpose, e.g. {"local3": {"cpus_per_node": 0.125}}); None elsewhere
            "emulation_nodes": emulation_nodes(),
        },
        "batch": {"per_device": cfg.train.batch_size, "global": cfg.train.batch_size * world.world_size},
        "launcher": world.launcher,
        "slurm": slurm_facts(),
        "hosts": hosts,
        "versions": software_versions(),
        "python_environments": environments or [],
        "git_revision": git_revision(),
        "plan": plan,
        "kernels_prebuilt": kernels_prebuilt(cfg, world),
    }
