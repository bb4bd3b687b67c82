"""Each measured point held against its prediction (vit_scale.planning.predict): prediction.csv, the
predicted curves' figure and the report's "Measured against predicted".

Per study directory (the one holding model/strategy/nN/run directories): calibration from its
check-n<N>.json for a run on N nodes when that check ran in the run's Slurm job (what a sweep's job
writes), else its check.json when that check ran in the same allocation as the run (Slurm job id; a
check outside Slurm counts for the runs beside it), else the system profile's defaults, else none;
compute from
the study's own 1-node rung (each strategy its own 1-node run where there is one). The system is
the check's, else read off the device (cpu: local, rocm: frontier, cuda: cuda).

Measured is the point's throughput over wall time (the results table's ips_point: what the figures plot),
and the 1-node rung's compute comes from that same figure, so a rung reproduces itself exactly: a
point whose run gave the compute has role "compute" and no error (it is the input, not a prediction);
every other point has role "predicted". `extrapolated`: a group of the point is larger than any whose
collectives the calibration measured (vit_scale.planning.alpha_beta.Network.extrapolated).

A run that did not fit (status oom or skipped) gets no prediction, and its row says so; a point the
planner predicts not to fit in the device's memory (the start record's device_memory_gib) gets none
either. A point more than 20% below its prediction is explained: where the run was traced, by its exposed
communication measured (analysis/traces.py) against predicted; else by how much each component
(compute, exposed intra-node, exposed inter-node communication) would have to grow to account for
the difference alone. A point whose run had a slow node (results.csv's slow_node, vit_scale.record.health)
keeps its measured and predicted figures but gets no error: its `slow_node` column says why. Torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

import pandas as pd

from vit_scale.errors import UserError
from vit_scale.planning import predict as pr

from .table import point_ips

BELOW = 0.20  # a point this far below its prediction is explained
# a row's role: its step gave the compute of its strategy's predictions (its rung), or it was predicted
COMPUTE, PREDICTED = "compute", "predicted"
CHECK_FILE = "check.json"
NODE_CHECK_FILE = "check-n{nodes}.json"  # a sweep job's check of its own nodes (vit_scale.record.check_file)
NOT_FITTING = {"oom": "the run ran out of memory", "skipped": "the run was skipped as not fitting"}
SYSTEM_OF_DEVICE = {"cpu": "local", "rocm": "frontier", "cuda": "cuda"}
COLUMNS = [
    "study",
    "model",
    "series",
    "strategy",
    "nodes",
    "world_size",
    "ranks_per_node",
    "batch_per_device",
    "precision",
    "status",
    "role",
    "extrapolated",
    "measured_ips",
    "predicted_ips",
    "predicted_ips_low",
    "predicted_ips_high",
    "inside_band",
    "error",
    "predicted_efficiency",
    "measured_step_ms",
    "predicted_step_ms",
    "predicted_compute_ms",
    "predicted_optimizer_ms",
    "predicted_exposed_intra_ms",
    "predicted_exposed_inter_ms",
    "traced_exposed_ms",
    "calibration",
    "calibration_source",
    "compute_source",
    "explanation",
    "slow_node",
    "path",
]


@dataclass
class Predictions:
    rows: pd.DataFrame  # prediction.csv
    calibrations: list = field(default_factory=list)  # one line per calibration used: what and where
    notes: list = field(default_factory=list)  # points not predicted, checks not used, and why


def _num(x) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def study_dir(run_dir: str) -> str:
    """The study directory of a run: the nearest of its four ancestors with a check.json, else the fourth
    (STUDY/model/strategy/nN/RUN, as vit-scale study lays runs out)."""
    probe = run_dir
    for _ in range(4):
        probe = os.path.dirname(probe)
        if os.path.isfile(os.path.join(probe, CHECK_FILE)):
            return probe
    return probe


def _read_check(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    try:
        return pr.read_check(path)
    except UserError:
        return {}


def _job_of(check: dict | None):
    slurm = (check or {}).get("slurm")
    return slurm.get("job_id") if isinstance(slurm, dict) else None


def _check_for(directory: str, nodes, job) -> tuple[str, dict | None]:
    """The check a run on `nodes` nodes in Slurm job `job` is calibrated by: the study's check-n<N>.json
    when that check ran in the run's own job, else its check.json."""
    if nodes is not None and job is not None:
        path = os.path.join(directory, NODE_CHECK_FILE.format(nodes=nodes))
        check = _read_check(path)
        if check and _job_of(check) is not None and str(_job_of(check)) == str(job):
            return path, check
    path = os.path.join(directory, CHECK_FILE)
    return path, _read_check(path)


class _Calibrations:
    """One Calibration per (study directory, system, model, precision, same allocation), with the notes
    of checks not used."""

    def __init__(self):
        self.cache, self.notes, self.systems = {}, [], {}

    def for_run(self, run, directory: str) -> pr.Calibration:
        world = run.start.get("world") or {}
        job = (run.start.get("slurm") or {}).get("job_id")
        path, check = _check_for(directory, world.get("nodes"), job)
        system = (check or {}).get("system") or SYSTEM_OF_DEVICE.get(world.get("device_type"), "local")
        if not isinstance(system, str):  # a hand-edited check.json: its check_calibration says why
            system = SYSTEM_OF_DEVICE.get(world.get("device_type"), "local")
        self.systems[run.run_dir] = system
        check_job = _job_of(check)
        same = check is not None and (check_job is None or job is None or str(check_job) == str(job))
        model, precision = run.start["model"]["name"], pr.run_precision(run.start)
        key = (path, system, model, precision, same)
        if key not in self.cache:
            self.cache[key] = self._make(path, check, system, model, precision, same, check_job)
        return self.cache[key]

    def _make(self, path, check, system, model, precision, same, check_job) -> pr.Calibration:
        try:
            profile = pr.profile_calibration(pr.profile_path(system))
        except UserError as exc:
            profile = None
            self._note(f"{system}: no profile defaults ({exc})")
        if check == {}:
            self._note(f"{path} not used: it cannot be read as a check.json")
        elif check is not None and not same:
            self._note(f"{path} not used for runs outside its allocation (Slurm job {check_job})")
        elif check is not None:
            try:
                return pr.check_calibration(
                    path, system=system, models=[model], precisions=[precision], defaults=profile, check=check
                )
            except UserError as exc:
                self._note(f"{path} not used for {model} in {precision}: {exc}")
        return profile if profile is not None else pr.no_calibration(f"no check.json and no {system} profile defaults")

    def device_spread(self, run) -> pr.DeviceSpread:
        """The device_spread of the system for_run found for the run (none where its profile gives none)."""
        system = self.systems.get(run.run_dir, "local")
        try:
            return pr.device_spread(pr.profile_path(system)) or pr.DeviceSpread()
        except UserError as exc:
            self._note(f"{system}: no device spread ({exc})")
            return pr.DeviceSpread()

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _options(run) -> str:
    return json.dumps((run.start.get("strategy") or {}).get("options") or {}, sort_keys=True, default=str)


def _traced(breakdown: pd.DataFrame | None) -> dict:
    """run directory -> mean exposed communication (ms) over its traced ranks."""
    if breakdown is None or breakdown.empty:
        return {}
    means = breakdown.groupby("run_dir")["comm_exposed_ms"].mean()
    return {os.path.normpath(k): float(v) for k, v in means.items()}


def _compute_source(directory: str, group: list, medians: dict) -> pr.ComputeSource:
    """The study's measured steps, one per point: its kept run's record with the step the point's median
    gives (global batch / ips_point), not that run's own; a run set aside (a repetition
    pooled into its point, or an older failure) is not a step of its own. medians: kept run directory ->
    its point's median."""
    kept = [r for r in group if os.path.normpath(r.run_dir) in medians]
    source = pr.compute_from(directory, runs=kept)
    steps = []
    for step in source.steps:
        median = medians[os.path.normpath(step.run_dir)]
        sc = step.scenario
        steps.append(dataclasses.replace(step, step_s=sc.batch_size * sc.world / median) if median > 0 else step)
    return dataclasses.replace(source, steps=steps)


def build(runs: list, results: pd.DataFrame, breakdown: pd.DataFrame | None = None) -> Predictions:
    """A prediction for every row of the results table whose run record is among `runs`."""
    by_path = {os.path.normpath(r.path): r for r in runs}
    ips = point_ips(results) if not results.empty else pd.Series(dtype=float)
    # run directory of each kept run -> its point's median images/s
    medians = {
        os.path.normpath(os.path.dirname(str(results.at[i, "path"]))): float(v)
        for i, v in ips.items()
        if not math.isnan(v)
    }
    traced = _traced(breakdown)
    cals = _Calibrations()
    sources: dict = {}
    notes: list = []
    rows = []
    for _, row in results.iterrows():
        run = by_path.get(os.path.normpath(str(row["path"])))
        if run is None:
            continue
        directory = study_dir(run.run_dir)
        label = f"{row['model']} {row['series']} on {int(row['nodes'])} node(s)"
        try:
            cal = cals.for_run(run, directory)
            if directory not in sources:
                group = [r for r in runs if study_dir(r.run_dir) == directory]
                sources[directory] = _compute_source(directory, group, medians)
                sources[directory].device_spread = cals.device_spread(run)
            sc = pr.scenario_of_run(run.start)
            world = run.start.get("world") or {}
            blocking = pr.blocking_for(world.get("backend"), world.get("device_type"))
            p = pr.predict([sc], cal, sources[directory], blocking, options=[_options(run)])[0]
            rung = sources[directory].step_for(sc, _options(run)).run_dir
        except (UserError, ValueError, TypeError, KeyError) as exc:
            # a record the planner cannot place (a label it does not know, a malformed option): the
            # point goes unpredicted and the report says why; the rest of the analysis goes on
            notes.append(f"{label}: not predicted: {exc}")
            continue
        measured = medians.get(os.path.normpath(run.run_dir), math.nan) if row["status"] == "ok" else math.nan
        out = _row(row, measured, sc, p, cal, traced.get(os.path.normpath(run.run_dir)))
        if os.path.normpath(rung) == os.path.normpath(run.run_dir):
            # the point whose step gave the compute reproduces itself by construction: not a prediction
            out.update(role=COMPUTE, error=math.nan, explanation="", inside_band=None)
        slow = row.get("slow_node")
        if isinstance(slow, str) and slow and out["role"] == PREDICTED:
            # its figure is that node's, not the strategy's: measured and predicted stay, no error or band
            # coverage is drawn from it
            out.update(error=math.nan, explanation="", slow_node=slow, inside_band=None)
        why = _not_predicted(row["status"], p, sc)
        if why:
            # no speed drawn over a failure mark (analysis/figures/predicted.py draws predicted_ips)
            for k in [c for c in COLUMNS if c.startswith("predicted_")] + ["error"]:
                out[k] = math.nan
            out["inside_band"] = None
            out["explanation"] = why
        rows.append(out)
    df = pd.DataFrame(rows, columns=COLUMNS)
    used = []
    for cal in {id(c): c for c in cals.cache.values()}.values():
        line = cal.describe()
        if line not in used:
            used.append(line)
    return Predictions(df, used, cals.notes + notes)


def _not_predicted(status: str, p, sc) -> str:
    """Why a point gets no predicted speed ("" when it gets one)."""
    if status in NOT_FITTING:
        return (
            f"not predicted: {NOT_FITTING[status]} (status {status}); a speed is predicted only for a point that fits"
        )
    if p.fits is False:
        return (
            f"not predicted: the planner predicts it does not fit in the device's {sc.device_memory_gib:.4g} GiB "
            f"(the start record's device_memory_gib)"
        )
    return ""


def _row(row, measured: float, sc, p, cal, traced_ms) -> dict:
    """prediction.csv's row of one point; measured: its median images/s (NaN unless ok)."""
    b = p.breakdown
    predicted = _num(p.images_per_s)
    world = sc.world

    def ms(x):
        return x * 1e3 if x is not None else math.nan

    out = {
        "study": row["study"],
        "model": row["model"],
        "series": row["series"],
        "strategy": row["strategy"],
        "nodes": int(row["nodes"]),
        "world_size": int(row["world_size"]),
        "ranks_per_node": sc.gpus_per_node,
        "batch_per_device": int(row["batch_per_device"]),
        "precision": sc.precision,
        "status": row["status"],
        "role": PREDICTED,
        "extrapolated": bool(p.extrapolated),
        "measured_ips": measured,
        "predicted_ips": predicted,
        # the 90% band from the calibration's ranges and the rung's repeats (vit_scale.planning.spread); NaN
        # where no input carries a range
        "predicted_ips_low": _num(p.band["images_per_s"][0]) if p.band and p.band["images_per_s"] else math.nan,
        "predicted_ips_high": _num(p.band["images_per_s"][1]) if p.band and p.band["images_per_s"] else math.nan,
        "inside_band": None,
        # rounded, and + 0.0 so that a rung that reproduces itself reads +0.0%, not -0.0%
        "error": round(measured / predicted - 1, 9) + 0.0 if predicted and not math.isnan(measured) else math.nan,
        "predicted_efficiency": _num(p.scaling_efficiency),
        "measured_step_ms": sc.batch_size * world / measured * 1e3 if measured > 0 else math.nan,
        "predicted_step_ms": ms(b.step_s) if b else math.nan,
        "predicted_compute_ms": ms(b.forward_s + b.backward_s) if b else math.nan,
        # no compute source times the optimizer apart (it is inside compute): empty, not a predicted 0
        "predicted_optimizer_ms": ms(b.optimizer_s) if b and b.optimizer_s else math.nan,
        "predicted_exposed_intra_ms": ms(b.exposed_intra_s) if b else math.nan,
        "predicted_exposed_inter_ms": ms(b.exposed_inter_s) if b else math.nan,
        "traced_exposed_ms": traced_ms if traced_ms is not None else math.nan,
        "calibration": cal.label,
        "calibration_source": cal.source,
        "compute_source": p.compute_source,
        "explanation": "",
        "slow_node": "",
        "path": row["path"],
    }
    if not math.isnan(out["predicted_ips_low"]) and not math.isnan(measured):
        out["inside_band"] = bool(out["predicted_ips_low"] <= measured <= out["predicted_ips_high"])
    busy = b.communication_s if b else {}
    out["explanation"] = explain(out, busy, cal.kind)
    return out


def explain(r: dict, busy: dict, calibration: str = "profile") -> str:
    """For a point more than BELOW under its prediction: where the missing time is. busy: the predicted
    communication per scope, hidden or not (which scopes the strategy communicates in)."""
    if not (r["error"] < -BELOW):
        return ""
    gap = r["measured_step_ms"] - r["predicted_step_ms"]
    head = (
        f"{-r['error']:.0%} below its prediction: the step took {r['measured_step_ms']:.4g} ms against "
        f"{r['predicted_step_ms']:.4g} ms predicted ({gap:+.4g} ms)"
    )
    predicted_exposed = r["predicted_exposed_intra_ms"] + r["predicted_exposed_inter_ms"]
    if not math.isnan(r["traced_exposed_ms"]):
        diff = r["traced_exposed_ms"] - predicted_exposed
        share = max(0.0, min(1.0, diff / gap)) if gap > 0 else 0.0
        return (
            f"{head}; traced: exposed communication {r['traced_exposed_ms']:.4g} ms measured against "
            f"{predicted_exposed:.4g} ms predicted ({diff:+.4g} ms, {share:.0%} of the difference); the rest "
            f"({gap - max(diff, 0.0):.4g} ms) is compute, memory copies or idle time (time_breakdown.csv)"
        )
    parts = [_grow("compute", r["predicted_compute_ms"], gap)]
    if calibration == "none":
        scopes = {"intra": r["ranks_per_node"] > 1, "inter": r["nodes"] > 1}
    else:
        scopes = {s: busy.get(s, 0.0) > 0 for s in ("intra", "inter")}
    for scope, words in (("intra", "exposed intra-node communication"), ("inter", "exposed inter-node communication")):
        if scopes[scope]:
            parts.append(_grow(words, r[f"predicted_exposed_{scope}_ms"], gap))
    return f"{head}; not traced: to account for it alone, " + ", or ".join(parts)


def _grow(what: str, now_ms: float, gap_ms: float) -> str:
    then = now_ms + gap_ms
    if now_ms > 0:
        return f"{what} would have to grow {then / now_ms:.2f}x ({now_ms:.4g} -> {then:.4g} ms)"
    return f"{what} would have to grow from 0 to {then:.4g} ms"
