"""Strategy registry: label -> family. Adding a family is one file here and one line below.

Families are imported lazily, so DeepSpeed and ColossalAI are loaded only when one of their
labels is asked for.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from ..errors import UserError

# family -> "module:class"
FAMILIES = {
    "ddp": "vit_scale.distributed.ddp:DDPStrategy",
    "fsdp": "vit_scale.distributed.fsdp:FSDPStrategy",
    "deepspeed": "vit_scale.distributed.deepspeed:DeepSpeedStrategy",
    "colossalai": "vit_scale.distributed.colossalai:ColossalAIStrategy",
}

# label pattern -> family
LABELS = [
    (r"DDP", "ddp"),
    (r"NO_SHARD|FULL_SHARD|SHARD_GRAD_OP|HYBRID_[1-9]\d*GPU", "fsdp"),
    (r"ZERO[123]|ZEROPP", "deepspeed"),
    (r"CAI_DDP|CAI_DDP_FP16|CAI_LOW_LEVEL_ZERO|CAI_GEMINI|CAI_FSDP", "colossalai"),
]
ALLOWED_TEXT = ("DDP, NO_SHARD, FULL_SHARD, SHARD_GRAD_OP, HYBRID_<g>GPU (g divides the world size), "
                "ZERO1, ZERO2, ZERO3, ZEROPP, CAI_DDP, CAI_DDP_FP16, CAI_LOW_LEVEL_ZERO, CAI_GEMINI, CAI_FSDP")


@dataclass(frozen=True)
class StrategyLabel:
    label: str
    family: str
    hybrid_group: int = 0  # g of HYBRID_<g>GPU, else 0


def parse_strategy(label: str) -> StrategyLabel:
    for pattern, family in LABELS:
        if re.fullmatch(pattern, label):
            m = re.fullmatch(r"HYBRID_(\d+)GPU", label)
            return StrategyLabel(label, family, int(m.group(1)) if m else 0)
    raise UserError(f"strategy: unknown strategy '{label}'; allowed: {ALLOWED_TEXT}")


def strategy_class(family: str):
    module_name, cls_name = FAMILIES[family].split(":")
    return getattr(importlib.import_module(module_name), cls_name)
