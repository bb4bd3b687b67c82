"""Who holds what: one torch-free description of how a strategy spreads a model over the ranks.

Each family package computes it (its `layout`, in its torch-free `__init__`, no process group needed); the
strategy builds its groups from it and records it, the planner sizes memory and communication
from it, and the analysis' synthetic records use it. One description, so the three cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    label: str
    family: str
    implementation: str  # what runs: ddp, fsdp1, fsdp2, deepspeed-zero3-pp, colossalai-GeminiPlugin ...
    sharding: str  # how the parameters are held: DDP, NO_SHARD, FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD,
    # ZERO1..3, or the ColossalAI label
    shard: int  # ranks one copy of the parameters is spread over (the record's shard_group_size)
    replicate: int  # copies of the parameters (replicate_group_size); shard x replicate = world
    state_shard: int  # ranks the optimizer states are partitioned over (ZeRO-1/2 partition them, not weights)
    hpz: int = 0  # ZEROPP: ranks of the secondary weight partition
    notes: tuple = ()  # what a reader of the record should know about this layout

    def __post_init__(self):
        if self.shard < 1 or self.replicate < 1 or self.state_shard < 1:
            raise ValueError(f"layout of {self.label}: group sizes must be positive")
