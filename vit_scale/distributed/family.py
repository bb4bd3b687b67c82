"""What the registry knows of a strategy family without loading its torch half.

Each family package (`vit_scale.distributed.fsdp` ...) declares one `Family` in its `__init__`:
its labels, its options dataclass (the run configuration's section named after it), its layout,
its planner terms (`costs`, from its torch-free `cost` module) and what it can do (fine-tune,
compile, LoRA, which JIT kernels it needs). The planner, the analysis and every list of labels
read these; only a run loads `strategy()`, the family's
Strategy class in its `strategy` module. Torch-free, like the family packages' `__init__`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vit_scale.distributed.costing import Costs
from vit_scale.distributed.layout import Layout


def _no_kernels(label: str, device_kind: str) -> tuple:
    return ()


def _full_replica(cfg, label, world_size: int, ranks_per_node: int) -> Layout:
    return Layout(label.label, label.family, label.family, label.label, 1, world_size, 1)


@dataclass(frozen=True)
class Family:
    name: str
    labels: tuple  # the strategy labels this family runs; every list of labels is derived from these
    strategy: Callable[[], type]  # imports and returns the family's Strategy class (its torch half)
    # the family's options (a dataclass of vit_scale.options fields): the run configuration's
    # section named after the family (config.Config declares it); None: the family has no options
    options: type | None = None
    # who holds what for a label on world_size ranks (cfg, label, world_size, ranks_per_node);
    # torch-free, the planner calls it. The default is a full replica on every rank.
    layout: Callable[..., Layout] = _full_replica
    supports_finetune: bool = False  # vit_scale.recipes.finetune runs it
    supports_compile: bool = False  # train.compile: its setup compiles (parts.compile_blocks / compile_whole)
    # finetune.lora (vit_scale.recipes.lora): which labels train a model some of whose parameters
    # are frozen, and why the others do not
    trains_lora: Callable[[str], bool] = lambda label: False
    lora_why: str = "not tried with frozen parameters"
    # the JIT-built kernels (keys of distributed/kernels.py) a run of (label, device kind) may
    # need; `vit-scale prepare` builds them before any run's clock starts
    jit_kernels: Callable[[str, str], tuple] = _no_kernels
    # its planner terms (its `cost` module: memory, collectives, timeline rules; vit_scale.distributed.costing);
    # None: `vit-scale plan` has no model of it
    costs: Costs | None = None
    # (key, flag, help): the options `vit-scale plan` offers as flags of their own (the others through
    # --set); type and choices come from the options dataclass's field
    plan_flags: tuple = ()
