"""What the trainer costs over a bare PyTorch loop: same model, batch, ranks, data, in one run.

    python benchmarks/trainer_overhead.py [--model vit_tiny] [--batch-size 8] [--steps 25] [--rounds 3]

The bare loop is model, loss, backward, optimizer step and nothing else. The trainer runs the
same work under DDP on one rank with its timing, device syncs, per-step records and progress
lines. The two alternate round by round so that drift of the machine (other load, frequency)
hits both alike; the figure is the median over rounds of each round's ratio. Bar: 0.97 or better.
"""
import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bare_loop(model_name, batch_size, steps, warmup, seed=0):
    import torch
    import torch.nn.functional as F

    from vit_scale.recipes.synthetic import SyntheticBatches
    from vit_scale.models import build_model, get_spec

    spec = get_spec(model_name)
    torch.manual_seed(seed)
    model = build_model(spec, 1000, device="cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    data = SyntheticBatches(batch_size, spec.img_size, 1000, "cpu", seed, 0)
    for step in range(steps):
        if step == warmup:
            start = time.perf_counter()
        images, labels = data[step]
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
    return (steps - warmup) * batch_size / (time.perf_counter() - start)


def trainer(model_name, batch_size, steps, warmup, out_dir):
    from vit_scale.config import load_config
    from vit_scale.launch.world import choose_device, detect_world
    from vit_scale.recipes.train import execute

    cfg = load_config(None, [f"model={model_name}", "strategy=DDP", f"train.batch_size={batch_size}",
                             f"train.steps={steps}", f"train.warmup_steps={warmup}", f"output.dir={out_dir}",
                             "output.study=overhead", "train.print_every=1000000"])
    world = choose_device(detect_world("single"), "cpu")
    before = set(glob.glob(os.path.join(out_dir, "**", "metrics.jsonl"), recursive=True))
    assert execute(cfg, world, keep_process_group=True) == 0
    (path,) = set(glob.glob(os.path.join(out_dir, "**", "metrics.jsonl"), recursive=True)) - before
    with open(path) as f:
        end = [json.loads(line) for line in f][-1]
    return end["images_per_s"]["mean"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_tiny")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch

    bare, ours = [], []
    with tempfile.TemporaryDirectory() as out_dir:
        for r in range(args.rounds):
            bare.append(bare_loop(args.model, args.batch_size, args.steps, args.warmup))
            ours.append(trainer(args.model, args.batch_size, args.steps, args.warmup, out_dir))
            print(f"round {r + 1}/{args.rounds}: bare {bare[-1]:.2f} img/s, trainer {ours[-1]:.2f} img/s", flush=True)
    ratio = statistics.median(o / b for o, b in zip(ours, bare))
    print(f"\n{args.model}, batch {args.batch_size}, 1 rank, CPU ({torch.get_num_threads()} threads), "
          f"torch {torch.__version__}, {args.steps - args.warmup} timed steps x {args.rounds} rounds")
    print(f"  bare PyTorch loop : {statistics.median(bare):8.2f} img/s (median)")
    print(f"  vit-scale trainer : {statistics.median(ours):8.2f} img/s (median)")
    print(f"  ratio trainer/bare: {ratio:.3f}   (median of the per-round ratios "
          f"{', '.join(f'{o / b:.3f}' for o, b in zip(ours, bare))}; bar: >= 0.97)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
