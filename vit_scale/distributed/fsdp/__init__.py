"""torch FSDP, torch-free half: its labels (NO_SHARD, FULL_SHARD, SHARD_GRAD_OP, HYBRID_<g>GPU),
its `fsdp.*` options and its layout, as FSDP1 (FullyShardedDataParallel, the study's) or FSDP2
(`fully_shard`). The Strategy, one unit per timm `Block`, is in `strategy`.

HYBRID_<g>GPU shards within groups of g consecutive ranks (the closest GPUs under srun's
block distribution) and replicates across groups: a (world/g, g) device mesh.

HYBRID_1GPU runs on FSDP2 whatever `fsdp.version` says. FSDP1 given a 1-rank shard group
switches to NO_SHARD over that one rank, with only a warning, and then never all-reduces
gradients: replicas train apart and the images/s look excellent because nothing is
communicated. FSDP2's (world, 1) mesh all-reduces across replicas as it should; the run
records which implementation ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vit_scale.distributed.family import Family
from vit_scale.distributed.fsdp.cost import COSTS
from vit_scale.distributed.layout import Layout
from vit_scale.options import option


# the fsdp.* keys of the run configuration
@dataclass
class FSDPConfig:
    version: Literal[1, 2] = option(1, "1: FullyShardedDataParallel (the paper's); 2: fully_shard")
    backward_prefetch: Literal["none", "pre", "post"] = option("pre", "FSDP1: BACKWARD_PRE / BACKWARD_POST / none")
    limit_all_gathers: bool = option(True, "FSDP1")
    forward_prefetch: bool = option(False, "FSDP1")
    use_orig_params: bool = option(False, "FSDP1")
    cpu_offload: bool = option(False, "needs a GPU with FSDP1 (pinned memory)")


# the fsdp.* keys `vit-scale plan` has flags for, and what their --help says
PLAN_FLAGS = (
    ("version", "--fsdp-version", "default 1 (fsdp.version)"),
    ("backward_prefetch", "--backward-prefetch", "default pre"),
    ("limit_all_gathers", "--limit-all-gathers", "default on"),
    ("forward_prefetch", "--forward-prefetch", "default off"),
    ("use_orig_params", "--use-orig-params", "default off"),
)


def layout(cfg, label, world_size, ranks_per_node):
    W, notes = world_size, []
    version = cfg.fsdp.version
    if label.hybrid_group == 1 and version == 1:
        version = 2
        notes.append(
            "HYBRID_1GPU runs on FSDP2 with a (world, 1) mesh: FSDP1 with 1-rank shard groups "
            "falls back to NO_SHARD over one rank and never synchronises the replicas"
        )
    shard = label.hybrid_group or (1 if label.label == "NO_SHARD" else W)
    sharding = "HYBRID_SHARD" if label.hybrid_group else label.label
    if version == 1 and shard == 1 and sharding != "NO_SHARD":
        notes.append(f"{label.label} over a 1-rank shard group: FSDP1 runs it as NO_SHARD")
        sharding = "NO_SHARD"
    return Layout(label.label, "fsdp", f"fsdp{version}", sharding, shard, max(1, W // shard), shard, notes=tuple(notes))


def _strategy():
    from vit_scale.distributed.fsdp.strategy import FSDPStrategy

    return FSDPStrategy


FAMILY = Family(
    "fsdp",
    # from replicated to fully sharded, the order legends and tables use; g: shard group size
    labels=("NO_SHARD", "HYBRID_<g>GPU", "SHARD_GRAD_OP", "FULL_SHARD"),
    strategy=_strategy,
    costs=COSTS,
    plan_flags=PLAN_FLAGS,
    options=FSDPConfig,
    layout=layout,
    supports_finetune=True,
    supports_compile=True,
    trains_lora=lambda label: True,  # FSDP2 as it is; FSDP1 with use_orig_params (recipes/lora.check)
)
