"""Does the meter disturb what it measures? Three comparisons on one device:

- the trainer against a bare PyTorch loop (same model, batch, data, precision, strategy DDP):
  images/s trainer / bare; the bare loop is benchmarks/trainer_overhead.py's (it imports it from
  here). On a CPU informational only: runs there differ by about ±15% from one to the next.
- event-timed against host-synchronised step times: the mean step time the trainer books in its
  normal run (device events on a GPU, no host synchronisation anywhere in the step) against the
  host clock's mean in a second run whose every step is bracketed by device synchronisations. Two
  runs, so that the synchronisation cannot shape the event-timed steps (timed inside one window,
  both clocks would agree by construction). On a GPU they must agree within TIMING_TOLERANCE; on
  a CPU both are host clocks of two runs, which differ by more than that from run to run, so the
  line is informational there.
- on a GPU, the planner's predicted peak allocated memory (the start record's plan) against the
  measured (the end record's): the planner's error.

`settings` is anything with model, batch_size, steps, warmup, precision, seed and device
attributes (the benchmark's argparse namespace, or MeterSettings).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from dataclasses import dataclass

TIMING_TOLERANCE = 0.05  # event-timed and host-timed mean step times may differ by this share
GPU_OVERHEAD_FLOOR = 0.90  # on a GPU, trainer/bare below this is a meter that costs throughput
# the labels bare_loop builds by hand; FSDP2 is the trainer's FULL_SHARD with fsdp.version=2
BARE_LABELS = ("DDP", "NO_SHARD", "FULL_SHARD", "SHARD_GRAD_OP", "FSDP2")


@dataclass
class MeterSettings:
    model: str
    batch_size: int
    steps: int
    warmup: int
    precision: str
    device: str
    rounds: int = 1
    seed: int = 0


def settings_for(device_type: str, quick: bool) -> MeterSettings:
    """vit_base at batch 32 in bf16 on a GPU (issue 12's benchmark); vit_micro on a CPU."""
    if device_type == "cpu":
        # a fresh process's first steps are slow on a CPU: a longer warm-up than the GPU's, in steps
        return MeterSettings("vit_micro", 8, 12 if quick else 24, 4 if quick else 6, "fp32", "cpu", 1 if quick else 3)
    return MeterSettings("vit_base", 32, 15 if quick else 25, 5, "bf16", "cuda", 1 if quick else 3)


# ---------------------------------------------------------------- the two loops


def bare_loop(label, settings, world):
    """images/s of the plain loop for one strategy label: forward, loss, backward, optimizer step,
    nothing else (no per-step host synchronisation, no records, no progress). On a GPU the fast
    loop an expert writes: bf16 autocast (FSDP: MixedPrecision in bf16), fused AdamW. Timed like
    the trainer: device synchronised and ranks at a barrier before the first step after the
    warm-up, synchronised at the end, the slowest rank's time. `label`: one of BARE_LABELS."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from vit_scale.models import block_class, build_model, get_spec
    from vit_scale.recipes.synthetic import SyntheticBatches

    spec = get_spec(settings.model)
    gpu = world.device_type != "cpu"
    bf16 = settings.precision == "bf16"
    torch.manual_seed(settings.seed)
    model = build_model(spec, 1000, device=world.device)
    if label == "DDP":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[world.device_index] if gpu else None)
    elif label == "FSDP2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # as the trainer's FSDP2: one unit per Block and the root, resharded after forward
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) if bf16 else None
        for block in model.blocks:
            fully_shard(block, **({"mp_policy": mp} if mp else {}))
        fully_shard(model, **({"mp_policy": mp} if mp else {}))
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        mp = MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16) if bf16 else None
        model = FullyShardedDataParallel(
            model,
            sharding_strategy=getattr(ShardingStrategy, label),
            auto_wrap_policy=ModuleWrapPolicy({block_class()}),
            mixed_precision=mp,
            device_id=world.device,
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, **({"fused": True} if gpu else {}))
    autocast = label == "DDP" and bf16
    data = SyntheticBatches(settings.batch_size, spec.img_size, 1000, world.device, settings.seed, world.rank)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    for step in range(settings.steps):
        if step == settings.warmup:
            sync()
            dist.barrier()
            start = time.perf_counter()
        images, labels = data[step]
        with torch.autocast(world.torch_device_type, torch.bfloat16, enabled=autocast):
            logits = model(images)
        F.cross_entropy(logits.float(), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=world.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return (settings.steps - settings.warmup) * settings.batch_size * world.world_size / elapsed.item()


def strategy_overrides(label: str) -> list[str]:
    """The trainer's overrides for one of BARE_LABELS."""
    return ["strategy=FULL_SHARD", "fsdp.version=2"] if label == "FSDP2" else [f"strategy={label}"]


def trainer_config(label, settings, out_dir, study):
    from vit_scale.config import load_config

    return load_config(
        None,
        [
            f"model={settings.model}",
            *strategy_overrides(label),
            f"train.batch_size={settings.batch_size}",
            f"train.steps={settings.steps}",
            f"train.warmup_steps={settings.warmup}",
            f"train.precision={settings.precision}",
            f"train.seed={settings.seed}",
            f"system.device={settings.device}",
            f"output.dir={out_dir}",
            f"output.study={study}",
            "train.print_every=1000000",
            # one device alone: no node to compare it with, and the check's own parts time its GEMMs
            "train.health_probe_s=0",
        ],
    )


def trainer(label, settings, world, out_dir, run_class=None, study=None):
    """The trainer's run of the label (`vit-scale train`, keep_process_group=True), its record under
    OUT_DIR/STUDY (default: the label): (images/s from its end record, the run) on rank 0, (None, the
    run) elsewhere."""
    from vit_scale.recipes.train import Run
    from vit_scale.record.reader import read_run_dir

    run = (run_class or Run)(trainer_config(label, settings, out_dir, study or label), world)
    # the meter's group is this rank alone: a failed run cannot leave it broken, so the run returns
    # and its failure becomes the meter's line
    code = run.execute(keep_process_group=True, return_on_failure=world.world_size == 1)
    if code != 0:
        record = read_run_dir(run.run_dir) if run.run_dir else None
        error = ((record.end or {}).get("error") if record else None) or f"exit code {code}"
        raise RuntimeError(f"the trainer's {label} run failed: {error} (record: {run.run_dir})")
    if not world.is_main:
        return None, run
    return read_run_dir(run.run_dir).end["images_per_s"]["mean"], run


def host_timed_run_class():
    """The trainer's Run with each step bracketed by device synchronisations and timed by the host
    clock (`host_step_s`): the reference the normal run's event-timed steps are compared with."""
    from vit_scale.recipes.train import Run

    class HostTimedRun(Run):
        def __init__(self, cfg, world):
            super().__init__(cfg, world)
            self.host_step_s: list[float] = []

        def train(self) -> None:
            import torch

            strategy = self.strategy
            real_setup = strategy.setup
            sync = torch.cuda.synchronize if self.world.device_type != "cpu" else (lambda: None)

            def setup(factory):
                real_setup(factory)
                real_step = strategy.train_step

                def step(images, labels):
                    sync()
                    started = time.perf_counter()
                    loss = real_step(images, labels)
                    sync()
                    self.host_step_s.append(time.perf_counter() - started)
                    return loss

                strategy.train_step = step

            strategy.setup = setup
            super().train()

    return HostTimedRun


# ---------------------------------------------------------------- the check's comparisons


def one_device_world(world):
    """This rank alone, as a world of one: the meter's runs measure one device, not the network."""
    return dataclasses.replace(world, rank=0, world_size=1, local_world_size=1, nodes=1)


def measure(world, settings: MeterSettings, out_dir: str) -> dict:
    """Every comparison, in a process group of this rank alone (the caller's job: the check's rank 0
    runs it before the world's process group exists). Each measured run starts with nothing of the
    runs before it alive (`release`), so that its peak is its own: what is kept of a run is its
    figures, never the run."""
    bare, ours = [], []
    event = run_dir = None
    for _ in range(settings.rounds):  # alternating, so that drift of the machine hits both alike
        release(world)
        bare.append(bare_loop("DDP", settings, world))
        release(world)
        ips, run = trainer("DDP", settings, world, out_dir, study="meter")
        ours.append(ips)
        event, run_dir = list(run.step_times), run.run_dir  # the normal run's timed steps, as the trainer booked them
        del run
    ratio = statistics.median(o / b for o, b in zip(ours, bare, strict=True))
    release(world)
    _, timed = trainer("DDP", settings, world, out_dir, host_timed_run_class(), study="meter")
    host = timed.host_step_s[len(timed.host_step_s) - len(timed.step_times) :]  # the same steps of the synchronised run
    del timed
    release(world)
    event_mean, host_mean = statistics.fmean(event), statistics.fmean(host)
    return {
        "settings": dataclasses.asdict(settings),
        "strategy": "DDP",
        "device_type": world.device_type,
        "bare_images_per_s": statistics.median(bare),
        "trainer_images_per_s": statistics.median(ours),
        "ratio": ratio,
        "event_step_s": event_mean,
        "host_step_s": host_mean,
        "steps_compared": len(event),
        "timing_difference": (event_mean - host_mean) / host_mean,
        **memory_error(run_dir, world),
    }


def release(world) -> None:
    """Free what the previous loop or run left: its model, optimizer state and DDP's buckets are held
    by reference cycles (DDP's reducer and hooks point back at the module) that only the collector
    breaks; then the allocator's cache of their memory is handed back, torch's caching allocator's
    on a GPU, glibc's free heap on a CPU (the resident set the CPU's peak is read from counts it)."""
    import gc

    gc.collect()
    if world.device_type != "cpu":
        import torch

        torch.cuda.empty_cache()
        return
    from vit_scale.compat import libc

    trim = getattr(libc(), "malloc_trim", None)
    if trim is not None:  # else not glibc (macOS, musl): its free memory stays counted
        trim(0)


def memory_error(run_dir: str, world) -> dict:
    """The planner's predicted peak allocated memory against the measured, on a GPU."""
    if world.device_type == "cpu":
        return {"predicted_peak_gib": None, "measured_peak_gib": None, "memory_error": None}
    from vit_scale.record.reader import read_run_dir

    rec = read_run_dir(run_dir)
    predicted = ((rec.start or {}).get("plan") or {}).get("peak_allocated_gib")
    measured = (((rec.end or {}).get("memory") or {}).get("peak_allocated_gib") or {}).get("max")
    error = (predicted - measured) / measured if predicted and measured else None
    return {"predicted_peak_gib": predicted, "measured_peak_gib": measured, "memory_error": error}


def measure_alone(world, settings: MeterSettings, out_dir: str) -> dict:
    """`measure` in a process group of this rank alone, torn down afterwards. Its store lives in
    memory (a HashStore), so no rendezvous is involved and the world's ranks wait meanwhile."""
    import torch
    import torch.distributed as dist

    alone = one_device_world(world)
    kwargs = {}
    if world.device_type != "cpu":
        torch.cuda.set_device(world.device_index)
        kwargs["device_id"] = world.device
    dist.init_process_group(world.backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    try:
        return measure(alone, settings, out_dir)
    finally:
        # measure's DDP model sits in reference cycles and its Reducer holds this group: collected now, the group
        # ends here rather than whenever the collector next runs (a gloo group ended there, with the GIL held, can
        # deadlock against its worker thread)
        gc.collect()
        dist.destroy_process_group()
