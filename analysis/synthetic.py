"""Write schema-1 run directories without a trainer: for the analysis tests, the speed benchmark
and trying the report on a laptop.

    python -m analysis.synthetic OUT_DIR        # a Frontier-like study to run the analysis on

The records follow docs/run_record.md; the numbers follow a simple model of the paper's
results (throughput per GPU falling slowly with nodes, FULL_SHARD memory falling with ranks),
not any measurement.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from dataclasses import dataclass

import numpy as np
import yaml

from vit_scale.distributed import layout_of, parse_strategy
from vit_scale.distributed.layout import Layout
from vit_scale.errors import UserError

# name: (params, flops per image, memory of the unsharded model state in GiB for the
# DDP-like strategies, activations GiB at batch 32) - rough, for plausible pictures only
MODELS = {
    "vit_micro": (0.2e6, 2.6e7, 0.003, 0.01),
    "vit_base": (86.6e6, 5.3e10, 1.4, 6.0),
    "vit_huge": (632e6, 5.0e11, 10.1, 20.0),
    "vit_1b": (910e6, 7.1e11, 14.6, 24.0),
    "vit_3b": (2.9e9, 2.3e12, 46.0, 18.0),
    "vit_5b": (3.8e9, 3.0e12, 61.0, 24.0),
    "vit_15b": (14.7e9, 1.1e13, 235.0, 40.0),
}


def layout(label: str, world_size: int, ranks_per_node: int) -> Layout:
    """The trainer's own layout for the label; a label it does not know (the analysis tests write
    some) as a replica on every rank."""
    try:
        return layout_of(label, world_size, ranks_per_node)
    except UserError:
        return Layout(label, "ddp", "ddp", label, 1, world_size, 1)


def default_options(label: str) -> dict:
    try:
        fam = parse_strategy(label).family
    except UserError:  # a label the registry does not know: options as DDP's
        fam = "ddp"
    if fam == "fsdp":
        return {
            "version": 1,
            "backward_prefetch": "pre",
            "limit_all_gathers": True,
            "forward_prefetch": False,
            "use_orig_params": False,
            "cpu_offload": False,
            "precision": "bf16",
            "activation_checkpointing": False,
        }
    if fam == "deepspeed":
        return {
            "stage": {"ZERO1": 1, "ZERO2": 2, "ZERO3": 3, "ZEROPP": 3}.get(label, 0),
            "offload_optimizer": False,
            "precision": "bf16",
            "activation_checkpointing": False,
        }
    if fam == "colossalai":
        return {"precision": "fp16" if label != "CAI_DDP" else "fp32", "activation_checkpointing": False}
    return {"precision": "bf16", "activation_checkpointing": False}


@dataclass
class RunSpec:
    """What write_run writes: one run as the trainer would record it. status other than ok gives an end
    record with that status (ips still written if given, as a timeout after some steps would); end=False
    leaves only start and steps_logged steps. The timed steps' images/s scatter around ips with a relative
    standard deviation `spread`, seeded by the run's path under root, their median and their throughput
    over wall time (images over the summed step times, the end record's mean) ips exactly (_timed_ips);
    `step_ips` gives the timed steps' figures instead (the steps are then warmup + their number, and the
    end record summarises them, its mean the images over their summed times as the trainer's).
    `repetition` is the study round the run belongs to (output.repetition; 0: none)."""

    study: str = "study"
    model: str = "vit_base"
    strategy: str = "DDP"
    nodes: int = 1
    ranks_per_node: int = 8
    batch: int = 32
    ips: float | None = 100.0
    status: str = "ok"
    options: dict | None = None
    steps: int = 30
    warmup: int = 5
    time: float = 1.7e9
    run_id: str | None = None
    memory_gib: float | None = 10.0
    device: str = "rocm"
    device_memory_gib: float | None = 64.0
    peak_tflops: float | None = 191.5
    error: str | None = None
    end: bool = True
    steps_logged: int | None = None
    replicas_agree: bool | None = True
    job_id: str | None = "1234"
    schema: int = 1
    params: float | None = None
    flops_per_image: float | None = None
    predicted_gib: float | None = None
    spread: float = 0.02
    step_ips: list | None = None
    repetition: int = 0
    nodes_health: dict | None = None  # the end record's, as vit_scale.run.health writes it (absent: none)
    time_split: dict | None = None  # the end record's time_split (vit_scale/run/ending.py), written when given

    def __post_init__(self):
        if self.step_ips is not None:
            self.steps = self.warmup + len(self.step_ips)
            self.ips = wall_throughput(self.step_ips) if len(self.step_ips) else self.ips
        self.run_id = self.run_id or f"{int(self.time)}-j{self.job_id}.{self.nodes}"
        m_params, m_flops, _, _ = MODELS.get(self.model, (1e6, 1e9, 1.0, 1.0))
        self.params = m_params if self.params is None else self.params
        self.flops_per_image = m_flops if self.flops_per_image is None else self.flops_per_image

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def steps_written(self) -> int:
        return self.steps if self.steps_logged is None else self.steps_logged

    @property
    def step_time(self) -> float:
        """The seconds of a step outside the timed ones (warmup)."""
        return self.batch * self.world_size / self.ips if self.ips else 1.0


def write_run(root: str, **fields) -> str:
    """One run directory under root, its fields RunSpec's; returns the path of its metrics.jsonl."""
    spec = RunSpec(**fields)
    run_dir = os.path.join(root, spec.study, spec.model, spec.strategy, f"n{spec.nodes}", spec.run_id)
    os.makedirs(run_dir, exist_ok=True)
    config = {
        "model": spec.model,
        "strategy": spec.strategy,
        "train": {"batch_size": spec.batch, "steps": spec.steps, "warmup_steps": spec.warmup, "log_every": 1},
        "output": {"dir": root, "study": spec.study, "run_id": spec.run_id, "repetition": spec.repetition},
    }
    timed_ips = (
        list(spec.step_ips)
        if spec.step_ips is not None
        else _timed_ips(spec.ips, max(0, spec.steps - spec.warmup), spec.spread, os.path.relpath(run_dir, root))
    )
    lines = [json.dumps(_start_record(spec, config))]
    end_time = _step_lines(spec, timed_ips, lines)
    if spec.end:
        lines.append(json.dumps(_end_record(spec, timed_ips, end_time)))
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path


def _start_record(spec: RunSpec, config: dict) -> dict:
    lay = layout(spec.strategy, spec.world_size, spec.ranks_per_node)
    gpu, nodes = spec.gpu, spec.nodes
    return {
        "event": "start",
        "time": spec.time,
        "schema": spec.schema,
        "run_id": spec.run_id,
        "study": spec.study,
        "time_iso": "2024-05-01T00:00:00Z",
        "config": config,
        "model": {
            "name": spec.model,
            "params": int(spec.params),
            "flops_per_image": int(spec.flops_per_image),
            "img_size": 224,
            "patch_size": 14,
            "embed_dim": 768,
            "depth": 12,
            "num_heads": 12,
            "mlp_dim": 3072,
            "num_classes": 1000,
        },
        "strategy": {
            "label": spec.strategy,
            "family": lay.family,
            "implementation": lay.implementation,
            "shard_group_size": lay.shard,
            "replicate_group_size": lay.replicate,
            "options": default_options(spec.strategy) if spec.options is None else dict(spec.options),
            "notes": list(lay.notes),
        },
        "world": {
            "world_size": spec.world_size,
            "nodes": nodes,
            "ranks_per_node": spec.ranks_per_node,
            "device_type": spec.device,
            "device_name": "AMD Instinct MI250X" if gpu else "cpu",
            "device_memory_gib": spec.device_memory_gib if gpu else None,
            "backend": "nccl" if gpu else "gloo",
            "peak_tflops_per_device": spec.peak_tflops if gpu else None,
            "peak_tflops_source": "table" if gpu else None,
        },
        "batch": {"per_device": spec.batch, "global": spec.batch * spec.world_size},
        "launcher": "srun" if spec.job_id else "torchrun",
        "slurm": {
            "job_id": spec.job_id,
            "step_id": str(nodes),
            "job_name": spec.study,
            "nodelist": f"frontier[00001-{nodes:05d}]",
            "partition": "batch",
            "account": "abc123",
        }
        if spec.job_id
        else None,
        "hosts": [f"frontier{i:05d}" for i in range(1, nodes + 1)],
        "versions": {
            "python": "3.11.7",
            "torch": "2.4.1+rocm6.1",
            "timm": "1.0.9",
            "deepspeed": None,
            "colossalai": None,
            "cuda": None,
            "hip": "6.1" if gpu else None,
            "nccl": "2.20.5",
        },
        "git_revision": "0123abc",
        "plan": (
            {"memory_gib": spec.memory_gib, "fits": True, "peak_allocated_gib": spec.predicted_gib or spec.memory_gib}
            if spec.memory_gib
            else None
        ),
    }


def _step_lines(spec: RunSpec, timed_ips: list, lines: list) -> float:
    """Appends the step lines to lines; returns the time after the last step."""
    images = spec.batch * spec.world_size
    # Step lines are formatted by hand: the benchmark writes a million of them.
    t = spec.time
    for k in range(1, spec.steps_written + 1):
        dt = images / timed_ips[k - spec.warmup - 1] if k > spec.warmup and timed_ips else spec.step_time
        t += dt
        lines.append(
            f'{{"event": "step", "time": {t:.3f}, "step": {k}, "loss": {6.9 - 0.01 * k:.5f}, "step_time_s": {dt:.6f}, '
            f'"images_per_s": {images / dt:.3f}, "warmup": {"true" if k <= spec.warmup else "false"}}}'
        )
    return t


def _memory(spec: RunSpec) -> dict | None:
    """The end record's memory: per-rank peaks a little apart, reserved above allocated on a GPU."""
    memory_gib, world_size = spec.memory_gib, spec.world_size
    if memory_gib is None:
        return None
    per_rank = [round(memory_gib * (1 - 0.01 * (r % 3)), 4) for r in range(world_size)]
    mem = {
        "device_kind": spec.device,
        "peak_allocated_gib" if spec.gpu else "peak_rss_gib": {
            "max": max(per_rank),
            "mean": sum(per_rank) / world_size,
            "per_rank": per_rank,
        },
        "window": "timed_steps",
    }
    if spec.gpu:
        mem["peak_reserved_gib"] = {
            "max": memory_gib * 1.1,
            "mean": memory_gib * 1.08,
            "per_rank": [memory_gib * 1.1] * world_size,
        }
    return mem


def _end_record(spec: RunSpec, timed_ips: list, end_time: float) -> dict:
    n_steps, ips, world_size, status = spec.steps_written, spec.ips, spec.world_size, spec.status
    timed = max(0, n_steps - spec.warmup)
    have_ips = ips is not None and timed > 0
    tflops = spec.flops_per_image * ips / world_size / 1e12 if have_ips else None
    ended = status in ("ok", "diverged")
    health = {"nodes_health": spec.nodes_health} if spec.nodes_health is not None else {}
    return {
        "event": "end",
        "time": end_time,
        "status": status,
        "error": spec.error if status != "ok" else None,
        "failed_rank": 0 if status not in ("ok", "skipped") else None,
        "steps_done": n_steps,
        "timed_steps": timed,
        "wall_time_s": spec.step_time * n_steps,
        "images_per_s": _summary(ips, timed_ips, spec.spread) if have_ips else None,
        "images_per_s_per_device": ips / world_size if have_ips else None,
        "memory": _memory(spec),
        "tflops_per_device": tflops,
        "mfu": tflops / spec.peak_tflops if (tflops is not None and spec.peak_tflops and spec.gpu) else None,
        # as the trainer does, a run whose replicas disagree is ended as diverged
        "replicas_agree": spec.replicas_agree if ended else None,
        "replica_checksums": [[1.0, 2.0, 3.0]] * min(world_size, 4) if ended else None,
        "final_loss": 6.9 - 0.01 * n_steps if ended else None,
        **health,
        **({"time_split": spec.time_split} if spec.time_split is not None else {}),
    }


def _timed_ips(ips: float | None, n: int, spread: float, seed_text: str) -> list:
    """n per-step figures around ips with a relative standard deviation `spread`, their median and their
    throughput over wall time exactly ips: seeded normal draws of the step times in the order drawn,
    centred on their median (the middle one or two set to it), the times above it scaled so that their
    mean matches too."""
    if not ips or n == 0:
        return []
    if spread <= 0 or n <= 2:
        return [float(ips)] * n
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    z = rng.standard_normal(n)
    order = np.argsort(z)
    z -= z[order[(n - 1) // 2]] if n % 2 else (z[order[n // 2 - 1]] + z[order[n // 2]]) / 2
    z[order[(n - 1) // 2 : n // 2 + 1]] = 0.0
    above = z > 0
    z[above] *= -z[~above].sum() / z[above].sum()
    return list(ips / (1 + spread * z / z.std()))


# ------------------------------------------------------------------------------ known step distributions
# For the known-answer tests: step figures whose point throughput, stalls and trend are known.


def wall_throughput(step_ips) -> float:
    """Images over the summed step times of steps of equal size: the end record's mean for these steps."""
    x = np.asarray(step_ips, dtype=float)
    return float(len(x) / np.sum(1.0 / x))


def steady_steps(ips: float, n: int, spread: float, seed: int) -> list:
    """n independent step figures, log-normal around ips with relative spread `spread`."""
    rng = np.random.default_rng(seed)
    return list(ips * np.exp(rng.normal(0.0, spread, n)))


def stalling_steps(ips: float, n: int, share: float, slowdown: tuple, seed: int, spread: float = 0.01) -> list:
    """Steady steps around ips of which a `share` (rounded, spread over the run) take slowdown[0] to
    slowdown[1] times as long: stalls, which the median step rate does not see and wall time does."""
    rng = np.random.default_rng(seed)
    x = np.asarray(steady_steps(ips, n, spread, seed))
    stalled = rng.choice(n, size=round(share * n), replace=False)
    x[stalled] /= rng.uniform(slowdown[0], slowdown[1], len(stalled))
    return list(x)


def drifting_steps(ips: float, n: int, drift: float, seed: int, spread: float = 0.01) -> list:
    """Steps around ips whose rate falls linearly by `drift` (a fraction) from the first to the last."""
    return list(np.asarray(steady_steps(ips, n, spread, seed)) * np.linspace(1.0, 1.0 - drift, n))


def _summary(ips: float, timed: list, spread: float) -> dict:
    """The end record's images_per_s of the timed steps as the trainer writes it (mean from the caller)."""
    if not timed:
        return {"mean": ips, "std": ips * spread, "min": ips, "max": ips, "median": ips}
    x = np.asarray(timed)
    return {
        "mean": ips,
        "std": float(x.std()),
        "min": float(x.min()),
        "max": float(x.max()),
        "median": float(np.median(x)),
    }


# ------------------------------------------------------------------------------ a whole study

# Relative cost of communication per strategy: the fraction of per-GPU throughput lost for each
# doubling of nodes, and the fraction lost on one node against DDP.
_COMM = {
    "DDP": (0.02, 0.00),
    "NO_SHARD": (0.03, 0.02),
    "HYBRID_1GPU": (0.015, 0.00),
    "HYBRID_2GPU": (0.03, 0.05),
    "HYBRID_8GPU": (0.035, 0.10),
    "SHARD_GRAD_OP": (0.05, 0.08),
    "FULL_SHARD": (0.07, 0.12),
}
_SPLIT_LABELS = {"NO_SHARD": 1, "DDP": 1, "HYBRID_1GPU": 1, "HYBRID_2GPU": 2, "HYBRID_8GPU": 8}


def model_memory(model: str, label: str, world_size: int) -> float:
    _, _, state, act = MODELS[model]
    split = _SPLIT_LABELS.get(label, world_size)
    if label == "SHARD_GRAD_OP":
        return state * 0.25 + state * 0.75 / world_size + act
    return state / split + act


def paper_study(
    root: str,
    study: str = "frontier",
    models=("vit_base", "vit_huge", "vit_1b", "vit_3b", "vit_5b"),
    labels=tuple(_COMM),
    node_counts=(1, 2, 4, 8, 16),
    steps: int = 30,
    capacity: float = 64.0,
    time: float = 1.7e9,
    grid: bool = True,
    failures: bool = True,
) -> list:
    """The paper's weak-scaling study, with OOMs where the model state does not fit and, with
    failures, one timeout, one run killed without an end record and one failed earlier attempt."""
    paths = []
    for mi, model in enumerate(models):
        _, flops, _, _ = MODELS[model]
        per_gpu_1 = 2.4e14 * 0.35 / flops  # ~35% MFU of an MI250X GCD at batch 32
        for label in labels:
            loss, one_node = _COMM[label]
            for ni, nodes in enumerate(node_counts):
                world = nodes * 8
                mem = model_memory(model, label, world)
                ips = per_gpu_1 * (1 - one_node) * (1 - loss) ** ni * world
                status, err, end = "ok", None, True
                if mem > capacity:
                    status, err, ips = "oom", f"HIP out of memory: tried to allocate {mem - capacity + 1:.2f} GiB", None
                elif failures and (model, label, nodes) == ("vit_1b", "FULL_SHARD", node_counts[-1]):
                    status, err = "timeout", "SIGTERM from Slurm (time limit) at step 17"
                elif failures and (model, label, nodes) == ("vit_huge", "SHARD_GRAD_OP", node_counts[-1]):
                    end = False  # killed outright: no end record
                when = time + 1000 * (mi * 100 + ni)
                if failures and (model, label, nodes) == ("vit_base", "DDP", node_counts[1]):
                    # an earlier attempt at the same point that hit a network error: set aside
                    paths.append(
                        write_run(
                            root,
                            study=study,
                            model=model,
                            strategy=label,
                            nodes=nodes,
                            ips=None,
                            status="failed",
                            error="NCCL error: unhandled system error",
                            memory_gib=None,
                            steps=steps,
                            time=when - 500,
                            run_id="earlier-attempt",
                            device_memory_gib=capacity,
                        )
                    )
                paths.append(
                    write_run(
                        root,
                        study=study,
                        model=model,
                        strategy=label,
                        nodes=nodes,
                        ips=ips,
                        status=status,
                        error=err,
                        memory_gib=mem if status == "ok" else None,
                        steps=steps,
                        time=when,
                        device_memory_gib=capacity,
                        end=end,
                        steps_logged=steps // 2 if not end else None,
                    )
                )
    if grid:
        paths += config_grid_study(root, study=study + "_configs", time=time)
    return paths


def config_grid_study(
    root: str, study: str = "configs", model: str = "vit_5b", nodes: int = 8, time: float = 1.7e9
) -> list:
    """Figure 1: three sharding strategies × backward prefetch × limit_all_gathers."""
    paths = []
    base = {"HYBRID_2GPU": 130.0, "FULL_SHARD": 100.0, "SHARD_GRAD_OP": 112.0}
    for label, ips in base.items():
        for prefetch, pf in (("none", 0.93), ("pre", 1.0), ("post", 0.97)):
            for lag, lf in ((False, 0.94), (True, 1.0)):
                opts = dict(default_options(label), backward_prefetch=prefetch, limit_all_gathers=lag)
                paths.append(
                    write_run(
                        root,
                        study=study,
                        model=model,
                        strategy=label,
                        nodes=nodes,
                        ips=ips * pf * lf * nodes,
                        options=opts,
                        time=time,
                        run_id=f"r-{prefetch}-{int(lag)}",
                        memory_gib=model_memory(model, label, 64),
                    )
                )
    return paths


def plugin_study(root: str, study: str = "plugin_comparison", model: str = "vit_base", time: float = 1.7e9) -> list:
    """Seeds 000/001: ColossalAI plugins on one GPU at several batch sizes (T4, 15 GiB)."""
    paths = []
    table = {
        "CAI_DDP": (24.0, 1.7, 0.012),
        "CAI_DDP_FP16": (57.0, 1.7, 0.010),
        "CAI_LOW_LEVEL_ZERO": (42.0, 1.6, 0.0),
        "CAI_GEMINI": (22.0, 0.65, 0.0),
    }
    for label, (ips8, mem8, mem_per_img) in table.items():
        for batch in (8, 16, 32, 64):
            ips = ips8 * (1 + 0.35 * (batch / 8 - 1) ** 0.5)
            mem = mem8 + mem_per_img * (batch - 8)
            status = "oom" if (label == "CAI_DDP" and batch == 64) else "ok"
            paths.append(
                write_run(
                    root,
                    study=study,
                    model=model,
                    strategy=label,
                    nodes=1,
                    ranks_per_node=1,
                    batch=batch,
                    ips=ips if status == "ok" else None,
                    status=status,
                    error="CUDA out of memory" if status != "ok" else None,
                    memory_gib=mem if status == "ok" else None,
                    device_memory_gib=15.0,
                    peak_tflops=65.0,
                    time=time,
                    job_id=None,
                    run_id=f"{int(time)}-bs{batch}",
                )
            )
    return paths


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m analysis.synthetic OUT_DIR", file=sys.stderr)
        return 2
    out = argv[0]
    n = len(paper_study(out)) + len(plugin_study(out))
    print(f"wrote {n} synthetic runs under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
