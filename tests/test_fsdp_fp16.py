"""FSDP with fp16: the overflow decision is shared by every rank, and what cannot run is refused.

The overflow test runs two real gloo ranks on CPU tensors (this file is also the rank program,
started by torchrun). The capability table refuses fp16 FSDP on a CPU, so the ranks build
FSDPStrategy directly, past `check`: the mechanism does not depend on the device. torch's
ShardedGradScaler all-reduces its found-inf flag only in `unscale_`, and `GradScaler.step` on an
optimizer with `_step_supports_amp_scaling` (the fused AdamW, vit-scale's GPU default) checks
the local gradients only; without an `unscale_` first, the rank that overflowed skips a step the
others take, and the loss scales drift apart.
"""

import json
import math
import sys

from conftest import FAST, torchrun


def _step(strategy, images, labels, overflow_on=(), clip=False):
    """One optimizer step: train_step, or (with an overflow or clipping) the same path taken by
    hand, backward, clip_grad_norm, optimizer_step, with an inf put into the gradients of the ranks
    in `overflow_on` only. Returns (whether this rank's parameters changed, the loss scale after)."""
    import torch

    from vit_scale.distributed import parts

    before = [t.detach().clone() for t in strategy.local_tensors()]
    if not overflow_on and not clip:
        strategy.train_step(images, labels)
    else:
        strategy.backward(parts.loss(strategy.forward(images), labels))
        if strategy.world.rank in overflow_on:
            grad = next(p.grad for p in strategy.model.parameters() if p.grad is not None and p.grad.numel())
            grad.view(-1)[0] = math.inf
        if clip:
            strategy.clip_grad_norm(1e9)  # unscales first: GradScaler.step then takes its other path
        strategy.optimizer_step()
    stepped = any(not torch.equal(a, b) for a, b in zip(before, strategy.local_tensors(), strict=True))
    return stepped, float(strategy.scaler.get_scale())


def rank_main() -> None:
    import torch.distributed as dist

    from vit_scale.config import load_config
    from vit_scale.distributed import parse_strategy
    from vit_scale.distributed.base import ModelFactory
    from vit_scale.distributed.fsdp.strategy import FSDPStrategy
    from vit_scale.launch.world import choose_device, detect_world, init_distributed, leave
    from vit_scale.models import count_params, get_spec
    from vit_scale.recipes.synthetic import SyntheticBatches

    cfg = load_config(None, [*FAST, "strategy=FULL_SHARD", "train.precision=fp16", "train.optimizer=fused"])
    world = choose_device(detect_world("torchrun"), "cpu")
    init_distributed(world, 120)
    strategy = FSDPStrategy(cfg, parse_strategy(cfg.strategy), world)
    spec = get_spec(cfg.model)
    strategy.setup(
        ModelFactory(
            spec, cfg.train.num_classes, cfg.train.seed, "device", count_params(cfg.model, cfg.train.num_classes)
        )
    )
    assert strategy.optimizer.defaults["fused"] is True
    batches = SyntheticBatches(
        cfg.train.batch_size, spec.img_size, cfg.train.num_classes, world.device, cfg.train.seed, world.rank
    )
    result = {
        "first": _step(strategy, *batches[0]),
        "overflow_on_rank_1": _step(strategy, *batches[1], overflow_on=(1,)),
        "clipped_overflow_on_both": _step(strategy, *batches[2], overflow_on=(0, 1), clip=True),
        "clipped": _step(strategy, *batches[3], clip=True),
        "after": _step(strategy, *batches[0]),
    }
    gathered = [None] * world.world_size
    dist.all_gather_object(gathered, result)
    if world.is_main:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.destroy_process_group()
    leave(0)  # as the trainer does: interpreter shutdown can abort in gloo's threads


def test_fsdp1_fp16_fused_adamw_overflow_on_one_rank_skips_the_step_on_every_rank():
    proc = torchrun(2, [__file__], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    ranks = json.loads(line[len("RESULT ") :])
    scale = 2.0**16
    expected = {
        "first": [True, scale],  # the setup is sound: a step is taken at the initial scale
        "overflow_on_rank_1": [False, scale / 2],  # nobody steps, both halve the scale
        # through unscale_ (clipping): the fused AdamW must see one 0-d flag equal to 1
        "clipped_overflow_on_both": [False, scale / 4],
        "clipped": [True, scale / 4],
        "after": [True, scale / 4],
    }
    for what, outcome in expected.items():
        assert [r[what] for r in ranks] == [outcome] * 2, (what, ranks)


def _gpu_world(world_size: int = 2):
    """A GPU rank as choose_device describes one; check() runs before any process group, so
    nothing here needs the GPU this machine lacks."""
    from vit_scale.launch.world import World

    return World(
        "torchrun",
        0,
        world_size,
        0,
        world_size,
        1,
        "node",
        "127.0.0.1",
        29500,
        device_type="cuda",
        device_index=0,
        backend="nccl",
    )


def test_fsdp2_fp16_with_cpu_offload_is_refused_on_a_gpu_in_one_line():
    """FSDP2's offloaded gradients live on the host, and GradScaler's overflow check on them is
    all-reduced by DTensor over the mesh's NCCL group, which has no CPU backend."""
    import pytest

    from vit_scale.config import load_config
    from vit_scale.distributed import parse_strategy
    from vit_scale.distributed.fsdp.strategy import FSDPStrategy
    from vit_scale.errors import UserError

    def check(*overrides):
        cfg = load_config(None, [*FAST, "train.precision=fp16", "fsdp.cpu_offload=true", *overrides])
        FSDPStrategy.check(cfg, parse_strategy(cfg.strategy), _gpu_world())

    for refused in (["strategy=FULL_SHARD", "fsdp.version=2"], ["strategy=HYBRID_1GPU", "fsdp.version=1"]):
        with pytest.raises(UserError) as error:
            check(*refused)
        text = str(error.value)
        assert text.startswith("fsdp.cpu_offload:") and "train.precision=fp16" in text and "\n" not in text, text
        assert "bf16" in text and "fsdp.version=1" in text and "fsdp.cpu_offload=false" in text
    # FSDP1's scaler moves a host flag to the device before reducing it; bf16 has no scaler
    check("strategy=FULL_SHARD", "fsdp.version=1")
    check("strategy=FULL_SHARD", "fsdp.version=2", "train.precision=bf16")
    check("strategy=FULL_SHARD", "fsdp.version=2", "fsdp.cpu_offload=false")


def test_fsdp1_offload_in_fp16_steps_with_an_optimizer_that_waits_for_the_scale():
    """FSDP1 with offloaded parameters steps on the host; the fused AdamW would take GradScaler's
    device scale and flag through copies its CPU kernel does not wait for (a GPU world is
    described, not used: no GPU here). auto picks the plain AdamW there; asking for fused is refused."""
    import pytest

    from vit_scale.config import load_config
    from vit_scale.distributed import parse_strategy
    from vit_scale.distributed.fsdp.strategy import FSDPStrategy
    from vit_scale.errors import UserError

    def strategy(*overrides):
        cfg = load_config(None, [*FAST, "strategy=FULL_SHARD", "fsdp.version=1", *overrides])
        label, world = parse_strategy(cfg.strategy), _gpu_world()
        FSDPStrategy.check(cfg, label, world)
        return FSDPStrategy(cfg, label, world)

    assert strategy("train.precision=fp16", "fsdp.cpu_offload=true").auto_optimizer() == "default"
    assert strategy("train.precision=bf16", "fsdp.cpu_offload=true").auto_optimizer() == "fused"
    assert strategy("train.precision=fp16").auto_optimizer() == "fused"
    with pytest.raises(
        UserError,
        match=r"^train.optimizer: fused with FSDP1 parameter offload and fp16 .*"
        r"use train.optimizer=auto",
    ):
        strategy("train.precision=fp16", "fsdp.cpu_offload=true", "train.optimizer=fused")


if __name__ == "__main__":
    sys.exit(rank_main())
