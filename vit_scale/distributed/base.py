"""The one interface every strategy family implements.

A strategy wraps the model and builds the optimizer (`setup`), runs one training step
(`train_step`), says what ran (`describe`) and which parameter shards this rank holds and with
whom it shares them (`local_tensors`, `shard_group`), which is all the replica check needs.
The training loop knows nothing else about any family.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod

from vit_scale.distributed.layout import Layout
from vit_scale.errors import UserError
from vit_scale.models import ModelSpec, block_class, build_model, init_module_

DTYPES = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
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
    family = ""
    labels: tuple = ()  # the strategy labels this family runs; every list of labels is derived from these
    # the family's options (a dataclass of vit_scale.options fields, declared in the family's file):
    # the run configuration's section named after the family; None: the family has no options
    options_class: type | None = None

    def __init__(self, cfg, label, world):
        self.cfg, self.label, self.world = cfg, label, world
        self.model = None
        self.optimizer = None
        self.layout = type(self).layout(cfg, label, world.world_size, world.local_world_size)
        self.implementation = self.layout.implementation
        self.notes: list[str] = list(self.layout.notes)
        self.shard_group = None  # ranks that together hold one full copy (None: this rank alone)
        self.shard_group_size = self.layout.shard
        self.replicate_group_size = self.layout.replicate
        precision = cfg.train.precision
        self.dtype_name = DTYPES[precision]

    @classmethod
    def layout(cls, cfg, label, world_size: int, ranks_per_node: int) -> Layout:
        """Who holds what for this label on world_size ranks; torch-free (the planner calls it).
        The default is a full replica on every rank."""
        W = world_size
        return Layout(label.label, cls.family, cls.family, label.label, 1, W, 1)

    # ------------------------------------------------------------ checks before any process group

    @classmethod
    def check(cls, cfg, label, world) -> None:
        """Raise UserError for a combination that cannot run here. Runs before init_process_group.
        Label x precision x device kind is the capability table's; a family adds its option rules."""
        from vit_scale.distributed.capabilities import refusal

        error = refusal(label.label, cfg.train.precision, world.device_type, cfg)
        if error:
            raise UserError(error)
        if cfg.train.compile and not cls.supports_compile:
            from vit_scale.distributed import labels_where

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

    # ------------------------------------------------------------ fine-tuning (vit_scale.recipes.finetune)
    # The benchmark loop above uses none of these. A family opts in with `supports_finetune` once
    # the defaults below are right for it or it overrides them; the defaults fit a torch module
    # whose optimizer is a plain torch optimizer (DDP).

    supports_finetune = False
    supports_compile = False  # train.compile: the family calls compile_blocks or compile_whole in setup
    # finetune.lora (vit_scale.recipes.lora): the labels that train a model some of whose
    # parameters are frozen, and why the others do not
    lora_why = "not tried with frozen parameters"

    @classmethod
    def trains_lora(cls, label: str) -> bool:
        return False

    @classmethod
    def jit_kernels(cls, label: str, device_kind: str) -> tuple:
        """The JIT-built kernels (keys of distributed/kernels.py) a run of `label` may need on
        `device_kind`; `vit-scale prepare` builds them before any run's clock starts."""
        return ()

    # the name of the layout `save_state` writes, kept in each checkpoint's meta.json so a
    # strategy that reads another layout refuses it in one line: "full" (rank 0 writes whole
    # state dicts, the default below), "sharded" (FSDP), "engine" (DeepSpeed), "booster" (ColossalAI)
    checkpoint_format = "full"

    def configure_finetune(self, ft) -> None:  # noqa: B027 - an optional hook; most families need nothing
        """Called by vit_scale.recipes.finetune with the `finetune` config section, after construction and
        before `artifacts`, `describe` and `setup`: a family whose wrapper takes clipping or
        accumulation in its own config (DeepSpeed) sets them here. The default needs nothing."""

    def forward(self, images):
        """Logits for a batch, in this family's precision (autocast here; FSDP casts inside)."""
        with self.autocast():
            return self.model(images)

    def no_sync(self):
        """Backward inside this context accumulates gradients without synchronising them: every
        micro-batch of an accumulated step but the last. The default synchronises anyway, which is
        correct, only slower."""
        return contextlib.nullcontext()

    def backward(self, loss) -> None:
        scaler = getattr(self, "scaler", None)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip the gradients of the whole model to `max_norm`; returns the norm before clipping."""
        import torch

        scaler = getattr(self, "scaler", None)
        if scaler is not None:
            scaler.unscale_(self.optimizer)  # clip the true gradients, not the loss-scaled ones
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))

    def optimizer_step(self) -> None:
        scaler = getattr(self, "scaler", None)
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def set_training(self, training: bool) -> None:
        self.model.train(training)

    def eval_logits(self, images):
        import torch

        with torch.no_grad():
            return self.forward(images)

    def unwrapped_model(self):
        """The timm module inside the wrapper (its parameter names are the checkpoint's)."""
        return getattr(self.model, "module", self.model)

    def checkpoint_state(self) -> dict:
        """Everything a resumed run needs besides data position and RNG: for "full", whole state
        dicts (called on every rank; rank 0 writes them); for "sharded", what
        torch.distributed.checkpoint saves and loads in place."""
        return {"model": self.unwrapped_model().state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_checkpoint_state(self, state: dict) -> None:
        self.unwrapped_model().load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def state_path(self, directory: str) -> str:
        """Where `save_state` writes inside a checkpoint directory (a load error names it)."""
        import os

        return os.path.join(directory, "state.pt")

    def save_state(self, directory: str) -> None:
        """Model and optimizer state into a checkpoint directory; every rank calls it, and what
        each writes is the family's business. This default: rank 0 writes whole state dicts."""
        import torch

        state = self.checkpoint_state()
        if self.world.is_main:
            torch.save(state, self.state_path(directory))

    def load_state(self, directory: str) -> None:
        """The inverse of `save_state`, on every rank, into the already set-up model and optimizer."""
        import torch

        self.load_checkpoint_state(torch.load(self.state_path(directory), map_location="cpu", weights_only=True))

    def rank_state(self) -> dict:
        """Small per-rank state saved beside each rank's RNG states (the fp16 loss scale)."""
        scaler = getattr(self, "scaler", None)
        return {"scaler": scaler.state_dict()} if scaler is not None else {}

    def load_rank_state(self, state: dict) -> None:
        scaler = getattr(self, "scaler", None)
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])

    # ------------------------------------------------------------ shared helpers

    def make_optimizer(self, params):
        import torch

        impl = self.cfg.train.optimizer
        if impl == "auto":
            impl = self.auto_optimizer()
        kwargs = {"fused": {"fused": True}, "foreach": {"foreach": True}, "single": {"foreach": False}}.get(impl, {})
        params = [p for p in params if p.requires_grad]  # LoRA freezes all but the adapters and head
        return torch.optim.AdamW(params, lr=self.cfg.train.lr, weight_decay=self.cfg.train.weight_decay, **kwargs)

    def auto_optimizer(self) -> str:
        """train.optimizer=auto: on a GPU the fused kernel: fastest, and unlike foreach it needs no
        temporary copy of the rank's parameters in the step (which would not let ViT-3B DDP fit a
        64 GB GCD)."""
        return "fused" if self.world.device_type != "cpu" else "default"

    def autocast(self):
        """Autocast for families that keep fp32 parameters and cast on the fly (DDP)."""
        import torch

        if self.dtype_name is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.world.torch_device_type, dtype=getattr(torch, self.dtype_name))

    @staticmethod
    def loss(logits, labels):
        import torch.nn.functional as F

        return F.cross_entropy(logits.float(), labels)

    def compile_blocks(self, model) -> None:
        """train.compile under FSDP, as torchtitan does it: each transformer Block compiled in place
        (the module keeps its type, so wrap policies and checkpoint wrappers still find it), the
        FSDP hooks between blocks left to eager."""
        if self.cfg.train.compile:
            block = block_class()
            for module in model.modules():
                if isinstance(module, block):
                    module.compile()

    def compile_whole(self, model) -> None:
        """train.compile under DDP: the wrapped model, whose graph DDP's optimizer splits at its buckets."""
        if self.cfg.train.compile:
            model.compile()

    def apply_activation_checkpointing(self, model) -> None:
        if not self.cfg.train.activation_checkpointing:
            return
        from functools import partial

        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        block = block_class()
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, block),
        )
