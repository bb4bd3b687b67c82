"""The fine-tuning and checkpoint hooks of a strategy: a mixin beside `base.Strategy`.

vit_scale.recipes.finetune drives a step through these (forward, no_sync, backward,
clip_grad_norm, optimizer_step, set_lr) and vit_scale.recipes.checkpoint saves and restores
through the rest; the benchmark loop uses none of them. The defaults fit a torch module whose
optimizer is a plain torch optimizer, with an optional fp16 GradScaler in `scaler` (DDP); a
family whose wrapper owns these steps (FSDP, DeepSpeed, ColossalAI) overrides them.
"""

from __future__ import annotations

import contextlib
import os

from vit_scale.distributed import parts


class FinetuneHooks:
    # the fp16 loss scaler a family's setup makes (torch's GradScaler or FSDP1's sharded one); None
    # when it trains without one (fp32, bf16) or its engine scales the loss itself
    scaler = None

    # the name of the layout `save_state` writes, kept in each checkpoint's meta.json so a
    # strategy that reads another layout refuses it in one line: "full" (rank 0 writes whole
    # state dicts, the default below), "sharded" (FSDP), "engine" (DeepSpeed), "booster" (ColossalAI)
    checkpoint_format = "full"

    def configure_finetune(self, ft) -> None:
        """Called by vit_scale.recipes.finetune with the `finetune` config section, after construction and
        before `artifacts`, `describe` and `setup`: a family whose wrapper takes clipping or
        accumulation in its own config (DeepSpeed) sets them here. The default needs nothing."""

    def forward(self, images):
        """Logits for a batch, in this family's precision (autocast here; FSDP casts inside)."""
        with parts.autocast(self.dtype_name, self.world.torch_device_type):
            return self.model(images)

    def no_sync(self):
        """Backward inside this context accumulates gradients without synchronising them: every
        micro-batch of an accumulated step but the last. The default synchronises anyway, which is
        correct, only slower."""
        return contextlib.nullcontext()

    def backward(self, loss) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip the gradients of the whole model to `max_norm`; returns the norm before clipping."""
        import torch

        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the loss-scaled ones
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))

    def optimizer_step(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
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

    # ------------------------------------------------------------ checkpoints (vit_scale.recipes.checkpoint)

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
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_rank_state(self, state: dict) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
