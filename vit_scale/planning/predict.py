"""Predicted step times and images/s for a list of points, from a calibration and a compute source:
the one entry point `vit-scale plan` and the analysis share.

    cal = choose_calibration(check="runs/study/check.json", profile=profile_path("frontier"),
                             system="frontier", models=["vit_base"], precisions=["bf16"])
    comp = compute_from("runs/study")                      # or compute_from_flops(peak, efficiency)
    rows = predict(points, cal, comp, blocking=False)      # points: Scenarios

Calibration, in this order: a check.json's fits (from the size sweep of `vit-scale check`; their
gaps filled by the profile's defaults), the system profile's `network:` defaults, or none (no
communication timed: the compute-bound ceiling). The result says which it used.

Compute: a measured step of the same model, batch and precision (a run directory, or a study
directory's 1-node rung: each strategy its own 1-node run where there is one), its compute being
the measured step less the exposed communication this model predicts for that very run; or the
counted FLOPs over the profile's peak times a stated efficiency.

Each input is read, validated and turned into plain values (with their spread) in a module of its own,
whose names this module gives again for its callers: the system profile (input_profile), a check's
calibration (input_check), the compute source (input_compute), a run record's scenario (input_run); the
Calibration they build is calibration.py's. This module composes them and runs the step model.

Bad input (a missing or unreadable file, a check.json of another system, model or precision, a
fit with too few points, a run directory of another model, batch or precision) raises
errors.UserError: one line naming the file or option and what is expected. Torch-free.
Model and limits: docs/plan.md, "Predicted step time" and "Predictions: calibration and compute".
"""

from __future__ import annotations

import dataclasses
import os

from vit_scale.planning import spread
from vit_scale.planning.alpha_beta import Network
from vit_scale.planning.calibration import CALIBRATIONS, Calibration, no_calibration
from vit_scale.planning.input_check import (
    check_calibration,
    read_check,
    read_fits,
    read_step_fits,
)
from vit_scale.planning.input_compute import (
    ComputeSource,
    MeasuredStep,
    compute_from,
    compute_from_flops,
    compute_of,
    efficiencies_from_runs,
    efficiency_from_runs,
    measured_step,
    on_other_devices,
    run_ips,
)
from vit_scale.planning.input_profile import (
    device_spread,
    peak_tflops,
    profile_calibration,
    profile_path,
    read_profile,
)
from vit_scale.planning.input_run import blocking_for, run_precision, scenario_of_run
from vit_scale.planning.scenario import Scenario, baseline_nodes
from vit_scale.planning.spread import DeviceSpread
from vit_scale.planning.step_time import Compute, StepPrediction, predict_step


def choose_calibration(
    check: str | None = None, profile: str | None = None, *, system: str = "", models=(), precisions=()
) -> Calibration:
    """check.json (over the profile's defaults) > the profile's defaults > none."""
    defaults = profile_calibration(profile) if profile else None
    if check:
        return check_calibration(check, system=system, models=models, precisions=precisions, defaults=defaults)
    if defaults is not None:
        return defaults
    return no_calibration(
        f"{os.path.basename(profile)} has no network section" if profile else "no check.json and no system profile"
    )


# ---------------------------------------------------------------- the predictions


def predict(
    points: list, calibration: Calibration, compute: ComputeSource, blocking: bool = False, options: list | None = None
) -> list:
    """One StepPrediction per point (a Scenario), each with its scaling efficiency against the same
    point on its baseline (1 node, or the fewest nodes a group wider than a node fits on: baseline_nodes).
    options: per point, the strategy options' JSON (prefers a compute run of the same series). Where an
    input carries a range (the calibration's, or a measured rung's repeats), each prediction gets its band
    (vit_scale.planning.spread: the predictions with every input at its cheap and at its costly end).
    Raises UserError for a point whose compute source does not fit it."""
    net = calibration.network
    spread_ends = calibration.ends
    banded = spread_ends is not None or compute.has_spread(points, options) or bool(compute.device_spread)
    out, base = [], {}
    for i, sc in enumerate(points):
        opt = options[i] if options else ""
        comp = compute.compute_for(sc, net, opt)
        p = _predict_one(sc, net, comp, blocking, base, "value")
        refunded = _on_budget(p, sc, comp, compute.device_spread, blocking)
        if refunded is not None:
            p = _predict_one(sc, net, refunded, blocking, base, "value", base_comp=comp)
        if banded:
            at_ends = []
            for costly in (False, True):
                end_net = spread_ends[costly] if spread_ends else net
                comp = compute.compute_for(sc, end_net, opt, end=costly if compute.origin else None)
                varied = compute.varied(comp, sc, costly)
                if costly and blocking and compute.device_spread.budget:
                    dear = predict_step(sc, end_net, varied, blocking)
                    varied = _on_budget(dear, sc, varied, compute.device_spread, blocking, costly=True) or varied
                at_ends.append(_predict_one(sc, end_net, varied, blocking, base, costly, base_comp=comp))
            spread.band(p, at_ends)
        first = p.baseline_nodes
        if first > 1:
            p.rules = p.rules + [
                f"baseline: {first} nodes, the fewest {sc.strategy} fits on ({sc.gpus_per_node} GPUs a node); "
                "efficiency against it"
            ]
        p.rules = p.rules + [f"calibration: {calibration.describe()}"]
        out.append(p)
    return out


def _on_budget(
    p: StepPrediction, sc: Scenario, comp: Compute, devices: DeviceSpread, blocking: bool, costly: bool = False
):
    """The compute beyond the rung on emulated nodes whose CPU share is a quota (a budget each 100 ms period,
    not a pace): the rung computes back to back at the quota's pace, compute time C; beyond it the ranks wait E
    on blocking collectives (gloo), spend none of the budget meanwhile, and compute faster after.
    The value: over the step a node uses at most its quota, so its compute still takes at least C - E of wall
    time, and at least the cores' own pace, (1 - faster) C: max(C - E, (1 - faster) C).
    The costly end (p predicted with the end's inputs): the budget comes back less evenly than that bound
    assumes (a period's unspent budget is lost at its end), and benchmarks/quota_burst.py measured the compute
    with waits of at least C at up to `burst_share` of C; with shorter waits, on the line from C (no wait) to
    that: C (1 - (1 - burst_share) min(1, E / C)). None where the share is not less than 1 (no quota, no wait,
    the rung itself, or collectives that overlap compute, where E is not idle time)."""
    if not (devices.budget and devices.faster and blocking) or p.breakdown is None or sc.nodes == baseline_nodes(sc):
        return None
    whole = comp.forward_s + comp.backward_s + comp.optimizer_s
    waits = p.breakdown.exposed_intra_s + p.breakdown.exposed_inter_s
    if whole <= 0:
        return None
    if costly:
        share = 1 - (1 - devices.burst_share) * min(1.0, waits / whole)
    else:
        share = max(whole - waits, (1 - devices.faster) * whole) / whole
    if share >= 1:
        return None
    return comp.scaled(share, f"{share:.0%} of it on the quota's budget ({waits * 1e3:.0f} ms of waits a step)")


def _predict_one(
    sc: Scenario, network: Network, comp: Compute, blocking: bool, base: dict, which, base_comp: Compute | None = None
) -> StepPrediction:
    """One point with its efficiency against its baseline's prediction under the same inputs (`which`: the
    value or an end of the ranges; base caches the baselines; base_comp: the baseline's compute where the
    point's is varied from it)."""
    p = predict_step(sc, network, comp, blocking)
    first = baseline_nodes(sc)
    one = dataclasses.replace(sc, nodes=first)
    key = (repr(one), which)
    if key not in base:
        base[key] = p if sc.nodes == first else predict_step(one, network, base_comp or comp, blocking)
    b = base[key]
    p.baseline_nodes = first
    if p.images_per_s_per_gpu is not None and b.images_per_s_per_gpu:
        p.scaling_efficiency = p.images_per_s_per_gpu / b.images_per_s_per_gpu
    return p


__all__ = [
    "CALIBRATIONS",
    "Calibration",
    "ComputeSource",
    "DeviceSpread",
    "MeasuredStep",
    "StepPrediction",
    "blocking_for",
    "check_calibration",
    "choose_calibration",
    "compute_from",
    "compute_from_flops",
    "compute_of",
    "device_spread",
    "efficiencies_from_runs",
    "efficiency_from_runs",
    "measured_step",
    "no_calibration",
    "on_other_devices",
    "peak_tflops",
    "predict",
    "profile_calibration",
    "run_ips",
    "run_precision",
    "profile_path",
    "read_check",
    "read_fits",
    "read_profile",
    "read_step_fits",
    "scenario_of_run",
]
