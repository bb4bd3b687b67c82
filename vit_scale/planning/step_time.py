"""How long one training step takes: compute, the optimizer, and the part of each collective that
compute does not hide (exposed communication within a node and across nodes).

    step = predict_step(Scenario(model="vit_base", strategy="FULL_SHARD", nodes=2), network, compute)

A per-unit timeline, not a simulator: one compute stream runs the units' forwards, then their
backwards in reverse, then the optimizer; collectives run on one stream per process group (NCCL and
RCCL serialise a group's collectives on its stream), each starting when its data is ready, the
library has issued it, and its group's previous collective is done. Compute waits only where it
needs a collective's result; what it waits is the exposed communication. The rules for when each
library issues what are each family's (the step_plan of vit_scale.distributed.<family>/cost.py),
each naming the function it follows; this module times them and names no family.

Sizes and group layouts are the families' (the bytes `vit-scale plan` reports,
vit_scale.planning.communication); times from vit_scale.planning.alpha_beta. Torch-free. Model and
limits: docs/plan.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vit_scale.distributed import FAMILIES
from vit_scale.distributed.costing.timeline import Coll, Unit, UnitPlan
from vit_scale.distributed.costing.timeline import buckets as _buckets  # noqa: F401 (tests/test_step_time.py)
from vit_scale.distributed.costing.timeline import flushed_buckets as _ds_buckets  # noqa: F401 (the same)
from vit_scale.planning import memory
from vit_scale.planning.alpha_beta import Network
from vit_scale.planning.scenario import Layout, Scenario, layout
from vit_scale.planning.shapes import Shape

PREFETCH_MODES = ("pre", "post", "none")


# ---------------------------------------------------------------- compute


def forward_flops_per_image(shape: Shape) -> dict:
    """Forward FLOPs (2 per multiply-add, matmuls and the patch convolution only) per image:
    {"stem": patch embedding, "block": one Block, "head": the classifier on the class token}."""
    D, M, T, p = shape.D, shape.M, shape.T, shape.patch
    block = 2 * T * (4 * D * D + 2 * D * M) + 2 * 2 * T * T * D  # qkv, proj, fc1, fc2; q.k^T and attn.v
    return {"stem": 2 * (T - 1) * D * 3 * p * p, "block": block, "head": 2 * D * shape.C}


def train_flops_per_image(shape: Shape, activation_checkpointing: bool = False) -> float:
    """Forward + backward (backward twice the forward; a checkpointed Block recomputes its forward)."""
    f = forward_flops_per_image(shape)
    total = 3 * (f["stem"] + shape.L * f["block"] + f["head"])
    return total + (shape.L * f["block"] if activation_checkpointing else 0)


@dataclass(frozen=True)
class Compute:
    """One device's compute for one step of the scenario's model, batch and precision."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    source: str

    @classmethod
    def measured(
        cls, forward_backward_s: float, optimizer_s: float, source: str, activation_checkpointing: bool = False
    ) -> Compute:
        """From a measured step (a run record, the study's 1-node rung): forward and backward split
        as their FLOPs are, 1:2 (1:3 with activation checkpointing, which recomputes the forward)."""
        back = 3 if activation_checkpointing else 2
        return cls(forward_backward_s / (1 + back), forward_backward_s * back / (1 + back), optimizer_s, source)

    def scaled(self, factor: float, why: str) -> Compute:
        """The same compute on a device `factor` times as slow (a band's end: another job's slowest device)."""
        return Compute(
            self.forward_s * factor, self.backward_s * factor, self.optimizer_s * factor, f"{self.source}; {why}"
        )

    @classmethod
    def from_flops(cls, sc: Scenario, peak_tflops: float, efficiency: float, optimizer_s: float = 0.0) -> Compute:
        """The step from an MFU: model FLOPs over peak x efficiency. Model FLOPs are forward + backward
        without activation checkpointing's recompute, as a run's recorded MFU counts them
        (vit_scale.models.flops_per_image: torch's FlopCounterMode over one forward and backward), so an
        MFU measured under checkpointing, which spent part of its time recomputing, gives back the step it
        was measured on. The recompute is inside that step: forward and backward split as the executed
        FLOPs are (1:3 under checkpointing, else 1:2)."""
        if not peak_tflops > 0 or not 0 < efficiency <= 1:
            raise ValueError("compute: peak_tflops must be positive and efficiency in (0, 1]")
        rate = peak_tflops * 1e12 * efficiency
        f = forward_flops_per_image(sc.shape)
        fwd = f["stem"] + sc.shape.L * f["block"] + f["head"]
        total = sc.batch_size * train_flops_per_image(sc.shape) / rate
        executed = train_flops_per_image(sc.shape, sc.activation_checkpointing)
        forward = total * fwd / executed
        recompute = " (MFU: recompute inside)" if sc.activation_checkpointing else ""
        return cls(
            forward,
            total - forward,
            optimizer_s,
            f"model FLOPs / ({peak_tflops:g} TFLOP/s x {efficiency:.0%}){recompute}",
        )


def _unit_compute(sc: Scenario, compute: Compute) -> list[tuple[float, float]]:
    """(forward, backward) seconds of the units in forward order: stem, Blocks, head, by FLOPs share."""
    shape = sc.shape
    f = forward_flops_per_image(shape)
    flops = [f["stem"]] + [f["block"]] * shape.L + [f["head"]]
    total = sum(flops)
    return [(compute.forward_s * x / total, compute.backward_s * x / total) for x in flops]


# ---------------------------------------------------------------- the timeline


@dataclass
class Breakdown:
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    exposed_intra_s: float = 0.0
    exposed_inter_s: float = 0.0
    # what compute took beyond its own time, slowed by the collectives in flight beside it
    # (Network.compute_slowdown)
    overlap_s: float = 0.0
    communication_s: dict = field(default_factory=lambda: {"intra": 0.0, "inter": 0.0})  # busy, hidden or not

    @property
    def step_s(self) -> float:
        return (
            self.forward_s
            + self.backward_s
            + self.optimizer_s
            + self.exposed_intra_s
            + self.exposed_inter_s
            + self.overlap_s
        )

    def as_dict(self) -> dict:
        def r(x):
            return round(x, 9)

        return {
            "step_s": r(self.step_s),
            "forward_s": r(self.forward_s),
            "backward_s": r(self.backward_s),
            "optimizer_s": r(self.optimizer_s),
            "exposed_intra_s": r(self.exposed_intra_s),
            "exposed_inter_s": r(self.exposed_inter_s),
            "overlap_s": r(self.overlap_s),
            "communication_s": {k: r(v) for k, v in self.communication_s.items()},
        }


class _Clock:
    """The compute stream's time, each collective stream's, and what the step is made of. Where compute and
    collectives share the device (Network.compute_slowdown, collective_slowdown), compute runs slower while a
    collective is in flight, and a collective slower over the compute spans of `computing` (a first pass's)."""

    def __init__(self, compute_slowdown: float = 0.0, collective_slowdown: float = 0.0, computing: tuple = ()):
        self.t = 0.0  # the compute stream
        self.free: dict = {}  # stream -> when its last collective ends
        self.out = Breakdown()
        self.compute_slowdown = compute_slowdown
        self.collective_slowdown = collective_slowdown
        self.computing = computing
        self.in_flight: list = []  # (start, end) of every collective issued (a collective's is fixed at issue)
        self.compute_spans: list = []  # (start, end) of every stretch of compute

    def issue(self, c: Coll | None, ready: float):
        """Start `c` once it is ready and its stream is free; (end, scope)."""
        if c is None:
            return None
        start = max(ready, self.free.get(c.stream, 0.0))
        end = _stretch(start, c.seconds, self.computing, self.collective_slowdown)
        self.free[c.stream] = end
        if c.seconds > 0:
            self.in_flight.append((start, end))
        self.out.communication_s[c.scope] += end - start
        return end, c.scope

    def wait(self, *handles) -> None:
        """Compute waits for these collectives; the wait is exposed, charged to the last one's scope."""
        handles = [h for h in handles if h is not None]
        if not handles:
            return
        end, scope = max(handles)
        if end > self.t:
            if scope == "inter":
                self.out.exposed_inter_s += end - self.t
            else:
                self.out.exposed_intra_s += end - self.t
            self.t = end

    def run(self, seconds: float, phase: str) -> None:
        end = _stretch(self.t, seconds, self.in_flight, self.compute_slowdown)
        if self.compute_slowdown:
            self.out.overlap_s += end - self.t - seconds
        self.compute_spans.append((self.t, end))
        self.t = end
        setattr(self.out, phase, getattr(self.out, phase) + seconds)


def _stretch(t: float, work: float, spans, slowdown: float) -> float:
    """When `work` seconds of one stream's work begun at t end, where the stream runs at 1 / (1 + slowdown) of
    its pace inside any of `spans` (the other stream's (start, end) intervals, overlapping or not)."""
    if not slowdown or not spans:
        return t + work
    left, rate = work, 1.0 + slowdown
    for a, b in sorted(s for s in spans if s[1] > t):
        if b <= t:
            continue  # inside a span already passed (spans may overlap)
        if a > t:
            step = min(left, a - t)
            t, left = t + step, left - step
        if left <= 0:
            break
        can = (b - t) / rate
        if left <= can:
            return t + left * rate
        t, left = b, left - can
    return t + left


def timeline(
    units: list,
    forward_ahead: int = 1,
    backward_prefetch: str = "pre",
    optimizer_s: float = 0.0,
    after_step: tuple = (),
    blocking: bool = False,
    one_reduce_in_flight: bool = False,
    backward_ahead: int = 1,
    compute_slowdown: float = 0.0,
    collective_slowdown: float = 0.0,
) -> Breakdown:
    """One step through `units` (forward order). Rules:

    forward_ahead = k: unit i's forward all-gather is issued when unit i-k starts its forward
      (k = 0: when unit i itself is due, so it is exposed; units before the k-th are gathered at
      the start of the step).
    backward_prefetch: the next unit's backward all-gather (next in backward order) is issued
      "pre": when this unit's backward starts, ahead of this unit's reduce-scatter;
      "post": when this unit's backward ends, still ahead of its reduce-scatter;
      "none": when the next unit is due, behind this unit's reduce-scatter on the same stream.
    after_backward collectives start when the unit's backward ends (chained ones when the one
      before them ends); the optimizer waits for all of them; after_step collectives run after it,
      exposed. blocking: every collective the units issue is waited for at once (gloo on a CPU,
      where the library's call returns when the collective is done).
    backward_ahead = k: "pre" and "post" prefetch the next k units in backward order (ZeRO-3's
      coordinator: as far ahead as in the forward).
    one_reduce_in_flight: before a unit's after_backward collectives are issued, compute waits for the
      previous unit's first one (FSDP2's reduce_scatter_max_input_buffers = 1).
    compute_slowdown, collective_slowdown: compute takes 1 + compute_slowdown times as long while a collective
      is in flight, and a collective 1 + collective_slowdown times as long while compute runs (they share the
      device's compute units and memory). A collective's time is fixed when it is issued, before the compute
      beside it has run: so the step is walked twice, the second time with each collective slowed over the
      first walk's compute (one pass of the fixed point; exact where compute does not move between the walks).
    """
    if backward_prefetch not in PREFETCH_MODES:
        raise ValueError(f"backward_prefetch: {backward_prefetch!r} is not one of {', '.join(PREFETCH_MODES)}")
    if blocking:
        forward_ahead, backward_prefetch = 0, "none"
    rules = (units, forward_ahead, backward_prefetch, optimizer_s, after_step, blocking, one_reduce_in_flight)
    rules += (backward_ahead,)
    clock = _walk(_Clock(compute_slowdown), *rules)
    if collective_slowdown:
        clock = _walk(_Clock(compute_slowdown, collective_slowdown, tuple(clock.compute_spans)), *rules)
    return clock.out


def _walk(
    clock: _Clock,
    units: list,
    forward_ahead: int,
    backward_prefetch: str,
    optimizer_s: float,
    after_step: tuple,
    blocking: bool,
    one_reduce_in_flight: bool,
    backward_ahead: int,
) -> _Clock:
    """The step's program on `clock` (timeline's rules)."""
    n = len(units)
    # each gather is issued in program order, before the compute it runs beside (whose pace it may slow)
    ahead = {i: clock.issue(units[i].gather_forward, 0.0) for i in range(min(forward_ahead, n))}
    for i, u in enumerate(units):
        handle = clock.issue(u.gather_forward, clock.t) if forward_ahead == 0 else ahead.pop(i)
        clock.wait(handle)
        if forward_ahead and i + forward_ahead < n:
            ahead[i + forward_ahead] = clock.issue(units[i + forward_ahead].gather_forward, clock.t)
        clock.run(u.forward_s, "forward_s")
    pending, gathered, last_reduce = [], {}, None
    order = list(reversed(range(n)))
    for j, i in enumerate(order):
        u = units[i]
        if u.gather_backward is not None and i not in gathered:
            gathered[i] = clock.issue(u.gather_backward, clock.t)
        clock.wait(gathered.get(i))
        ahead = [k for k in order[j + 1 : j + 1 + backward_ahead] if units[k].gather_backward is not None]
        if backward_prefetch == "pre":
            for k in ahead:
                if k not in gathered:
                    gathered[k] = clock.issue(units[k].gather_backward, clock.t)
        clock.run(u.backward_s, "backward_s")
        if backward_prefetch == "post":
            for k in ahead:
                if k not in gathered:
                    gathered[k] = clock.issue(units[k].gather_backward, clock.t)
        if one_reduce_in_flight and u.after_backward:
            clock.wait(last_reduce)
        previous = None
        for k, c in enumerate(u.after_backward):
            ready = previous[0] if (c.chained and previous) else clock.t
            previous = clock.issue(c, ready)
            pending.append(previous)
            if k == 0:
                last_reduce = previous
            if blocking:
                clock.wait(previous)
    clock.wait(*pending)
    clock.run(optimizer_s, "optimizer_s")
    for c in after_step:
        clock.wait(clock.issue(c, clock.t))
    return clock


# ---------------------------------------------------------------- a scenario's units


def _unit_plan(sc: Scenario, lay: Layout, net: Network, compute: Compute) -> UnitPlan:
    """The units' compute, and the family's collectives and issue rules (its `cost` module's
    step_plan, through the registry's Family.costs)."""
    c = 4 if sc.precision == "fp32" else 2
    units = [Unit(f, b) for f, b in _unit_compute(sc, compute)]
    costs = FAMILIES[lay.family].costs
    if costs is None:
        raise ValueError(f"strategy {lay.label}: no step time rule")
    return costs.step_plan(sc, lay, net, units, c)


# ---------------------------------------------------------------- the prediction


@dataclass
class StepPrediction:
    model: str
    strategy: str
    nodes: int
    gpus_per_node: int
    fits: bool | None
    breakdown: Breakdown | None
    images_per_s_per_gpu: float | None
    images_per_s: float | None
    rules: list
    compute_source: str
    network_source: str
    scaling_efficiency: float | None = None
    # a group larger than any whose collectives the network's figures were measured at (Network.extrapolated)
    extrapolated: bool = False
    largest_group: int = 0
    baseline_nodes: int = 1  # the node count scaling_efficiency is against
    # the 90% band from the inputs' spread (vit_scale.planning.spread.band): name -> (low, high); None: no
    # input has a range
    band: dict | None = None
    end_ips: tuple = ()  # images/s per GPU with every input at its cheap and at its costly end

    def as_dict(self) -> dict:
        band = self.band or {}
        bounds = {
            f"{name}_{side}": None if band.get(name) is None else round(band[name][i], 9)
            for name in ("images_per_s_per_gpu", "images_per_s", "step_s", "scaling_efficiency")
            for i, side in enumerate(("low", "high"))
        }
        return {
            "model": self.model,
            "strategy": self.strategy,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "fits": self.fits,
            "step": self.breakdown.as_dict() if self.breakdown else None,
            "images_per_s_per_gpu": self.images_per_s_per_gpu,
            "images_per_s": self.images_per_s,
            "scaling_efficiency": self.scaling_efficiency,
            "rules": list(self.rules),
            "compute_source": self.compute_source,
            "network_source": self.network_source,
            "extrapolated": self.extrapolated,
            "largest_group": self.largest_group,
            "baseline_nodes": self.baseline_nodes,
            **bounds,
        }


def predict_step(sc: Scenario, network: Network, compute: Compute, blocking: bool = False) -> StepPrediction:
    """The step of one scenario. A point that does not fit in the device's memory is predicted as not
    fitting (no speed). blocking: the collectives the library issues from the training thread are
    waited for there (gloo on a CPU); DDP's reducer stays asynchronous."""
    sc.validate()
    lay = layout(sc)
    fits = None
    if sc.device_memory_gib is not None:
        fits = bool(memory.predict(sc, lay).total <= sc.device_memory_gib * memory.GIB)
    common = {
        "model": sc.model,
        "strategy": sc.strategy,
        "nodes": sc.nodes,
        "gpus_per_node": sc.gpus_per_node,
        "compute_source": compute.source,
        "network_source": network.source,
    }
    if fits is False:
        return StepPrediction(
            fits=False,
            breakdown=None,
            images_per_s_per_gpu=None,
            images_per_s=None,
            rules=["does not fit in device memory: no speed predicted"],
            **common,
        )
    plan = _unit_plan(sc, lay, network, compute)
    out = timeline(
        plan.units,
        plan.forward_ahead,
        plan.backward_prefetch,
        compute.optimizer_s,
        plan.after_step,
        blocking=blocking and plan.blocking_applies,
        one_reduce_in_flight=plan.one_reduce_in_flight,
        backward_ahead=plan.backward_ahead,
        compute_slowdown=network.compute_slowdown,
        collective_slowdown=network.collective_slowdown,
    )
    per_gpu = sc.batch_size / out.step_s if out.step_s > 0 else None
    largest = max((c.ranks for c in _colls(plan)), default=0)
    rules = plan.rules + (
        ["blocking collectives: each one waited for where it is issued"] if blocking and plan.blocking_applies else []
    )
    return StepPrediction(
        fits=fits,
        breakdown=out,
        images_per_s_per_gpu=per_gpu,
        images_per_s=None if per_gpu is None else per_gpu * sc.world,
        rules=rules,
        extrapolated=network.extrapolated(largest),
        largest_group=largest,
        **common,
    )


def _colls(plan: UnitPlan):
    for u in plan.units:
        yield from (c for c in (u.gather_forward, u.gather_backward, *u.after_backward) if c is not None)
    yield from (c for c in plan.after_step if c is not None)


def predict_curve(sc: Scenario, nodes: list, network: Network, compute: Compute, blocking: bool = False) -> list:
    """Weak scaling: the scenario on each node count, each with its images/s per GPU over its baseline's
    (1 node, or the fewest a group wider than a node fits on)."""
    import dataclasses

    from vit_scale.planning.scenario import baseline_nodes

    first = baseline_nodes(sc)
    base = predict_step(dataclasses.replace(sc, nodes=first), network, compute, blocking)
    rows = []
    for n in nodes:
        p = base if n == first else predict_step(dataclasses.replace(sc, nodes=n), network, compute, blocking)
        p.baseline_nodes = first
        if p.images_per_s_per_gpu is not None and base.images_per_s_per_gpu:
            p.scaling_efficiency = p.images_per_s_per_gpu / base.images_per_s_per_gpu
        rows.append(p)
    return rows
