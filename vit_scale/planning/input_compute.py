"""The compute source as an input of a prediction: measured steps (a run or a study directory's 1-node
rung, with the run-to-run interval of its repeats), the counted FLOPs over a peak times an efficiency, or a
run's recorded MFU; each read and validated here and turned into a step_time.Compute per point. Bad input
is errors.UserError: one line naming the option and what is expected."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from vit_scale.errors import UserError
from vit_scale.planning.alpha_beta import Network
from vit_scale.planning.input_run import blocking_for, scenario_of_run
from vit_scale.planning.scenario import Scenario, baseline_nodes
from vit_scale.planning.spread import DeviceSpread
from vit_scale.planning.step_time import Compute, predict_step
from vit_scale.record import reader


def _d(x) -> dict:
    return x if isinstance(x, dict) else {}


BISECT_STEPS = 32  # halvings of the compute interval: 2^-32 of the step, far below its noise


@dataclass(frozen=True)
class MeasuredStep:
    """One ok run's step (global batch over its median images/s: run_ips) and the scenario it ran."""

    scenario: Scenario
    step_s: float
    run_dir: str
    blocking: bool
    options: str = ""  # the strategy's options, to prefer a run of the same series

    @property
    def key(self) -> tuple:
        return (self.scenario.model, self.scenario.batch_size, self.scenario.precision)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def run_ips(run) -> float | None:
    """A run's images/s as the analysis takes it (analysis/table.py, _run_median): the median of its timed
    steps (the end record's, else from its steps), its mean only where neither is there."""
    ips = _d((run.end or {}).get("images_per_s"))
    if _positive(ips.get("median")):
        return float(ips["median"])
    steps = sorted(reader.timed_step_ips(run.path)) if getattr(run, "path", None) else []
    if steps:
        n = len(steps)
        median = steps[n // 2] if n % 2 else (steps[n // 2 - 1] + steps[n // 2]) / 2
        if median > 0:
            return median
    return float(ips["mean"]) if _positive(ips.get("mean")) else None


def measured_step(run) -> MeasuredStep | None:
    """A vit_scale.record.reader RunRecord's median step, or None when it gives no speed."""
    end = run.end or {}
    if run.status != "ok" or end.get("replicas_agree") is False:
        return None
    ips = run_ips(run)
    if ips is None:
        return None
    start = run.start
    sc = scenario_of_run(start)
    world = _d(start.get("world"))
    options = json.dumps(_d(_d(start.get("strategy")).get("options")), sort_keys=True, default=str)
    return MeasuredStep(
        sc,
        sc.batch_size * sc.world / ips,
        run.run_dir,
        blocking_for(world.get("backend"), world.get("device_type")),
        options,
    )


def compute_of(step: MeasuredStep, network: Network) -> Compute:
    """The compute c of a measured step s: the c at which the model's predicted step for that very run,
    c plus the communication it does not hide, equals s (found by bisection: the predicted step grows with
    compute). All of it is counted as forward and backward: a measured step does not say how much was the
    optimizer's."""
    sc = dataclasses.replace(step.scenario, device_memory_gib=None)
    ckpt = sc.activation_checkpointing

    def predicted(c: float) -> float:
        return predict_step(sc, network, Compute.measured(c, 0.0, "", ckpt), step.blocking).breakdown.step_s

    s = step.step_s
    if predicted(s) <= s * (1 + 1e-9):  # nothing exposed even with all of it as compute (up to rounding)
        c = s
    elif predicted(0.0) >= s:  # the predicted communication alone takes longer than the measured step
        c = 0.0
    else:
        lo, hi = 0.0, s
        for _ in range(BISECT_STEPS):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if predicted(mid) < s else (lo, mid)
        c = (lo + hi) / 2
    where = os.path.basename(step.run_dir.rstrip(os.sep)) or step.run_dir
    src = (
        f"measured step of {sc.strategy} on {sc.nodes} node(s) ({where}: {s * 1e3:.4g} ms) less "
        f"{(s - c) * 1e3:.3g} ms exposed communication predicted for it"
    )
    if c == 0.0:
        src += " (the predicted communication alone exceeds the measured step: compute taken as 0)"
    return Compute.measured(c, 0.0, src, ckpt)


@dataclass
class ComputeSource:
    """Where each point's compute comes from: measured steps (each point takes the best-matching one of
    its model, batch and precision), or the counted FLOPs over a peak times an efficiency."""

    steps: list = field(default_factory=list)  # MeasuredSteps
    origin: str = ""  # the --compute-from path
    peak: float | None = None  # TFLOP/s per device, for FLOPs
    efficiency: float | None = None
    # per model, from --efficiency-from: a run's MFU applies to its own model only
    efficiencies: dict = field(default_factory=dict)
    # (model, precision, batch) -> planning.compute.GemmTimings: check.json's GEMMs, in place of `efficiency`
    gemms: dict = field(default_factory=dict)
    # the system profile's device_spread (input_profile.device_spread): a band's compute, beyond the baseline
    # rung, this share faster or slower than the rung's; empty: none
    device_spread: DeviceSpread = field(default_factory=DeviceSpread)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        return "measured" if self.origin else "check" if self.gemms else "flops"

    def describe(self) -> str:
        if self.origin:
            return f"measured steps from {self.origin} ({len(self.steps)} run(s))"
        if self.gemms:
            timed = ", ".join(f"{t.model} {t.precision} batch {t.batch_size}" for t in self.gemms.values())
            flat = f"; other points: FLOPs over {self.peak:g} TFLOP/s x {self.efficiency:.0%}" if self.peak else ""
            return f"the Block's GEMMs timed by the check ({timed}), scaled to the step{flat}"
        if self.efficiencies:
            each = ", ".join(f"{m} {e:.0%}" for m, e in sorted(self.efficiencies.items()))
            return f"counted FLOPs over {self.peak:g} TFLOP/s x each model's MFU ({each})"
        return f"counted FLOPs over {self.peak:g} TFLOP/s x {self.efficiency:.0%} efficiency"

    def step_for(self, sc: Scenario, options: str = "") -> MeasuredStep:
        """Same model, batch and precision on the point's baseline node count (baseline_nodes: 1, or the
        fewest a group wider than a node fits on): the same strategy and options, else the same strategy,
        else the fastest run there of any strategy (the least communication in the way). A run on another
        node count is no baseline: its step holds communication that a 1-node step does not, and taking
        it as the rung would count that as compute (UserError)."""
        key = (sc.model, sc.batch_size, sc.precision)
        same = [s for s in self.steps if s.key == key]
        if not same:
            have = sorted({f"{m} at batch {b} in {p}" for m, b, p in (s.key for s in self.steps)})
            raise UserError(
                f"--compute-from: {self.origin} has no run of {sc.model} at batch {sc.batch_size} in "
                f"{sc.precision}; expected a run of the same model, batch and precision "
                f"(it has: {', '.join(have) or 'no ok run'})"
            )
        nodes = baseline_nodes(sc)
        rung = [s for s in same if s.scenario.nodes == nodes]
        if not rung:
            counts = ", ".join(str(n) for n in sorted({s.scenario.nodes for s in same}))
            raise UserError(
                f"--compute-from: {self.origin} has runs of {sc.model} at batch {sc.batch_size} in {sc.precision} "
                f"on {counts} node(s) only; expected its rung on {nodes} node(s), the baseline of "
                f"{sc.strategy} (the fewest nodes its groups fit on)"
            )
        return min(self.rung_for(sc, options, rung), key=lambda s: s.step_s)

    def rung_for(self, sc: Scenario, options: str = "", rung: list | None = None) -> list:
        """The runs step_for picks from: its repeats (same strategy and options, else same strategy), or the
        fastest run of another strategy alone. rung: the baseline's runs, when step_for has found them."""
        if rung is None:
            self.step_for(sc, options)  # its errors, for a point no run covers
            key = (sc.model, sc.batch_size, sc.precision)
            rung = [s for s in self.steps if s.key == key and s.scenario.nodes == baseline_nodes(sc)]
        for pick in (
            [s for s in rung if s.scenario.strategy == sc.strategy and s.options == options],
            [s for s in rung if s.scenario.strategy == sc.strategy],
        ):
            if pick:
                return pick
        return [min(rung, key=lambda s: s.step_s)]

    def has_spread(self, points: list, options: list | None = None) -> bool:
        """Whether some point's measured rung has repeats whose steps differ (their run-to-run interval)."""
        if not self.origin:
            return False
        return any(
            len({s.step_s for s in self.rung_for(sc, options[i] if options else "")}) > 1 for i, sc in enumerate(points)
        )

    def varied(self, comp: Compute, sc: Scenario, costly: bool) -> Compute:
        """A band end's compute: beyond the baseline node count, on devices device_spread slower (costly) or
        faster than those the compute was measured or counted on. A job's step runs at its slowest device's
        pace, and another allocation's slowest device may lie anywhere within the system's spread of the
        baseline's; the baseline itself is the reference the efficiency is taken against."""
        if sc.nodes == baseline_nodes(sc):
            return comp
        return on_other_devices(comp, self.device_spread, costly)

    def compute_for(self, sc: Scenario, network: Network, options: str = "", end: bool | None = None) -> Compute:
        """The point's compute; end (measured steps only): False the fastest of its rung's repeats, True the
        slowest (their run-to-run interval), None the one step_for picks."""
        if not self.origin and self.gemms:
            from vit_scale.planning.compute import compute_of_gemms, why_not

            if why_not(self.gemms, sc) is None:
                return compute_of_gemms(self.gemms[(sc.model, sc.precision, sc.batch_size)], sc)
            if self.peak is None:
                raise UserError(
                    f"--calibration: {why_not(self.gemms, sc)}; and the system profile gives no peak TFLOP/s to "
                    "count FLOPs against: run vit-scale check --model M --batch-size B for this point, or give "
                    "--compute-from RUNDIR"
                )
        if not self.origin:
            if self.efficiencies:
                if sc.model not in self.efficiencies:
                    raise UserError(
                        f"--efficiency-from: no ok run of {sc.model} recorded an MFU; expected runs of the same "
                        f"model (it has {', '.join(sorted(self.efficiencies))}): an MFU does not carry over "
                        "between models"
                    )
                return Compute.from_flops(sc, self.peak, self.efficiencies[sc.model])
            return Compute.from_flops(sc, self.peak, self.efficiency)
        if end is None:
            step = self.step_for(sc, options)
        else:
            step = (max if end else min)(self.rung_for(sc, options), key=lambda s: s.step_s)
        key = (step.run_dir, id(network))
        if key not in self._cache:
            # the network is kept with its compute, so that its id is not reused while the entry stands
            self._cache[key] = (network, compute_of(step, network))
        return self._cache[key][1]


def on_other_devices(comp: Compute, device_spread, costly: bool) -> Compute:
    """`comp` on another allocation's devices (a DeviceSpread, or one share for both sides), its time the
    spread's share more (costly) or less; unchanged where the spread is none."""
    spread = DeviceSpread.of(device_spread)
    factor = spread.factor(costly)
    if factor == 1:
        return comp
    return comp.scaled(factor, f"compute {factor - 1:+.0%} (device_spread)")


def compute_from(path: str, runs: list | None = None) -> ComputeSource:
    """`--compute-from PATH`: a run directory (its metrics.jsonl) or a study directory (every ok run
    under it; each point then uses its 1-node rung). runs: RunRecords already read from PATH."""
    if runs is None:
        if not os.path.isdir(path):
            raise UserError(f"--compute-from: {path} is not a directory; expected a run directory or a study directory")
        runs = reader.collect([path]).runs
    _no_mfu_above_one(runs, "--compute-from")
    steps = [s for s in (measured_step(r) for r in runs) if s is not None]
    if not steps:
        raise UserError(
            f"--compute-from: {path} holds no run that finished ok with a speed; expected a run "
            f"directory (metrics.jsonl) or a study directory"
        )
    return ComputeSource(steps=steps, origin=path)


def compute_from_flops(peak: float | None, efficiency: float, where: str = "the system profile") -> ComputeSource:
    if peak is None or not peak > 0:
        raise UserError(
            f"--compute-from: {where} gives no peak TFLOP/s for this precision; give --compute-from "
            f"RUNDIR (a measured run) instead"
        )
    if not 0 < efficiency <= 1:
        raise UserError(f"--efficiency: must be in (0, 1], got {efficiency}")
    return ComputeSource(peak=peak, efficiency=efficiency)


def _no_mfu_above_one(runs, option: str) -> None:
    """An ok run whose end record claims more FLOP/s than its device's peak (MFU above 1) timed or
    counted something wrong; its speed would make compute a fraction of what any device does."""
    for r in runs:
        mfu = (r.end or {}).get("mfu")
        if r.status == "ok" and isinstance(mfu, (int, float)) and not isinstance(mfu, bool) and not mfu <= 1:
            raise UserError(
                f"{option}: {r.run_dir}: its end record's mfu is {mfu:g}, above 1 (more FLOP/s than the "
                f"device's peak); expected runs whose MFU is at most 1"
            )


def efficiency_from_runs(runs, model: str | None = None) -> float | None:
    """The median MFU of the ok runs that recorded one (of `model` only, when given: an MFU depends on the
    model's shapes and does not carry over to another). A recorded MFU counts model FLOPs without
    checkpointing's recompute; Compute.from_flops applies it the same way. A run with an MFU above 1 is
    bad input (UserError)."""
    _no_mfu_above_one(runs, "--efficiency-from")
    mfus = sorted(
        float((r.end or {})["mfu"])
        for r in runs
        if r.status == "ok"
        and isinstance((r.end or {}).get("mfu"), (int, float))
        and r.end["mfu"] > 0
        and (model is None or _d(r.start.get("model")).get("name") == model)
    )
    return mfus[len(mfus) // 2] if mfus else None


def efficiencies_from_runs(runs) -> dict:
    """Per model, the median MFU of its ok runs: --efficiency-from."""
    models = {_d(r.start.get("model")).get("name") for r in runs if isinstance(r.start, dict)}
    out = {m: efficiency_from_runs(runs, m) for m in models if isinstance(m, str)}
    return {m: e for m, e in out.items() if e is not None}
