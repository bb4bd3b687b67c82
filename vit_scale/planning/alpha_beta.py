"""How long a collective takes: the latency-bandwidth (alpha-beta) model, its fit from timed points,
and the documented defaults a system profile carries for when nothing was measured.

    t(S, n) = alpha + S * f(n) / B

S is the whole tensor (all-reduce input, all-gather output, reduce-scatter input), n the ranks and
f(n) the bus-bandwidth factor of nccl-tests' PERFORMANCE.md (all_reduce 2(n-1)/n, all_gather and
reduce_scatter (n-1)/n), so that B is the "bus bandwidth" nccl-tests prints: what one rank's
slowest link carries, comparable across collectives and rank counts.

`fit` turns (size, seconds) points of one collective in one scope (within a node, across nodes)
into alpha and B, and marks a fit it cannot vouch for (too few sizes, a large residual, latency
points that run backwards) instead of handing it on silently. `read_network` reads a profile's
`network:` section. Torch-free: the planner and the analysis use it. Formulas: docs/plan.md.
"""

from __future__ import annotations

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


def bus_factor(collective: str, n: int) -> float:
    if collective not in BUS_FACTORS:
        raise ValueError(f"collective: {collective!r} is not one of {', '.join(COLLECTIVES)}")
    return BUS_FACTORS[collective](n) if n > 1 else 0.0


@dataclass(frozen=True)
class Link:
    """alpha (latency, microseconds) and B (bus bandwidth, GB/s) of one scope, and where they came from."""

    alpha_us: float
    bus_gbps: float
    source: str = ""

    def seconds(self, collective: str, size_bytes: float, n: int) -> float:
        if n < 2 or size_bytes <= 0:
            return 0.0
        return self.alpha_us * 1e-6 + size_bytes * bus_factor(collective, n) / (self.bus_gbps * GB)


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

    @property
    def usable(self) -> bool:
        return not self.flags

    def link(self) -> Link:
        return Link(self.alpha_us, self.bus_gbps, f"fit of {self.collective} ({self.scope}, {self.ranks} ranks)")

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
        }


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
    return Fit(collective, scope, ranks, alpha * 1e6, bus, residual, len(sizes), tuple(flags), ranks_per_node)


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


@dataclass(frozen=True)
class Network:
    """The alpha-beta parameters a prediction uses: per scope, optionally per collective (from fits).

    A group that spans nodes runs all of its bytes at the across-nodes rate (a ring is as slow as its
    slowest hop), with the across-nodes latency. That rate depends on how many of a node's ranks the
    group has: the profile's `inter_node.bus_gbps` is one rank's share of the node's NICs, and a ring
    over k of a node's ranks uses k such shares (NCCL/RCCL open a channel per NIC, so a ring over all
    of a node's ranks drives every NIC), bounded by the within-node rate:
        bus = min(intra, per-rank inter x k)
    k = 1 for a strided group (HSDP's replicas: one rank per node, several groups sharing the NICs).
    A fit across nodes was measured at its own ranks per node (Fit.ranks_per_node) and is rescaled
    the same way.
    """

    intra: Link
    inter: Link
    per_collective: dict = field(default_factory=dict)  # (collective, scope) -> Fit or Link, from usable fits
    source: str = ""

    def link(self, collective: str, spans_nodes: bool, ranks_per_node: int = 1) -> Link:
        scope = "inter" if spans_nodes else "intra"
        k = max(1, int(ranks_per_node))
        intra = self.per_collective.get((collective, "intra"))
        intra = intra.link() if isinstance(intra, Fit) else (intra or self.intra)
        fitted = self.per_collective.get((collective, scope))
        if fitted is not None:
            if not isinstance(fitted, Fit):
                return fitted
            measured = fitted.link()
            if not spans_nodes or not fitted.ranks_per_node or fitted.ranks_per_node == k:
                return measured
            bus = measured.bus_gbps * k / fitted.ranks_per_node
            if k > fitted.ranks_per_node:
                bus = min(bus, max(intra.bus_gbps, measured.bus_gbps))
            return Link(measured.alpha_us, bus, f"{measured.source}, rescaled to {k} rank(s) per node")
        if not spans_nodes:
            return intra
        return Link(self.inter.alpha_us, min(self.inter.bus_gbps * k, intra.bus_gbps), self.inter.source)

    def seconds(self, collective: str, size_bytes: float, n: int, spans_nodes: bool, ranks_per_node: int = 1) -> float:
        return self.link(collective, spans_nodes, ranks_per_node).seconds(collective, size_bytes, n)

    def with_fits(self, fits) -> Network:
        """These defaults, replaced per collective and scope by every usable fit; marked fits are not used."""
        table = dict(self.per_collective)
        for f in fits:
            if f.usable:
                table[(f.collective, f.scope)] = f
        used = sorted(f"{c}/{s}" for c, s in table)
        source = self.source + (f"; fitted: {', '.join(used)}" if used else "")
        return Network(self.intra, self.inter, table, source)


NETWORK_KEYS = {"intra_node", "inter_node"}
LINK_KEYS = {"bus_gbps", "latency_us"}


def network_from_profile(data: dict, where: str) -> Network | None:
    """The `network:` section of a system profile's YAML mapping, or None when it has none.
    Bad values raise ValueError naming the key (the caller turns it into its one-line error)."""
    section = data.get("network")
    if section is None:
        return None
    if not isinstance(section, dict) or set(section) - NETWORK_KEYS or NETWORK_KEYS - set(section):
        raise ValueError(f"{where}: network needs exactly the keys {', '.join(sorted(NETWORK_KEYS))}")
    links = {}
    for key in sorted(NETWORK_KEYS):
        entry = section[key]
        if not isinstance(entry, dict) or set(entry) != LINK_KEYS:
            raise ValueError(f"{where}: network.{key} needs exactly the keys {', '.join(sorted(LINK_KEYS))}")
        for sub in sorted(LINK_KEYS):
            value = entry[sub]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
                raise ValueError(f"{where}: network.{key}.{sub} must be a positive number, got {value!r}")
        links[key] = Link(float(entry["latency_us"]), float(entry["bus_gbps"]), f"{where} network.{key}")
    return Network(links["intra_node"], links["inter_node"], source=f"defaults of {where}")


def read_network(path: str) -> Network | None:
    """The documented defaults of one system profile (configs/systems/NAME.yaml)."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    return network_from_profile(data, os.path.basename(path))
