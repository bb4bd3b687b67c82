"""LoRA fine-tuning (finetune.lora.rank > 0): peft's low-rank adapters injected into the Linear
layers of each timm Block, every other weight frozen except the classifier head, which is new for
the dataset and trains in full.

The adapters go into the plain timm module before any strategy wraps it (LoraFactory), so the
wrappers see ordinary parameters, some of them frozen: DDP leaves those out of its all-reduce, FSDP2
shards them like the rest, FSDP1 needs use_orig_params=true to flatten frozen and trainable
parameters into one unit, DeepSpeed's ZeRO optimizers keep state only for trainable ones.
"""

from __future__ import annotations

import importlib.util
import re

from vit_scale.errors import UserError
from vit_scale.models import BLOCK_LINEARS, parse_block_linears

INSTALL = "pip install 'vit-scale[lora]' (or bash env/setup_venv.sh SYSTEM --extras lora)"


def enabled(lora_cfg) -> bool:
    return lora_cfg.rank > 0


def targets(lora_cfg) -> list[str]:
    """finetune.lora.targets in one order, so that `qkv,fc1` and `fc1,qkv` describe (and resume) the
    same adapters (validation has refused unknown names)."""
    return parse_block_linears(lora_cfg.targets)


def describe(lora_cfg) -> str:
    """One string that says which adapters a run trains: kept in checkpoints, which a run with
    other adapters (or none) cannot continue from."""
    if not enabled(lora_cfg):
        return "none"
    return f"r={lora_cfg.rank} alpha={lora_cfg.alpha:g} targets={','.join(targets(lora_cfg))}"


def check(cfg, world, family) -> None:
    """LoRA's own conditions, on every rank before any process group: one line each."""
    from vit_scale.distributed import parse_strategy
    from vit_scale.distributed.base import init_mode
    from vit_scale.models import count_params

    if not enabled(cfg.finetune.lora):
        return
    if not family.trains_lora(cfg.strategy):
        from vit_scale.distributed import allowed_text, labels_where

        can = labels_where(lambda other, label: other.trains_lora(label))
        raise UserError(
            f"finetune.lora.rank: {cfg.strategy} does not train LoRA adapters ({family.lora_why}); "
            f"allowed: {allowed_text(can)}"
        )
    layout = family.layout(cfg, parse_strategy(cfg.strategy), world.world_size, world.local_world_size)
    if layout.implementation == "fsdp1" and not cfg.fsdp.use_orig_params:
        raise UserError(
            "finetune.lora.rank: FSDP1 flattens each Block's parameters into one tensor, which cannot mix "
            "LoRA's frozen and trainable ones; set fsdp.use_orig_params=true (or fsdp.version=2)"
        )
    if init_mode(cfg.train.init, count_params(cfg.model, cfg.train.num_classes)) == "meta":
        raise UserError(
            f"finetune.lora.rank: adapters are added to a model built on the device, and train.init="
            f"{cfg.train.init} builds {cfg.model} on the meta device; set train.init=device"
        )
    if importlib.util.find_spec("peft") is None:
        raise UserError(f"finetune.lora.rank: LoRA needs peft, which is not installed; {INSTALL}")


def target_pattern(lora_cfg) -> str:
    """A regular expression peft matches against whole module names. The bare name 'proj' would also
    pick patch_embed.proj, the Conv2d patch embedding, which is not an attention layer."""
    paths = "|".join(re.escape(BLOCK_LINEARS[t]) for t in targets(lora_cfg))
    return rf"blocks\.\d+\.({paths})"


def add_adapters(model, lora_cfg) -> dict:
    """Inject the adapters into `model` in place, freeze everything else but the head; returns the
    facts the run record keeps (parameter counts of the whole, unsharded model)."""
    from vit_scale.compat import ensure_torchvision_importable

    ensure_torchvision_importable()  # peft imports transformers, which imports torchvision
    import peft

    config = peft.LoraConfig(
        r=lora_cfg.rank,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=target_pattern(lora_cfg),
        bias="none",
    )
    peft.inject_adapter_in_model(config, model)  # also freezes every parameter that is not an adapter's
    for p in model.head.parameters():
        p.requires_grad_(True)
    adapted = sum(1 for m in model.modules() if isinstance(m, peft.tuners.lora.LoraLayer))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {
        "rank": lora_cfg.rank,
        "alpha": lora_cfg.alpha,
        "dropout": lora_cfg.dropout,
        "targets": targets(lora_cfg),
        "adapted_layers": adapted,
        "trainable_params": trainable,
        "total_params": total,
        "peft": peft.__version__,
    }


class LoraFactory:
    """A model factory whose models carry the adapters: the wrapped factory builds (and loads
    pretrained weights into) the timm model, then the adapters are added, the same on every rank."""

    def __init__(self, inner, lora_cfg):
        self.inner, self.lora_cfg = inner, lora_cfg
        self.spec, self.num_classes, self.seed, self.params = inner.spec, inner.num_classes, inner.seed, inner.params
        self.init = inner.init  # "device": check refuses what would build on the meta device
        self.block_class = inner.block_class
        self.facts: dict | None = None

    def on_device(self, device):
        model = self.inner.on_device(device)
        self.facts = add_adapters(model, self.lora_cfg)
        return model

    def on_meta(self):
        raise RuntimeError("LoRA needs train.init=device")  # refused before the run starts (check)

    def init_module(self, module, name, device=None):
        # only meta-built models are initialised module by module, and LoRA's are never meta-built;
        # timm's initialiser would also overwrite the adapters' zero B matrices
        raise RuntimeError("LoRA needs train.init=device")
