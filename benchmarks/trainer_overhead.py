"""What the trainer costs over a bare PyTorch loop: same model, batch, ranks, data, precision, in one launch.

    python benchmarks/trainer_overhead.py [--device cpu|cuda] [--ranks N] [--pairs DDP,NO_SHARD,FULL_SHARD]
                                          [--model vit_tiny] [--batch-size 8] [--steps 25] [--rounds 3]
                                          [--keep DIR] [--json PATH]

Each pair is a bare loop and the trainer running the same strategy on the same ranks:
  DDP        torch DDP around the model                 against `strategy=DDP`
  NO_SHARD   FSDP1, one unit per timm Block, NO_SHARD    against `strategy=NO_SHARD`
  FULL_SHARD FSDP1, one unit per timm Block, FULL_SHARD  against `strategy=FULL_SHARD`
  SHARD_GRAD_OP  (not by default) FSDP1, SHARD_GRAD_OP   against `strategy=SHARD_GRAD_OP`
  FSDP2      (not by default) fully_shard on each Block and the root  against `strategy=FULL_SHARD fsdp.version=2`
The bare loop is forward, loss, backward, optimizer step and nothing else: no per-step host
synchronisation, no records, no progress. On a GPU (--device cuda) it is the fast loop an expert
writes: bf16 autocast (FSDP: MixedPrecision in bf16), fused AdamW. Both sides time the same window
the same way: device synchronised and ranks at a barrier before the first step after the warm-up,
synchronised at the end, the slowest rank's time. The bare loop and the trainer alternate round by
round so that drift of the machine hits both alike; each pair's figure is the median over rounds
of the per-round ratio trainer/bare. Bar (issue 12): 0.97 or better. Each loop and run starts with
what the one before left collected and the allocator's cache handed back (the check meter's
`release`), so that neither side's speed or the trainer's measured peak memory carries the other's.
`--keep DIR` keeps the trainer's run records there (else a temporary directory); `--json PATH` writes
every round's figures and the trainer's run directories, rewritten after each pair
(benchmarks/gpu_acceptance.py reads it).

It starts itself under torchrun with --ranks processes (default: 2 on a CPU, every GPU on a GPU).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PAIRS = ("DDP", "NO_SHARD", "FULL_SHARD")  # the default


# the two loops live with vit-scale check's meter, which compares them on one device before a study
from vit_scale.check.meter import BARE_LABELS, bare_loop, release, trainer  # noqa: E402


def worker(args) -> int:
    import torch

    from vit_scale.launch.world import choose_device, detect_world, init_distributed, leave

    world = choose_device(detect_world("torchrun"), args.device)
    init_distributed(world, 600)
    pairs = args.pairs.split(",")
    bare = {p: [] for p in pairs}
    ours = {p: [] for p in pairs}
    run_dirs = {p: [] for p in pairs}
    device = (
        torch.cuda.get_device_name(world.device_index)
        if world.device_type != "cpu"
        else f"CPU ({torch.get_num_threads()} threads per rank)"
    )
    with tempfile.TemporaryDirectory() as temporary:
        out_dir = args.keep or temporary
        for r in range(args.rounds):
            for label in pairs:
                release(world)
                bare[label].append(bare_loop(label, args, world))
                release(world)
                ips, run = trainer(label, args, world, out_dir)
                ours[label].append(ips)
                run_dirs[label].append(run.run_dir)
                del run
                if world.is_main:
                    print(
                        f"round {r + 1}/{args.rounds} {label:10}: bare {bare[label][-1]:9.2f} img/s, "
                        f"trainer {ours[label][-1]:9.2f} img/s",
                        flush=True,
                    )
                    if args.json:  # after every pair, so that a run killed at its time limit leaves what it had
                        write_json(args, world, device, {"bare": bare, "trainer": ours, "run_dirs": run_dirs})
    if world.is_main:
        print(
            f"\n{args.model}, batch {args.batch_size} per rank, {world.world_size} rank(s), {args.precision}, "
            f"{device}, torch {torch.__version__}, {args.steps - args.warmup} timed steps x {args.rounds} rounds"
        )
        for label in pairs:
            ratios = [o / b for o, b in zip(ours[label], bare[label], strict=True)]
            print(
                f"  {label:10} bare {statistics.median(bare[label]):9.2f} img/s, trainer "
                f"{statistics.median(ours[label]):9.2f} img/s (medians; per-round ratios "
                f"{', '.join(f'{x:.3f}' for x in ratios)})"
            )
        for label in pairs:
            ratio = statistics.median(o / b for o, b in zip(ours[label], bare[label], strict=True))
            print(f"ratio {label}: {ratio:.3f}")
        print("bar: every ratio 0.97 or better", flush=True)
    torch.distributed.destroy_process_group()
    leave(0)


def write_json(args, world, device: str, figures: dict) -> None:
    """Every round's images/s of both sides and the trainer's run directories, per pair."""
    import json

    import torch

    settings = {k: getattr(args, k) for k in ("model", "batch_size", "precision", "steps", "warmup", "rounds", "seed")}
    doc = {
        "settings": settings,
        "ranks": world.world_size,
        "device": device,
        "torch": torch.__version__,
        "pairs": {
            label: {key: figures[key][label] for key in ("bare", "trainer", "run_dirs")} for label in figures["bare"]
        },
    }
    tmp = f"{args.json}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, args.json)  # whole or not at all: the script may be killed while writing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--ranks", type=int, default=0, help="processes (default: 2 on a CPU, every GPU on a GPU)")
    parser.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated, from {', '.join(BARE_LABELS)}")
    parser.add_argument("--model", default=None, help="default: vit_tiny on a CPU, vit_base on a GPU")
    parser.add_argument("--batch-size", type=int, default=None, help="per rank; default: 8 on a CPU, 32 on a GPU")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default=None, help="default: fp32 CPU, bf16 GPU")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", default=None, help="keep the trainer's run records in DIR")
    parser.add_argument("--json", default=None, help="write every round's figures to PATH")
    args = parser.parse_args()
    bad = [p for p in args.pairs.split(",") if p not in BARE_LABELS]
    if bad:
        parser.error(f"--pairs: unknown {', '.join(bad)}; allowed: {', '.join(BARE_LABELS)}")
    args.keep = os.path.abspath(args.keep) if args.keep else None
    args.json = os.path.abspath(args.json) if args.json else None
    gpu = args.device == "cuda"
    args.model = args.model or ("vit_base" if gpu else "vit_tiny")
    args.batch_size = args.batch_size or (32 if gpu else 8)
    args.precision = args.precision or ("bf16" if gpu else "fp32")
    if "LOCAL_RANK" in os.environ:
        return worker(args)
    ranks = args.ranks
    if not ranks:
        import torch

        ranks = torch.cuda.device_count() if gpu else 2
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        os.path.abspath(__file__),
        *sys.argv[1:],
    ]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
