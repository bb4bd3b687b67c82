"""One question to the planner: a model under a strategy on so many nodes, and everything the
answer depends on (batch, precision, checkpointing, the strategy family's options, the allowance).

Built from the trainer's own `Config` (`from_config`), so the CLI, the trainer's `predict_for_run`
and the job scripts all describe a run the same way, with the same defaults and validation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from vit_scale.distributed import PRECISIONS, layout_of, parse_strategy
from vit_scale.distributed.colossalai import ColossalAIConfig
from vit_scale.distributed.deepspeed import DeepSpeedConfig
from vit_scale.distributed.fsdp import FSDPConfig
from vit_scale.distributed.layout import Layout
from vit_scale.errors import UserError
from vit_scale.models import get_spec
from vit_scale.planning.shapes import Shape

ATTENTION = ("fused", "materialised")
OPTIMIZER_IMPLS = ("auto", "foreach", "single", "fused")

# ColossalAI's LowLevelZero default reduce bucket (reduce_bucket_size_in_m=12, in elements)
CAI_REDUCE_BUCKET = 12 * 1024 * 1024
# DeepSpeed ZeRO-3 defaults the trainer does not override
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
DS_SUB_GROUP_SIZE = 1_000_000_000


@dataclass
class Allowance:
    """What the caching allocator and the runtime need beyond the bytes tensors hold."""

    runtime_gib: float = 1.0  # device context + NCCL/RCCL buffers: outside torch's allocator
    fragmentation: float = 0.05  # share of the peak lost to block rounding and splitting
    stream_held: bool = True  # count memory released onto communication streams (docs/plan.md)
    cpu_ahead_units: int = 4  # FSDP1 without limit_all_gathers: units the CPU all-gathers ahead


@dataclass
class Scenario:
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
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    colossalai: ColossalAIConfig = field(default_factory=ColossalAIConfig)
    allowance: Allowance = field(default_factory=Allowance)

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
        if a.runtime_gib < 0 or a.fragmentation < 0 or a.cpu_ahead_units < 0:
            raise UserError("allowance: runtime-gib, fragmentation and cpu-ahead-units must not be negative")
        g = label.hybrid_group
        if g and self.world % g:
            raise UserError(
                f"strategy: {label.label} needs a world size divisible by {g}, but {self.nodes} node(s) "
                f"x {self.gpus_per_node} GPUs is {self.world}; use HYBRID_<g>GPU with g dividing "
                f"{self.world}"
            )
        if label.label == "ZEROPP":
            hpz = self.deepspeed.hpz_partition_size or self.gpus_per_node
            if self.world % hpz:
                raise UserError(f"deepspeed.hpz_partition_size: {hpz} must divide the world size ({self.world})")


def baseline_nodes(sc: Scenario) -> int:
    """The smallest node count the scenario's strategy can run on (its weak-scaling baseline): 1, or for a
    group wider than a node (HYBRID_16GPU on 8-GPU nodes, a ZeRO++ partition of 16) the fewest nodes
    whose ranks it divides."""
    label = parse_strategy(sc.strategy)
    groups = [label.hybrid_group or 1]
    if label.label == "ZEROPP" and sc.deepspeed.hpz_partition_size:
        groups.append(sc.deepspeed.hpz_partition_size)
    n = 1
    while any((n * sc.gpus_per_node) % g for g in groups) and n < 1 << 16:
        n += 1
    return n


def from_config(cfg, nodes: int, gpus_per_node: int, device_memory_gib: float | None, **extra) -> Scenario:
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
        fsdp=dataclasses.replace(cfg.fsdp),
        deepspeed=dataclasses.replace(cfg.deepspeed),
        colossalai=dataclasses.replace(cfg.colossalai),
        **{"optimizer": cfg.train.optimizer, **extra},
    )


# ---------------------------------------------------------------- who holds what

# what the planner adds to the strategy's own layout notes: how far its formula is checked
_APPROXIMATE = {
    "deepspeed": "DeepSpeed memory follows its 0.19 ZeRO optimizer; approximate beyond the states the tests check",
    "colossalai": "ColossalAI memory is approximate: its plugins need a GPU, so nothing here is checked against "
    "real tensors",
}


def layout(sc: Scenario) -> Layout:
    """The strategy's own layout (vit_scale.distributed), as the trainer would build it."""
    lay = layout_of(sc.strategy, sc.world, sc.gpus_per_node, sc)
    if lay.family in _APPROXIMATE:
        lay = dataclasses.replace(lay, notes=lay.notes + (_APPROXIMATE[lay.family],))
    return lay
