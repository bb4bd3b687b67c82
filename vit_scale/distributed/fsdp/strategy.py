"""torch FSDP, the torch half: FSDP1 (FullyShardedDataParallel) or FSDP2 (`fully_shard`), one unit
per timm `Block`; the labels, options and layout are the package's (vit_scale.distributed.fsdp)."""

from __future__ import annotations

import contextlib
import itertools

from vit_scale.distributed import parts
from vit_scale.distributed.base import Strategy, module_names
from vit_scale.distributed.fsdp import layout
from vit_scale.distributed.hooks import FinetuneHooks
from vit_scale.errors import UserError


class FSDPStrategy(FinetuneHooks, Strategy):
    family = "fsdp"
    checkpoint_format = "sharded"  # torch.distributed.checkpoint: each rank writes and reads its own shard

    @classmethod
    def check(cls, cfg, label, world) -> None:
        super().check(cfg, label, world)
        g = label.hybrid_group
        if g and world.world_size % g:
            raise UserError(
                f"strategy: {label.label} needs a world size divisible by {g}, but this run has "
                f"{world.world_size} ranks; use HYBRID_<g>GPU with g dividing {world.world_size}"
            )
        if (
            cfg.train.compile
            and layout(cfg, label, world.world_size, world.local_world_size).implementation == "fsdp1"
            and not cfg.fsdp.use_orig_params
        ):
            raise UserError(
                "train.compile: under FSDP1 it needs fsdp.use_orig_params=true (with flat parameters "
                "torch.compile falls back to eager inside every unit); set fsdp.use_orig_params=true "
                "or fsdp.version=2"
            )
        if cfg.fsdp.cpu_offload and world.device_type == "cpu" and cfg.fsdp.version == 1:
            raise UserError(
                "fsdp.cpu_offload: FSDP1 parameter offload needs a GPU (it pins host memory); "
                "set fsdp.cpu_offload=false on a CPU"
            )
        if cfg.train.optimizer == "fused" and cls._offloads_fp16_on_fsdp1(cfg, label, world):
            raise UserError(
                "train.optimizer: fused with FSDP1 parameter offload and fp16 would read the loss scale and "
                "overflow flag through device-to-host copies its CPU kernel does not wait for; use "
                "train.optimizer=auto (not fused here), train.precision=bf16, or fsdp.cpu_offload=false"
            )
        # offloaded FSDP2 gradients live on the host; GradScaler's overflow check on them is reduced by
        # DTensor over the mesh's NCCL/RCCL group (torch/distributed/tensor/_dispatch.py:
        # found_inf_reduce_handler), which has no CPU backend, so the first fp16 step would fail
        if (
            cfg.fsdp.cpu_offload
            and cfg.train.precision == "fp16"
            and world.device_type != "cpu"
            and layout(cfg, label, world.world_size, world.local_world_size).implementation == "fsdp2"
        ):
            raise UserError(
                f"fsdp.cpu_offload: {label.label} on FSDP2 cannot offload with train.precision=fp16 (the "
                "loss scaler's overflow check would all-reduce host tensors over NCCL); use bf16, "
                "fsdp.version=1 (not HYBRID_1GPU), or fsdp.cpu_offload=false"
            )

    @classmethod
    def _offloads_fp16_on_fsdp1(cls, cfg, label, world) -> bool:
        """FSDP1 with parameters (and so gradients and the optimizer step) on the host, an fp16 loss
        scaler and a GPU: where GradScaler's device tensors meet CPU kernels."""
        return (
            cfg.fsdp.cpu_offload
            and cfg.train.precision == "fp16"
            and world.device_type != "cpu"
            and layout(cfg, label, world.world_size, world.local_world_size).implementation == "fsdp1"
        )

    def auto_optimizer(self) -> str:
        """train.optimizer=auto under FSDP: as everywhere (parts.optimizer_kernel), except that
        FSDP1 with parameter offload and fp16 takes torch's default kernel."""
        # the fused AdamW copies GradScaler's scale and overflow flag from the GPU to the host
        # asynchronously and starts its CPU kernel at once (torch/optim/adam.py: _fused_adam,
        # .to(device, non_blocking=True)), so it may step on values not yet landed
        if self._offloads_fp16_on_fsdp1(self.cfg, self.label, self.world):
            return "default"
        return parts.optimizer_kernel("auto", self.world.device_type)

    def options(self) -> dict:
        opts = super().options()
        opts.update(
            {
                "fsdp_version": self.implementation_version,
                "sharding": self.sharding,
                "hybrid_group": self.label.hybrid_group or None,
                "backward_prefetch": self.cfg.fsdp.backward_prefetch,
                "limit_all_gathers": self.cfg.fsdp.limit_all_gathers,
                "forward_prefetch": self.cfg.fsdp.forward_prefetch,
                "use_orig_params": self.cfg.fsdp.use_orig_params,
                "cpu_offload": self.cfg.fsdp.cpu_offload,
            }
        )
        return opts

    def __init__(self, cfg, label, world):
        super().__init__(cfg, label, world)
        self.sharding = "HYBRID_SHARD" if label.hybrid_group else label.label
        self.implementation_version = int(self.implementation[len("fsdp") :])
        if self.implementation_version == 2 and (cfg.fsdp.backward_prefetch != "pre" or not cfg.fsdp.limit_all_gathers):
            self.notes.append(
                "backward_prefetch and limit_all_gathers are FSDP1 options; FSDP2 prefetches one "
                "unit ahead in backward and bounds in-flight all-gathers itself"
            )

    # ------------------------------------------------------------ meshes

    def _mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(
            self.world.torch_device_type,
            (self.replicate_group_size, self.shard_group_size),
            mesh_dim_names=("replicate", "shard"),
        )

    # ------------------------------------------------------------ setup

    def setup(self, factory) -> None:
        """Build the model, apply the parts in this implementation's order around the wrapping,
        then the optimizer and, for fp16, the loss scaler."""
        train = self.cfg.train
        meta = factory.init == "meta"
        model = factory.on_meta() if meta else factory.on_device(self.world.device)
        names = module_names(model) if meta else {}  # before activation checkpointing wraps the blocks
        if self.implementation_version == 1:
            if train.compile:
                parts.compile_blocks(model)
            self.model = self._fsdp1(model, factory, names)
            if train.activation_checkpointing:
                parts.apply_ac(self.model)  # after wrapping, so the checkpoint wrapper sits inside each FSDP unit
        else:
            if train.activation_checkpointing:
                parts.apply_ac(model)
            if train.compile:
                parts.compile_blocks(model)
            self.model = self._fsdp2(model, factory, names)
        kernel = self.auto_optimizer() if train.optimizer == "auto" else train.optimizer
        self.optimizer = parts.make_optimizer(self.model.parameters(), train, kernel)
        self.scaler = self._loss_scaler() if train.precision == "fp16" else None

    def _loss_scaler(self):
        import torch

        if self.implementation_version == 1:
            return _rank_agreeing_sharded_grad_scaler(self.world.torch_device_type, offload=self.cfg.fsdp.cpu_offload)
        # its overflow check on DTensor gradients is all-reduced by DTensor itself
        # (torch/distributed/tensor/_dispatch.py: found_inf_reduce_handler, a MAX)
        return torch.amp.GradScaler(self.world.torch_device_type)

    def _fsdp1(self, model, factory, names):
        """The model wrapped in FullyShardedDataParallel, one unit per Block; a meta-built model
        (names: its modules' names) is materialised unit by unit as FSDP1 shards it."""
        import torch
        from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        kwargs = {}
        if self.label.hybrid_group:
            mesh = self._mesh()
            kwargs["device_mesh"] = mesh
            self.shard_group = mesh.get_group("shard")
        elif self.sharding != "NO_SHARD":
            self.shard_group = torch.distributed.group.WORLD
        if self.dtype_name:
            dtype = getattr(torch, self.dtype_name)
            kwargs["mixed_precision"] = MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)
        prefetch = {"none": None, "pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST}
        if names:
            # FSDP1 calls this for each module of a unit, the unit unsharded, before it flattens and
            # shards it (torch/distributed/fsdp/_init_utils.py: _materialize_with_param_init_fn)
            def materialise(module):
                module.to_empty(device=self.world.device, recurse=False)
                factory.init_module(module, names[module])

            kwargs["param_init_fn"] = materialise
        return FSDP(
            model,
            sharding_strategy=getattr(ShardingStrategy, self.sharding),
            auto_wrap_policy=ModuleWrapPolicy({factory.block_class()}),
            backward_prefetch=prefetch[self.cfg.fsdp.backward_prefetch],
            limit_all_gathers=self.cfg.fsdp.limit_all_gathers,
            forward_prefetch=self.cfg.fsdp.forward_prefetch,
            use_orig_params=self.cfg.fsdp.use_orig_params,
            cpu_offload=CPUOffload(offload_params=self.cfg.fsdp.cpu_offload),
            device_id=self.world.device,
            **kwargs,
        )

    def _fsdp2(self, model, factory, names):
        """The model with fully_shard on each unit (a Block, or the checkpoint wrapper around it)
        and on the root; a meta-built model (names: its modules' names) is materialised after."""
        import torch
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        mesh = self._mesh()
        replicate, shard = self.replicate_group_size, self.shard_group_size
        if shard > 1:
            self.shard_group = mesh.get_group("shard")
        # a 2-D mesh makes FSDP2 shard over "shard" and all-reduce over "replicate" (HSDP)
        kwargs = {
            "mesh": mesh if replicate > 1 else mesh["shard"],
            "reshard_after_forward": self.sharding != "SHARD_GRAD_OP",
        }
        if self.dtype_name:
            dtype = getattr(torch, self.dtype_name)
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
        if self.cfg.fsdp.cpu_offload:
            # pinned host memory needs an accelerator; unpinned works on a CPU-only machine
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=self.world.device_type != "cpu")
        block = factory.block_class()
        units = [m for m in model.blocks]  # each Block, or the checkpoint wrapper around it
        assert all(isinstance(getattr(u, "_checkpoint_wrapped_module", u), block) for u in units)
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        if self.cfg.fsdp.forward_prefetch:
            for current, following in itertools.pairwise(units):
                current.set_modules_to_forward_prefetch([following])
        if names:
            model.to_empty(device=self.fsdp2_shard_device())
            for module, name in names.items():
                # each whole parameter drawn on the compute device (fast), this rank's shard kept
                factory.init_module(module, name, device=self.world.device)
        return model

    def fsdp2_shard_device(self):
        """Where FSDP2 keeps this rank's shards: on the host with fsdp.cpu_offload, which FSDP2
        requires of offloaded parameters at its first forward (torch/distributed/fsdp/_fully_shard/
        _fsdp_param_group.py: _validate_cpu_offload_params), else on the device."""
        import torch

        return torch.device("cpu") if self.cfg.fsdp.cpu_offload else self.world.device

    # ------------------------------------------------------------ step

    def train_step(self, images, labels):
        logits = self.model(images)  # MixedPrecision / MixedPrecisionPolicy cast inside; no autocast
        loss = parts.loss(logits, labels)
        parts.backward_and_step(loss, self.optimizer, self.scaler)
        return loss.detach()

    # ------------------------------------------------------------ fine-tuning (vit_scale.recipes.finetune)

    def forward(self, images):
        return self.model(images)  # MixedPrecision / MixedPrecisionPolicy cast inside; no autocast

    def no_sync(self):
        if self.implementation_version == 1:
            return self.model.no_sync()
        return self._fsdp2_no_sync()

    @contextlib.contextmanager
    def _fsdp2_no_sync(self):
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    def clip_grad_norm(self, max_norm: float) -> float:
        import torch

        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.implementation_version == 1:
            # each rank holds a shard of the gradients: FSDP1's own method reduces the norm over them
            return float(self.model.clip_grad_norm_(max_norm))
        # FSDP2 gradients are DTensors: the norm is partial per shard until full_tensor() reduces it
        params = [p for p in self.model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params])
        if hasattr(total, "full_tensor"):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return float(total)

    def checkpoint_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        # sharded state dicts (ShardedTensor / DTensor): no rank ever gathers the whole model
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def load_checkpoint_state(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    def state_path(self, directory: str) -> str:
        import os

        return os.path.join(directory, "state")

    def save_state(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp

        with _quiet_sharded_tensor_warnings():
            dcp.save(self.checkpoint_state(), checkpoint_id=self.state_path(directory))

    def load_state(self, directory: str) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

        with _quiet_sharded_tensor_warnings():
            state = self.checkpoint_state()  # this run's layout; DCP fills it in place
            # FSDP1 gives a rank whose shard holds none of a small parameter (cls_token, say) an
            # empty ShardedTensor; flattening drops it, and DCP then takes the "missing" key for
            # a pre-2.4 checkpoint and fails. Left unflattened, that rank simply reads nothing.
            dcp.load(
                state,
                checkpoint_id=self.state_path(directory),
                planner=DefaultLoadPlanner(flatten_sharded_tensors=False),
            )
            self.load_checkpoint_state(state)


def _rank_agreeing_sharded_grad_scaler(device_type: str, offload: bool = False):
    """FSDP1's ShardedGradScaler, made to skip a step on every rank or on none.

    torch 2.13's ShardedGradScaler shares the overflow flag only in `unscale_`, as a SUM of shape
    (1,). `GradScaler.step` on an optimizer that unscales inside its own kernel (the fused AdamW,
    the GPU default) calls no `unscale_`: it checks this rank's gradients alone
    (`_check_inf_per_device`), so the rank that overflowed skips a step the others take and the
    loss scales drift apart. Calling `unscale_` first is no cure: the fused AdamW then gets the
    summed flag, and it skips only when the flag is exactly 1 and subtracts the flag from its step
    count (torch/optim/adam.py `_fused_adam`; the CUDA kernel's `*found_inf_ptr == 1`), so two
    overflowing ranks step anyway, and a (1,)-shaped flag fails its `_foreach_sub_`.

    So the flag is shared where every path computes it, `_unscale_grads_` (called by `unscale_` and
    by `_check_inf_per_device`), with MAX, which keeps it 0 or 1; and `unscale_` is GradScaler's
    own, whose flag is 0-d and needs no second reduction.

    `offload` (gradients on the host): the scale and the flag are handed over already on the host.
    ShardedGradScaler would copy them there with `non_blocking=True` (_MultiDeviceReplicator.get)
    and run the CPU unscale kernel at once, on a scale not yet landed and a flag the late copy of 0
    then overwrites (pytorch/pytorch#176429, not in 2.13)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    class RankAgreeingShardedGradScaler(ShardedGradScaler):
        def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16=True):
            if offload:
                inv_scale, found_inf = inv_scale.cpu(), found_inf.cpu()  # blocking copies
            flags = super()._unscale_grads_(optimizer, inv_scale, found_inf, True)  # FSDP may hold fp16 gradients
            for flag in flags.values():
                # NCCL reduces device tensors only; offloaded gradients give a host flag
                shared = flag if flag.device.type == self._device else flag.to(self._device)
                dist.all_reduce(shared, op=dist.ReduceOp.MAX, group=self.process_group)
                if shared is not flag:
                    flag.copy_(shared)
            return flags

        def unscale_(self, optimizer):
            torch.amp.GradScaler.unscale_(self, optimizer)

    return RankAgreeingShardedGradScaler(device_type)


@contextlib.contextmanager
def _quiet_sharded_tensor_warnings():
    """FSDP1's sharded state dicts are ShardedTensors, which torch 2.13 warns about on every use (a
    screenful per save); the format is the one FSDP1 offers, so say nothing per tensor."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*ShardedTensor.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r".*_get_pg_default_device.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"Multiple backends are registered.*", category=UserWarning)
        yield
