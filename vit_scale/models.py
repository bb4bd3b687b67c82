"""The ViT family of the study, by name, built on timm's VisionTransformer.

Dimensions follow Table 1 of the Frontier FSDP study (seed 003). Parameter counts are
counted from the built module, never copied from the table: with timm's standard MLP the
table's ViT-5B dimensions give about 3.81B parameters, not the 5349M the table prints.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache

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


# the Linear layers of a timm Block, by short name (what finetune.lora.targets lists) -> path inside the Block
BLOCK_LINEARS = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


def parse_block_linears(text: str) -> list[str]:
    """Comma-separated Block Linear names as a list in BLOCK_LINEARS order, without repeats, so that
    `qkv,fc1` and `fc1,qkv` name the same layers; unknown names follow, left for the caller to refuse."""
    named = [t.strip() for t in text.split(",") if t.strip()]
    return [t for t in BLOCK_LINEARS if t in named] + [t for t in dict.fromkeys(named) if t not in BLOCK_LINEARS]


def block_class():
    """The module FSDP wraps as one unit and activation checkpointing recomputes."""
    from vit_scale.compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.models.vision_transformer import Block

    return Block


@cache
def count_params(name: str, num_classes: int = 1000) -> int:
    """The true parameter count, from a module built on the meta device (no memory)."""
    model = build_model(get_spec(name), num_classes, device="meta")
    return sum(p.numel() for p in model.parameters())


@cache
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
    info.update(
        params=count_params(name, num_classes),
        flops_per_image=flops_per_image(name, num_classes),
        num_classes=num_classes,
    )
    return info


# what timm 1.0.31's VisionTransformer(weight_init='') leaves in each parameter (timm/models/
# vision_transformer.py: VisionTransformer.init_weights and init_weights_vit_timm)
WEIGHT_STD = 0.02  # Linear weights and pos_embed: trunc_normal_(std=.02), cut at +-2 (timm's a, b)
TOKEN_STD = 1e-6  # cls_token, reg_token: normal_(std=1e-6)


def init_module_(module, name: str, seed: int, device=None) -> None:
    """Initialise the parameters `module` owns directly (not its children), drawn as timm draws them.

    For a model built on the meta device and materialised a piece at a time (FSDP1 one module at a
    time, FSDP2 shard by shard, ZeRO-3 gathered per module). `name` is the module's qualified name
    in the bare timm model. Each parameter comes from its own generator, seeded by `seed` and the
    parameter's qualified name, so its values do not depend on the rank, the sharding, the order in
    which modules are materialised, or the launch. The whole parameter is drawn (on `device`,
    default where it lives) and a sharded (DTensor) parameter keeps its own piece of it.

    The distributions are those of `train.init=device`, not its values (those come from one global
    stream in construction order):
    - nn.Linear: weight truncated normal, std 0.02; bias zeros (init_weights_vit_timm).
    - nn.Conv2d (the patch embedding): PyTorch's own init, which timm leaves in place
      (init_weights_vit_timm only touches Linear, modules with init_weights, and with
      needs_reset=False nothing else): kaiming_uniform_(a=sqrt(5)) and a uniform bias, both
      within +-1/sqrt(fan_in).
    - nn.LayerNorm: ones and zeros (its own reset_parameters at construction).
    - pos_embed: truncated normal, std 0.02; cls_token, reg_token: normal, std 1e-6.
    Any other parameter raises: a timm model with another module needs its rule here first.
    """
    import torch

    if any(True for _ in module.buffers(recurse=False)):
        raise RuntimeError(
            f"meta-device initialisation: {type(module).__name__} {name or '(root)'} has buffers, "
            "which to_empty leaves uninitialised and vit_scale.models.init_module_ does not fill"
        )
    with torch.no_grad():
        for param_name, param in module.named_parameters(recurse=False):
            qualified = f"{name}.{param_name}" if name else param_name
            full = torch.empty(param.shape, dtype=torch.float32, device=device or _local(param).device)
            generator = torch.Generator(device=full.device).manual_seed(_parameter_seed(seed, qualified))
            _draw_as_timm(module, param_name, full, generator)
            _copy_into(param, full)


def _draw_as_timm(module, param_name: str, out, generator) -> None:
    import math

    from torch import nn

    if param_name == "pos_embed":
        nn.init.trunc_normal_(out, std=WEIGHT_STD, a=-2.0, b=2.0, generator=generator)
    elif param_name in ("cls_token", "reg_token"):
        nn.init.normal_(out, std=TOKEN_STD, generator=generator)
    elif isinstance(module, nn.Linear):
        if param_name == "weight":
            nn.init.trunc_normal_(out, std=WEIGHT_STD, a=-2.0, b=2.0, generator=generator)
        else:
            nn.init.zeros_(out)
    elif isinstance(module, nn.LayerNorm):
        (nn.init.ones_ if param_name == "weight" else nn.init.zeros_)(out)
    elif isinstance(module, nn.Conv2d):
        # as nn.Conv2d.reset_parameters: the bias bound from the weight's fan-in
        if param_name == "weight":
            nn.init.kaiming_uniform_(out, a=math.sqrt(5), generator=generator)
        else:
            bound = 1 / math.sqrt(math.prod(module.weight.shape[1:]))
            nn.init.uniform_(out, -bound, bound, generator=generator)
    else:
        raise RuntimeError(
            f"meta-device initialisation: no rule for {type(module).__name__}.{param_name}; "
            "vit_scale.models.init_module_ knows timm's ViT modules only"
        )


def _parameter_seed(seed: int, qualified_name: str) -> int:
    import hashlib

    digest = hashlib.blake2b(f"{seed}:{qualified_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # manual_seed takes any non-negative 64-bit value


def _local(param):
    return param.to_local() if hasattr(param, "to_local") else param


def _copy_into(param, full) -> None:
    """The whole draw into a parameter; a DTensor takes the piece its placements give this rank."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        # src_data_rank=None: split locally, no scatter from rank 0 (every rank drew the same values)
        piece = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
        param.to_local().copy_(piece)
    else:
        param.copy_(full)
