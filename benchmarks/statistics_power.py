"""How often the analysis's comparison and intervals are right, by simulation through its own functions.

    python benchmarks/statistics_power.py [--sims 2000] [--seed 1]

Prints the tables of docs/analysis.md (Statistics):
1. the comparison (analysis.stats.compare): the share of simulated pairs of points called separated, for
   runs per point 2, 3, 5, 8 against true differences 0 (the false-positive rate), 3, 5 and 10% and
   run-to-run variation 1% and 3%, for Welch's t (runs not paired) and the paired t (one run of each
   point per repetition round, each round slowed or sped by a shared factor of the same size as the
   run-to-run variation, which the pairing removes);
2. the interval of a point over its runs (analysis.stats.point_estimate, t on the log throughputs): how
   often it covers the point's true typical throughput;
3. one run: the within-run interval's coverage of that run's own long-run throughput, and the share of
   steady runs marked "not steady", for AR(1) step rates (phi 0, 0.5, 0.8) over 30 and 100 steps, and
   how often a 5% drift over the run is marked.

Runs are log-normal around their point's level (sd = the run-to-run variation); a run's throughput is
drawn directly (its steps add a variation far below 1% over hundreds of steps). Each cell is the share
over --sims simulated pairs or runs; its binomial standard error is at most 0.5/sqrt(sims) (1.1 points
at 2000). About 2.3 CPU-minutes at --sims 1000 (scipy's t test is most of it).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from analysis import stats  # noqa: E402

RUNS = (2, 3, 5, 8)
DIFFERENCES = (0.0, 0.03, 0.05, 0.10)
VARIATIONS = (0.01, 0.03)


def separated_share(rng, runs: int, difference: float, variation: float, sims: int, paired: bool) -> float:
    """Share of simulated pairs whose comparison is separated; a is `difference` faster than b."""
    hits = 0
    for _ in range(sims):
        rounds = rng.normal(0.0, variation, runs) if paired else np.zeros(runs)
        la = np.log1p(difference) + rounds + rng.normal(0.0, variation, runs)
        lb = rounds + rng.normal(0.0, variation, runs)
        a = [stats.Run(float(np.exp(x)), (), (i + 1) if paired else 0) for i, x in enumerate(la)]
        b = [stats.Run(float(np.exp(x)), (), (i + 1) if paired else 0) for i, x in enumerate(lb)]
        hits += stats.compare(a, b).separated is True
    return hits / sims


def coverage_over_runs(rng, runs: int, variation: float, sims: int) -> float:
    """Share of simulated points whose interval over runs covers the true typical throughput (1)."""
    hit = 0
    for _ in range(sims):
        est = stats.point_estimate([stats.Run(float(np.exp(x))) for x in rng.normal(0.0, variation, runs)])
        hit += est.low <= 1.0 <= est.high
    return hit / sims


def ar1_rates(rng, n: int, phi: float, noise: float = 0.03, drift: float = 0.0) -> np.ndarray:
    """n step rates around 1: AR(1) relative noise of marginal sd `noise`, times a linear drift to 1 - drift."""
    e = rng.normal(0.0, noise * np.sqrt(1 - phi**2), n)
    z = np.empty(n)
    z[0] = rng.normal(0.0, noise)
    for i in range(1, n):
        z[i] = phi * z[i - 1] + e[i]
    return (1 + z) * np.linspace(1.0, 1.0 - drift, n)


def within_run(rng, n: int, phi: float, sims: int, drift: float = 0.0) -> tuple[float, float]:
    """(coverage of the run's long-run throughput, share marked not steady) over simulated runs."""
    # the long-run throughput of the steady process: 1 / E[1 / rate], by a long draw
    truth = 1.0 / np.mean(1.0 / ar1_rates(np.random.default_rng(0), 400_000, phi))
    cover = marked = 0
    for _ in range(sims):
        rates = ar1_rates(rng, n, phi, drift=drift)
        thr = 1.0 / np.mean(1.0 / rates)
        low, high = stats.within_run_interval(thr, rates)
        cover += low <= truth <= high
        marked += stats.steady(rates) is False
    return cover / sims, marked / sims


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    print(f"Separated at 95% ({args.sims} simulated pairs a cell; difference 0%: the false-positive rate)")
    print("| test | run-to-run | runs per point | 0% | 3% | 5% | 10% |")
    print("|---|---|---|---|---|---|---|")
    for paired in (False, True):
        for variation in VARIATIONS:
            for runs in RUNS:
                cells = [separated_share(rng, runs, d, variation, args.sims, paired) for d in DIFFERENCES]
                name = "paired t" if paired else "Welch t"
                print(f"| {name} | {variation:.0%} | {runs} | " + " | ".join(f"{c:.1%}" for c in cells) + " |")

    print(f"\nInterval over runs (t on log throughputs, nominal 95%): coverage ({args.sims} points a cell)")
    print("| run-to-run | " + " | ".join(f"{r} runs" for r in RUNS) + " |")
    print("|---|" + "---|" * len(RUNS))
    for variation in VARIATIONS:
        cov = [coverage_over_runs(rng, r, variation, args.sims) for r in RUNS]
        print(f"| {variation:.0%} | " + " | ".join(f"{c:.1%}" for c in cov) + " |")

    sims = max(args.sims // 2, 1)
    print(f"\nOne run: within-run interval (nominal 95%) and the steadiness mark ({sims} runs a cell, steps 3% noise)")
    print("| timed steps | phi | covers the run's throughput | steady run marked not steady | 5% drift marked |")
    print("|---|---|---|---|---|")
    for n in (30, 100):
        for phi in (0.0, 0.5, 0.8):
            cov, false_mark = within_run(rng, n, phi, sims)
            _, drift_mark = within_run(rng, n, phi, sims, drift=0.05)
            print(f"| {n} | {phi} | {cov:.1%} | {false_mark:.1%} | {drift_mark:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
