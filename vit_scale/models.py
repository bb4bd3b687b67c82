"""The ViT family of the study, by name, built on timm's VisionTransformer.

Dimensions follow Table 1 of the Frontier FSDP study (seed 003). Parameter counts are
counted from the built module, never copied from the table: with timm's standard MLP the
table's ViT-5B dimensions give about 3.81B parameters, not the 5349M the table prints.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from vit_scale.errors import UserError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    embed_dim: int
    depth: int
    mlp_dim: int
    num_heads: int
    patch_size: int
    img_size: int = 224
    table_params_m: float | None = None  # what seed 003's Table 1 prints, for the docs only

    @property
    def tokens(self) -> int:
        """Sequence length: patches plus the class token."""
        return (self.img_size // self.patch_size) ** 2 + 1


_SPECS = [
    # laptops and tests
    ModelSpec("vit_micro", embed_dim=64, depth=4, mlp_dim=128, num_heads=4, patch_size=4, img_size=32),
    ModelSpec("vit_tiny", embed_dim=192, depth=12, mlp_dim=768, num_heads=3, patch_size=16),
    ModelSpec("vit_small", embed_dim=384, depth=12, mlp_dim=1536, num_heads=6, patch_size=16),
    # Table 1 of seed 003
    ModelSpec("vit_base", embed_dim=768, depth=12, mlp_dim=3072, num_heads=12, patch_size=16, table_params_m=87),
    ModelSpec("vit_huge", embed_dim=1280, depth=32, mlp_dim=5120, num_heads=16, patch_size=14, table_params_m=635),
    ModelSpec("vit_1b", embed_dim=1536, depth=32, mlp_dim=6144, num_heads=16, patch_size=14, table_params_m=914),
    ModelSpec("vit_3b", embed_dim=2816, depth=32, mlp_dim=11264, num_heads=32, patch_size=14, table_params_m=3067),
    ModelSpec("vit_5b", embed_dim=1792, depth=56, mlp_dim=15360, num_heads=16, patch_size=14, table_params_m=5349),
    ModelSpec("vit_15b", embed_dim=5040, depth=48, mlp_dim=20160, num_heads=48, patch_size=14, table_params_m=14720),
]
MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}


def get_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise UserError(f"model: unknown model '{name}'; allowed: {', '.join(MODELS)}") from None


def build_model(spec: ModelSpec, num_classes: int = 1000, device=None):
    """A timm VisionTransformer for `spec` on `device` ("meta" builds no storage at all)."""
    from vit_scale.compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        img_size=spec.img_size,
        patch_size=spec.patch_size,
        num_classes=num_classes,
        embed_dim=spec.embed_dim,
        depth=spec.depth,
        num_heads=spec.num_heads,
        mlp_ratio=spec.mlp_dim / spec.embed_dim,
        # a meta model would only waste time running the init on nothing
        weight_init="skip" if str(device) == "meta" else "",
        device=device,
    )


def block_class():
    """The module FSDP wraps as one unit and activation checkpointing recomputes."""
    from vit_scale.compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.models.vision_transformer import Block

    return Block


@lru_cache(maxsize=None)
def count_params(name: str, num_classes: int = 1000) -> int:
    """The true parameter count, from a module built on the meta device (no memory)."""
    model = build_model(get_spec(name), num_classes, device="meta")
    return sum(p.numel() for p in model.parameters())


@lru_cache(maxsize=None)
def flops_per_image(name: str, num_classes: int = 1000) -> int:
    """Forward + backward FLOPs for one image, counted by torch.utils.flop_counter on meta tensors.

    Counting on the meta device costs no memory and no compute, so it works for ViT-15B too.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    spec = get_spec(name)
    model = build_model(spec, num_classes, device="meta")
    images = torch.empty(1, 3, spec.img_size, spec.img_size, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        model(images).sum().backward()
    return int(counter.get_total_flops())


def describe(name: str, num_classes: int = 1000) -> dict:
    spec = get_spec(name)
    info = dataclasses.asdict(spec)
    info.pop("table_params_m")
    info.update(params=count_params(name, num_classes), flops_per_image=flops_per_image(name, num_classes),
                num_classes=num_classes)
    return info


def init_module_(module, needs_reset: bool = True) -> None:
    """Initialise the parameters a module owns directly (not its children), as timm does.

    Used when a model built on the meta device is materialised one unit at a time: FSDP calls this
    for each module it materialises, and FSDP2 after `to_empty`. Sharded (DTensor) parameters are
    initialised through their local shard.
    """
    import torch
    from torch import nn

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    with torch.no_grad():
        if isinstance(module, nn.Linear):
            nn.init.trunc_normal_(local(module.weight), std=0.02)
            if module.bias is not None:
                nn.init.zeros_(local(module.bias))
        elif isinstance(module, nn.LayerNorm):
            if module.weight is not None:
                nn.init.ones_(local(module.weight))
            if module.bias is not None:
                nn.init.zeros_(local(module.bias))
        elif isinstance(module, nn.Conv2d):
            nn.init.trunc_normal_(local(module.weight), std=0.02)
            if module.bias is not None:
                nn.init.zeros_(local(module.bias))
        for name in ("pos_embed",):
            if isinstance(getattr(module, name, None), nn.Parameter):
                nn.init.trunc_normal_(local(getattr(module, name)), std=0.02)
        for name in ("cls_token", "reg_token"):
            if isinstance(getattr(module, name, None), nn.Parameter):
                nn.init.normal_(local(getattr(module, name)), std=1e-6)
