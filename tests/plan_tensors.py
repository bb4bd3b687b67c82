"""Test driver: the bytes each rank really holds after one training step, next to the planner's
parameter, gradient and optimizer components.

    torchrun --nproc_per_node=2 tests/plan_tensors.py OUT.json LABEL[:key=value,...] ... [train:key=value,...]
or as an entry of tests/run_many.py: ["@driver", "plan_tensors", OUT.json, LABEL, ...].

Each LABEL case builds vit_micro with the trainer's own strategy class, runs one real step (forward,
backward, optimizer step; `zero_grad` is held back so the gradients are still there), then sums
the sizes of what the rank holds. Rank 0 writes one JSON object per case to OUT.json.
Storage is measured, not numel, so padding FSDP adds to its shards is counted as the GPU would.
A `train:` case runs the trainer itself (`train.execute`) with those overrides, in the same
process group, and reports every rank's exit code (the plan.skip_if_not_fits path).
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.optim.optimizer import _foreach_supported_types

from vit_scale.config import load_config
from vit_scale.distributed import parse_strategy, parts, strategy_class
from vit_scale.distributed.base import ModelFactory
from vit_scale.launch.world import choose_device, detect_world, init_distributed, leave
from vit_scale.models import count_params, get_spec
from vit_scale.planning import layout
from vit_scale.planning import memory as plan_memory
from vit_scale.recipes.synthetic import SyntheticBatches

FAST = ["model=vit_micro", "train.batch_size=2", "train.precision=bf16", "train.steps=2", "train.warmup_steps=1"]


def _bytes(tensors) -> int:
    """Bytes of the storages behind `tensors`, each storage once."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def _numel_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        total += t.numel() * t.element_size()
    return total


def _optimizer_state(optimizer) -> list:
    return [v for state in optimizer.state.values() for k, v in state.items() if torch.is_tensor(v) and k != "step"]


def measure(strategy) -> dict:
    """params / optimizer bytes this rank holds after the step (DDP and FSDP: gradients too)."""
    if strategy.family in ("ddp", "fsdp"):
        params = list(strategy.model.parameters())
        return {
            "params": _bytes(params),
            "grads": _numel_bytes(p.grad for p in params),
            "optimizer": _numel_bytes(_optimizer_state(strategy.optimizer)),
            "foreach_capable": all(type(p) in _foreach_supported_types for p in params),
        }
    zero = strategy.model.optimizer
    if strategy.stage < 3:
        params = _numel_bytes(zero.bit16_groups_flat)
        masters = zero.single_partition_of_fp32_groups
    else:
        module_params = list(strategy.model.module.parameters())
        # each parameter's partition, and the whole of those small enough to stay gathered
        params = _numel_bytes(p.ds_tensor for p in module_params) + _numel_bytes(
            p.data for p in module_params if p.ds_persist
        )
        masters = zero.fp32_partitioned_groups_flat
    return {
        "params": params,
        "optimizer": _numel_bytes(masters) + _numel_bytes(_optimizer_state(zero.optimizer)),
        "foreach_capable": all(type(p) in _foreach_supported_types for p in masters),
    }


def deepspeed_grads(strategy) -> int:
    """The gradient partition between DeepSpeed's backward and its step (the step releases it)."""
    zero = strategy.model.optimizer
    if strategy.stage < 3:
        groups = zero.averaged_gradients  # views into the partition buffer, per parameter group
        groups = groups.values() if isinstance(groups, dict) else groups
        return _bytes(t for group in groups if group for t in group)
    return _numel_bytes([zero.grad_partitions_flat_buffer])


def deepspeed_step(strategy, images, labels) -> int:
    """DeepSpeedStrategy.train_step with the gradient partition measured before the step."""
    if strategy.input_dtype is not None:
        images = images.to(strategy.input_dtype)
    loss = parts.loss(strategy.model(images), labels)
    strategy.model.backward(loss)
    grads = deepspeed_grads(strategy)
    strategy.model.step()
    return grads


def predicted(cfg, world) -> dict:
    from vit_scale.planning import from_config

    sc = from_config(cfg, nodes=1, gpus_per_node=world.world_size, device_memory_gib=None)
    pred = plan_memory.predict(sc, layout(sc))
    full = pred.phases["backward_end"]  # every gradient exists, before the step's extras
    return {
        "params": full["params"],
        "grads": full["grads"],
        "optimizer": full["optimizer"],
        "optimizer_impl_auto": pred.optimizer_impl,
    }


def run_case(case: str, world) -> dict:
    label, _, extra = case.partition(":")
    cfg = load_config(None, FAST + [f"strategy={label}"] + [x for x in extra.split(",") if x])
    parsed = parse_strategy(cfg.strategy)
    strategy = strategy_class(parsed.family)(cfg, parsed, world)
    spec = get_spec(cfg.model)
    strategy.setup(
        ModelFactory(
            spec, cfg.train.num_classes, cfg.train.seed, cfg.train.init, count_params(cfg.model, cfg.train.num_classes)
        )
    )
    if parsed.family in ("ddp", "fsdp"):
        strategy.optimizer.zero_grad = lambda *args, **kwargs: None  # keep this step's gradients
    images, labels = SyntheticBatches(
        cfg.train.batch_size, spec.img_size, cfg.train.num_classes, world.device, cfg.train.seed, world.rank, 1
    )[0]
    if parsed.family == "deepspeed":
        grads = deepspeed_step(strategy, images, labels)
        got = {**measure(strategy), "grads": grads}
    else:
        strategy.train_step(images, labels)
        got = measure(strategy)
    result = {"case": case, "rank": world.rank, "measured": got, "predicted": predicted(cfg, world)}
    results = [None] * world.world_size
    dist.all_gather_object(results, result)
    return {"case": case, "ranks": results}


def run_training(case: str, world) -> dict:
    from vit_scale.recipes import train

    cfg = load_config(None, [x for x in case.split(":", 1)[1].split(",") if x])
    code = train.execute(cfg, world, keep_process_group=True)
    codes = [None] * world.world_size
    dist.all_gather_object(codes, code)
    return {"case": case, "codes": codes}


def run(argv: list) -> int:
    """OUT.json CASES...: in the launch's process group, started here unless a run before made it
    (tests/run_many.py's @driver entries)."""
    out, cases = argv[0], argv[1:]
    cfg = load_config(None, FAST)
    world = choose_device(detect_world(cfg.system.launcher), "cpu")
    if not dist.is_initialized():
        init_distributed(world, cfg.system.collective_timeout_s)
    results = [run_training(case, world) if case.startswith("train:") else run_case(case, world) for case in cases]
    if world.rank == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    return 0


def main() -> int:
    code = run(sys.argv[1:])
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    leave(main())  # as vit_scale.recipes.train.main does: interpreter shutdown can abort in gloo's threads
