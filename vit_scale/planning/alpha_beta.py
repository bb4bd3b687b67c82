"""How long a collective takes: the latency-bandwidth (alpha-beta) model in the per-step form of
NCCL's own cost model, its fit from timed points, and the documented defaults a system profile carries
for when nothing was measured.

    ring:  t = launch + intra_steps x alpha_intra + inter_steps x alpha_inter + S * f(n) / B
    tree:  t = launch + (2(ppn-1)) x alpha_intra + 2 log2(nodes) x alpha_inter + S / (0.5 x 0.92 x B)

S is the whole tensor (all-reduce input, all-gather output, reduce-scatter input), n the ranks, f(n)
the bus-bandwidth factor of nccl-tests' PERFORMANCE.md (all_reduce 2(n-1)/n, all_gather and
reduce_scatter (n-1)/n), so that B is the "bus bandwidth" nccl-tests prints. The steps are those NCCL's
src/graph/tuning.cc charges a latency for (ring_steps, tree_steps): a ring all-gather over n ranks on k
nodes takes n-1 steps, k-1 of them across nodes; so a collective's latency grows with its ranks.
All-gather and reduce-scatter run as rings; all-reduce as ring or tree, whichever is faster at that
size and group (Network.cost), within what NCCL_ALGO allows.

API for callers: Network(intra=Link(alpha_step_us, bus_gbps), inter=Link(...), launch_us=...,
measured_ranks=...).cost(collective, size, n, nodes, ranks_per_node) -> Cost (seconds, algorithm,
latency and bandwidth parts, steps); .algorithm(...) the rule alone; .extrapolated(n) whether a group
is larger than any measured.

`fit` turns (size, seconds) points of one collective at one group size into a whole collective's
alpha and B, and marks a fit it cannot vouch for (too few sizes, a large residual, latency points that
run backwards) instead of handing it on silently; Fit.link spreads its alpha over the group's ring
steps. `read_network` reads a profile's `network:` section. Torch-free: the planner and the analysis
use it. Formulas and sources: docs/plan.md."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
SCOPES = ("intra", "inter")
# nccl-tests PERFORMANCE.md, "Bus bandwidth": the factor that turns algorithm bandwidth S/t into
# the bandwidth a ring's links carry
BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}

MIN_SIZES = 4  # distinct sizes a fit needs before it says anything about alpha and B
MAX_RESIDUAL = 0.25  # largest relative residual (|model - measured| / measured) a usable fit has
MONOTONE_NOISE = 0.10  # relative slack when a point carries no spread of its own
GB = 1e9
# a fit's 90% interval: its estimate +- this many standard errors (the normal's 5th-95th percentile; a fit
# has tens of points, sizes times repeats, where Student's t differs from it by a few per cent)
Z90 = 1.645


def bus_factor(collective: str, n: int) -> float:
    if collective not in BUS_FACTORS:
        raise ValueError(f"collective: {collective!r} is not one of {', '.join(COLLECTIVES)}")
    return BUS_FACTORS[collective](n) if n > 1 else 0.0


@dataclass(frozen=True)
class Link:
    """One scope's per-step latency (alpha, microseconds: what each step of the algorithm waits besides its
    bytes) and bus bandwidth (B, GB/s), and where they came from."""

    alpha_us: float
    bus_gbps: float
    source: str = ""

    def seconds(self, collective: str, size_bytes: float, n: int) -> float:
        """A ring over n ranks inside this one scope: its steps x alpha + S f(n) / B."""
        if n < 2 or size_bytes <= 0:
            return 0.0
        steps = sum(ring_steps(collective, n, 1))
        return steps * self.alpha_us * 1e-6 + size_bytes * bus_factor(collective, n) / (self.bus_gbps * GB)


@dataclass(frozen=True)
class Fit:
    collective: str
    scope: str
    ranks: int
    alpha_us: float
    bus_gbps: float
    max_rel_residual: float
    sizes: int  # distinct sizes the fit saw
    flags: tuple = ()  # why it should not be used; empty when it can
    # ranks of the fitted group on each node (the check's ranks per node for an across-nodes fit): what
    # its bandwidth is rescaled from for a group with another number (Network.link); None: not recorded
    ranks_per_node: int | None = None
    # the standard errors of alpha and B from the size sweep's scatter (its repeats included); None: not
    # recorded (a check before them), no interval
    alpha_se_us: float | None = None
    bus_se_gbps: float | None = None

    @property
    def usable(self) -> bool:
        return not self.flags

    @property
    def has_spread(self) -> bool:
        return bool(self.alpha_se_us or self.bus_se_gbps)

    def at_end(self, costly: bool) -> Fit:
        """The fit at the end of its 90% interval that makes a collective cheaper, or dearer (`costly`):
        alpha +- Z90 standard errors (at least 0), B through its slope 1/B +- Z90 of the slope's error, so
        that the dear end stays above 0 and a cheap end past 1/B = 0 is an unbounded bandwidth."""
        if not self.has_spread:
            return self
        sign = 1 if costly else -1
        alpha = max(0.0, self.alpha_us + sign * Z90 * (self.alpha_se_us or 0.0))
        rel = Z90 * (self.bus_se_gbps or 0.0) / self.bus_gbps  # the slope's relative error, by the delta method
        bus = self.bus_gbps / (1 + rel) if costly else (self.bus_gbps / (1 - rel) if rel < 1 else math.inf)
        return dataclasses.replace(self, alpha_us=alpha, bus_gbps=bus, alpha_se_us=None, bus_se_gbps=None)

    @property
    def nodes(self) -> int:
        """Nodes the fitted group spanned: 1 inside a node; across nodes its ranks over its ranks per node
        (one rank a node when not recorded)."""
        if self.scope == "intra":
            return 1
        return max(1, self.ranks // (self.ranks_per_node or 1))

    def link(self, intra_alpha_us: float | None = None, launch_us: float = 0.0) -> Link:
        """The fit in the per-step form: its latency (the whole collective's, at its ranks), less the
        per-collective `launch_us` the network adds anyway, spread over the ring steps it paid for. Across
        nodes, the steps inside a node are charged `intra_alpha_us` each (the within-node per-step latency)
        and the rest is the across-nodes steps' (never below zero); without it, every step alike."""
        intra, inter = ring_steps(self.collective, self.ranks, self.nodes)
        steps_us = max(0.0, self.alpha_us - launch_us) if math.isfinite(self.alpha_us) else self.alpha_us
        if intra + inter == 0 or not math.isfinite(self.alpha_us):
            alpha = self.alpha_us
        elif inter and intra_alpha_us is not None:
            alpha = max(0.0, steps_us - intra * intra_alpha_us) / inter
        else:
            alpha = steps_us / (intra + inter)
        return Link(alpha, self.bus_gbps, f"fit of {self.collective} ({self.scope}, {self.ranks} ranks)")

    def as_dict(self) -> dict:
        return {
            "collective": self.collective,
            "scope": self.scope,
            "ranks": self.ranks,
            "alpha_us": round(self.alpha_us, 3),
            "bus_gbps": round(self.bus_gbps, 4),
            "max_rel_residual": round(self.max_rel_residual, 4),
            "sizes": self.sizes,
            "usable": self.usable,
            "flags": list(self.flags),
            **({"ranks_per_node": self.ranks_per_node} if self.ranks_per_node else {}),
            **({"alpha_us_se": _se(self.alpha_se_us, 3)} if self.alpha_se_us is not None else {}),
            **({"bus_gbps_se": _se(self.bus_se_gbps, 6)} if self.bus_se_gbps is not None else {}),
        }


def _se(x: float, digits: int) -> float:
    # check.json stays strict JSON: an error the fit could not give (too few points) is written as 0
    return round(x, digits) if math.isfinite(x) else 0.0


def _point(p) -> tuple[float, float, float]:
    """(size, seconds) or (size, seconds, spread): spread is the point's own noise in seconds
    (a standard deviation, or half the min-max range of its repeats)."""
    size, seconds = float(p[0]), float(p[1])
    spread = float(p[2]) if len(p) > 2 and p[2] is not None else 0.0
    return size, seconds, spread


def fit(
    collective: str,
    scope: str,
    ranks: int,
    points,
    min_sizes: int = MIN_SIZES,
    max_residual: float = MAX_RESIDUAL,
    noise: float = MONOTONE_NOISE,
    ranks_per_node: int | None = None,
) -> Fit:
    """Weighted least squares (weights 1/t^2, so relative errors) of t = alpha + x / B with
    x = S * f(n), over every point (repeats included).

    A negative intercept (the smallest sizes faster than the line allows) is clamped to zero and the
    slope refitted through the origin: a latency below zero means nothing. Flags:
      - fewer than `min_sizes` distinct sizes;
      - the largest relative residual above `max_residual`;
      - a larger message measured faster than a smaller one beyond both points' noise (their spreads
        summed, and at least `noise` of the smaller size's time): latency points that run backwards, as
        a CPU's two quick iterations did (8 B slower than 131 KiB);
      - no positive bandwidth (time not growing with size).
    """
    if scope not in SCOPES:
        raise ValueError(f"scope: {scope!r} is not one of {', '.join(SCOPES)}")
    pts = sorted(_point(p) for p in points)
    f = bus_factor(collective, ranks)
    flags = []
    if ranks < 2:
        flags.append(f"{ranks} rank: a collective over one rank moves nothing")
    sizes = sorted({s for s, _, _ in pts})
    if len(sizes) < min_sizes:
        flags.append(f"too few points: {len(sizes)} distinct size(s), a fit needs at least {min_sizes}")
    if not pts or f <= 0:
        return Fit(collective, scope, ranks, math.nan, math.nan, math.nan, len(sizes), tuple(flags) or ("no points",))
    xs = [s * f for s, _, _ in pts]
    ts = [t for _, t, _ in pts]
    # weights 1/t^2: the residual that matters is relative, and sizes span six orders of magnitude
    # (unweighted, the largest messages alone would set the line and the latency would be noise)
    ws = [1.0 / (t * t) if t > 0 else 0.0 for t in ts]
    sw = sum(ws)
    if sw <= 0:
        return Fit(collective, scope, ranks, math.nan, math.nan, math.nan, len(sizes), tuple(flags) + ("no time",))
    mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    mt = sum(w * t for w, t in zip(ws, ts, strict=True)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
    slope = sum(w * (x - mx) * (t - mt) for w, x, t in zip(ws, xs, ts, strict=True)) / sxx if sxx > 0 else 0.0
    alpha = mt - slope * mx
    if alpha < 0:
        alpha = 0.0
        sq = sum(w * x * x for w, x in zip(ws, xs, strict=True))
        slope = sum(w * x * t for w, x, t in zip(ws, xs, ts, strict=True)) / sq if sq > 0 else 0.0
    if slope <= 0:
        flags.append("no bandwidth: time does not grow with size")
        bus = math.inf
    else:
        bus = 1.0 / slope / GB
    residual = max((abs(alpha + slope * x - t) / t for x, t in zip(xs, ts, strict=True) if t > 0), default=math.inf)
    if residual > max_residual:
        flags.append(f"large residual: {residual:.0%} > {max_residual:.0%}")
    backwards = _backwards(pts, noise)
    if backwards:
        flags.append(backwards)
    alpha_se, bus_se = _standard_errors(xs, ts, ws, alpha, slope, mx, sxx, sw, clamped=alpha == 0.0)
    return Fit(
        collective,
        scope,
        ranks,
        alpha * 1e6,
        bus,
        residual,
        len(sizes),
        tuple(flags),
        ranks_per_node,
        alpha_se * 1e6,
        bus_se,
    )


def _standard_errors(xs, ts, ws, alpha, slope, mx, sxx, sw, clamped: bool) -> tuple[float, float]:
    """(alpha's standard error in seconds, B's in GB/s) of the weighted fit: the residual variance over the
    degrees of freedom left (every point, repeats included, so the repeats' spread is in it) times the
    parameters' variance factors; B's by the delta method (B = 1/slope). Through the origin (alpha clamped
    to 0) alpha's is 0, a bound rather than an estimate. NaN where too few points leave no freedom."""
    n, k = len(xs), 1 if clamped else 2
    if n <= k or slope <= 0:
        return math.nan, math.nan
    s2 = sum(w * (alpha + slope * x - t) ** 2 for x, t, w in zip(xs, ts, ws, strict=True)) / (n - k)
    if clamped:
        sq = sum(w * x * x for w, x in zip(ws, xs, strict=True))
        var_slope, var_alpha = (s2 / sq if sq > 0 else math.inf), 0.0
    else:
        var_slope = s2 / sxx if sxx > 0 else math.inf
        var_alpha = s2 * (1 / sw + mx * mx / sxx) if sxx > 0 else math.inf
    return math.sqrt(var_alpha), math.sqrt(var_slope) / (slope * slope) / GB


def _backwards(pts, noise: float) -> str:
    """The first pair where a larger size ran faster than a smaller one beyond their noise."""
    by_size: dict[float, list] = {}
    for s, t, spread in pts:
        by_size.setdefault(s, []).append((t, spread))
    rows = []
    for s in sorted(by_size):
        times = [t for t, _ in by_size[s]]
        spread = max([sp for _, sp in by_size[s]] + [(max(times) - min(times)) / 2])
        rows.append((s, sum(times) / len(times), spread))
    for i, (small, t_small, sp_small) in enumerate(rows):
        for big, t_big, sp_big in rows[i + 1 :]:
            # a relative floor even with spreads: a flat latency region (8 B 25.1 us, 64 B 24.9 us, each
            # +-0.05 us) is one latency, not latency running backwards
            slack = max(sp_small + sp_big, noise * t_small)
            if t_big + slack < t_small:
                return (
                    f"not monotone: {_size(big)} took {t_big * 1e6:.1f} us, less than {_size(small)}'s "
                    f"{t_small * 1e6:.1f} us beyond their noise"
                )
    return ""


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


# ---------------------------------------------------------------- what a collective costs, per scope


# ---------------------------------------------------------------- what a collective costs: the algorithm's steps

ALGORITHMS = ("ring", "tree")
# NCCL src/graph/tuning.cc (ncclTopoTuneModel) and ROCm/rccl src/graph/tuning.cc: the tree's bus bandwidth
# is the ring's x 0.92 ("busBw = std::min(busBw * .92, ...)" for all-reduce), and an all-reduce over a tree
# moves each byte up and down once: algorithm bandwidth = bus x 0.5 ("ratio *= .5")
TREE_BUS_RATIO = 0.92
ALGO_ENV = "NCCL_ALGO"  # RCCL reads the same variable (its sources keep NCCL's names)
_ENV_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter"}


def ring_steps(collective: str, n: int, nodes: int = 1) -> tuple[int, int]:
    """(steps inside a node, steps across nodes) a ring pays a latency for, as NCCL's cost model counts
    them (tuning.cc: nsteps = 2(n-1) for all-reduce, n-1 for all-gather and reduce-scatter; of those,
    nInterSteps = 2(nodes-1), resp. nodes-1, cross a node boundary; the rest stay inside a node)."""
    if collective not in BUS_FACTORS:
        raise ValueError(f"collective: {collective!r} is not one of {', '.join(COLLECTIVES)}")
    if n < 2:
        return 0, 0
    k = max(1, min(int(nodes), n))
    total = 2 * (n - 1) if collective == "all_reduce" else n - 1
    inter = 0 if k == 1 else (2 * (k - 1) if collective == "all_reduce" else k - 1)
    return total - inter, inter


def tree_steps(n: int, nodes: int = 1) -> tuple[int, int]:
    """(steps inside a node, steps across nodes) of NCCL's tree all-reduce (tuning.cc: 2 x ((ppn-1) intra
    + log2i(nodes) inter): a chain through each node's ranks, a binary tree across nodes, up and down)."""
    if n < 2:
        return 0, 0
    k = max(1, min(int(nodes), n))
    ppn = n // k
    return 2 * (ppn - 1), 2 * (k.bit_length() - 1)


def allowed_algorithms(collective: str, value: str | None = None) -> tuple:
    """The algorithms the library may pick for `collective` under NCCL_ALGO (`value`; None or "" reads the
    environment's, unset: all). Forms NCCL's parseList accepts: "ring", "tree,ring", "^tree",
    "ring;allreduce:tree". All-gather and reduce-scatter run as rings whatever it says (NCCL and RCCL offer
    them no tree; PAT, NVLS and CollNet are not modelled)."""
    if collective != "all_reduce":
        return ("ring",)
    value = os.environ.get(ALGO_ENV, "") if value is None else value
    if not value.strip():
        return ALGORITHMS
    chosen = None
    for i, token in enumerate(value.split(";")):
        prefix, _, elems = token.rpartition(":")
        if prefix and _ENV_NAMES.get(prefix.strip().lower()) != collective:
            continue
        if not prefix and i > 0:
            raise ValueError(f"{ALGO_ENV}: {value!r}: every entry after the first needs a prefix (allreduce:...)")
        negate = elems.strip().startswith("^")
        names = {e.strip().lower() for e in elems.strip().lstrip("^").split(",") if e.strip()}
        chosen = tuple(a for a in ALGORITHMS if (a in names) != negate)
    if chosen is None:
        return ALGORITHMS
    if not chosen:
        raise ValueError(f"{ALGO_ENV}: {value!r} leaves {collective} no algorithm; the model knows ring and tree")
    return chosen


@dataclass(frozen=True)
class Cost:
    """One collective's time and what it is made of."""

    seconds: float
    algorithm: str  # "ring" or "tree"
    latency_s: float  # launch + steps x per-step latency
    bandwidth_s: float
    intra_steps: int
    inter_steps: int


@dataclass(frozen=True)
class Network:
    """What a collective costs in a prediction: per scope a per-step latency and a bus bandwidth
    (optionally per collective, from a check's fits), a launch latency per collective, and the rule by
    which the library picks its algorithm.

        t = launch + intra_steps x alpha_intra + inter_steps x alpha_inter + S f(n) / B     (ring)
        t = launch + tree steps (same split) + S / (0.5 x tree_bus_ratio x B)               (tree all-reduce)

    The steps are NCCL's cost model's (ring_steps, tree_steps); all-reduce takes whichever of ring and
    tree is faster at that size and group (NCCL and RCCL pick by the same kind of estimate,
    tuning.cc's latencies + size / bandwidths), within what NCCL_ALGO allows.

    Bandwidth: a group that spans nodes runs all of its bytes at the across-nodes rate (a ring is as slow
    as its slowest hop). That rate depends on how many of a node's ranks the group has: the profile's
    `inter_node.bus_gbps` is one rank's share of the node's NICs, and a ring over k of a node's ranks
    uses k such shares (NCCL/RCCL open a channel per NIC), bounded by the within-node rate:
        bus = min(intra, per-rank inter x k)
    k = 1 for a strided group (HSDP's replicas: one rank per node). A fit across nodes was measured at its
    own ranks per node (Fit.ranks_per_node) and is rescaled the same way.

    measured_ranks: the largest group whose collectives were measured for these figures (the largest fit,
    or the profile's sources); a group beyond it is `extrapolated`. None: not known.
    """

    intra: Link
    inter: Link
    per_collective: dict = field(default_factory=dict)  # (collective, scope) -> Fit or Link, from usable fits
    source: str = ""
    launch_us: float = 0.0  # per collective, whatever its ranks (NCCL's baseLatencies)
    tree_bus_ratio: float = TREE_BUS_RATIO
    measured_ranks: int | None = None
    algo: str | None = None  # NCCL_ALGO as the run sets it; None: this process's environment
    # a ring that spans nodes pays at least this for every step, inside a node too (tuning.cc: "Inter-node
    # rings still have to launch nsteps * net overhead", intraLat = max(intraLat, netOverhead)): the rank at
    # each node boundary forwards all n-1 chunks through the network, one message each
    net_overhead_us: float = 0.0
    # the spread of these figures from their sources (the profile's `*_range` keys): one Range each;
    # empty: one reading, no interval (vit_scale.planning.spread)
    ranges: tuple = ()
    # the collectives' library, as the profile or the check names it ("gloo", "nccl"; "": not said): gloo's
    # collectives cost what cost() says of them
    backend: str = ""
    # compute that runs while a collective is in flight takes this share longer, and a collective that runs
    # beside compute this share longer (the two share the device's compute units, caches and memory bandwidth;
    # step_time.timeline; docs/plan.md "Compute and collectives side by side"); 0: not slowed
    compute_slowdown: float = 0.0
    collective_slowdown: float = 0.0
    # gloo's rings keep two segments in flight (gloo/allgather.cc sends each chunk in two halves and waits for
    # the next-to-last operation; allreduce.cc keeps one segment in flight while it reduces the other), so a
    # step's latency may pass while the other segment moves: this share of the ring's latency beyond its first
    # step hides behind its bytes (0: latency plus bytes; 1: the longer of its steps' latency and one step's
    # latency plus its bytes). gloo only; docs/plan.md, "gloo's rings: latency behind bytes"
    segment_overlap: float = 0.0

    def at_end(self, costly: bool) -> Network:
        """These figures with every ranged one at the end of its range that makes a collective cheaper
        (lowest latency, highest bandwidth) or, `costly`, dearer; fits from a check are left as they are."""
        if not self.has_spread:
            return self
        links = {"intra_node": self.intra, "inter_node": self.inter}
        top = {}
        for r in self.ranges:
            scope, _, name = r.key.rpartition(".")
            end = r.end(costly)
            if scope:
                field_name = "bus_gbps" if name == "bus_gbps" else "alpha_us"
                links[scope] = dataclasses.replace(links[scope], **{field_name: end})
            else:
                top[name] = end
        side = "costly" if costly else "cheap"
        table = {k: v.at_end(costly) if isinstance(v, Fit) else v for k, v in self.per_collective.items()}
        return dataclasses.replace(
            self,
            intra=links["intra_node"],
            inter=links["inter_node"],
            per_collective=table,
            ranges=(),
            source=f"{self.source} ({side} end of every range)",
            **top,
        )

    @property
    def has_spread(self) -> bool:
        """Whether some figure carries a range, or some fit a standard error."""
        return bool(self.ranges) or any(isinstance(v, Fit) and v.has_spread for v in self.per_collective.values())

    def _scope_link(self, collective: str, scope: str) -> Link:
        intra = self.per_collective.get((collective, "intra"))
        intra = intra.link(launch_us=self.launch_us) if isinstance(intra, Fit) else (intra or self.intra)
        if scope == "intra":
            return intra
        fitted = self.per_collective.get((collective, "inter"))
        if isinstance(fitted, Fit):
            return fitted.link(intra.alpha_us, self.launch_us)
        return fitted or self.inter

    def link(self, collective: str, spans_nodes: bool, ranks_per_node: int = 1) -> Link:
        """The per-step latency and bus bandwidth the group's steps of that scope pay (across nodes: the
        bandwidth of the whole ring, rescaled to the group's ranks per node)."""
        k = max(1, int(ranks_per_node))
        intra = self._scope_link(collective, "intra")
        if not spans_nodes:
            return intra
        inter = self._scope_link(collective, "inter")
        fitted = self.per_collective.get((collective, "inter"))
        if isinstance(fitted, Fit):
            if not fitted.ranks_per_node or fitted.ranks_per_node == k:
                return inter
            bus = inter.bus_gbps * k / fitted.ranks_per_node
            if k > fitted.ranks_per_node:
                bus = min(bus, max(intra.bus_gbps, inter.bus_gbps))
            return Link(inter.alpha_us, bus, f"{inter.source}, rescaled to {k} rank(s) per node")
        return Link(inter.alpha_us, min(inter.bus_gbps * k, intra.bus_gbps), inter.source)

    def algorithm(self, collective: str, size_bytes: float, n: int, nodes: int = 1, ranks_per_node: int = 0) -> str:
        """The algorithm the library runs this collective with: ring for all-gather and reduce-scatter;
        for all-reduce the faster of ring and tree by this model's estimate, among those NCCL_ALGO allows."""
        return self.cost(collective, size_bytes, n, nodes, ranks_per_node).algorithm

    def cost(self, collective: str, size_bytes: float, n: int, nodes: int = 1, ranks_per_node: int = 0) -> Cost:
        """The collective over n ranks on `nodes` nodes, ranks_per_node of them on each (0: n // nodes)."""
        if n < 2 or size_bytes <= 0:
            return Cost(0.0, "ring", 0.0, 0.0, 0, 0)
        algorithms = allowed_algorithms(collective, self.algo)
        if self.backend == "gloo":
            # torch's ProcessGroupGloo reduce-scatters by all-reducing a copy of the whole input and keeping its
            # own chunk (reduce_scatter_tensor_coalesced: clone, allreduce, chunk), so it costs that all-reduce
            # (the check measures the two alike at every size); gloo's all-reduce is a ring reduce-scatter then
            # a ring all-gather (gloo/allreduce.cc), never a tree
            collective, algorithms = ("all_reduce" if collective == "reduce_scatter" else collective), ("ring",)
        k = max(1, min(int(nodes), n))
        per_node = ranks_per_node or max(1, n // k)
        intra = self._scope_link(collective, "intra")
        bw = self.link(collective, k > 1, per_node)
        best = None
        for algo in algorithms:
            if algo == "ring":
                steps = ring_steps(collective, n, k)
                bandwidth = size_bytes * bus_factor(collective, n) / (bw.bus_gbps * GB)
            else:
                steps = tree_steps(n, k)
                bandwidth = size_bytes / (0.5 * self.tree_bus_ratio * bw.bus_gbps * GB)
            inter_alpha = bw.alpha_us if k > 1 else 0.0
            intra_alpha = max(intra.alpha_us, self.net_overhead_us) if (k > 1 and algo == "ring") else intra.alpha_us
            latency = (self.launch_us + steps[0] * intra_alpha + steps[1] * inter_alpha) * 1e-6
            seconds = latency + bandwidth
            if self.segment_overlap and self.backend == "gloo" and algo == "ring":
                first = (self.launch_us + (inter_alpha if k > 1 else intra_alpha)) * 1e-6
                hidden = max(latency, first + bandwidth)
                seconds += self.segment_overlap * (hidden - seconds)
            c = Cost(seconds, algo, latency, bandwidth, *steps)
            if best is None or c.seconds < best.seconds:
                best = c
        return best

    def seconds(self, collective: str, size_bytes: float, n: int, spans_nodes: bool, ranks_per_node: int = 1) -> float:
        """Time of the collective over a group of n ranks, ranks_per_node of them on each node it spans."""
        k = max(1, int(ranks_per_node))
        nodes = -(-n // k) if spans_nodes else 1
        return self.cost(collective, size_bytes, n, nodes, k if spans_nodes else n).seconds

    def extrapolated(self, n: int) -> bool:
        """Whether a group of n ranks is larger than any whose collectives these figures were measured at."""
        return self.measured_ranks is not None and n > self.measured_ranks

    def with_fits(self, fits) -> Network:
        """These defaults, replaced per collective and scope by every usable fit; marked fits are not used.
        The largest fitted group becomes what predictions beyond it are extrapolated from."""
        table = dict(self.per_collective)
        largest = self.measured_ranks
        for f in fits:
            if f.usable:
                table[(f.collective, f.scope)] = f
                largest = max(largest or 0, f.ranks)
        used = sorted(f"{c}/{s}" for c, s in table)
        source = self.source + (f"; fitted: {', '.join(used)}" if used else "")
        return dataclasses.replace(self, per_collective=table, source=source, measured_ranks=largest)


NETWORK_KEYS = {"intra_node", "inter_node"}
# optional, beside the two scopes: launch_us (per collective), net_overhead_us (per step of a ring spanning
# nodes), tree_bus_ratio, measured_ranks; and the spread of the first three from their sources
NETWORK_OPTIONAL = {
    "launch_us",
    "net_overhead_us",
    "tree_bus_ratio",
    "measured_ranks",
    "launch_us_range",
    "net_overhead_us_range",
    "tree_bus_ratio_range",
    "compute_slowdown",
    "compute_slowdown_range",
    "collective_slowdown",
    "collective_slowdown_range",
    "segment_overlap",
    "segment_overlap_range",
}
# step_latency_us: per ring step. latency_us (profiles before the per-step form): a collective's latency
# as measured over two ranks, i.e. one ring step of an all-gather, so read as the same per-step figure
LINK_KEYS = {"bus_gbps", "step_latency_us"}
LEGACY_LINK_KEYS = {"bus_gbps", "latency_us"}
RANGE_SUFFIX = "_range"  # KEY_range: [low, high], the spread of KEY's sources (vit_scale.planning.spread)


def _positive(value, what: str, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        raise ValueError(f"{what} must be a {'non-negative' if zero_ok else 'positive'} number, got {value!r}")
    if not (value >= 0 if zero_ok else value > 0):
        raise ValueError(f"{what} must be a {'non-negative' if zero_ok else 'positive'} number, got {value!r}")
    return float(value)


def _share(value, what: str, zero_ok: bool) -> float:
    share = _positive(value, what, zero_ok=zero_ok)
    if share > 1:
        raise ValueError(f"{what} must be in {'[' if zero_ok else '('}0, 1], got {share!r}")
    return share


def network_from_profile(data: dict, where: str, algo: str | None = None) -> Network | None:
    """The `network:` section of a system profile's YAML mapping, or None when it has none.
    Bad values raise ValueError naming the key (the caller turns it into its one-line error).
    algo: the NCCL_ALGO the runs set (None: this process's environment)."""
    section = data.get("network")
    if section is None:
        return None
    if not isinstance(section, dict) or set(section) - NETWORK_KEYS - NETWORK_OPTIONAL or NETWORK_KEYS - set(section):
        raise ValueError(
            f"{where}: network needs the keys {', '.join(sorted(NETWORK_KEYS))} "
            f"(and may have {', '.join(sorted(NETWORK_OPTIONAL))})"
        )
    links, ranges = {}, []
    for key in sorted(NETWORK_KEYS):
        entry = section[key]
        plain = {k for k in entry if not k.endswith(RANGE_SUFFIX)} if isinstance(entry, dict) else set()
        if (
            not isinstance(entry, dict)
            or plain not in (LINK_KEYS, LEGACY_LINK_KEYS)
            or any(k[: -len(RANGE_SUFFIX)] not in plain for k in set(entry) - plain)
        ):
            raise ValueError(
                f"{where}: network.{key} needs exactly the keys {', '.join(sorted(LINK_KEYS))} (each may have "
                f"a KEY{RANGE_SUFFIX}: [low, high] beside it)"
            )
        latency_key = "step_latency_us" if "step_latency_us" in entry else "latency_us"
        alpha = _positive(entry[latency_key], f"{where}: network.{key}.{latency_key}")
        bus = _positive(entry["bus_gbps"], f"{where}: network.{key}.bus_gbps")
        links[key] = Link(alpha, bus, f"{where} network.{key}")
        for name, value in ((latency_key, alpha), ("bus_gbps", bus)):
            if name + RANGE_SUFFIX in entry:
                ranges.append(
                    read_range(
                        entry[name + RANGE_SUFFIX],
                        value,
                        f"{key}.{name}",
                        f"{where}: network.{key}.{name}{RANGE_SUFFIX}",
                        costly_high=name != "bus_gbps",
                    )
                )
    extra = {}
    for key in ("launch_us", "net_overhead_us", "compute_slowdown", "collective_slowdown"):
        if key in section:
            extra[key] = _positive(section[key], f"{where}: network.{key}", zero_ok=True)
        if key + RANGE_SUFFIX in section:
            if key not in extra:
                raise ValueError(f"{where}: network.{key}{RANGE_SUFFIX} is given without network.{key}")
            ranges.append(
                read_range(section[key + RANGE_SUFFIX], extra[key], key, f"{where}: network.{key}{RANGE_SUFFIX}")
            )
    # shares where more is a cheaper collective, so their range's low end is the costly one: the tree's share of
    # the ring's bandwidth (above 0, as a bandwidth), and the share of a gloo ring's latency its bytes hide
    for key, zero_ok in (("tree_bus_ratio", False), ("segment_overlap", True)):
        if key in section:
            extra[key] = _share(section[key], f"{where}: network.{key}", zero_ok)
        if key + RANGE_SUFFIX in section:
            what = f"{where}: network.{key}{RANGE_SUFFIX}"
            if key not in extra:
                raise ValueError(f"{what} is given without network.{key}")
            ranges.append(
                read_range(section[key + RANGE_SUFFIX], extra[key], key, what, False, 1.0 if zero_ok else None)
            )
    if ranges:
        extra["ranges"] = tuple(ranges)
    if "measured_ranks" in section:
        ranks = section["measured_ranks"]
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
            raise ValueError(f"{where}: network.measured_ranks must be a whole number of ranks >= 2, got {ranks!r}")
        extra["measured_ranks"] = ranks
    backend = str(data.get("backend") or "")
    return Network(
        links["intra_node"], links["inter_node"], source=f"defaults of {where}", algo=algo, backend=backend, **extra
    )


@dataclass(frozen=True)
class Range:
    """One input's spread from its sources: `key` (as the profile names it, e.g. "inter_node.bus_gbps"), its
    value and the lowest and highest reading; costly_high: a higher reading makes a collective dearer (a
    latency), else cheaper (a bandwidth)."""

    key: str
    value: float
    low: float
    high: float
    costly_high: bool = True

    def end(self, costly: bool) -> float:
        return self.high if costly == self.costly_high else self.low

    def text(self) -> str:
        return f"{self.key} {self.value:g} ({self.low:g}-{self.high:g})"


def read_range(given, value: float, key: str, what: str, costly_high: bool = True, share: float | None = None) -> Range:
    """A `KEY_range: [low, high]` beside KEY's `value`: two finite numbers, 0 or more (a bandwidth above
    0; a share, `share` its largest, from 0 up to it), low <= value <= high; else ValueError naming `what`."""
    ok = (
        isinstance(given, (list, tuple))
        and len(given) == 2
        and all(not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) for v in given)
    )
    if not ok:
        raise ValueError(f"{what} must be [low, high], two finite numbers, got {given!r}")
    low, high = float(given[0]), float(given[1])
    above = not costly_high and share is None  # a bandwidth: above 0
    if low < 0 or (above and low <= 0):
        raise ValueError(f"{what}: its low end must be {'above' if above else 'at least'} 0, got {low:g}")
    if share is not None and high > share:
        raise ValueError(f"{what}: its high end must be at most {share:g} (a share), got {high:g}")
    if not low <= value <= high:
        raise ValueError(
            f"{what}: [{low:g}, {high:g}] does not contain the value {value:g}; expected low <= value <= high"
        )
    return Range(key, value, low, high, costly_high)


def read_network(path: str) -> Network | None:
    """The documented defaults of one system profile (configs/systems/NAME.yaml)."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    return network_from_profile(data, os.path.basename(path))
