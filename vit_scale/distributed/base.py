"""The one interface every strategy family's torch half implements, and the model factory.

A strategy knows its `layout`, refuses what cannot run (`check`), wraps the model and builds the
optimizer (`setup`), runs one training step (`train_step`), says what ran (`describe`) and what
it writes into the run directory (`artifacts`), and which parameter shards this rank holds and
with whom it shares them (`local_tensors`, `shard_group`), which is all the replica check needs.
The training loop knows nothing else about any family. What the families apply to the model
(optimizer, autocast, compile, activation checkpointing) is in `parts`; fine-tuning and
checkpoints are `hooks.FinetuneHooks`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from vit_scale.distributed import FAMILIES, labels_where
from vit_scale.distributed.parts import DTYPES
from vit_scale.errors import UserError
from vit_scale.models import ModelSpec, block_class, build_model, init_module_

META_INIT_ABOVE_PARAMS = 1.5e9


def init_mode(init: str, params: int) -> str:
    """train.init as it will run: `auto` builds on the meta device above META_INIT_ABOVE_PARAMS
    parameters (a whole fp32 copy per rank would not fit beside the sharded one), else on the
    device. The one place this is decided: the factory builds by it, DeepSpeed configures by it."""
    if init != "auto":
        return init
    return "meta" if params > META_INIT_ABOVE_PARAMS else "device"


def module_names(model) -> dict:
    """{module: its qualified name} in the bare timm model, taken before any wrapper nests or
    renames modules: the meta init keys its seeds by these names, so wrappers (FSDP units,
    activation checkpointing) must not change them."""
    return {module: name for name, module in model.named_modules()}


class ModelFactory:
    """Builds the model the same way on every rank, so replicas start equal without a broadcast."""

    def __init__(self, spec: ModelSpec, num_classes: int, seed: int, init: str, params: int):
        self.spec, self.num_classes, self.seed, self.params = spec, num_classes, seed, params
        self.init = init_mode(init, params)

    def on_device(self, device):
        import torch

        torch.manual_seed(self.seed)
        return build_model(self.spec, self.num_classes, device=device)

    def on_meta(self):
        return build_model(self.spec, self.num_classes, device="meta")

    def init_module(self, module, name: str, device=None) -> None:
        """Initialise a materialised meta-built module's own parameters from timm's distributions,
        each parameter from a generator keyed by this factory's seed and its name (`name`: the
        module's, from `module_names`), so every rank, sharding and launch gets the same values.
        `device`: where each whole parameter is drawn (default: where it lives)."""
        init_module_(module, name, self.seed, device)

    @staticmethod
    def block_class():
        return block_class()


class Strategy(ABC):
    family = ""  # the name of the family (vit_scale.distributed.FAMILIES) whose torch half this is

    def __init__(self, cfg, label, world):
        self.cfg, self.label, self.world = cfg, label, world
        self.model = None
        self.optimizer = None
        self.layout = FAMILIES[self.family].layout(cfg, label, world.world_size, world.local_world_size)
        self.implementation = self.layout.implementation
        self.notes: list[str] = list(self.layout.notes)
        self.shard_group = None  # ranks that together hold one full copy (None: this rank alone)
        self.shard_group_size = self.layout.shard
        self.replicate_group_size = self.layout.replicate
        self.dtype_name = DTYPES[cfg.train.precision]

    # ------------------------------------------------------------ checks before any process group

    @classmethod
    def check(cls, cfg, label, world) -> None:
        """Raise UserError for a combination that cannot run here. Runs before init_process_group.
        Label x precision x device kind is the capability table's; a family adds its option rules."""
        from vit_scale.distributed.capabilities import refusal

        error = refusal(label.label, cfg.train.precision, world.device_type, cfg)
        if error:
            raise UserError(error)
        if cfg.train.compile and not FAMILIES[cls.family].supports_compile:
            compiling = labels_where(lambda family, _: family.supports_compile)
            raise UserError(
                f"train.compile: {label.label} does not compile (its engine owns the model); "
                f"compile runs with {', '.join(compiling)}; set train.compile=false"
            )

    # ------------------------------------------------------------ the interface

    @abstractmethod
    def setup(self, factory: ModelFactory) -> None:
        """Build the wrapped model and its optimizer."""

    @abstractmethod
    def train_step(self, images, labels):
        """Forward, backward, optimizer step; returns the loss as a detached 0-d tensor."""

    def options(self) -> dict:
        """What `describe` records of the options that ran; a family adds its own."""
        opts = {
            "precision": self.cfg.train.precision,
            "activation_checkpointing": self.cfg.train.activation_checkpointing,
        }
        # only when on, so a study's series are named after them and earlier records read as before
        opts.update({key: True for key in ("compile", "tf32") if getattr(self.cfg.train, key)})
        return opts

    def describe(self) -> dict:
        return {
            "label": self.label.label,
            "family": self.family,
            "implementation": self.implementation,
            "shard_group_size": self.shard_group_size,
            "replicate_group_size": self.replicate_group_size,
            "options": self.options(),
            "notes": self.notes,
        }

    def artifacts(self) -> dict[str, str]:
        """Files this strategy wants in the run directory ({file name: text}), written by rank 0
        before setup (e.g. the generated DeepSpeed config). Built from the config alone."""
        return {}

    def local_tensors(self):
        """The parameter data this rank holds (its shard, or the whole model when unsharded)."""
        for p in self.model.parameters():
            yield p.to_local() if hasattr(p, "to_local") else p
