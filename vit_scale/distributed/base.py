"""The one interface every strategy family implements.

A strategy wraps the model and builds the optimizer (`setup`), runs one training step
(`train_step`), says what ran (`describe`) and which parameter shards this rank holds and with
whom it shares them (`local_tensors`, `shard_group`), which is all the replica check needs.
The training loop knows nothing else about any family.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod

from ..errors import UserError
from ..models import ModelSpec, block_class, build_model, init_module_

DTYPES = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}
META_INIT_ABOVE_PARAMS = 1.5e9


class ModelFactory:
    """Builds the model the same way on every rank, so replicas start equal without a broadcast."""

    def __init__(self, spec: ModelSpec, num_classes: int, seed: int, init: str, params: int):
        self.spec, self.num_classes, self.seed, self.params = spec, num_classes, seed, params
        self.init = init if init != "auto" else ("meta" if params > META_INIT_ABOVE_PARAMS else "device")

    def on_device(self, device):
        import torch

        torch.manual_seed(self.seed)
        return build_model(self.spec, self.num_classes, device=device)

    def on_meta(self):
        return build_model(self.spec, self.num_classes, device="meta")

    @staticmethod
    def init_module(module) -> None:
        init_module_(module)

    @staticmethod
    def block_class():
        return block_class()


class Strategy(ABC):
    family = ""

    def __init__(self, cfg, label, world):
        self.cfg, self.label, self.world = cfg, label, world
        self.model = None
        self.optimizer = None
        self.implementation = self.family
        self.notes: list[str] = []
        self.shard_group = None        # ranks that together hold one full copy (None: this rank alone)
        self.shard_group_size = 1
        self.replicate_group_size = world.world_size
        precision = cfg.train.precision
        self.dtype_name = DTYPES[precision]

    # ------------------------------------------------------------ checks before any process group

    @classmethod
    def check(cls, cfg, label, world) -> None:
        """Raise UserError for a combination that cannot run here. Runs before init_process_group."""
        if cfg.train.precision == "fp16" and world.device_type == "cpu" and cls.family in ("fsdp",):
            raise UserError("train.precision: fp16 with FSDP needs a GPU (sharded grad scaling is CUDA-only); "
                            "use bf16 or fp32 on a CPU")

    # ------------------------------------------------------------ the interface

    @abstractmethod
    def setup(self, factory: ModelFactory) -> None:
        """Build the wrapped model and its optimizer."""

    @abstractmethod
    def train_step(self, images, labels):
        """Forward, backward, optimizer step; returns the loss as a detached 0-d tensor."""

    def options(self) -> dict:
        return {"precision": self.cfg.train.precision,
                "activation_checkpointing": self.cfg.train.activation_checkpointing}

    def describe(self) -> dict:
        return {"label": self.label.label, "family": self.family, "implementation": self.implementation,
                "shard_group_size": self.shard_group_size, "replicate_group_size": self.replicate_group_size,
                "options": self.options(), "notes": self.notes}

    def artifacts(self) -> dict[str, str]:
        """Files this strategy wants in the run directory ({file name: text}), written by rank 0
        before setup (e.g. the generated DeepSpeed config). Built from the config alone."""
        return {}

    def local_tensors(self):
        """The parameter data this rank holds (its shard, or the whole model when unsharded)."""
        for p in self.model.parameters():
            yield p.to_local() if hasattr(p, "to_local") else p

    # ------------------------------------------------------------ shared helpers

    def make_optimizer(self, params):
        import torch

        return torch.optim.AdamW(params, lr=self.cfg.train.lr, weight_decay=self.cfg.train.weight_decay)

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

    def apply_activation_checkpointing(self, model) -> None:
        if not self.cfg.train.activation_checkpointing:
            return
        from functools import partial

        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

        block = block_class()
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, block))
