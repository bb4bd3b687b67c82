"""torch DistributedDataParallel, torch-free half: every rank holds the whole model; gradients
are all-reduced. The Strategy is in `strategy`."""

from __future__ import annotations

from vit_scale.distributed.ddp.cost import COSTS
from vit_scale.distributed.family import Family
from vit_scale.distributed.layout import Layout


def layout(cfg, label, world_size, ranks_per_node):
    return Layout(label.label, "ddp", "ddp", "DDP", 1, world_size, 1)


def _strategy():
    from vit_scale.distributed.ddp.strategy import DDPStrategy

    return DDPStrategy


FAMILY = Family(
    "ddp",
    labels=("DDP",),
    strategy=_strategy,
    costs=COSTS,
    layout=layout,
    supports_finetune=True,  # the fine-tuning hooks' defaults are DDP's; only no_sync is its own
    supports_compile=True,
    trains_lora=lambda label: True,  # frozen parameters stay out of the gradient all-reduce
)
