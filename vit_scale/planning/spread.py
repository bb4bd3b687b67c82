"""How sure a prediction is: the band its inputs' spread gives each predicted point, and where one strategy
falls below another as a range of node counts.

    cheap, costly = ends(network)            # every ranged input at its cheap / costly end (None: no ranges)
    band(value, [at_cheap, at_costly])       # a StepPrediction's *_low / *_high from the predictions at the ends
    crossings(curves)                        # per model and pair of strategies, the node counts it falls below

Propagation is by bounds, not sampling. Every input with a range (a latency, a bandwidth: the system profile's
`*_range` keys, each written beside its citation) moves a collective's time one way only: a higher latency, a
lower bandwidth or less of a gloo ring's latency hidden behind its bytes never makes a collective shorter
(alpha_beta.Network.cost: latency + bytes over bandwidth, the faster of ring and tree), and the step's timeline
(step_time.timeline: each collective starts at the later of its data being ready and its stream being free,
compute waits for it) only adds and takes maxima, so a longer collective never shortens the step. So the step with
every input at its cheap end is the shortest the ranges allow and with every one at its costly end the longest.
Each range is read as its input's 90% interval, and the inputs as moving together (they do: the across-nodes
per-step latency and the network overhead are one reading of one table): for inputs that move together, the 5th
and 95th percentiles of a monotone function are its values at the inputs' 5th and 95th percentiles, so the two
ends are the 90% band exactly; inputs varying independently would give a narrower one, so the band is on the wide
side. Where compute is derived from a measured step (its step less the communication predicted exposed there), a
dearer network leaves less compute, and a point's images/s need not be monotone in the inputs: the band is then
the hull of the value and both ends. Sampling would need hundreds of timelines a point; the bounds take two, which
keeps `vit-scale plan` as fast as before. Torch-free. docs/plan.md, "How sure a prediction is".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEVEL = 0.90  # what the band claims to cover: each range read as its input's 90% interval
BANDED = ("images_per_s_per_gpu", "images_per_s", "step_s", "scaling_efficiency")
# "falls below": by more than the curves' own noise (published.CROSSING_MARGIN's reasoning: the authors'
# curves move by +-3% from one run to the next and their 1-node rungs differ by up to 5%)
CROSSING_MARGIN = 0.05


@dataclass(frozen=True)
class DeviceSpread:
    """How far a band end's compute, beyond its baseline rung, may lie from the rung's, as shares of its time:
    `faster` less at the cheap end, `slower` more at the costly end. A profile's number is both (Frontier's
    0.08: another allocation's devices 8% either way); a pair [faster, slower] is not symmetric (the isolated
    emulation: a node that waits on its link computes faster than at its rung, as its CPU quota allows)."""

    faster: float = 0.0
    slower: float = 0.0
    # the faster share is a CPU quota's budget a period that waiting leaves unspent (emulated nodes): the
    # value, not only the band's end, takes as much of it as the step's waits give back (predict._on_budget)
    budget: bool = False
    # on such a budget, the most of the rung's compute time a node's compute was measured to take once its
    # ranks wait at least that long a step (the profile's quota_burst_share, benchmarks/quota_burst.py): the
    # costly end's ceiling there; 1: not measured, the rung's own pace
    burst_share: float = 1.0

    @classmethod
    def of(cls, value) -> DeviceSpread:
        """A DeviceSpread, a share for both sides, or None (no spread)."""
        if isinstance(value, DeviceSpread):
            return value
        return cls(float(value or 0.0), float(value or 0.0))

    @classmethod
    def read(cls, value) -> DeviceSpread | None:
        """A profile's `device_spread` (a share, or [faster, slower]); None where it is not one of those (each
        share a finite number from 0 up to, not including, 1)."""

        def share(x) -> bool:
            return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and 0 <= x < 1

        if share(value):
            return cls(float(value), float(value))
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(share(x) for x in value):
            return cls(float(value[0]), float(value[1]))
        return None

    def __bool__(self) -> bool:
        return self.faster > 0 or self.slower > 0

    def factor(self, costly: bool) -> float:
        """What a band end's compute time is multiplied by."""
        return 1 + self.slower if costly else 1 - self.faster

    def text(self) -> str:
        if self.faster == self.slower:
            return f"devices {self.faster:.0%} slower or faster"
        quota = " (a CPU quota's budget, given back by waiting)" if self.budget else ""
        if self.budget and self.burst_share < 1:
            quota = (
                " (a CPU quota's budget, given back by waiting; the costly end, with waits as long as the compute, "
                f"{self.burst_share:.0%} of the rung's time)"
            )
        return f"compute up to {self.faster:.0%} less and {self.slower:.0%} more time{quota}"


def ends(network) -> tuple | None:
    """(cheap, costly): the network with every ranged figure (and every fit with standard errors, at +-Z90
    of them) at the end that makes collectives cheaper, and dearer; None when nothing has a spread."""
    if not network.has_spread:
        return None
    return network.at_end(False), network.at_end(True)


def _value(p, name: str):
    if name == "step_s":
        return p.breakdown.step_s if p.breakdown is not None else None
    return getattr(p, name)


def band(value, at_ends: list) -> None:
    """Sets value.band: for each of BANDED, (low, high) over the value and the predictions at the ends (the
    hull: see the module's docstring), or None where a point has no speed."""
    out = {}
    for name in BANDED:
        xs = [_value(p, name) for p in [value, *at_ends]]
        out[name] = None if any(x is None for x in xs) else (min(xs), max(xs))
    value.band = out
    value.end_ips = tuple(p.images_per_s_per_gpu for p in at_ends)


def falls_below(nodes: list, a: list, b: list, margin: float = CROSSING_MARGIN) -> int | None:
    """The first node count from which `a` stays more than `margin` below `b` (None: not within `nodes`)."""
    below = [x is not None and y is not None and x < (1 - margin) * y for x, y in zip(a, b, strict=True)]
    for i, n in enumerate(nodes):
        if all(below[i:]):
            return n
    return None


def crossings(curves: dict, margin: float = CROSSING_MARGIN) -> list:
    """curves: (model, strategy) -> {nodes: (value, cheap end, costly end)} images/s per GPU. For every model
    and ordered pair (A, B) with A not more than `margin` below B at the first node count both have, where A
    falls below B at some reading: the node counts it happens at, as a range over the readings.

    Each result: model, strategy (A), below (B), value (the node count at the inputs' values, None: not within
    the ladder), earliest, latest (over the value and both ends; latest None when at some reading it does not
    happen within the ladder), largest (the ladder's top) and text."""
    out = []
    models = list(dict.fromkeys(m for m, _ in curves))
    for model in models:
        strategies = [s for m, s in curves if m == model]
        for a in strategies:
            for b in strategies:
                if a == b:
                    continue
                ca, cb = curves[(model, a)], curves[(model, b)]
                nodes = sorted(n for n in set(ca) & set(cb) if ca[n] is not None and cb[n] is not None)
                if len(nodes) < 2 or ca[nodes[0]][0] < (1 - margin) * cb[nodes[0]][0]:
                    continue  # already below where both start: no crossing, a lasting gap
                at = [
                    falls_below(nodes, [ca[n][k] for n in nodes], [cb[n][k] for n in nodes], margin) for k in range(3)
                ]
                found = [x for x in at if x is not None]
                if not found:
                    continue
                result = {
                    "model": model,
                    "strategy": a,
                    "below": b,
                    "value": at[0],
                    "earliest": min(found),
                    "latest": None if len(found) < len(at) else max(found),
                    "largest": nodes[-1],
                }
                result["text"] = crossing_text(result)
                out.append(result)
    return out


def crossing_text(c: dict) -> str:
    """ "FULL_SHARD falls below HYBRID_2GPU between 4 and 16 nodes (at the inputs' values: from 8)"."""
    head = f"{c['strategy']} falls below {c['below']}"
    value = "does not within the ladder" if c["value"] is None else f"from {c['value']}"
    if c["latest"] is None:
        where = f"from {c['earliest']} nodes, or not within the ladder (up to {c['largest']} nodes)"
    elif c["latest"] == c["earliest"]:
        where = f"from {c['earliest']} nodes"
    else:
        where = f"between {c['earliest']} and {c['latest']} nodes"
    return f"{head} {where} (at the inputs' values: {value})"
