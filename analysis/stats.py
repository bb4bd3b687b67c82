"""What the measurements of a point settle: its throughput with a named interval, its step figures
(median step rate, share of stalled steps, whether each run was steady) and the test that says
whether one point is faster than another.

numpy and scipy.stats (no torch): the analysis runs on a login node. What each interval and test
assumes, and how often it is right in simulation, is in docs/analysis.md (Statistics);
benchmarks/statistics_power.py reproduces those tables.

- A run's figure is its **throughput over wall time**: the images of its timed steps over the timed
  window's seconds (the end record's `images_per_s.mean`). A step that stalls costs its full time
  here, where the median of per-step rates would not see it. Beside it: the median step rate, the
  share of steps slower than twice the median step (SLOW), and whether the step rate was steady
  (first third against last third, `steady`).
- A point of several runs: the geometric mean of its runs' throughputs, with the t interval of the
  mean of their logarithms (T_LOG_RUNS), nominal 95%: it covers the point's typical throughput when
  the runs' logarithms are roughly normal and the runs independent.
- A point of one run: that run's throughput with a **within-run** interval (WITHIN_RUN): batch means
  of its step times, the batches lengthened until consecutive ones are uncorrelated. It says how
  precisely the run's steps fix that run's throughput, nothing of how a second run would differ.
- The comparison (`compare`): the ratio of two points' throughputs with a 95% interval from a t test
  on the log run throughputs: paired by repetition round on the rounds both points have (the round's
  shared slowness cancels), else Welch's. Separated when the interval excludes 1.
  A point with one run is not compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
MIN_STEPS = 4  # fewer timed steps give no within-run interval (two batches of two steps at least)
MIN_TESTED_BATCHES = 4  # the autocorrelation of fewer batches is not tested
ACF_LEVEL = 0.10  # one-sided: a missed correlation narrows an interval, a false alarm only widens one
ACF_Z = float(sps.norm.ppf(1 - ACF_LEVEL))
SLOW = 2.0  # a step taking more than SLOW times the run's median step is counted as slow
STEADY_LEVEL = 0.01  # two-sided level of the first-third against last-third test: it runs on every run
MIN_STEADY_STEPS = 9  # three thirds of three steps at least

WITHIN_RUN = "within-run batch means"
T_LOG_RUNS = "t on log run throughputs"
PAIRED = "paired t on log run throughputs"
WELCH = "Welch t on log run throughputs"
NOT_COMPARED = "one run each: not compared"
ONE_SIDE_NOT_COMPARED = "a point ran once: not compared"


@cache
def t_quantile(probability: float, df: int) -> float:
    """scipy's t quantile, remembered: the analysis asks for the same few thousands of times."""
    return float(sps.t.ppf(probability, df))


def _clean(values) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x) & (x > 0)]


# ------------------------------------------------------------------------------ one run


@dataclass(frozen=True)
class Run:
    """One ok run of a point: its throughput over wall time, its timed per-step images/s in the order
    they ran, and the repetition round it belongs to (0: not a study's repetition)."""

    throughput: float
    steps: Sequence[float] = ()
    repetition: int = 0


def slow_share(steps) -> float:
    """Share of timed steps slower than SLOW times the run's median step (rate below median / SLOW)."""
    x = _clean(steps)
    if not len(x):
        return math.nan
    return float(np.mean(x < np.median(x) / SLOW))


def _lag1_correlated(y: np.ndarray) -> bool:
    """Whether consecutive values of y are positively correlated, by a one-sided test at ACF_LEVEL.

    The lag-1 autocorrelation r of k independent values has mean -1/k and standard deviation
    (k - 2) / (k sqrt(k - 1)) (normal values). Only positive correlation narrows an interval.
    """
    k = len(y)
    d = y - y.mean()
    ss = float(d @ d)
    if k < MIN_TESTED_BATCHES or ss == 0:
        return False
    r = float(d[1:] @ d[:-1]) / ss
    return bool((r + 1 / k) / ((k - 2) / (k * math.sqrt(k - 1))) > ACF_Z)


def _batch_means(x: np.ndarray, k: int) -> np.ndarray:
    """The means of np.array_split(x, k)'s k contiguous parts, in one pass (a run has thousands of steps)."""
    n = len(x)
    sizes = np.full(k, n // k)
    sizes[: n % k] += 1
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    return np.add.reduceat(x, starts) / sizes


def _batch_medians(x: np.ndarray, k: int) -> np.ndarray:
    """The medians of np.array_split(x, k)'s k contiguous parts: the longer parts first, then the shorter."""
    n = len(x)
    size, longer = n // k, n % k
    head = x[: longer * (size + 1)].reshape(longer, size + 1)
    tail = x[longer * (size + 1) :].reshape(k - longer, size)
    return np.concatenate((np.median(head, axis=1), np.median(tail, axis=1)))


def batch_count(values) -> int:
    """How many contiguous batches one run's timed values (in order) are split into; 0 below MIN_STEPS.

    The batch length starts at 1 and doubles while the lag-1 autocorrelation of the batch means is
    significant and at least MIN_TESTED_BATCHES batches remain to test. The length used is at least
    floor(sqrt(n)), and twice the first uncorrelated length when correlation was found. When no tested
    length clears the correlation the run is split into 3 batches (2 from 4 or 5 values).
    """
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < MIN_STEPS:
        return 0
    b, found = 1, False
    while n // b >= MIN_TESTED_BATCHES:
        if not _lag1_correlated(_batch_means(x, n // b)):
            break
        b, found = 2 * b, True
    else:
        return min(3, n // 2)
    b = max(math.isqrt(n), 2 * b if found else b, 2)
    return max(min(3, n // 2), n // b)


def within_run_interval(throughput: float, steps, level: float = LEVEL) -> tuple[float, float]:
    """(low, high): the within-run interval of one run's throughput over wall time, by batch means.

    Throughput over wall time is images over the summed step times, so its uncertainty is that of the
    mean step time: the step times (1 / rate, in the order they ran) are cut into batch_count contiguous
    batches, the mean step time's interval is the batches' mean ± t(df k-1) s / sqrt(k), and it is turned
    into throughput around the recorded figure. NaNs below MIN_STEPS; an upper end of inf when the
    interval of the step time reaches 0.
    """
    times = 1.0 / _clean(steps)
    k = batch_count(times)
    if k < 2 or not math.isfinite(throughput):
        return math.nan, math.nan
    means = _batch_means(times, k)
    mid = float(times.mean())
    half = t_quantile((1 + level) / 2, k - 1) * float(np.std(means, ddof=1)) / math.sqrt(k)
    low = throughput * mid / (mid + half)
    high = throughput * mid / (mid - half) if mid > half else math.inf
    return low, high


def steady(steps) -> bool | None:
    """False when the step rate moves between the run's first and last thirds beyond its noise.

    The difference of the last and first thirds' median log step rates, against its standard error from
    the noise about the run's linear trend (so the trend itself does not count as noise): the residuals
    are cut into batches of the length batch_count gives them (uncorrelated batches), and a third's median
    varies as a batch median does times sqrt(batch length / third's length). Not steady when the
    difference exceeds t(1 - STEADY_LEVEL / 2, batches - 1) standard errors. None below MIN_STEADY_STEPS.
    """
    x = np.log(_clean(steps))
    n = len(x)
    if n < MIN_STEADY_STEPS:
        return None
    index = np.arange(n, dtype=float)
    resid = x - np.polyval(np.polyfit(index, x, 1), index)
    batches = max(batch_count(resid), 3)
    length = n / batches
    medians = _batch_medians(resid, batches)
    thirds = np.array_split(x, 3)
    diff = float(np.median(thirds[-1]) - np.median(thirds[0]))
    se = float(np.std(medians, ddof=1)) * math.sqrt(length / len(thirds[0]) + length / len(thirds[-1]))
    if se == 0:
        return bool(diff == 0)
    return bool(abs(diff) / se <= t_quantile(1 - STEADY_LEVEL / 2, batches - 1))


# ------------------------------------------------------------------------------ a point


@dataclass(frozen=True)
class Estimate:
    """A point's throughput over wall time, its interval (method and nominal level named) and what they
    rest on, with the step figures beside them."""

    value: float  # one run: its throughput; several: the geometric mean of theirs
    low: float = math.nan
    high: float = math.nan
    level: float = math.nan  # nominal level of the interval
    method: str = ""  # WITHIN_RUN, T_LOG_RUNS; "" without an interval
    runs: int = 0  # ok runs
    steps: int = 0  # timed step figures over all its runs
    cv: float = math.nan  # run-to-run coefficient of variation of the throughputs; NaN with one run
    median_step_ips: float = math.nan  # median over its runs of each run's median step rate
    slow_share: float = math.nan  # share of all its timed steps slower than SLOW times their run's median
    not_steady: int = 0  # runs whose step rate trended

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))


def usable_runs(runs: Sequence[Run]) -> list[Run]:
    """The runs with a throughput; a run without one leaves with its steps (they are its own)."""
    return [r for r in runs if r.throughput is not None and math.isfinite(r.throughput) and r.throughput > 0]


def point_estimate(runs: Sequence[Run], level: float = LEVEL) -> Estimate:
    """A point's estimate from its ok runs (see the module's docstring)."""
    runs = usable_runs(runs)
    steps = [_clean(r.steps) for r in runs]
    n_steps = int(sum(len(s) for s in steps))
    if not runs:
        return Estimate(math.nan, steps=n_steps)
    medians = [float(np.median(s)) for s in steps if len(s)]
    slow = [float(np.sum(s < np.median(s) / SLOW)) for s in steps if len(s)]
    common = dict(
        runs=len(runs),
        steps=n_steps,
        median_step_ips=float(np.median(medians)) if medians else math.nan,
        slow_share=sum(slow) / n_steps if n_steps else math.nan,
        not_steady=sum(steady(s) is False for s in steps),
    )
    if len(runs) == 1:
        low, high = within_run_interval(runs[0].throughput, steps[0], level)
        if math.isnan(low):
            return Estimate(runs[0].throughput, **common)
        return Estimate(runs[0].throughput, low, high, level, WITHIN_RUN, **common)
    logs = np.log([r.throughput for r in runs])
    mean, sd = float(logs.mean()), float(logs.std(ddof=1))
    half = t_quantile((1 + level) / 2, len(logs) - 1) * sd / math.sqrt(len(logs))
    thr = np.array([r.throughput for r in runs])
    cv = float(np.std(thr, ddof=1) / np.mean(thr))
    return Estimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), level, T_LOG_RUNS, cv=cv, **common)


# ------------------------------------------------------------------------------ the test


@dataclass(frozen=True)
class Comparison:
    """Point a's throughput over point b's, with its interval from the runs (None: not compared)."""

    ratio: float  # a's point throughput / b's
    low: float = math.nan
    high: float = math.nan
    separated: bool | None = None  # the interval excludes 1; None when not compared
    method: str = ""  # PAIRED, WELCH, or why not compared (NOT_COMPARED, ONE_SIDE_NOT_COMPARED)
    level: float = LEVEL


def _rounds(runs: Sequence[Run]) -> dict[int, Run] | None:
    """round -> run when every run names its own round (1, 2 ..., each once), else None."""
    by_round = {r.repetition: r for r in runs}
    if len(by_round) != len(runs) or min(by_round) < 1:
        return None
    return by_round


def shared_rounds(a: Sequence[Run], b: Sequence[Run]) -> list[int]:
    """The repetition rounds both points have one ok run of, whichever they are (a round either lost
    leaves the pairing, not the other rounds); [] when either point's runs do not each name a round."""
    ra, rb = _rounds(a), _rounds(b)
    if ra is None or rb is None:
        return []
    return sorted(set(ra) & set(rb))


def compare(a: Sequence[Run], b: Sequence[Run], level: float = LEVEL) -> Comparison:
    """The ratio of a's throughput to b's and its interval from a t test on the log run throughputs.

    Paired by repetition round on the rounds both points have (two or more; a round one of them lost, or
    ran only one of, is left out of the pairs); else Welch's t (unequal variances). The ratio is of the two
    points' figures (all their ok runs); the paired interval rests on the shared rounds. Separated when the
    interval excludes 1. With one run on either side there is no run-to-run variance to test against: the
    ratio of the two figures, not compared.
    """
    a, b = usable_runs(a), usable_runs(b)
    if not a or not b:
        return Comparison(math.nan, method=NOT_COMPARED)
    la = np.log([r.throughput for r in a])
    lb = np.log([r.throughput for r in b])
    ratio = math.exp(float(la.mean() - lb.mean()))
    if len(a) < 2 or len(b) < 2:
        return Comparison(ratio, method=NOT_COMPARED if len(a) == len(b) == 1 else ONE_SIDE_NOT_COMPARED)
    rounds = shared_rounds(a, b)
    paired = len(rounds) >= 2
    if paired:
        ra, rb = {r.repetition: r for r in a}, {r.repetition: r for r in b}
        pa = np.log([ra[r].throughput for r in rounds])
        pb = np.log([rb[r].throughput for r in rounds])
        diff = pa - pb
        if float(np.ptp(diff)) == 0.0:  # no spread at all (synthetic records): the ratio is exact
            lo = hi = float(diff[0])
        else:
            lo, hi = sps.ttest_rel(pa, pb).confidence_interval(level)
    else:
        if float(np.ptp(la)) == 0.0 and float(np.ptp(lb)) == 0.0:
            lo = hi = float(la[0] - lb[0])
        else:
            lo, hi = sps.ttest_ind(la, lb, equal_var=False).confidence_interval(level)
    low, high = math.exp(lo), math.exp(hi)
    return Comparison(ratio, low, high, bool(low > 1 or high < 1), PAIRED if paired else WELCH, level)


def ratio_interval(value, num: tuple, den: tuple) -> tuple:
    """The interval of a ratio `value` ~ num / den (times a constant), by propagation on the log scale.

    num and den are (value, low, high) of the two estimates, scalars or arrays. Lower side: the
    numerator's lower and the denominator's upper relative half-widths in quadrature; upper side
    the reverse. A missing interval gives NaN; one that reaches 0 (or inf) an end of 0 (or inf).
    """
    (nm, nl, nh), (dm, dl, dh) = (np.asarray(num, dtype=float), np.asarray(den, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):

        def rel(a, b):  # |log(a / b)|, infinite when either is 0 or below (an interval reaching 0)
            return np.where((a <= 0) | (b <= 0), np.inf, np.abs(np.log(a / b)))

        down = np.hypot(rel(nm, nl), rel(dh, dm))
        up = np.hypot(rel(nh, nm), rel(dm, dl))
        value = np.asarray(value, dtype=float)
        lo, hi = value * np.exp(-down), value * np.exp(up)
    return (float(lo), float(hi)) if np.ndim(lo) == 0 else (lo, hi)
