"""The pieces every family's `setup` and `train_step` apply to the model, as free functions (as
torchtitan keeps them): the optimizer, autocast, torch.compile, activation checkpointing and the
loss. Each family's setup calls them in its own order, which it shows in one place; torch is
imported inside each function, so the family modules stay importable without it.
"""

from __future__ import annotations

import contextlib

from vit_scale.models import block_class

DTYPES = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def optimizer_kernel(choice: str, device_type: str) -> str:
    """train.optimizer as it will run. auto: on a GPU the fused kernel: fastest, and unlike foreach
    it needs no temporary copy of the rank's parameters in the step (which would not let ViT-3B DDP
    fit a 64 GB GCD); on a CPU torch's default."""
    if choice != "auto":
        return choice
    return "fused" if device_type != "cpu" else "default"


def make_optimizer(params, train, kernel: str):
    """torch's AdamW at train.lr and train.weight_decay over the parameters that train; `kernel`:
    fused, foreach, single or default (optimizer_kernel)."""
    import torch

    kwargs = {"fused": {"fused": True}, "foreach": {"foreach": True}, "single": {"foreach": False}}.get(kernel, {})
    params = [p for p in params if p.requires_grad]  # LoRA freezes all but the adapters and head
    return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay, **kwargs)


def autocast(dtype_name: str | None, device_type: str):
    """Autocast for families that keep fp32 parameters and cast on the fly (DDP); a no-op for fp32."""
    import torch

    if dtype_name is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=getattr(torch, dtype_name))


def loss(logits, labels):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float(), labels)


def backward_and_step(loss_value, optimizer, scaler) -> None:
    """The backward and the optimizer step of a torch optimizer, through the fp16 loss scaler when there
    is one (torch's GradScaler or FSDP's ShardedGradScaler), then the gradients dropped."""
    if scaler is not None:
        scaler.scale(loss_value).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss_value.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def compile_blocks(model) -> None:
    """train.compile under FSDP, as torchtitan does it: each transformer Block compiled in place
    (the module keeps its type, so wrap policies and checkpoint wrappers still find it), the FSDP
    hooks between blocks left to eager."""
    block = block_class()
    for module in model.modules():
        if isinstance(module, block):
            module.compile()


def compile_whole(model) -> None:
    """train.compile under DDP: the wrapped model, whose graph DDP's optimizer splits at its buckets."""
    model.compile()


def apply_ac(model) -> None:
    """Activation checkpointing: each timm Block recomputed in the backward (non-reentrant)."""
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
