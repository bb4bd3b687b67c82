"""How fast the analysis collects a large study.

    python benchmarks/analysis_speed.py [--runs 2000] [--steps 500] [--dir DIR] [--full] [--profile]

Generates --runs run directories of --steps step records each (analysis/synthetic.py: 5 studies
× 5 models × 10 strategies × 1..128 nodes, 1% killed mid-run so their step lines must be read),
then times collecting them into the results table: reading every metrics.jsonl and building the
tidy table with efficiencies and rerun handling. The bar is 2,000 × 500 in under 10 s.
--full also times the whole CLI (figures at 300 dpi and the report); --profile prints where the
collection time goes. Files are read from the page cache (they were just written), as on a
login node re-running the analysis; a first read from a parallel file system is slower.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import os
import pstats
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from analysis import table  # noqa: E402
from analysis.synthetic import MODELS, write_run  # noqa: E402
from vit_scale.record import reader as records  # noqa: E402

BAR_SECONDS = 10.0
STRATEGIES = (
    "DDP",
    "NO_SHARD",
    "HYBRID_1GPU",
    "HYBRID_2GPU",
    "HYBRID_8GPU",
    "SHARD_GRAD_OP",
    "FULL_SHARD",
    "ZERO1",
    "ZERO2",
    "ZERO3",
)
MODEL_NAMES = ("vit_base", "vit_huge", "vit_1b", "vit_3b", "vit_5b")
NODES = (1, 2, 4, 8, 16, 32, 64, 128)


def generate(out: str, n_runs: int, steps: int) -> tuple[int, float]:
    points = itertools.product(range(10**6), MODEL_NAMES, STRATEGIES, NODES)
    total = 0
    for i, (study, model, strategy, nodes) in enumerate(itertools.islice(points, n_runs)):
        flops = MODELS[model][1]
        ips = 2.4e14 * 0.35 / flops * nodes * 8 * (0.97 ** NODES.index(nodes))
        killed = i % 100 == 99  # a job killed mid-run leaves no end record
        path = write_run(
            out,
            study=f"bench{study}",
            model=model,
            strategy=strategy,
            nodes=nodes,
            ips=ips,
            steps=steps,
            warmup=5,
            time=1.7e9 + i,
            run_id=f"r{i:05d}",
            end=not killed,
            steps_logged=steps // 2 if killed else None,
            memory_gib=20.0,
        )
        total += os.path.getsize(path)
    return total, 0.0


def collect_and_build(out: str):
    coll = records.collect([out])
    t_read = coll.seconds
    t0 = time.perf_counter()
    tables = table.build(coll)
    return coll, tables, t_read, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--dir", help="generate into (or reuse) this directory instead of a temporary one")
    p.add_argument("--full", action="store_true", help="also time the whole CLI: figures and report")
    p.add_argument("--profile", action="store_true", help="print the functions the collection spends most in")
    args = p.parse_args()

    tmp = None
    out = args.dir
    if out is None:
        tmp = tempfile.mkdtemp(prefix="vit-scale-bench-")
        out = os.path.join(tmp, "runs")
    try:
        if os.path.isdir(out) and os.listdir(out):
            print(f"reusing the runs under {out}")
        else:
            t0 = time.perf_counter()
            size, _ = generate(out, args.runs, args.steps)
            print(
                f"generated {args.runs} runs × {args.steps} steps ({size / 2**20:.0f} MiB) "
                f"in {time.perf_counter() - t0:.1f} s under {out}"
            )

        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
        coll, tables, t_read, t_table = collect_and_build(out)
        if args.profile:
            prof.disable()
        total = t_read + t_table
        n = len(coll.runs)
        print(f"read     {n} runs in {t_read:.2f} s ({n / t_read:,.0f} runs/s), {len(coll.skipped)} skipped")
        print(f"table    {len(tables.results)} rows in {t_table:.2f} s")
        verdict = "under" if total < BAR_SECONDS else "OVER"
        print(
            f"collect  {n} runs in {total:.2f} s in total ({n / total:,.0f} runs/s): {verdict} the "
            f"{BAR_SECONDS:.0f} s bar"
        )
        if args.profile:
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(18)
            print(text.getvalue())
        if args.full:
            import subprocess

            report_dir = os.path.join(tmp or os.path.dirname(out.rstrip("/")), "report")
            t0 = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    os.path.join(ROOT, "analysis", "weak_scaling.py"),
                    out,
                    "--out",
                    report_dir,
                    "--quiet",
                ],
                capture_output=True,
                text=True,
            )
            print(
                f"full CLI (collect, table, figures at 300 dpi, report): {time.perf_counter() - t0:.1f} s, "
                f"exit {proc.returncode}"
            )
            if proc.returncode != 0:
                print(proc.stderr)
        return 0 if total < BAR_SECONDS else 1
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
