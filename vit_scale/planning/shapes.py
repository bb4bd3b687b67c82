"""What a timm VisionTransformer of the registry is made of, counted from its dimensions alone.

No torch here: the planner must answer in well under a second, and `models.count_params` builds
a meta-device model (which imports torch and timm). `tests/test_plan.py` checks that the counts
below equal `models.count_params` for every registered model.

The module layout is timm's defaults as `models.build_model` uses them: class token, learned
position embedding over T = patches + 1 tokens, qkv and projection biases, no LayerScale, no
qk-norm, a final LayerNorm and a linear head on the class token.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from vit_scale.distributed.costing.memory import numel


@dataclass(frozen=True)
class Shape:
    name: str
    D: int  # embedding width
    L: int  # blocks
    M: int  # MLP hidden width
    H: int  # attention heads
    patch: int
    img: int
    C: int = 1000  # classes

    @classmethod
    def from_spec(cls, spec, num_classes: int = 1000) -> Shape:
        return cls(
            spec.name,
            spec.embed_dim,
            spec.depth,
            spec.mlp_dim,
            spec.num_heads,
            spec.patch_size,
            spec.img_size,
            num_classes,
        )

    # ------------------------------------------------------------ parameters

    @property
    def T(self) -> int:
        """Tokens: patches plus the class token."""
        return (self.img // self.patch) ** 2 + 1

    def block_tensors(self) -> list[tuple[int, ...]]:
        """Shapes of one Block's parameters, in module order."""
        D, M = self.D, self.M
        return [
            (D,),
            (D,),  # norm1
            (3 * D, D),
            (3 * D,),  # attn.qkv
            (D, D),
            (D,),  # attn.proj
            (D,),
            (D,),  # norm2
            (M, D),
            (M,),  # mlp.fc1
            (D, M),
            (D,),
        ]  # mlp.fc2

    def root_tensors(self) -> list[tuple[int, ...]]:
        """Parameters outside the blocks: what the root FSDP unit holds."""
        D = self.D
        return [
            (1, 1, D),  # cls_token
            (1, self.T, D),  # pos_embed
            (D, 3, self.patch, self.patch),
            (D,),  # patch_embed.proj
            (D,),
            (D,),  # norm
            (self.C, D),
            (self.C,),
        ]  # head

    def tensors(self) -> list[tuple[int, ...]]:
        return self.root_tensors() + self.block_tensors() * self.L

    def module_order_tensors(self) -> list[tuple[int, ...]]:
        """All parameters in `model.parameters()` order: the root's own (cls_token, pos_embed),
        then patch_embed, blocks, norm, head."""
        root = self.root_tensors()
        return root[:4] + self.block_tensors() * self.L + root[4:]

    def whole_tensors_in_partitions(self, parts: int, align: int = 1) -> int:
        """The most elements any rank's partition buffer holds when the flat parameter list is cut
        into `parts` equal partitions (padded to a multiple of parts x align) and a rank keeps
        every tensor that overlaps its partition whole (DeepSpeed ZeRO-1/2 gradient partitions)."""
        sizes = [numel(s) for s in self.module_order_tensors()]
        part = -(-sum(sizes) // (parts * align)) * align
        held = [0] * parts
        start = 0
        for n in sizes:
            first, last = start // part, min((start + n - 1) // part, parts - 1)
            for r in range(first, last + 1):
                held[r] += n
            start += n
        return max(held)

    @cached_property
    def block_params(self) -> int:
        return sum(numel(s) for s in self.block_tensors())  # 4D^2 + 2DM + 9D + M

    @cached_property
    def root_params(self) -> int:
        return sum(numel(s) for s in self.root_tensors())

    @cached_property
    def params(self) -> int:
        return self.L * self.block_params + self.root_params

    @cached_property
    def largest_tensor(self) -> int:
        return max(numel(s) for s in self.tensors())

    @cached_property
    def matmul_weights(self) -> int:
        """Weights autocast casts to the compute dtype (Linear and Conv2d weights)."""
        D, M = self.D, self.M
        return self.L * (4 * D * D + 2 * D * M) + self.C * D + D * 3 * self.patch * self.patch

    @property
    def block_matmul_weights(self) -> int:
        return 4 * self.D * self.D + 2 * self.D * self.M

    def small_tensor_params(self, threshold: int) -> int:
        """Parameters in tensors of at most `threshold` elements (ZeRO-3 keeps those gathered)."""
        return sum(numel(s) for s in self.tensors() if numel(s) <= threshold)

    # ------------------------------------------------------------ activations (bytes, one image)

    def block_activation_bytes(self, a: int, r: int, fused: bool, softmax_bytes: int) -> int:
        """What one Block keeps for backward, per image, without activation checkpointing.

        a: bytes of a low-precision activation (2 under bf16/fp16, 4 under fp32);
        r: bytes of the residual stream, which LayerNorm reads (4 under autocast, where
           LayerNorm runs in fp32; else a).
        Saved, per token: norm1 input (r·D), qkv input (a·D), qkv output holding q, k, v (3a·D),
        attention output, which the projection also reads as a view (a·D), norm2 input (r·D),
        fc1 input (a·D), GELU input (a·M), fc2 input (a·M), LayerNorm mean and rstd (2 × 2 × 4 B).
        Fused attention (F.scaled_dot_product_attention, timm's default) adds its logsumexp
        (H × 4 B per token). Materialised attention instead keeps q·scale (a·D), a copied
        projection input (a·D) and the softmax output, H·T² values per image (`softmax_bytes`
        each: a, or 4 + a under autocast, where softmax runs in fp32 and the matmul reads a cast).
        """
        D, M, T, H = self.D, self.M, self.T, self.H
        per_token = 2 * r * D + 6 * a * D + 2 * a * M + 16
        if fused:
            return T * (per_token + 4 * H)
        return T * (per_token + a * D) + H * T * T * softmax_bytes

    def block_checkpoint_bytes(self, r: int) -> int:
        """What a checkpointed Block keeps: its input (the residual stream), per image."""
        return self.T * self.D * r

    def backward_transient_bytes(self, a: int, r: int) -> int:
        """Gradient temporaries while one Block runs backward, per image: the MLP's two hidden
        gradients (2 a·M) and the residual-stream gradient in and out (2 r·D), per token."""
        return self.T * (2 * a * self.M + 2 * r * self.D)

    def stem_head_bytes(self, a: int, r: int, autocast: bool) -> int:
        """Outside the blocks, per image: the image and its low-precision cast (the patch
        convolution's saved input), the final LayerNorm's input and output (under autocast only
        the cast class token the head reads), logits and the loss's fp32 log-softmax."""
        image = 3 * self.img * self.img
        cast = image * a if a < 4 else 0
        norm_out = self.D * a if autocast else self.T * self.D * a
        return image * 4 + cast + self.T * self.D * r + norm_out + self.C * (a + 8)

    def image_bytes(self) -> int:
        """One fp32 input image (the trainer keeps its synthetic batches on the device)."""
        return 3 * self.img * self.img * 4
