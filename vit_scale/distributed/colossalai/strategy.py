"""ColossalAI Booster plugins: CAI_DDP, CAI_DDP_FP16, CAI_LOW_LEVEL_ZERO, CAI_GEMINI, CAI_FSDP.

The plugins run on the trainer's own process group: `colossalai.launch*` is not called (it
would call init_process_group again and reseed every rank with 1024); the Booster and its
plugins need only an initialised torch.distributed and, on a GPU, the current device, both of
which vit_scale.launch.world has set.

What runs where is the capability table's (vit_scale.distributed.capabilities): on a CPU,
CAI_DDP in fp32 or bf16; the other plugins need a GPU (LowLevelZero and Gemini put their buffers
on the accelerator and use ColossalAI's fused/CPU Adam kernels, TorchFSDPPlugin passes
`torch.cuda.current_device()` to FSDP); on ROCm, neither Gemini nor LowLevelZero with
`colossalai.cpu_offload` (HybridAdam's kernels are nvcc-only). `check` refuses the rest before any work.

Labels and precision:
- CAI_DDP: TorchDDPPlugin; fp32, bf16 through torch autocast around the forward as DDP does
  (ColossalAI 0.5.0's Booster has no bf16 for TorchDDPPlugin: its BF16MixedPrecision is an
  abstract class, and `boost` fails on a GPU), fp16 through the Booster's fp16 (GPU only).
- CAI_DDP_FP16: TorchDDPPlugin with the Booster's fp16 mixed precision (autocast + GradScaler),
  seed 000's `torch_ddp_fp16`; asks for `train.precision=fp16` so the record says what ran.
- CAI_LOW_LEVEL_ZERO: stage `colossalai.zero_stage` (1 or 2), `colossalai.cpu_offload`;
  precision fp32, bf16 or fp16 from `train.precision`.
- CAI_GEMINI: placement policy, offload fractions, pin memory; fp16 or bf16 only.
  `colossalai.preset=seed000` sets offload_optim_frac=1.0 and pin_memory=True (seed 000's run).
- CAI_FSDP: TorchFSDPPlugin (torch FSDP1, FULL_SHARD, one unit per timm Block as FULL_SHARD does).

Fine-tuning (vit_scale.recipes.finetune) goes through the Booster for every plugin: booster.backward,
optimizer.step, booster.no_sync for the accumulated micro-batches where the plugin has it
(TorchDDPPlugin, LowLevelZero stage 1; LowLevelZero stage 2 and Gemini accumulate in their own
gradient buffers, FSDP synchronises every micro-batch). Checkpoints: TorchDDPPlugin saves whole
state dicts as DDP does (the "full" format; the Booster's load_model fails on a CPU), the other
plugins the Booster's sharded save_model/save_optimizer (the "booster" format). Clipping: torch's
clip_grad_norm_ under TorchDDPPlugin (fp16 gradients unscaled first), FSDP1's own clip_grad_norm_
under CAI_FSDP, and the plugin's `max_norm` (set from finetune.clip_grad_norm in
configure_finetune) under LowLevelZero and Gemini, which clip inside step(). Only CAI_DDP (fp32)
is tested, on CPU ranks; the GPU plugins' fine-tuning path has not been run.
"""

from __future__ import annotations

from vit_scale.distributed import parts
from vit_scale.distributed.base import Strategy
from vit_scale.distributed.colossalai import PLUGINS, PRESETS
from vit_scale.distributed.hooks import FinetuneHooks
from vit_scale.errors import UserError

INSTALL_HINT = (
    "pip install --no-deps colossalai==0.5.0 && pip install -c CONSTRAINTS transformers==4.51.3 "
    "peft==0.13.2 galore-torch bitsandbytes (CONSTRAINTS pins your torch, e.g. torch==2.13.0; "
    "see docs/strategies.md)"
)


def _import_colossalai():
    from vit_scale.compat import ensure_torchvision_importable

    ensure_torchvision_importable()  # colossalai imports transformers, which imports torchvision
    try:
        import colossalai
        import colossalai.booster
    except ImportError as exc:
        raise UserError(
            f"strategy: ColossalAI labels need the colossalai package, which is not importable "
            f"({' '.join(str(exc).split())}); install it keeping your torch: {INSTALL_HINT}"
        ) from None
    return colossalai


class ColossalAIStrategy(FinetuneHooks, Strategy):
    family = "colossalai"  # fine-tuning: see the module docstring and the methods under "fine-tuning"
    checkpoint_format = "booster"

    # ------------------------------------------------------------ checks before any process group

    @classmethod
    def check(cls, cfg, label, world) -> None:
        super().check(cfg, label, world)
        if cfg.train.init == "meta":
            raise UserError(
                "train.init: meta is not supported with ColossalAI labels (the model is built on the "
                "device); use train.init=device"
            )
        _import_colossalai()

    # ------------------------------------------------------------ configuration

    def __init__(self, cfg, label, world):
        super().__init__(cfg, label, world)
        self.booster = None
        self.finetune = None  # the `finetune` config section once configure_finetune has run
        if label.label in ("CAI_DDP", "CAI_DDP_FP16"):
            # whole state dicts of the unwrapped module and the optimizer, as DDP's: the Booster's
            # load_model calls the accelerator's synchronize(), which ColossalAI's CPU accelerator refuses
            self.checkpoint_format = "full"
        self.plugin_name = PLUGINS[label.label]
        c = cfg.colossalai
        self.gemini = {
            "placement_policy": c.placement_policy,
            "offload_optim_frac": c.offload_optim_frac,
            "offload_param_frac": c.offload_param_frac,
            "pin_memory": c.pin_memory,
        }
        if label.label == "CAI_GEMINI" and c.preset != "none":
            self.gemini.update(PRESETS[c.preset])
            self.notes.append(
                f"colossalai.preset={c.preset}: " + ", ".join(f"{k}={v}" for k, v in PRESETS[c.preset].items())
            )

    def configure_finetune(self, ft) -> None:
        """Fine-tuning: LowLevelZero and Gemini clip inside step() at their plugin's `max_norm`
        (finetune.clip_grad_norm here), and Gemini keeps gradients across backwards only with
        `enable_gradient_accumulation` (set when finetune.accumulation_steps > 1)."""
        self.finetune = ft

    def _plugin_clips(self) -> bool:
        return self.label.label in ("CAI_LOW_LEVEL_ZERO", "CAI_GEMINI")

    def _optimizer_name(self) -> str:
        c = self.cfg.colossalai
        if self.label.label == "CAI_GEMINI" or (self.label.label == "CAI_LOW_LEVEL_ZERO" and c.cpu_offload):
            return "HybridAdam (AdamW mode)"
        if self.label.label == "CAI_FSDP":
            return "torch.optim.Adam (decoupled_weight_decay=True, i.e. AdamW)"
        return "torch.optim.AdamW"

    def options(self) -> dict:
        c = self.cfg.colossalai
        opts = super().options()
        opts.update({"plugin": self.plugin_name, "optimizer": self._optimizer_name()})
        name = self.label.label
        if name in ("CAI_DDP", "CAI_DDP_FP16"):
            opts.update(
                booster_mixed_precision=self._booster_mixed_precision(),
                autocast="bf16" if name == "CAI_DDP" and self.cfg.train.precision == "bf16" else None,
                bucket_cap_mb=c.bucket_cap_mb,
            )
        elif name == "CAI_LOW_LEVEL_ZERO":
            opts.update(zero_stage=c.zero_stage, cpu_offload=c.cpu_offload, initial_scale=c.initial_scale)
        elif name == "CAI_GEMINI":
            opts.update(self.gemini, preset=c.preset, initial_scale=c.initial_scale)
            if self.finetune is not None:
                opts.update(enable_gradient_accumulation=self.finetune.accumulation_steps > 1)
        elif name == "CAI_FSDP":
            opts.update(sharding="FULL_SHARD", auto_wrap="timm Block")
        if self.finetune is not None and self._plugin_clips():
            opts.update(max_norm=self.finetune.clip_grad_norm)
        return opts

    # ------------------------------------------------------------ setup

    def _plugin(self, factory):
        import torch
        from colossalai.booster import plugin as plugins

        c, precision, name = self.cfg.colossalai, self.cfg.train.precision, self.label.label
        if name in ("CAI_DDP", "CAI_DDP_FP16"):
            return plugins.TorchDDPPlugin(bucket_cap_mb=c.bucket_cap_mb)
        ft = self.finetune
        max_norm = ft.clip_grad_norm if ft is not None else 0.0  # the benchmark trainer does not clip
        if name == "CAI_LOW_LEVEL_ZERO":
            return plugins.LowLevelZeroPlugin(
                stage=c.zero_stage,
                precision=precision,
                cpu_offload=c.cpu_offload,
                initial_scale=c.initial_scale,
                max_norm=max_norm,
            )
        if name == "CAI_GEMINI":
            accumulate = ft is not None and ft.accumulation_steps > 1
            return plugins.GeminiPlugin(
                precision=precision,
                initial_scale=c.initial_scale,
                max_norm=max_norm,
                enable_gradient_accumulation=accumulate,
                **self.gemini,
            )
        from torch.distributed.fsdp import MixedPrecision
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        mixed = None
        if self.dtype_name:
            dtype = getattr(torch, self.dtype_name)
            mixed = MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)
        return plugins.TorchFSDPPlugin(
            auto_wrap_policy=ModuleWrapPolicy({factory.block_class()}), mixed_precision=mixed
        )

    def setup(self, factory) -> None:
        import torch

        _import_colossalai()
        from colossalai.booster import Booster

        model = factory.on_device(self.world.device)
        # the order: checkpointing, then the optimizer, then the Booster wraps both
        if self.cfg.train.activation_checkpointing:
            parts.apply_ac(model)
        kernel = parts.optimizer_kernel(self.cfg.train.optimizer, self.world.device_type)
        if self._optimizer_name().startswith("HybridAdam"):
            from colossalai.nn.optimizer import HybridAdam

            optimizer = HybridAdam(
                model.parameters(), lr=self.cfg.train.lr, weight_decay=self.cfg.train.weight_decay, adamw_mode=True
            )
        elif self.label.label == "CAI_FSDP":
            # TorchFSDPPlugin re-runs `optimizer.__init__(params, **optimizer.defaults)`; torch's AdamW
            # rejects its own `decoupled_weight_decay` default there; Adam takes the same settings
            # (decoupled_weight_decay=True among them) and makes the same update
            defaults = parts.make_optimizer(model.parameters(), self.cfg.train, kernel).defaults
            optimizer = torch.optim.Adam(model.parameters(), **defaults)
        else:
            optimizer = parts.make_optimizer(model.parameters(), self.cfg.train, kernel)
        mixed = self._booster_mixed_precision()
        self.booster = Booster(plugin=self._plugin(factory), mixed_precision=mixed)
        self.model, self.optimizer, *_ = self.booster.boost(model, optimizer)
        if self.label.label == "CAI_FSDP":
            self.shard_group = torch.distributed.group.WORLD

    def _booster_mixed_precision(self):
        """TorchDDPPlugin: the Booster casts for fp16 only; bf16 is our own autocast (see the module doc)."""
        if self.label.label in ("CAI_DDP", "CAI_DDP_FP16") and self.cfg.train.precision == "fp16":
            return "fp16"
        return None

    def _own_autocast(self):
        import contextlib

        if self.label.label == "CAI_DDP" and self.cfg.train.precision == "bf16":
            return parts.autocast(self.dtype_name, self.world.torch_device_type)
        return contextlib.nullcontext()

    # ------------------------------------------------------------ step

    def train_step(self, images, labels):
        with self._own_autocast():
            logits = self.model(images)
        loss = parts.loss(logits, labels)
        self.booster.backward(loss, self.optimizer)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.detach()

    # ------------------------------------------------------------ fine-tuning (vit_scale.recipes.finetune)
    # finetune drives each optimizer step as `accumulation_steps` x (forward, backward(loss /
    # accumulation_steps)), all but the last inside no_sync, then clip_grad_norm and optimizer_step.

    def forward(self, images):
        with self._own_autocast():  # as train_step: otherwise the Booster's wrappers cast
            return self.model(images)

    def no_sync(self):
        import contextlib

        if self.booster.plugin.support_no_sync():
            return self.booster.no_sync(self.model, self.optimizer)
        return contextlib.nullcontext()  # accumulates anyway, synchronising every micro-batch

    def backward(self, loss) -> None:
        self.booster.backward(loss, self.optimizer)

    def clip_grad_norm(self, max_norm: float):
        if self._plugin_clips():
            return None  # the plugin clips inside step() at its max_norm (configure_finetune)
        if self.label.label == "CAI_FSDP":
            return float(self.model.module.clip_grad_norm_(max_norm))  # FSDP1's own: gradients are sharded
        import torch

        # TorchDDPPlugin: torch's clip, as DDP's; under the Booster's fp16 unscale first, as the
        # wrapper's clip_grad_by_norm does (which returns no norm), so the true gradients are clipped
        if getattr(self.optimizer, "scaler", None) is not None:
            self.optimizer.unscale_grad()
        return float(torch.nn.utils.clip_grad_norm_(self.model.unwrap().parameters(), max_norm))

    def optimizer_step(self) -> None:
        self.optimizer.step()  # unscales (fp16), skips on overflow, clips (LowLevelZero, Gemini)
        self.optimizer.zero_grad()

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:  # the wrapper hands through the inner optimizer's
            group["lr"] = lr

    def unwrapped_model(self):
        return self.model.unwrap()

    def state_path(self, directory: str) -> str:
        import os

        return super().state_path(directory) if self.checkpoint_format == "full" else os.path.join(directory, "booster")

    def save_state(self, directory: str) -> None:
        """The Booster's sharded model and optimizer checkpoints, on every rank (each plugin's own
        layout: gathered on rank 0 for LowLevelZero and Gemini's model, per-rank shards where the
        plugin keeps them); TorchDDPPlugin's labels save whole state dicts as DDP does."""
        import os

        if self.checkpoint_format == "full":
            return super().save_state(directory)
        path = self.state_path(directory)
        self.booster.save_model(self.model, os.path.join(path, "model"), shard=True)
        self.booster.save_optimizer(self.optimizer, os.path.join(path, "optimizer"), shard=True)

    def load_state(self, directory: str) -> None:
        import os

        if self.checkpoint_format == "full":
            return super().load_state(directory)
        path = self.state_path(directory)
        for part in ("model", "optimizer"):
            if not os.path.isdir(os.path.join(path, part)):
                raise FileNotFoundError(f"no {part}/ in the checkpoint")
        self.booster.load_model(self.model, os.path.join(path, "model"))
        self.booster.load_optimizer(self.optimizer, os.path.join(path, "optimizer"))

    def _loss_scaler(self):
        """The fp16 loss scaler: torch's GradScaler (TorchDDPPlugin + the Booster's fp16) or the
        dynamic scaler of LowLevelZero's or Gemini's mixed-precision mixin; None otherwise."""
        opt = self.optimizer
        if getattr(opt, "scaler", None) is not None:
            return opt.scaler
        mixin = getattr(opt, "mixed_precision_mixin", None) or getattr(opt, "mix_precision_mixin", None)
        return getattr(mixin, "grad_scaler", None)

    def rank_state(self) -> dict:
        scaler = self._loss_scaler()
        return {"scaler": scaler.state_dict()} if scaler is not None else {}

    def load_rank_state(self, state: dict) -> None:
        scaler = self._loss_scaler()
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])

    # ------------------------------------------------------------ replica check

    def local_tensors(self):
        if self.label.label == "CAI_GEMINI":
            from colossalai.zero import GeminiDDP

            module = self.model
            while not isinstance(module, GeminiDDP) and hasattr(module, "module"):
                module = module.module
            # parameters live in sharded chunks: gather a full copy on every rank (a collective)
            yield from module.state_dict(only_rank_0=False).values()
            return
        if self.label.label == "CAI_FSDP":
            yield from self.model.parameters()  # FSDP1 flat parameters: this rank's shard
            return
        yield from self.model.unwrap().parameters()
