"""One question to the planner: a model under a strategy on so many nodes, and everything the
answer depends on (batch, precision, checkpointing, the strategy family's options, the allowance).

Built from the trainer's own `Config` (`from_config`), so the CLI, the trainer's `predict_for_run`
and the job scripts all describe a run the same way, with the same defaults and validation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from vit_scale.distributed import FAMILIES, PRECISIONS, family_options, layout_of, parse_strategy
from vit_scale.distributed.layout import Layout
from vit_scale.errors import UserError
from vit_scale.models import get_spec
from vit_scale.planning.shapes import Shape

ATTENTION = ("fused", "materialised")
OPTIMIZER_IMPLS = ("auto", "foreach", "single", "fused")


# A GEMM's BLAS workspace, which torch takes from its caching allocator for the call (so it counts in
# max_memory_allocated and the active-bytes peak) and which is live at every instant inside a GEMM:
# the forward's and the backward's peaks. ROCm: torch's hipBLASLt path (the default for bf16 matmuls
# on gfx90a/gfx94x) allocates HIPBLASLT_WORKSPACE_SIZE, 76 MiB unless set (torch 2.6 on, pytorch PR
# 139300; aten/src/ATen/cuda, parseCUDABlasLtWorkspaceSize: 76*1024 KiB under USE_ROCM); one at a
# time (docs/plan.md, Workspace, says why not two). CUDA: 1 to 32 MiB by torch version and
# architecture, not modelled (0). CPU: none.
BLAS_WORKSPACE_MIB = {"rocm": 76.0, "cuda": 0.0, "cpu": 0.0}


def blas_workspace_mib(device: str | None) -> float:
    """The BLAS workspace of a device kind ("rocm", "cuda", "cpu"); 0 for one not known."""
    return BLAS_WORKSPACE_MIB.get(str(device), 0.0)


@dataclass
class Allowance:
    """What the caching allocator and the runtime need beyond the bytes tensors hold."""

    runtime_gib: float = 1.0  # device context + NCCL/RCCL buffers: outside torch's allocator
    fragmentation: float = 0.05  # share of the peak lost to block rounding and splitting
    stream_held: bool = True  # count memory released onto communication streams (docs/plan.md)
    cpu_ahead_units: int = 4  # FSDP1 without limit_all_gathers: units the CPU all-gathers ahead
    blas_workspace_mib: float = 0.0  # a GEMM's BLAS workspace (blas_workspace_mib()), counted as workspace


@dataclass
class _Point:
    """The scenario's fields every family shares; Scenario adds one section per family's options."""

    model: str
    strategy: str
    nodes: int = 1
    gpus_per_node: int = 8
    batch_size: int = 32
    precision: str = "bf16"
    activation_checkpointing: bool = False
    attention: str = "fused"
    num_classes: int = 1000
    synthetic_batches: int = 4
    optimizer: str = "auto"
    device_memory_gib: float | None = 64.0

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def shape(self) -> Shape:
        return Shape.from_spec(get_spec(self.model), self.num_classes)

    def validate(self) -> None:
        get_spec(self.model)
        label = parse_strategy(self.strategy)
        for name in ("nodes", "gpus_per_node", "batch_size", "num_classes", "synthetic_batches"):
            if getattr(self, name) < 1:
                raise UserError(f"{name.replace('_', '-')}: must be a positive integer, got {getattr(self, name)}")
        if self.device_memory_gib is not None and not self.device_memory_gib > 0:
            raise UserError(f"device-memory-gib: must be positive, got {self.device_memory_gib}")
        if self.precision not in PRECISIONS:
            raise UserError(f"precision: {self.precision!r} is not allowed; allowed: {', '.join(PRECISIONS)}")
        if self.attention not in ATTENTION:
            raise UserError(f"attention: {self.attention!r} is not allowed; allowed: {', '.join(ATTENTION)}")
        if self.optimizer not in OPTIMIZER_IMPLS:
            raise UserError(f"optimizer: {self.optimizer!r} is not allowed; allowed: {', '.join(OPTIMIZER_IMPLS)}")
        a = self.allowance
        if a.runtime_gib < 0 or a.fragmentation < 0 or a.cpu_ahead_units < 0 or a.blas_workspace_mib < 0:
            raise UserError(
                "allowance: runtime-gib, fragmentation, cpu-ahead-units and blas-workspace-mib must not be negative"
            )
        g = label.hybrid_group
        if g and self.world % g:
            raise UserError(
                f"strategy: {label.label} needs a world size divisible by {g}, but {self.nodes} node(s) "
                f"x {self.gpus_per_node} GPUs is {self.world}; use HYBRID_<g>GPU with g dividing "
                f"{self.world}"
            )
        costs = FAMILIES[label.family].costs
        if costs is not None:
            costs.check(self, label)  # the family's options against this world (ZeRO++'s partition)


# One question's every field: _Point's, then each family's options as a section named after it
# (sc.fsdp, sc.deepspeed ..., in registry order, as the run configuration's Config has them; the
# families' cost modules read them), then the allowance. Derived from the registry, so that a family
# added in one folder is planned with its options; keyword construction and dataclasses.replace work
# as on any dataclass (Scenario(model=..., fsdp=FSDPConfig(version=2))).
Scenario = dataclasses.make_dataclass(
    "Scenario",
    [(name, options, field(default_factory=options)) for name, options in family_options().items()]
    + [("allowance", Allowance, field(default_factory=Allowance))],
    bases=(_Point,),
)
Scenario.__module__ = __name__  # make_dataclass's `module` argument is Python 3.12's
Scenario.__doc__ = "A model under a strategy on so many nodes, with the step and every family's options."


def baseline_nodes(sc) -> int:
    """The smallest node count the scenario's strategy can run on (its weak-scaling baseline): 1, or for a
    group wider than a node (HYBRID_16GPU on 8-GPU nodes, a ZeRO++ partition of 16) the fewest nodes
    whose ranks it divides."""
    label = parse_strategy(sc.strategy)
    groups = [label.hybrid_group or 1]
    costs = FAMILIES[label.family].costs
    if costs is not None:
        groups.extend(costs.groups(sc, label))
    n = 1
    while any((n * sc.gpus_per_node) % g for g in groups) and n < 1 << 16:
        n += 1
    return n


def from_config(cfg, nodes: int, gpus_per_node: int, device_memory_gib: float | None, **extra):
    """A Scenario for the run `cfg` describes, on `nodes` x `gpus_per_node` ranks."""
    return Scenario(
        model=cfg.model,
        strategy=cfg.strategy,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        batch_size=cfg.train.batch_size,
        precision=cfg.train.precision,
        activation_checkpointing=cfg.train.activation_checkpointing,
        num_classes=cfg.train.num_classes,
        synthetic_batches=getattr(cfg.train, "synthetic_batches", 4),
        device_memory_gib=device_memory_gib,
        **{name: dataclasses.replace(getattr(cfg, name)) for name in family_options()},
        **{"optimizer": cfg.train.optimizer, **extra},
    )


# ---------------------------------------------------------------- who holds what


def layout(sc) -> Layout:
    """The strategy's own layout (vit_scale.distributed), as the trainer would build it."""
    lay = layout_of(sc.strategy, sc.world, sc.gpus_per_node, sc)
    costs = FAMILIES[lay.family].costs
    if costs is not None and costs.note:
        # what the planner adds to the strategy's own layout notes: how far its formulas are checked
        lay = dataclasses.replace(lay, notes=lay.notes + (costs.note,))
    return lay
