"""ColossalAI Booster plugins, torch-free half: the labels CAI_DDP, CAI_DDP_FP16,
CAI_LOW_LEVEL_ZERO, CAI_GEMINI and CAI_FSDP, the plugin each runs, the `colossalai.*` options and
the layout. The Strategy (the Booster) is in `strategy`, whose docstring says what runs where.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vit_scale.distributed.colossalai.cost import COSTS
from vit_scale.distributed.family import Family
from vit_scale.distributed.layout import Layout
from vit_scale.options import AT_LEAST_1, FRACTION, option

PLUGINS = {
    "CAI_DDP": "TorchDDPPlugin",
    "CAI_DDP_FP16": "TorchDDPPlugin",
    "CAI_LOW_LEVEL_ZERO": "LowLevelZeroPlugin",
    "CAI_GEMINI": "GeminiPlugin",
    "CAI_FSDP": "TorchFSDPPlugin",
}

PRESETS = {"none": {}, "seed000": {"offload_optim_frac": 1.0, "pin_memory": True}}


# the colossalai.* keys of the run configuration
@dataclass
class ColossalAIConfig:
    zero_stage: Literal[1, 2] = option(2, "CAI_LOW_LEVEL_ZERO: 1 or 2")
    cpu_offload: bool = option(False, "CAI_LOW_LEVEL_ZERO")
    placement_policy: Literal["static", "auto"] = option("static", "CAI_GEMINI")
    offload_optim_frac: float = option(0.0, "CAI_GEMINI (static placement)", FRACTION)
    offload_param_frac: float = option(0.0, "CAI_GEMINI (static placement)", FRACTION)
    pin_memory: bool = option(False, "CAI_GEMINI")
    preset: Literal["none", "seed000"] = option(
        "none", "seed000: offload_optim_frac=1.0, pin_memory=True (overrides both)"
    )
    initial_scale: float = option(
        65536.0, "fp16 loss scale to start from (CAI_DDP_FP16 uses torch's GradScaler default)", AT_LEAST_1
    )
    bucket_cap_mb: int = option(25, "CAI_DDP, CAI_DDP_FP16: DDP gradient bucket size", AT_LEAST_1)


def layout(cfg, label, world_size, ranks_per_node):
    W, notes = world_size, ()
    shard = W if label.label == "CAI_FSDP" else 1
    state_shard = 1 if label.label in ("CAI_DDP", "CAI_DDP_FP16") else W
    if label.label in ("CAI_LOW_LEVEL_ZERO", "CAI_GEMINI"):
        notes = (
            "optimizer states are partitioned over all ranks; the replica check compares each "
            "rank's full copy of the parameters"
            + (" (gathered from Gemini's chunks)" if label.label == "CAI_GEMINI" else ""),
        )
    return Layout(
        label.label,
        "colossalai",
        f"colossalai-{PLUGINS[label.label]}",
        label.label,
        shard,
        W // shard,
        state_shard,
        notes=notes,
    )


def _strategy():
    from vit_scale.distributed.colossalai.strategy import ColossalAIStrategy

    return ColossalAIStrategy


def _jit_kernels(label: str, device_kind: str) -> tuple:
    # HybridAdam (Gemini; LowLevelZero with cpu_offload): its host half and, on a GPU, its device half
    if label in ("CAI_GEMINI", "CAI_LOW_LEVEL_ZERO"):
        return ("colossalai.cpu_adam", "colossalai.fused_optim")
    return ()


FAMILY = Family(
    "colossalai",
    labels=("CAI_DDP", "CAI_DDP_FP16", "CAI_LOW_LEVEL_ZERO", "CAI_GEMINI", "CAI_FSDP"),
    strategy=_strategy,
    costs=COSTS,
    options=ColossalAIConfig,
    layout=layout,
    supports_finetune=True,
    trains_lora=lambda label: label == "CAI_DDP",
    lora_why="only CAI_DDP was tried with frozen parameters; Gemini and LowLevelZero need a GPU",
    jit_kernels=_jit_kernels,
)
