"""What the measurements of a point settle: its median images/s, a 95% confidence interval, the
run-to-run variation, and the test that says whether one point is faster than another.

numpy only (no scipy, no torch): the analysis runs on a login node. The practice followed is
Hoefler & Belli, "Scientific benchmarking of parallel computing systems" (SC'15): report the
median of skewed timings with a nonparametric interval, say how many runs it rests on, and
compare with a stated test.

The statistic of a run is the median of its per-step images/s over the timed steps (the end
record's `images_per_s.median`). The statistic of a point is:

- one run: that median. Its interval comes from the timed steps by **batch medians**: the steps
  are split into k contiguous batches, each batch's median is taken, and the interval is the run's
  median ± t(0.975, k - 1) × s / sqrt(k), s the standard deviation of the k batch medians.
  Consecutive steps are correlated (a slow period of the network or the file system spans
  several), so the spread of single steps divided by sqrt(n) would understate the error; batches
  longer than the correlation are nearly independent, and the spread of their statistics carries
  the correlation in. The assumption is exactly that: the batches are long enough to be nearly
  independent. So the batch length adapts (batch_count): it doubles from 1 step while the lag-1
  autocorrelation of the batch means is significant (one-sided, 10%) with 4 batches or more to
  test, is at least floor(sqrt(n)) and twice the length first found uncorrelated when correlation
  was found; when no testable length clears it, the run is cut into 3 batches, the coarsest split
  a t interval makes sense of (refusing the interval instead would leave a 60% difference over 15
  steps untested in a quarter of the runs). Simulated AR(1) steps, 1000 seeds each, coverage of the
  true median and the rate at which two equal runs are separated: 15 steps, phi 0, 0.5, 0.8: 95%,
  91%, 83% and 0.8%, 1.7%, 4.0% (fixed batches of floor(sqrt(n)) gave about 75% and 12% at 0.8); 30
  steps: 96%, 94%, 91% and 0.4%, 1.3%, 1.7%; 100 steps: 93%, 93%, 92% and under 1%. Medians rather
  than means per batch because the statistic is the median: one slow step (a garbage collection,
  a page of the checkpoint) moves a batch mean but not a batch median. With fewer than 4 timed
  steps there is no interval. This interval measures the run only: it cannot see how much a second
  run of the same point would differ.
- several runs: the median over the runs' medians. Its interval is the **order-statistic**
  (binomial) interval of the median over the runs when there are 6 or more (nonparametric, its
  confidence at least 95%: the sign test's inversion). From 2 to 5 runs no pair of order
  statistics reaches 95% (the widest, min to max, has confidence 1 - 2^(1-R): 50% to 94%), so the
  interval is the runs' median ± t(0.975, R - 1) × s / sqrt(R), s the standard deviation of the run
  medians: normal in the run medians, which are medians of many steps. The run-to-run coefficient
  of variation is s / mean of the run medians.

**The test** (`compare`): two points are separated when their 95% intervals do not overlap;
"within noise" means exactly that they overlap. One test for one run and for many, and the one a
reader can check in the table. It is much stricter than a test at 5%: for two approximately normal
estimates, intervals that do not overlap differ by more than 1.96 (se_a + se_b) >= 1.96
sqrt(se_a^2 + se_b^2), so equal points are separated far less often than 5% (simulated: 0.4% to
0.8% with 2 to 5 runs a point, 0.4% or less with 6 or more, about 1% to 4% between single runs of
15 correlated steps, above), and a difference a 5% test would find can still leave the intervals
overlapping: "within noise" means not shown, not shown equal.
Mann-Whitney over repetitions was not chosen: it does not apply to the steps of one run (they are
not independent), and with 3 runs per point its smallest two-sided p-value is 0.1, so it could
never separate anything at 5%. With one run per point the verdict holds within those runs only:
run-to-run variation (node placement, network neighbours, clock boosts) is unmeasured.

**Ratios** (`ratio_interval`, for the scaling efficiency): the interval of a / b is propagated
from the two intervals on the log scale, each side's relative half-widths added in quadrature
(independent, approximately log-normal estimates); no bootstrap, so the table is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

LEVEL = 0.95
MIN_STEPS = 4  # fewer timed steps give no batch (two batches of two steps at least)
MIN_TESTED_BATCHES = 4  # the autocorrelation of fewer batches is not tested
ACF_LEVEL = 0.10  # one-sided level of the batches' autocorrelation test: a miss narrows an interval, a
ACF_Z = 1.2816  # false alarm only widens one, so power counts more here; z(0.90)
MIN_ORDER_RUNS = 6  # fewer runs: no order-statistic interval reaches 95%

BATCH_MEDIANS = "batch medians"
ORDER_STATISTIC = "order statistic"
T_OVER_RUNS = "t over runs"


@dataclass(frozen=True)
class Estimate:
    """A point's images/s: its median and confidence interval, and what they rest on."""

    median: float
    low: float = math.nan
    high: float = math.nan
    confidence: float = math.nan  # the interval's own confidence (>= LEVEL for order statistics)
    method: str = ""  # BATCH_MEDIANS, ORDER_STATISTIC, T_OVER_RUNS; "" without an interval
    runs: int = 1
    steps: int = 0  # timed step figures the estimate rests on, over all its runs
    cv: float = math.nan  # run-to-run coefficient of variation; NaN with one run

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))


@dataclass(frozen=True)
class Comparison:
    """The faster of two points against the slower, by non-overlap of their intervals."""

    margin: float  # faster median / slower median - 1
    separated: bool | None  # None when either interval is missing
    single_run: bool  # a side rests on one run: the verdict holds within those runs only

    @property
    def within_noise(self) -> bool | None:
        return None if self.separated is None else not self.separated


# ------------------------------------------------------------------------------ distributions


def _binom_half_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly (integers, then one division)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2**n


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with df degrees of freedom (closed form, Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for j in range(1, df // 2):
            term *= c2 * (2 * j - 1) / (2 * j)
            total += term
        return s * total
    if df == 1:
        return 2 * theta / math.pi
    term, total = 1.0, 1.0
    for j in range(1, (df - 1) // 2):
        term *= c2 * (2 * j) / (2 * j + 1)
        total += term
    return 2 / math.pi * (theta + s * math.cos(theta) * total)


@cache
def t_quantile(level: float, df: int) -> float:
    """t such that P(|T| <= t) = level: the multiplier of a two-sided interval (bisection)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, not {df}")
    lo, hi = 0.0, 1.0
    while _t_two_sided(hi, df) < level:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_two_sided(mid, df) < level:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


# ------------------------------------------------------------------------------ intervals


def _clean(values) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    return x[np.isfinite(x)]


def order_statistic_interval(values, level: float = LEVEL) -> tuple[float, float, float]:
    """(low, high, confidence): the order-statistic interval of the median of independent values.

    The narrowest symmetric pair x_(j) <= x_(n+1-j) whose confidence 1 - 2 P(Bin(n, 1/2) <= j-1)
    is at least `level`; when no pair reaches it (fewer than 6 values at 95%), min and max with
    their lower confidence, which the caller must state or replace. NaNs for fewer than 2 values.
    """
    x = np.sort(_clean(values))
    n = len(x)
    if n < 2:
        return math.nan, math.nan, math.nan
    best_j, best_conf = 1, 1 - 2 * _binom_half_cdf(0, n)
    for j in range(2, n // 2 + 1):
        conf = 1 - 2 * _binom_half_cdf(j - 1, n)
        if conf < level:
            break
        best_j, best_conf = j, conf
    return float(x[best_j - 1]), float(x[n - best_j]), best_conf


def _lag1_correlated(y: np.ndarray) -> bool:
    """Whether consecutive values of y are positively correlated, by a one-sided test at ACF_LEVEL.

    The lag-1 autocorrelation r of k independent values has mean -1/k and standard deviation
    (k - 2) / (k sqrt(k - 1)) (normal values); r above that mean by more than z(1 - ACF_LEVEL) of
    those is significant. Only positive correlation matters: it is what narrows an interval.
    """
    k = len(y)
    d = y - y.mean()
    ss = float(d @ d)
    if k < MIN_TESTED_BATCHES or ss == 0:
        return False
    r = float(d[1:] @ d[:-1]) / ss
    return (r + 1 / k) / ((k - 2) / (k * math.sqrt(k - 1))) > ACF_Z


def batch_count(steps) -> int:
    """How many contiguous batches one run's timed steps (in order) are split into; 0 below MIN_STEPS.

    The batch length starts at 1 (the steps themselves) and doubles while the lag-1 autocorrelation
    of the batch means is significant (_lag1_correlated) and at least MIN_TESTED_BATCHES batches
    remain to test. The length used is at least floor(sqrt(n)), and twice the first length found
    uncorrelated when any correlation was found (a test of few batches misses much of it). When no
    tested length clears the correlation, or the length leaves fewer than 3 batches, the run is
    split into 3 batches: the coarsest split a t interval still makes sense of (2 from 4 or 5 steps).
    """
    x = _clean(steps)
    n = len(x)
    if n < MIN_STEPS:
        return 0
    b, found = 1, False
    while n // b >= MIN_TESTED_BATCHES:
        if not _lag1_correlated(np.array([part.mean() for part in np.array_split(x, n // b)])):
            break
        b, found = 2 * b, True
    else:
        return min(3, n // 2)
    b = max(math.isqrt(n), 2 * b if found else b, 2)
    return max(min(3, n // 2), n // b)


def batch_medians_interval(steps, center: float | None = None, level: float = LEVEL) -> tuple[float, float, int]:
    """(low, high, batches): the interval of one run's median from the medians of contiguous batches.

    `steps` in the order they ran (the batches must be contiguous for their independence to hold);
    `center` is the run's median (the end record's), else the steps' median. The batch count comes
    from batch_count, which lengthens the batches while consecutive ones are correlated.
    """
    x = _clean(steps)
    k = batch_count(x)
    if k < 2:
        return math.nan, math.nan, 0
    medians = np.array([np.median(part) for part in np.array_split(x, k)])
    mid = float(np.median(x)) if center is None or math.isnan(center) else float(center)
    half = t_quantile(level, k - 1) * float(np.std(medians, ddof=1)) / math.sqrt(k)
    return mid - half, mid + half, k


def run_cv(run_medians) -> float:
    """Run-to-run coefficient of variation: s / mean over the runs' medians; NaN with one run."""
    x = _clean(run_medians)
    if len(x) < 2 or np.mean(x) == 0:
        return math.nan
    return float(np.std(x, ddof=1) / np.mean(x))


def point_estimate(run_medians: Sequence[float], run_steps: Sequence = (), level: float = LEVEL) -> Estimate:
    """A point's estimate from its runs: each run's median and its timed per-step images/s (in order).

    run_steps may be shorter than run_medians or hold empty lists (steps not logged); they are
    used only for a single run's interval and for the count of steps.
    """
    medians = [float(m) for m in run_medians if m is not None and not math.isnan(float(m))]
    steps = [_clean(s) for s in run_steps]
    n_steps = int(sum(len(s) for s in steps))
    if not medians:
        return Estimate(math.nan, runs=0, steps=n_steps)
    runs = len(medians)
    if runs == 1:
        lo, hi, k = batch_medians_interval(steps[0] if steps else [], medians[0], level)
        if k == 0:
            return Estimate(medians[0], runs=1, steps=n_steps)
        return Estimate(medians[0], max(lo, 0.0), hi, level, BATCH_MEDIANS, 1, n_steps)
    x = np.array(medians)
    mid = float(np.median(x))
    cv = run_cv(x)
    if runs >= MIN_ORDER_RUNS:
        lo, hi, conf = order_statistic_interval(x, level)
        if conf >= level:
            return Estimate(mid, lo, hi, conf, ORDER_STATISTIC, runs, n_steps, cv)
    half = t_quantile(level, runs - 1) * float(np.std(x, ddof=1)) / math.sqrt(runs)
    return Estimate(mid, max(mid - half, 0.0), mid + half, level, T_OVER_RUNS, runs, n_steps, cv)


# ------------------------------------------------------------------------------ the test


def compare(faster: Estimate, slower: Estimate) -> Comparison:
    """The margin of `faster` over `slower` and whether their 95% intervals separate them."""
    margin = faster.median / slower.median - 1 if slower.median else math.nan
    single = faster.runs <= 1 or slower.runs <= 1
    if not (faster.has_interval and slower.has_interval):
        return Comparison(margin, None, single)
    return Comparison(margin, bool(faster.low > slower.high or slower.low > faster.high), single)


def ratio_interval(value, num: tuple, den: tuple) -> tuple:
    """The interval of a ratio `value` ~ num / den (times a constant), by propagation on the log scale.

    num and den are (median, low, high) of the two estimates, scalars or arrays. Lower side: the
    numerator's lower and the denominator's upper relative half-widths in quadrature; upper side
    the reverse. A missing interval gives NaN; one that reaches 0 a lower bound of 0.
    """
    (nm, nl, nh), (dm, dl, dh) = (np.asarray(num, dtype=float), np.asarray(den, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):

        def rel(a, b):  # |log(a / b)|, infinite when either is 0 or below (an interval reaching 0)
            return np.where((a <= 0) | (b <= 0), np.inf, np.abs(np.log(a / b)))

        down = np.hypot(rel(nm, nl), rel(dh, dm))
        up = np.hypot(rel(nh, nm), rel(dm, dl))
        value = np.asarray(value, dtype=float)
        lo, hi = value * np.exp(-down), value * np.exp(up)
    return (float(lo), float(hi)) if np.ndim(lo) == 0 else (lo, hi)
