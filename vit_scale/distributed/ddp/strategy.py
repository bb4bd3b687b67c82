"""torch DistributedDataParallel, the torch half: every rank holds the whole model; gradients are
all-reduced."""

from __future__ import annotations

from vit_scale.distributed import parts
from vit_scale.distributed.base import Strategy
from vit_scale.distributed.hooks import FinetuneHooks


class DDPStrategy(FinetuneHooks, Strategy):
    family = "ddp"  # the fine-tuning hooks' defaults are DDP's; only no_sync is its own

    def no_sync(self):
        return self.model.no_sync()

    def setup(self, factory) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        train = self.cfg.train
        model = factory.on_device(self.world.device)
        # the order: checkpointing inside DDP, then DDP, then compile the wrapped model, then the optimizer
        if train.activation_checkpointing:
            parts.apply_ac(model)
        device_ids = None if self.world.device_type == "cpu" else [self.world.device_index]
        self.model = DistributedDataParallel(model, device_ids=device_ids)
        if train.compile:
            parts.compile_whole(self.model)
        kernel = parts.optimizer_kernel(train.optimizer, self.world.device_type)
        self.optimizer = parts.make_optimizer(self.model.parameters(), train, kernel)
        self.scaler = torch.amp.GradScaler(self.world.torch_device_type) if train.precision == "fp16" else None

    def train_step(self, images, labels):
        with parts.autocast(self.dtype_name, self.world.torch_device_type):
            logits = self.model(images)
        loss = parts.loss(logits, labels)
        parts.backward_and_step(loss, self.optimizer, self.scaler)
        return loss.detach()
