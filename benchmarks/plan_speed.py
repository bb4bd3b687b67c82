"""How long `vit-scale plan` takes, beside what it avoids: importing torch.

    python benchmarks/plan_speed.py [--repeat 5]

The planner is torch-free so that it answers on a login node in well under the time torch takes to
import. Prints the median wall time of `vit-scale plan --model vit_15b --json` (every strategy, one
node count), of `vit-scale plan --system frontier` over vit_base FULL_SHARD and HYBRID_2GPU on 1-128 nodes
(the prediction with its 90% bands) and of `python -c "import torch"`, each a fresh interpreter, and the
machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wall(cmd: list) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="fresh interpreters per command (default 5)")
    args = ap.parse_args(argv)
    commands = {
        "vit-scale plan --model vit_15b --json": [
            sys.executable,
            "-m",
            "vit_scale",
            "plan",
            "--model",
            "vit_15b",
            "--json",
        ],
        # the prediction with its bands (three timelines a point: the value and both ends of the ranges)
        "vit-scale plan --system frontier (16 points)": [
            sys.executable,
            "-m",
            "vit_scale",
            "plan",
            "--system",
            "frontier",
            "--model",
            "vit_base",
            "--strategy",
            "FULL_SHARD,HYBRID_2GPU",
            "--nodes",
            "1,2,4,8,16,32,64,128",
            "--no-figure",
        ],
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }
    for name, cmd in commands.items():
        times = [wall(cmd) for _ in range(args.repeat)]
        print(f"{name:46} median {statistics.median(times):6.2f} s  (min {min(times):.2f}, {args.repeat} runs)")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
