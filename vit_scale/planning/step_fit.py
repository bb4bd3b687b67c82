"""One collective's per-step latency and bus bandwidth, fitted from its timings at several group sizes,
in the form vit_scale.planning.alpha_beta.Network prices a ring with:

    t = launch + intra_steps(n, k) x alpha_intra + inter_steps(n, k) x alpha_inter + S f(n) / B

(n ranks on k nodes; the steps are alpha_beta.ring_steps, NCCL's tuning.cc count). Within a node
(k = 1) the unknowns are launch, alpha_intra and 1/B; across nodes alpha_inter and 1/B, the launch
taken from the same collective's fit within a node, and, from groups over several node counts, the
latency of the steps inside each node of a ring spanning nodes (NCCL charges them at least its network
overhead: tuning.cc; `intra_latency_us`, which the planner takes as Network.net_overhead_us); from one
node count those steps are charged the within-node fit's latency. Launch and per-step latency come apart only when the
groups differ in their steps: from one group size the whole latency is put on the steps (launch 0),
and the fit says so in its notes.

Weighted least squares (weights 1/t^2: relative errors, sizes over six orders of magnitude), each
latency at least 0 (the best fit over the latencies held at 0 where a free one would go below). A fit
is marked, not used, for too few sizes, a large residual, latency points that run backwards at some
group size, or no bandwidth. `vit-scale check` (full mode) writes one StepFit.as_dict() per collective
and scope into check.json's `step_fits`; vit_scale.planning.predict reads them back. Torch-free.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from vit_scale.planning.alpha_beta import (
    COLLECTIVES,
    GB,
    MAX_RESIDUAL,
    MIN_SIZES,
    MONOTONE_NOISE,
    SCOPES,
    Z90,
    Link,
    _backwards,  # the single-size fit's test for latency running backwards, applied per group size
    bus_factor,
    ring_steps,
)

ONE_GROUP_NOTE = "one group size: its latency is put on the ring's steps (launch not told apart)"


@dataclass(frozen=True)
class Point:
    """One timed size at one group size: n ranks over `nodes` nodes."""

    size: float
    seconds: float
    spread: float
    ranks: int
    nodes: int = 1


@dataclass(frozen=True)
class StepFit:
    collective: str
    scope: str
    step_latency_us: float  # per ring step of this scope
    launch_us: float  # per collective, whatever its ranks
    bus_gbps: float  # the ring's bus bandwidth (across nodes: with ranks_per_node ranks of each node in it)
    groups: tuple  # the group sizes (ranks) it was fitted from
    max_rel_residual: float
    sizes: int  # distinct sizes over all groups
    flags: tuple = ()  # why it should not be used; empty when it can
    notes: tuple = ()
    ranks_per_node: int | None = None  # across nodes: ranks of each node in the fitted groups
    intra_latency_us: float = 0.0  # across nodes: the per-step latency its steps inside a node were charged
    # standard errors from the size sweep's scatter (repeats included): per-step latency, launch, bus
    # bandwidth; None: not recorded (a check before them), no interval
    step_latency_se_us: float | None = None
    launch_se_us: float | None = None
    bus_se_gbps: float | None = None

    @property
    def usable(self) -> bool:
        return not self.flags

    @property
    def has_spread(self) -> bool:
        return bool(self.step_latency_se_us or self.launch_se_us or self.bus_se_gbps)

    def at_end(self, costly: bool) -> StepFit:
        """The fit at the end of its 90% interval that makes a collective cheaper, or dearer (`costly`):
        each latency +- Z90 standard errors (at least 0), B through its slope (alpha_beta.Fit.at_end)."""
        if not self.has_spread:
            return self
        sign = 1 if costly else -1

        def shift(value: float, se: float | None) -> float:
            return max(0.0, value + sign * Z90 * (se or 0.0))

        rel = Z90 * (self.bus_se_gbps or 0.0) / self.bus_gbps
        bus = self.bus_gbps / (1 + rel) if costly else (self.bus_gbps / (1 - rel) if rel < 1 else math.inf)
        return replace(
            self,
            step_latency_us=shift(self.step_latency_us, self.step_latency_se_us),
            launch_us=shift(self.launch_us, self.launch_se_us),
            bus_gbps=bus,
            step_latency_se_us=None,
            launch_se_us=None,
            bus_se_gbps=None,
        )

    @property
    def largest_ranks(self) -> int:
        return max(self.groups, default=0)

    def link(self) -> Link:
        """The fit as Network takes a scope's figures: across nodes the bandwidth is one rank's share
        (Network.link multiplies it back by a group's ranks per node)."""
        bus = self.bus_gbps / self.ranks_per_node if self.scope == "inter" and self.ranks_per_node else self.bus_gbps
        groups = ", ".join(map(str, self.groups))
        return Link(self.step_latency_us, bus, f"step fit of {self.collective} ({self.scope}, {groups} ranks)")

    def predict(self, p: Point) -> float:
        intra, inter = ring_steps(self.collective, p.ranks, p.nodes)
        alpha_intra = self.intra_latency_us if self.scope == "inter" else self.step_latency_us
        latency = self.launch_us + intra * alpha_intra + inter * (self.step_latency_us if self.scope == "inter" else 0)
        return latency * 1e-6 + p.size * bus_factor(self.collective, p.ranks) / (self.bus_gbps * GB)

    def as_dict(self) -> dict:
        return {
            "collective": self.collective,
            "scope": self.scope,
            "step_latency_us": _round(self.step_latency_us, 4),
            "launch_us": _round(self.launch_us, 4),
            "bus_gbps": _round(self.bus_gbps, 4),
            "groups": list(self.groups),
            "largest_ranks": self.largest_ranks,
            "max_rel_residual": _round(self.max_rel_residual, 4),
            "sizes": self.sizes,
            "usable": self.usable,
            "flags": list(self.flags),
            "notes": list(self.notes),
            **({"ranks_per_node": self.ranks_per_node} if self.ranks_per_node else {}),
            **({"intra_latency_us": _round(self.intra_latency_us, 4)} if self.scope == "inter" else {}),
            **{
                key: _round(value, 6)
                for key, value in (
                    ("step_latency_us_se", self.step_latency_se_us),
                    ("launch_us_se", self.launch_se_us),
                    ("bus_gbps_se", self.bus_se_gbps),
                )
                if value is not None
            },
        }


def _round(x: float, digits: int) -> float:
    # check.json stays strict JSON: a value the fit could not give is 0 there, and the fit is flagged
    return round(x, digits) if math.isfinite(x) else 0.0


def _solve(rows: list, ys: list, ws: list) -> list | None:
    """Weighted least squares: the coefficients c minimising sum w (row . c - y)^2 (normal equations,
    Gaussian elimination with pivoting); None when they are not determined."""
    m = len(rows[0])
    # columns scaled to unit weighted norm first: bytes (up to 1e9) and step counts (1 to 1e3) side by side
    # would otherwise leave the steps' pivots below any sane threshold
    norms = [math.sqrt(sum(w * r[i] ** 2 for r, w in zip(rows, ws, strict=True))) or 1.0 for i in range(m)]
    rows = [[r[i] / norms[i] for i in range(m)] for r in rows]
    a = [[sum(w * r[i] * r[j] for r, w in zip(rows, ws, strict=True)) for j in range(m)] for i in range(m)]
    b = [sum(w * r[i] * y for r, y, w in zip(rows, ys, ws, strict=True)) for i in range(m)]
    for col in range(m):
        pivot = max(range(col, m), key=lambda i: abs(a[i][col]))
        if abs(a[pivot][col]) <= 1e-10:  # unit columns: a pivot this small is a column the others make
            return None
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for i in range(col + 1, m):
            f = a[i][col] / a[col][col]
            a[i] = [x - f * y for x, y in zip(a[i], a[col], strict=True)]
            b[i] -= f * b[col]
    c = [0.0] * m
    for i in reversed(range(m)):
        c[i] = (b[i] - sum(a[i][j] * c[j] for j in range(i + 1, m))) / a[i][i]
    return [c[i] / norms[i] for i in range(m)]


def _nonnegative_latencies(columns: list, ys: list, ws: list, latency: list) -> list:
    """The least-squares coefficients with every latency column (indices in `latency`) at least 0: of the
    fits with some latencies held at 0, the best whose free latencies are all non-negative."""
    best, best_sse = None, math.inf
    n = len(columns)
    unused = [i for i in range(n) if not any(columns[i])]  # a column of zeros: no unknown there
    for held in itertools.chain.from_iterable(itertools.combinations(latency, r) for r in range(len(latency) + 1)):
        free = [i for i in range(n) if i not in held and i not in unused]
        if not free:
            continue
        rows = [[col[i] for i in free] for col in zip(*columns, strict=True)]
        c = _solve(rows, ys, ws)
        if c is None:
            continue
        full = [0.0] * n
        for i, v in zip(free, c, strict=True):
            full[i] = v
        if any(full[i] < 0 for i in latency):
            continue
        sse = sum(
            w * (sum(full[i] * columns[i][k] for i in range(n)) - y) ** 2
            for k, (y, w) in enumerate(zip(ys, ws, strict=True))
        )
        if sse < best_sse * (1 - 1e-12):
            best, best_sse = full, sse
    return best or [0.0] * n


def fit_steps(
    collective: str,
    scope: str,
    points,
    intra: StepFit | None = None,
    ranks_per_node: int | None = None,
    min_sizes: int = MIN_SIZES,
    max_residual: float = MAX_RESIDUAL,
    noise: float = MONOTONE_NOISE,
) -> StepFit:
    """The per-step fit of one collective in one scope from Points at one or more group sizes. Across
    nodes, `intra` (the same collective's usable fit within a node) gives the launch and the latency of
    the steps inside each node; without it they are 0 and the notes say so."""
    if collective not in COLLECTIVES or scope not in SCOPES:
        raise ValueError(f"collective/scope: {collective!r}/{scope!r}; expected one of {COLLECTIVES} / {SCOPES}")
    pts = sorted((p for p in points if p.ranks >= 2 and p.seconds > 0), key=lambda p: (p.ranks, p.size))
    groups = tuple(sorted({p.ranks for p in pts}))
    sizes = len({p.size for p in pts})
    flags, notes = [], []
    if sizes < min_sizes:
        flags.append(f"too few points: {sizes} distinct size(s), a fit needs at least {min_sizes}")
    if not pts:
        return StepFit(collective, scope, math.nan, math.nan, math.nan, groups, math.nan, 0, ("no points",))
    steps = [ring_steps(collective, p.ranks, p.nodes if scope == "inter" else 1) for p in pts]
    xs = [p.size * bus_factor(collective, p.ranks) for p in pts]
    ts = [p.seconds for p in pts]
    if scope == "intra":
        system = _intra_system(steps, xs, ts, notes)
    else:
        system = _inter_system(pts, steps, xs, ts, intra, notes)
    ws = [1.0 / (t * t) for t in ts]
    c = _nonnegative_latencies(system.columns, system.ys, ws, system.latency)
    se = _standard_errors(system, c, ws)
    intra_s = c[3] if len(c) > 3 else system.intra_s
    launch = c[0] if scope == "intra" else system.launch_s
    alpha, slope = c[1], c[2]
    if slope <= 0:
        flags.append("no bandwidth: time does not grow with size")
    bus = 1.0 / slope / GB if slope > 0 else math.inf
    fitted = StepFit(
        collective,
        scope,
        alpha * 1e6,
        launch * 1e6,
        bus,
        groups,
        0.0,
        sizes,
        (),
        (),
        ranks_per_node if scope == "inter" else None,
        intra_s * 1e6,
    )
    fitted = replace(
        fitted,
        step_latency_se_us=se[1] * 1e6,
        launch_se_us=se[0] * 1e6 if scope == "intra" else 0.0,
        bus_se_gbps=se[2] / (slope * slope) / GB if slope > 0 else math.nan,
    )
    residual = (
        max((abs(fitted.predict(p) - p.seconds) / p.seconds for p in pts), default=math.inf) if slope > 0 else math.inf
    )
    if residual > max_residual:
        flags.append(f"large residual: {residual:.0%} > {max_residual:.0%}")
    flags += _first_backwards(pts, groups, noise)
    return replace(fitted, max_rel_residual=residual, flags=tuple(flags), notes=tuple(notes))


def _standard_errors(system, c: list, ws: list) -> list:
    """Each coefficient's standard error (seconds; 1/B's in s/byte): the residual variance over the degrees of
    freedom left (every point, repeats included) times the diagonal of the inverse of the weighted normal
    matrix of the coefficients the fit left free; 0 for a latency held at 0 (a bound, not an estimate) and
    a column of zeros, NaN where too few points leave no freedom or the matrix is singular."""
    n_coef, n = len(system.columns), len(system.ys)
    free = [i for i in range(n_coef) if any(system.columns[i]) and not (i in system.latency and c[i] == 0.0)]
    out = [0.0] * n_coef
    if n <= len(free):
        return [math.nan if i in free else 0.0 for i in range(n_coef)]
    residuals = [sum(c[i] * system.columns[i][k] for i in range(n_coef)) - system.ys[k] for k in range(n)]
    s2 = sum(w * r * r for w, r in zip(ws, residuals, strict=True)) / (n - len(free))
    # the normal matrix over the free columns, each scaled to unit weighted norm (as _solve does) so that
    # bytes and step counts side by side leave a well-conditioned inverse
    norms = [math.sqrt(sum(w * system.columns[i][k] ** 2 for k, w in enumerate(ws))) for i in free]
    cols = [[system.columns[i][k] / norm for k in range(n)] for i, norm in zip(free, norms, strict=True)]
    a = [[sum(w * x * y for w, x, y in zip(ws, ci, cj, strict=True)) for cj in cols] for ci in cols]
    inv = _inverse(a)
    if inv is None:
        return [math.nan if i in free else 0.0 for i in range(n_coef)]
    for j, i in enumerate(free):
        out[i] = math.sqrt(max(0.0, s2 * inv[j][j])) / norms[j]
    return out


def _inverse(a: list) -> list | None:
    """The inverse of a small square matrix (Gauss-Jordan with pivoting); None when it is singular."""
    m = len(a)
    aug = [row[:] + [1.0 if i == j else 0.0 for j in range(m)] for i, row in enumerate(a)]
    for col in range(m):
        pivot = max(range(col, m), key=lambda i: abs(aug[i][col]))
        if abs(aug[pivot][col]) <= 1e-12:
            return None
        aug[col], aug[pivot] = aug[pivot], aug[col]
        p = aug[col][col]
        aug[col] = [x / p for x in aug[col]]
        for i in range(m):
            if i != col and aug[i][col]:
                f = aug[i][col]
                aug[i] = [x - f * y for x, y in zip(aug[i], aug[col], strict=True)]
    return [row[m:] for row in aug]


@dataclass
class _System:
    """The weighted least-squares system of one fit: a column per unknown (launch, per-step latency, 1/B, and
    across nodes the in-node steps' latency), the times it explains, which unknowns are latencies (kept >= 0),
    and the launch and in-node step latency taken as known (from the within-node fit) rather than fitted."""

    columns: list
    ys: list
    latency: list
    launch_s: float = 0.0
    intra_s: float = 0.0


def _intra_system(steps: list, xs: list, ts: list, notes: list) -> _System:
    # unknowns: launch, per-step latency, 1/B (launch only where the groups' steps differ)
    if len({s[0] for s in steps}) > 1:
        return _System([[1.0] * len(ts), [s[0] for s in steps], xs], ts, [0, 1])
    notes.append(ONE_GROUP_NOTE)
    return _System([[0.0] * len(ts), [s[0] for s in steps], xs], ts, [1])


def _inter_system(pts: list, steps: list, xs: list, ts: list, intra: StepFit | None, notes: list) -> _System:
    usable_intra = intra is not None and intra.usable
    launch_s = intra.launch_us * 1e-6 if usable_intra else 0.0
    intra_s = intra.step_latency_us * 1e-6 if usable_intra else 0.0
    in_node = [s[0] for s in steps]
    if len({p.nodes for p in pts}) > 1 and any(in_node):
        # several node counts: the in-node steps of a ring spanning nodes get a latency of their own (NCCL
        # charges them at least its network overhead, tuning.cc), told apart from the across-nodes steps
        ys = [t - launch_s for t in ts]
        return _System([[0.0] * len(pts), [s[1] for s in steps], xs, in_node], ys, [1, 3], launch_s, intra_s)
    if any(in_node):
        notes.append(
            "one node count: the steps inside each node charged the within-node fit's latency"
            if usable_intra
            else "one node count and no usable fit within a node: steps inside each node charged nothing"
        )
    ys = [t - launch_s - s[0] * intra_s for t, s in zip(ts, steps, strict=True)]
    return _System([[0.0] * len(pts), [s[1] for s in steps], xs], ys, [1], launch_s, intra_s)


def _first_backwards(pts: list, groups: tuple, noise: float) -> list:
    """The flag of the first group size whose time runs backwards with size, if any."""
    for n in groups:
        backwards = _backwards([(p.size, p.seconds, p.spread) for p in pts if p.ranks == n], noise)
        if backwards:
            return [f"{n} ranks: {backwards}"]
    return []


STEP_FIT_KEYS = ("collective", "scope", "step_latency_us", "launch_us", "bus_gbps", "groups", "max_rel_residual",
                 "sizes", "flags")  # fmt: skip


def from_dict(entry: dict) -> StepFit:
    """A check.json `step_fits` entry back into a StepFit (the caller has checked the keys and types)."""
    per_node = entry.get("ranks_per_node")
    return StepFit(
        entry["collective"],
        entry["scope"],
        float(entry["step_latency_us"]),
        float(entry["launch_us"]),
        float(entry["bus_gbps"]),
        tuple(int(n) for n in entry["groups"]),
        float(entry["max_rel_residual"]),
        int(entry["sizes"]),
        tuple(str(f) for f in entry["flags"]),
        tuple(str(n) for n in entry.get("notes") or ()),
        int(per_node) if per_node else None,
        float(entry.get("intra_latency_us") or 0.0),
        *(
            None if entry.get(key) is None else float(entry[key])
            for key in ("step_latency_us_se", "launch_us_se", "bus_gbps_se")
        ),
    )
