"""How often the analysis's comparison and intervals are right, by simulation through its own functions.

    python benchmarks/statistics_power.py [--sims 2000] [--seed 1] [--only SECTION,...]

Prints the tables and figures of docs/analysis.md (Statistics), by section (--only; all by default):
1. the comparison (analysis.stats.compare): the share of simulated pairs of points called separated, for
   runs per point 2, 3, 5, 8 against true differences 0 (the false-positive rate), 3, 5 and 10% and
   run-to-run variation 1% and 3%, for Welch's t (runs not paired) and the paired t (one run of each
   point per repetition round, each round slowed or sped by a shared factor of the same size as the
   run-to-run variation, which the pairing removes);
2. the interval of a point over its runs (analysis.stats.point_estimate, t on the log throughputs): how
   often it covers the point's true typical throughput;
3. one run: the within-run interval's coverage of that run's own long-run throughput, and the share of
   steady runs marked "not steady", for AR(1) step rates (phi 0, 0.5, 0.8) over 30 and 100 steps, and
   how often a 5% drift over the run is marked;
4. `cells`: two cells of those tables again from --cell-sims simulations (default 20000), where 1000 leave
   a binomial standard error of a point and more: Welch's power at 3 runs, 3% variation and a 10%
   difference, and the within-run coverage at 30 steps and phi 0.5;
5. `stalls`: what stalls on 5% of the steps, 3 to 10 times as long, cost the throughput over wall time;
6. `pairing`: the false-positive rate of each form of the test (paired on shared rounds; Welch on runs
   without a shared round factor; Welch on runs that share one but are not paired), and the power on a
   5% difference of two points that both lost round 1 of 5, paired on rounds 2-5 against Welch;
7. `auto`: `vit-scale study --repeat auto` (analysis/sequential.py's looks, stats.compare at each
   look's level) against a fixed --repeat 5 at 3% run-to-run variation with a shared round factor of the
   same size: mean runs per point and the share separated, for equal points and 5%, 10%, 30% and 2x;
8. `calibrate` (only when named): each maximum's last-look level (analysis/sequential.FINAL), the largest
   keeping equal points' separations at sequential.CALIBRATED (4.75%) over all looks, by bisection over
   10^6 simulated pairs each (the paired t's statistics, vectorised: the rule's looks are paired t tests,
   whose sequence does not depend on the variation).

Runs are log-normal around their point's level (sd = the run-to-run variation); a run's throughput is
drawn directly (its steps add a variation far below 1% over hundreds of steps). Each cell is the share
over --sims simulated pairs or runs; its binomial standard error is at most 0.5/sqrt(sims) (1.1 points
at 2000). Measured: sections 1-3 about 2.3 CPU-minutes at --sims 1000 (scipy's t test is most of it);
`auto` 57 CPU-seconds at --sims 4000; `cells,stalls,pairing` 53 at --sims 4000 --cell-sims 20000;
`calibrate` with its table of designs 6 (numpy 2.4.6, scipy 1.17.1, a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from analysis import sequential, stats  # noqa: E402
from analysis.synthetic import stalling_steps, wall_throughput  # noqa: E402

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


def _pair(rng, rounds: int, difference: float, variation: float) -> tuple[list, list]:
    """Two points' runs over `rounds` rounds: each round moves both by a shared factor, each run by its own."""
    shared = rng.normal(0.0, variation, rounds)
    la = np.log1p(difference) + shared + rng.normal(0.0, variation, rounds)
    lb = shared + rng.normal(0.0, variation, rounds)
    return (
        [stats.Run(float(np.exp(x)), (), i + 1) for i, x in enumerate(la)],
        [stats.Run(float(np.exp(x)), (), i + 1) for i, x in enumerate(lb)],
    )


def _unrounded(runs: list) -> list:
    return [stats.Run(r.throughput, (), 0) for r in runs]


def pairing(rng, sims: int) -> None:
    """False positives of each form of the test, and pairing on the rounds two points kept."""
    print(f"\nFalse positives by form of the test (3% run-to-run variation, {sims} pairs of equal points a cell)")
    print("| form | 3 runs | 5 runs |")
    print("|---|---|---|")
    rows = {"paired t (shared round factor, paired)": [], "Welch t (no shared round factor)": [],
            "Welch t (shared round factor, not paired)": []}  # fmt: skip
    for runs in (3, 5):
        hits = [0, 0, 0]
        for _ in range(sims):
            a, b = _pair(rng, runs, 0.0, 0.03)
            hits[0] += stats.compare(a, b).separated is True
            hits[2] += stats.compare(_unrounded(a), _unrounded(b)).separated is True
            alone = [[stats.Run(float(np.exp(x))) for x in rng.normal(0.0, 0.03, runs)] for _ in "ab"]
            hits[1] += stats.compare(*alone).separated is True
        for row, h in zip(rows.values(), hits, strict=True):
            row.append(h / sims)
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(f"{c:.1%}" for c in cells) + " |")
    paired = welch = 0
    for _ in range(sims):
        a, b = _pair(rng, 5, 0.05, 0.03)
        paired += stats.compare(a[1:], b[1:]).separated is True  # today: paired on rounds 2-5
        welch += stats.compare(_unrounded(a[1:]), _unrounded(b[1:])).separated is True  # before: Welch
    print(
        f"Both points lost round 1 of 5 (rounds 2-5 left), 5% difference, 3% variation and a shared round factor "
        f"of 3%: separated {paired / sims:.1%} paired on the shared rounds, {welch / sims:.1%} by Welch ({sims} pairs)"
    )


def stalls(sims: int) -> None:
    """Throughput over wall time of runs stalling 3-10x on 5% of their steps, against their median step rate."""
    loss = []
    for seed in range(sims):
        steps = stalling_steps(100.0, 200, 0.05, (3.0, 10.0), seed=seed, spread=0.01)
        loss.append(1 - wall_throughput(steps) / float(np.median(steps)))
    print(
        f"\nStalls 3-10x on 5% of 200 steps (1% step noise, {sims} runs): throughput over wall time "
        f"{np.mean(loss):.1%} below the median step rate (runs from {min(loss):.1%} to {max(loss):.1%})"
    )


def cells(rng, sims: int) -> None:
    """Two cells of the tables from more simulations."""
    power = separated_share(rng, 3, 0.10, 0.03, sims, paired=False)
    cover, _ = within_run(rng, 30, 0.5, sims)
    print(f"\nFrom {sims} simulations a cell: Welch t, 3% variation, 3 runs, 10% difference: separated {power:.1%}")
    print(f"within-run interval, 30 timed steps, phi 0.5: covers the run's throughput {cover:.1%}")


AUTO_DIFFERENCES = (0.0, 0.05, 0.10, 0.30, 1.0)


def auto_one(rng, difference: float, maximum: int, variation: float = 0.03) -> tuple[int, bool, bool]:
    """One simulated pair under --repeat auto:maximum and under a fixed --repeat 5: (auto's runs per point,
    auto separated, fixed separated). The rounds are common to both designs (the same machine)."""
    a, b = _pair(rng, max(maximum, 5), difference, variation)
    fixed = stats.compare(a[:5], b[:5]).separated is True
    for after in range(2, maximum + 1):
        x, y = a[:after], b[:after]
        if stats.point_estimate(y).value > stats.point_estimate(x).value:
            x, y = y, x  # the best against the next, as the study's look picks them
        if sequential.test_at_look(x, y, after, maximum).separated is True:
            return after, True, fixed
    return maximum, False, fixed


def auto(rng, sims: int, maximum: int) -> None:
    print(
        f"\n--repeat auto:{maximum} against a fixed --repeat 5 (3% run-to-run variation, shared round factor of 3%, "
        f"{sims} simulated pairs a difference)"
    )
    print("| difference | auto: runs per point | auto: separated | fixed 5: separated | runs saved |")
    print("|---|---|---|---|---|")
    for difference in AUTO_DIFFERENCES:
        out = [auto_one(rng, difference, maximum) for _ in range(sims)]
        runs = float(np.mean([o[0] for o in out]))
        name = "2x" if difference == 1.0 else f"{difference:.0%}"
        print(
            f"| {name} | {runs:.2f} | {np.mean([o[1] for o in out]):.1%} | {np.mean([o[2] for o in out]):.1%} | "
            f"{1 - runs / 5:.0%} |"
        )


def _paired_t(diffs: np.ndarray, n: int) -> np.ndarray:
    x = diffs[:, :n]
    return np.abs(x.mean(1)) / (x.std(1, ddof=1) / np.sqrt(n))


def calibrate(rng, sims: int = 1_000_000) -> None:
    """The last look's level for each maximum (sequential.FINAL), by bisection on simulated equal points."""
    from scipy import stats as sps

    target = sequential.CALIBRATED
    print(f"\nLast-look levels keeping equal points' separations at {target:.2%} ({sims} pairs each)")
    for maximum in sequential.MAXIMA:
        diffs = rng.normal(0.0, 1.0, (sims, maximum))
        ts = {n: _paired_t(diffs, n) for n in range(2, maximum + 1)}
        crossed = np.zeros(sims, bool)
        for n in range(2, maximum):
            crossed |= ts[n] > sps.t.ppf(1 - sequential.look_level(n, maximum) / 2, n - 1)
        lo, hi = 0.0, target
        for _ in range(25):
            mid = (lo + hi) / 2
            rate = np.mean(crossed | (ts[maximum] > sps.t.ppf(1 - mid / 2, maximum - 1)))
            lo, hi = (mid, hi) if rate <= target else (lo, mid)
        print(f"  auto:{maximum}: {lo:.4f} (interim looks: {np.mean(crossed):.2%} of equal pairs separated)")


# (name, maximum, the level of each look after rounds 2 .. maximum): the designs docs/analysis.md weighs
DESIGNS = (
    ("5% at every look, auto:5", 5, (0.05, 0.05, 0.05, 0.05)),
    ("5% at every look, auto:7", 7, (0.05,) * 6),
    ("Bonferroni 1.25% x 4, auto:5", 5, (0.0125,) * 4),
    ("Bonferroni 1% 2% 1% 1%, auto:5", 5, (0.01, 0.02, 0.01, 0.01)),
    ("best of a search at auto:5", 5, (0.0, 0.015, 0.01, 0.035)),
    ("the rule at auto:5", 5, tuple(sequential.look_level(r, 5) for r in range(2, 6))),
    ("the rule at auto:7", 7, tuple(sequential.look_level(r, 7) for r in range(2, 8))),
)


def designs(rng, sims: int = 200_000, variation: float = 0.03) -> None:
    """Each design's false-positive rate, power and runs per point at 5%, 10%, 30% and 2x (vectorised paired t)."""
    from scipy import stats as sps

    print(f"\nDesigns weighed ({sims} simulated pairs a cell, {variation:.0%} run-to-run variation, paired t)")
    print("| design | equal: separated | 5%: separated | 10%: separated | 30%: runs | 2x: runs |")
    print("|---|---|---|---|---|---|")
    draws = {d: rng.normal(0.0, variation * np.sqrt(2), (sims, 7)) + np.log1p(d) for d in AUTO_DIFFERENCES}
    for name, maximum, levels in DESIGNS:
        cells = []
        for d in AUTO_DIFFERENCES:
            stopped, runs = np.zeros(sims, bool), np.full(sims, float(maximum))
            for n, level in zip(range(2, maximum + 1), levels, strict=True):
                if level > 0:
                    hit = (_paired_t(draws[d], n) > sps.t.ppf(1 - level / 2, n - 1)) & ~stopped
                    runs[hit], stopped = n, stopped | hit
            cells.append((stopped.mean(), runs.mean()))
        (fp, _), (p5, _), (p10, _), (_, r30), (_, r2) = cells
        print(f"| {name} | {fp:.1%} | {p5:.1%} | {p10:.1%} | {r30:.2f} | {r2:.2f} |")


SECTIONS = ("tests", "coverage", "within", "cells", "stalls", "pairing", "auto")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=2000)
    parser.add_argument("--cell-sims", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections: {','.join(SECTIONS)},calibrate")
    parser.add_argument("--max", type=int, default=sequential.DEFAULT_MAX, help="auto:N's maximum")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    unknown = only - set(SECTIONS) - {"calibrate"}
    if unknown:
        parser.error(f"--only: {','.join(sorted(unknown))}; allowed: {','.join(SECTIONS)},calibrate")
    rng = np.random.default_rng(args.seed)
    if "tests" in only:
        tests(rng, args.sims)
    if "coverage" in only:
        coverage(rng, args.sims)
    if "within" in only:
        within(rng, args.sims)
    if "cells" in only:
        cells(rng, args.cell_sims)
    if "stalls" in only:
        stalls(args.sims)
    if "pairing" in only:
        pairing(rng, args.sims)
    if "auto" in only:
        auto(rng, args.sims, args.max)
    if "calibrate" in only:
        calibrate(rng)
        designs(rng)
    return 0


def tests(rng, sims: int) -> None:
    print(f"Separated at 95% ({sims} simulated pairs a cell; difference 0%: the false-positive rate)")
    print("| test | run-to-run | runs per point | 0% | 3% | 5% | 10% |")
    print("|---|---|---|---|---|---|---|")
    for paired in (False, True):
        for variation in VARIATIONS:
            for runs in RUNS:
                cells = [separated_share(rng, runs, d, variation, sims, paired) for d in DIFFERENCES]
                name = "paired t" if paired else "Welch t"
                print(f"| {name} | {variation:.0%} | {runs} | " + " | ".join(f"{c:.1%}" for c in cells) + " |")


def coverage(rng, sims: int) -> None:
    print(f"\nInterval over runs (t on log throughputs, nominal 95%): coverage ({sims} points a cell)")
    print("| run-to-run | " + " | ".join(f"{r} runs" for r in RUNS) + " |")
    print("|---|" + "---|" * len(RUNS))
    for variation in VARIATIONS:
        cov = [coverage_over_runs(rng, r, variation, sims) for r in RUNS]
        print(f"| {variation:.0%} | " + " | ".join(f"{c:.1%}" for c in cov) + " |")


def within(rng, sims: int) -> None:
    sims = max(sims // 2, 1)
    print(f"\nOne run: within-run interval (nominal 95%) and the steadiness mark ({sims} runs a cell, steps 3% noise)")
    print("| timed steps | phi | covers the run's throughput | steady run marked not steady | 5% drift marked |")
    print("|---|---|---|---|---|")
    for n in (30, 100):
        for phi in (0.0, 0.5, 0.8):
            cov, false_mark = within_run(rng, n, phi, sims)
            _, drift_mark = within_run(rng, n, phi, sims, drift=0.05)
            print(f"| {n} | {phi} | {cov:.1%} | {false_mark:.1%} | {drift_mark:.1%} |")


if __name__ == "__main__":
    sys.exit(main())
