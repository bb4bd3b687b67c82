"""A run record as an input of a prediction: the Scenario its start record describes, its precision, and
whether its collectives block (gloo on a CPU)."""

from __future__ import annotations

import dataclasses

from vit_scale.distributed import family_options
from vit_scale.planning.scenario import Allowance, Scenario, blas_workspace_mib


def _d(x) -> dict:
    return x if isinstance(x, dict) else {}


def _section(cls, config: dict, options: dict):
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in {**_d(config), **options}.items() if k in names}
    return cls(**values)


def run_precision(start: dict) -> str:
    """The run's precision: the resolved config's train.precision, else the strategy's options."""
    train = _d(_d(start.get("config")).get("train"))
    return str(train.get("precision") or _d(_d(start.get("strategy")).get("options")).get("precision") or "bf16")


def scenario_of_run(start: dict) -> Scenario:
    """The planner's Scenario for the run a start record describes (it ran, so no memory verdict)."""
    cfg, strat, world = _d(start.get("config")), _d(start.get("strategy")), _d(start.get("world"))
    options = _d(strat.get("options"))
    train = _d(cfg.get("train"))
    ckpt = train.get("activation_checkpointing", options.get("activation_checkpointing", False))
    return Scenario(
        model=start["model"]["name"],
        strategy=strat["label"],
        nodes=int(world["nodes"]),
        gpus_per_node=int(world.get("ranks_per_node") or world["world_size"] // max(1, world["nodes"])),
        batch_size=int(start["batch"]["per_device"]),
        precision=run_precision(start),
        activation_checkpointing=bool(ckpt),
        num_classes=int(train.get("num_classes", 1000)),
        # the device's memory as the run saw it (null on a CPU), so that a point the planner says does not
        # fit is predicted as not fitting, not as a speed
        device_memory_gib=_memory(world.get("device_memory_gib")),
        # a GEMM's BLAS workspace on the device the run had (76 MiB on ROCm; 0 on CUDA and CPU)
        allowance=Allowance(blas_workspace_mib=blas_workspace_mib(world.get("device_type"))),
        # each family's section from the resolved config, the run's own family's from its recorded options
        **{
            name: _section(cls, cfg.get(name), options if strat.get("family") == name else {})
            for name, cls in family_options().items()
        },
    )


def _memory(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 else None


def blocking_for(backend: str | None, device_type: str | None = None) -> bool:
    """gloo on a CPU returns from a collective when it is done (vit_scale.planning.step_time.timeline)."""
    return backend == "gloo" or device_type == "cpu"
