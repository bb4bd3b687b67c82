"""DeepSpeed ZeRO: ZERO1, ZERO2, ZERO3 and ZEROPP (ZeRO-3 with hpZ, qwZ and qgZ).

Runs inside the trainer's own process group (torchrun, srun or MPI as vit_scale.launch.world set it
up); the `deepspeed` launcher is not needed. `deepspeed.initialize` finds torch.distributed
already initialised and only wraps it.

The generated DeepSpeed config is built from the run config alone and written to the run
directory as `deepspeed.json` (see `artifacts`). Choices that keep the comparison fair:
- `gradient_clipping` is set explicitly (default 0.0, no clipping, like DDP and FSDP):
  DeepSpeed 0.19 clips at 1.0 when the key is absent, and the losses then differ from DDP's.
  Fine-tuning (vit_scale.recipes.finetune, configure_finetune) takes it from finetune.clip_grad_norm
  instead, and gradient_accumulation_steps from finetune.accumulation_steps.
- Without offload the optimizer is the same `torch.optim.AdamW` the other strategies use,
  handed to DeepSpeed as a client optimizer. Offload needs DeepSpeed's own optimizer
  (DeepSpeedCPUAdam, from an `optimizer` section of the config), whose op DeepSpeed compiles
  the first time (about 45 s on a CPU, cached under ~/.cache/torch_extensions).
- On a CPU, DeepSpeed's comm backend compiles its `deepspeed_shm_comm` op (about 30 s) the first
  time any engine is made. That op serves only `inference_all_reduce` (tensor-parallel
  inference); training all-reduces through torch.distributed. `deepspeed.skip_shm_comm`
  (default true) marks it unavailable so no run waits for it.
- DeepSpeed's throughput timer is off (`timers.throughput.enabled=false`): on by default, it
  synchronises the device when forward starts and when step() ends (deepspeed/utils/timer.py,
  ThroughputTimer.start/stop), two host waits a step inside the trainer's timed window for a
  figure the trainer measures itself. What DeepSpeed still synchronises is in docs/timing.md.
- ZEROPP's qgZ is refused unless each rank sees all of its node's GPUs (`qgz_refusal`).

Replica check: ZeRO-1/2 keep every parameter whole on every rank (only optimizer states, and
for ZeRO-2 gradients, are partitioned), so each rank's module parameters are one replica.
ZeRO-3 keeps each parameter's partition in `p.ds_tensor`, partitioned over all ranks (hpZ's
secondary partition is a per-node cache refilled from it every forward, so the primary one is
the model), so the shard group is the world.
"""

from __future__ import annotations

import json
import os

from vit_scale.distributed import parts
from vit_scale.distributed.base import Strategy
from vit_scale.distributed.deepspeed import STAGES, qgz_refusal
from vit_scale.distributed.hooks import FinetuneHooks
from vit_scale.errors import UserError

INSTALL_HINT = (
    "pip install 'vit-scale[deepspeed]' (on a CPU-only machine: DS_BUILD_OPS=0 "
    "and a constraints file pinning your torch)"
)
STEPS_PER_PRINT = 10**9  # DeepSpeed's own progress lines would interleave with the trainer's


def _import_deepspeed():
    try:
        import deepspeed
    except ImportError as exc:
        raise UserError(
            f"strategy: DeepSpeed labels need the deepspeed package, which is not importable "
            f"({' '.join(str(exc).split())}); install the extra: {INSTALL_HINT}"
        ) from None
    return deepspeed


class DeepSpeedStrategy(FinetuneHooks, Strategy):
    family = "deepspeed"
    checkpoint_format = "engine"

    # ------------------------------------------------------------ checks before any process group

    @classmethod
    def check(cls, cfg, label, world) -> None:
        super().check(cfg, label, world)
        ds = cfg.deepspeed
        stage = STAGES[label.label]
        if ds.offload_params and stage != 3:
            raise UserError(
                f"deepspeed.offload_params: parameter offload is ZeRO-3 only (ZERO3, ZEROPP), "
                f"not {label.label}; set deepspeed.offload_params=false or use ZERO3"
            )
        if label.label == "ZEROPP":
            hpz = ds.hpz_partition_size or world.local_world_size
            if world.world_size % hpz:
                raise UserError(
                    f"deepspeed.hpz_partition_size: {hpz} must divide the world size "
                    f"({world.world_size} ranks); 0 means ranks per node ({world.local_world_size})"
                )
            if world.device_type == "cpu" and (ds.quantized_weights or ds.quantized_gradients):
                raise UserError(
                    "strategy: ZEROPP quantisation (deepspeed.quantized_weights, "
                    "deepspeed.quantized_gradients: qwZ, qgZ) needs a GPU (DeepSpeed has no CPU kernel "
                    "for it); on a CPU set both to false to run hpZ alone"
                )
            if world.device_type != "cpu":
                import torch

                error = qgz_refusal(
                    ds.quantized_gradients, torch.cuda.device_count(), world.local_world_size, world.nodes
                )
                if error:
                    raise UserError(error)
        _import_deepspeed()  # after the config checks: a bad key is reported without the import's seconds

    # ------------------------------------------------------------ configuration

    def __init__(self, cfg, label, world):
        super().__init__(cfg, label, world)
        ds = cfg.deepspeed
        self.stage = STAGES[label.label]
        self.hpz = self.layout.hpz
        self.uses_ds_optimizer = ds.offload_optimizer or ds.offload_params
        if world.device_type == "cpu" and ds.skip_shm_comm:
            self.notes.append(
                "DeepSpeed's shm_comm op (inference all-reduce only) was not built: deepspeed.skip_shm_comm=true"
            )
        if self.stage == 3 and self._init_mode() == "meta":
            self.notes.append(
                "built under deepspeed.zero.Init (train.init meta): parameters are initialised one "
                "module at a time on rank 0 and broadcast"
            )
        self.finetune = None  # the `finetune` config section once configure_finetune has run
        self.ds_config = self._build_config()

    def configure_finetune(self, ft) -> None:
        """Fine-tuning: the engine clips at `finetune.clip_grad_norm` (0: off) inside step(), in
        place of the benchmark's `deepspeed.gradient_clipping`, and accumulates over
        `finetune.accumulation_steps` micro-batches (its own boundary counter; see backward)."""
        self.finetune = ft
        self.ds_config = self._build_config()

    def _clipping(self) -> float:
        return self.finetune.clip_grad_norm if self.finetune is not None else self.cfg.deepspeed.gradient_clipping

    def _init_mode(self) -> str:
        """What ModelFactory will do with train.init, before it exists (the config is written first)."""
        from vit_scale.distributed.base import init_mode
        from vit_scale.models import count_params

        return init_mode(self.cfg.train.init, count_params(self.cfg.model, self.cfg.train.num_classes))

    def _build_config(self) -> dict:
        cfg, ds, world = self.cfg, self.cfg.deepspeed, self.world
        pin = world.device_type != "cpu"  # pinned host memory needs an accelerator
        zero: dict = {
            "stage": self.stage,
            "overlap_comm": ds.overlap_comm,
            "contiguous_gradients": ds.contiguous_gradients,
            "reduce_bucket_size": ds.reduce_bucket_size,
        }
        if self.stage < 3:
            zero.update(allgather_bucket_size=ds.allgather_bucket_size, reduce_scatter=True)
        else:
            zero.update(
                stage3_prefetch_bucket_size=ds.prefetch_bucket_size,
                stage3_param_persistence_threshold=ds.param_persistence_threshold,
            )
        if ds.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
        if ds.offload_params:
            zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
        if self.label.label == "ZEROPP":
            zero.update(
                zero_hpz_partition_size=self.hpz,
                zero_quantized_weights=ds.quantized_weights,
                zero_quantized_gradients=ds.quantized_gradients,
            )
        accum = self.finetune.accumulation_steps if self.finetune is not None else 1
        config = {
            "train_micro_batch_size_per_gpu": cfg.train.batch_size,
            "gradient_accumulation_steps": accum,
            "train_batch_size": cfg.train.batch_size * world.world_size * accum,
            "gradient_clipping": self._clipping(),
            "zero_optimization": zero,
            "bf16": {"enabled": cfg.train.precision == "bf16"},
            "fp16": {"enabled": cfg.train.precision == "fp16"},
            "steps_per_print": STEPS_PER_PRINT,
            "wall_clock_breakdown": False,
            "timers": {"throughput": {"enabled": False, "synchronized": False}},  # see the module docstring
        }
        if self.uses_ds_optimizer:
            # offload runs the optimizer step on the host with DeepSpeed's CPU Adam (AdamW mode)
            config["optimizer"] = {
                "type": "AdamW",
                "params": {"lr": cfg.train.lr, "weight_decay": cfg.train.weight_decay},
            }
        return config

    def artifacts(self) -> dict[str, str]:
        return {"deepspeed.json": json.dumps(self.ds_config, indent=2) + "\n"}

    def options(self) -> dict:
        ds = self.cfg.deepspeed
        opts = super().options()
        opts.update(
            {
                "zero_stage": self.stage,
                "offload_optimizer": ds.offload_optimizer,
                "offload_params": ds.offload_params,
                "overlap_comm": ds.overlap_comm,
                "contiguous_gradients": ds.contiguous_gradients,
                "reduce_bucket_size": ds.reduce_bucket_size,
                "gradient_clipping": self._clipping(),
                "optimizer": "DeepSpeedCPUAdam (AdamW mode)" if self.uses_ds_optimizer else "torch.optim.AdamW",
                "skip_shm_comm": ds.skip_shm_comm and self.world.device_type == "cpu",
            }
        )
        if self.stage < 3:
            opts["allgather_bucket_size"] = ds.allgather_bucket_size
        else:
            opts.update(
                prefetch_bucket_size=ds.prefetch_bucket_size, param_persistence_threshold=ds.param_persistence_threshold
            )
        if self.label.label == "ZEROPP":
            opts.update(
                hpz_partition_size=self.hpz,
                quantized_weights=ds.quantized_weights,
                quantized_gradients=ds.quantized_gradients,
            )
        return opts

    # ------------------------------------------------------------ setup

    def _prepare_environment(self, deepspeed) -> None:
        world = self.world
        # DeepSpeed reads these itself; srun and MPI do not set them (torchrun does)
        os.environ.setdefault("RANK", str(world.rank))
        os.environ.setdefault("WORLD_SIZE", str(world.world_size))
        from vit_scale.launch.world import device_local_rank_env

        # DeepSpeed picks its device from LOCAL_RANK and, under Open MPI, checks it against
        # OMPI_COMM_WORLD_LOCAL_RANK: both must name the device the trainer chose
        os.environ.update(device_local_rank_env(world))
        import logging
        import warnings

        deepspeed.utils.logger.setLevel(logging.WARNING)
        # DeepSpeed 0.19 calls collectives torch 2.13 deprecates, and each call would warn
        warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
        if world.device_type == "cpu" and self.cfg.deepspeed.skip_shm_comm:
            import deepspeed.ops

            # a module-level dict that DeepSpeed consults before building an op; edits persist
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        # wrap the trainer's process group now, not inside deepspeed.initialize: zero.Init reads
        # the world size before it would initialise anything, and would see 1
        deepspeed.init_distributed(dist_backend=world.backend, dist_init_required=False)

    def setup(self, factory) -> None:
        import torch

        deepspeed = _import_deepspeed()
        self._prepare_environment(deepspeed)
        if self.stage == 3 and factory.init == "meta":
            model = self._build_partitioned(deepspeed, factory)
        else:
            model = factory.on_device(self.world.device)
        # the order: checkpointing, then the optimizer (unless DeepSpeed's own), then the engine
        if self.cfg.train.activation_checkpointing:
            parts.apply_ac(model)
        optimizer = None
        if not self.uses_ds_optimizer:
            kernel = parts.optimizer_kernel(self.cfg.train.optimizer, self.world.device_type)
            optimizer = parts.make_optimizer(model.parameters(), self.cfg.train, kernel)
        trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: adapters and head only
        self.model, self.optimizer, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            model_parameters=trainable if optimizer is None else None,
            config=self.ds_config,
            dist_init_required=False,
        )
        self.input_dtype = getattr(torch, self.dtype_name) if self.dtype_name else None
        if self.stage == 3:
            self.shard_group = torch.distributed.group.WORLD

    def _build_partitioned(self, deepspeed, factory):
        """ZeRO-3 above the meta-init size: build under zero.Init (each module partitioned as it is
        made, so no rank ever holds the whole model), then initialise each module's parameters
        gathered one module at a time, rank 0's values broadcast to all: the values FSDP's meta init
        gives the same model (each parameter's draw is keyed by the seed and its name)."""
        from vit_scale.distributed.base import module_names

        # no dtype argument: zero.Init takes it from the config's bf16/fp16 sections. (DeepSpeed
        # 0.19.8 ignores an explicit dtype on accelerators without fp16 and builds bf16 instead.)
        with deepspeed.zero.Init(config_dict_or_path=self.ds_config):
            model = factory.on_device(self.world.device)
        for module, name in module_names(model).items():
            params = list(module.parameters(recurse=False))
            if not params:
                continue
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                if self.world.rank == 0:
                    factory.init_module(module, name)
        return model

    # ------------------------------------------------------------ step

    def train_step(self, images, labels):
        if self.input_dtype is not None:
            images = images.to(self.input_dtype)  # DeepSpeed holds bf16/fp16 weights; inputs must match
        logits = self.model(images)
        loss = parts.loss(logits, labels)
        self.model.backward(loss)
        self.model.step()
        return loss.detach()

    # ------------------------------------------------------------ fine-tuning (vit_scale.recipes.finetune)
    # finetune drives each optimizer step as `accumulation_steps` x (forward, backward(loss /
    # accumulation_steps)), the last outside no_sync, then clip_grad_norm and optimizer_step. The
    # engine counts micro-steps itself (gradient_accumulation_steps in its config) and wants
    # step() after every backward; it reduces gradients and updates only on the boundary.

    def forward(self, images):
        if self.input_dtype is not None:
            images = images.to(self.input_dtype)  # as train_step: the engine holds bf16/fp16 weights
        return self.model(images)

    def backward(self, loss) -> None:
        # finetune has already divided the loss by the accumulation steps
        self.model.backward(loss, scale_wrt_gas=False)
        if not self.model.is_gradient_accumulation_boundary():
            self.model.step()  # not a boundary: only advances the engine's micro-step counter

    def clip_grad_norm(self, max_norm: float):
        return None  # the engine clips inside step() at finetune.clip_grad_norm (configure_finetune)

    def optimizer_step(self) -> None:
        if not self.model.is_gradient_accumulation_boundary():
            raise RuntimeError(
                "DeepSpeed engine is not at a gradient accumulation boundary at the optimizer step: "
                "its micro-step counter and finetune.accumulation_steps disagree"
            )
        self.model.step()  # reduce, unscale, clip, update, zero the gradients

    def set_lr(self, lr: float) -> None:
        # the engine's optimizer (ZeRO's wrapper) hands param_groups through to the client AdamW
        # (or DeepSpeedCPUAdam with offload), so the schedule reaches the optimizer that steps
        for group in self.model.optimizer.param_groups:
            group["lr"] = lr

    def state_path(self, directory: str) -> str:
        return os.path.join(directory, "engine")

    def save_state(self, directory: str) -> None:
        """The engine's own checkpoint (every rank writes its partitions), as tag "engine"."""
        self.model.save_checkpoint(directory, tag="engine")

    def load_state(self, directory: str) -> None:
        loaded, _ = self.model.load_checkpoint(directory, tag="engine")
        if loaded is None:
            raise RuntimeError("the engine found nothing to load")

    # ------------------------------------------------------------ replica check

    def local_tensors(self):
        import torch.distributed as dist

        if self.stage < 3:
            yield from self.model.module.parameters()
            return
        for p in self.model.module.parameters():
            group = p.ds_process_group
            if dist.get_world_size(group=group) != self.world.world_size:
                raise RuntimeError(
                    "ZeRO-3 parameter partitioned over fewer ranks than the world; "
                    "the replica check does not know this layout"
                )
            part = p.ds_tensor.numel()
            start = part * dist.get_rank(group=group)
            valid = max(0, min(part, p.ds_numel - start))  # the last partition is padded, the padding unset
            yield p.ds_tensor.detach().reshape(-1).narrow(0, 0, valid)
