"""torch DistributedDataParallel: every rank holds the whole model; gradients are all-reduced."""

from __future__ import annotations

from vit_scale.distributed.base import Strategy
from vit_scale.distributed.layout import Layout


class DDPStrategy(Strategy):
    family = "ddp"
    labels = ("DDP",)
    supports_finetune = True  # the Strategy defaults are DDP's; only no_sync is its own
    supports_compile = True

    @classmethod
    def trains_lora(cls, label: str) -> bool:
        return True  # frozen parameters stay out of the gradient all-reduce

    @classmethod
    def layout(cls, cfg, label, world_size, ranks_per_node):
        return Layout(label.label, "ddp", "ddp", "DDP", 1, world_size, 1)

    def no_sync(self):
        return self.model.no_sync()

    def setup(self, factory) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        model = factory.on_device(self.world.device)
        self.apply_activation_checkpointing(model)
        device_ids = None if self.world.device_type == "cpu" else [self.world.device_index]
        self.model = DistributedDataParallel(model, device_ids=device_ids)
        self.compile_whole(self.model)
        self.optimizer = self.make_optimizer(self.model.parameters())
        self.scaler = torch.amp.GradScaler(self.world.torch_device_type) if self.cfg.train.precision == "fp16" else None

    def train_step(self, images, labels):
        with self.autocast():
            logits = self.model(images)
        loss = self.loss(logits, labels)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()
