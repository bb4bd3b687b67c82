"""Strategy registry: family name -> its `Family` (vit_scale.distributed.family). Adding a family
is one package here (its torch-free `__init__` declaring FAMILY, its torch-free `cost` module, the
planner's terms, and its `strategy` module) and one line below; every list of labels is derived
here from the families' labels, as is the set of option sections (`fsdp.*`, `deepspeed.*` ...)
that the run configuration and the planner's Scenario declare.

The family packages' `__init__` import no torch, DeepSpeed or ColossalAI, nor their own
`strategy` module (the planner and the analysis read labels, options and layouts without them);
a family's torch half is loaded only when a run of one of its labels starts (`strategy_class`).
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import Literal

from vit_scale.distributed import colossalai, ddp, deepspeed, fsdp
from vit_scale.errors import UserError

FAMILIES = {
    "ddp": ddp.FAMILY,
    "fsdp": fsdp.FAMILY,
    "deepspeed": deepspeed.FAMILY,
    "colossalai": colossalai.FAMILY,
}

GROUP_SIZE = "<g>"  # in a label: any positive group size (HYBRID_<g>GPU)

# what every strategy trains in (train.precision); the capability table's columns
Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS = typing.get_args(Precision)


@cache
def family_labels() -> dict[str, tuple]:
    """{family: its labels}, as each family package declares them."""
    return {name: family.labels for name, family in FAMILIES.items()}


def all_labels() -> list[str]:
    """Every label in registry order, HYBRID_<g>GPU standing for all group sizes."""
    return [label for labels in family_labels().values() for label in labels]


def labels_where(test) -> list[str]:
    """The labels, in registry order, for which test(family, label) holds (family: its `Family`):
    what a refusal lists as allowed (fine-tuning, compile, LoRA)."""
    return [label for family in FAMILIES.values() for label in family.labels if test(family, label)]


def label_pattern(label: str) -> str:
    """The regular expression a declared label stands for (its group size, if any, captured)."""
    return re.escape(label).replace(re.escape(GROUP_SIZE), r"([1-9]\d*)")


def allowed_text(labels=None) -> str:
    return ", ".join(
        label + (" (g divides the world size)" if GROUP_SIZE in label else "") for label in (labels or all_labels())
    )


@dataclass(frozen=True)
class StrategyLabel:
    label: str
    family: str
    hybrid_group: int = 0  # g of HYBRID_<g>GPU, else 0


def parse_strategy(label: str) -> StrategyLabel:
    for family, labels in family_labels().items():
        for known in labels:
            m = re.fullmatch(label_pattern(known), label)
            if m:
                return StrategyLabel(label, family, int(m.group(1)) if m.groups() else 0)
    raise UserError(f"strategy: unknown strategy '{label}'; allowed: {allowed_text()}")


@cache
def family_options() -> dict[str, type]:
    """{family: its options dataclass}, for each family that declares one: the run configuration
    declares a section per entry, named after the family, in registry order."""
    return {name: family.options for name, family in FAMILIES.items() if family.options is not None}


def default_options() -> SimpleNamespace:
    """Every family's options at their defaults, under the names the run configuration gives them:
    what a layout reads when no run's configuration is at hand."""
    return SimpleNamespace(**{family: options() for family, options in family_options().items()})


def layout_of(strategy: str, world_size: int, ranks_per_node: int, cfg=None):
    """The Layout a strategy label has on world_size ranks (cfg: anything with the families' option
    sections, a run's Config or the planner's Scenario; None: the defaults). Torch-free: the planner
    and the analysis call it without a process group."""
    if cfg is None:
        cfg = default_options()
    label = parse_strategy(strategy)
    return FAMILIES[label.family].layout(cfg, label, world_size, ranks_per_node)


def strategy_class(family: str):
    """The family's Strategy class: its torch half, imported now."""
    return FAMILIES[family].strategy()
