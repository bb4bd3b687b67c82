"""Pretrained weights from a local file, fitted to the model being fine-tuned.

Reads what timm reads: a state dict saved with torch (.pth, .pt, .bin; bare, or under
`state_dict` / `model`, EMA weights preferred as timm does, `module.` prefixes removed) or a
.safetensors file. timm's own ViT filter then adapts the checkpoint to the model: position
embeddings resampled to a different image size, patch embeddings to a different patch size.
The classifier head is replaced when its shape differs (a different number of classes): the
model keeps its freshly initialised head. Anything else that does not fit is an error.

The file is read once per rank before any process group (so a bad file is a one-line error on
every rank), and the prepared tensors are copied into the model when the strategy builds it.
"""

from __future__ import annotations

import os

from vit_scale.distributed.base import ModelFactory
from vit_scale.errors import UserError

HEAD_PREFIX = "head."  # timm VisionTransformer's classifier: head.weight, head.bias


def _read(path: str) -> dict:
    from vit_scale.compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.models import load_state_dict

    if not os.path.isfile(path):
        raise UserError(f"finetune.pretrained: no such file: {path} (nothing is downloaded at run time)")
    try:
        state = load_state_dict(path, use_ema=True, weights_only=True)
    except Exception as exc:
        raise UserError(
            f"finetune.pretrained: cannot read {path} as a torch or safetensors checkpoint: "
            f"{' '.join(str(exc).split())[:300]}"
        ) from None
    import torch

    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(
            f"finetune.pretrained: {path} holds no state dict (expected tensors by parameter name, "
            f"bare or under 'state_dict' or 'model')"
        )
    return state


def prepare(path: str, model) -> tuple[dict, bool]:
    """The checkpoint's tensors, fitted to `model` (which may be on the meta device), and whether
    the classifier head was replaced."""
    from vit_scale.compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from timm.models.vision_transformer import checkpoint_filter_fn

    state = _read(path)
    try:
        state = checkpoint_filter_fn(state, model)
    except Exception as exc:
        raise UserError(
            f"finetune.pretrained: {path} cannot be adapted to this ViT: {' '.join(str(exc).split())[:300]}"
        ) from None
    expected = model.state_dict()
    head_replaced = False
    for key in [k for k in state if k.startswith(HEAD_PREFIX)]:
        if key not in expected or tuple(state[key].shape) != tuple(expected[key].shape):
            del state[key]
            head_replaced = True
    missing = [k for k in expected if k not in state and not (head_replaced and k.startswith(HEAD_PREFIX))]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k in state if k in expected and tuple(state[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        if wrong:
            k = wrong[0]
            parts.append(
                f"{len(wrong)} of another shape (e.g. {k}: {tuple(state[k].shape)} in the file, "
                f"{tuple(expected[k].shape)} in the model)"
            )
        raise UserError(f"finetune.pretrained: {path} does not fit this model: {'; '.join(parts)}")
    return state, head_replaced


class PretrainedFactory(ModelFactory):
    """ModelFactory whose models start from pretrained weights (same seed, so the replaced head is
    initialised identically on every rank)."""

    def __init__(self, spec, num_classes, seed, init, params, state: dict):
        super().__init__(spec, num_classes, seed, init, params)
        self.state = state

    def on_device(self, device):
        import torch

        model = super().on_device(device)
        with torch.no_grad():
            result = model.load_state_dict(self.state, strict=False)
        assert not result.unexpected_keys and all(k.startswith(HEAD_PREFIX) for k in result.missing_keys), result
        return model

    def on_meta(self):
        raise RuntimeError("pretrained weights need train.init=device")  # refused before the run starts
