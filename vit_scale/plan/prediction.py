"""The plan's prediction (with --system): each row's predicted step and speed from
vit_scale.planning.predict, the calibration and compute it used, and the strategies not worth running."""

from __future__ import annotations

import os

from vit_scale.errors import UserError
from vit_scale.planning import spread
from vit_scale.planning.compute import LABEL, read_compute, why_not

from .options import DEFAULT_EFFICIENCY

OPTIMIZER_NOTE = "not modelled: inside compute"  # no compute source times the optimizer step apart
NOT_WORTH = 0.5  # a strategy below this share of the best at the largest node count


def predict_rows(args, rows: list, scenarios: list) -> dict:
    """Each row's prediction (row["prediction"]) and what they share: the calibration, the compute
    source and the strategies predicted not worth running. Bad input raises UserError, before anything
    is written."""
    from vit_scale.planning import predict as pr

    profile = pr.profile_path(args.system)
    models = list(dict.fromkeys(r["model"] for r in rows))
    cal = pr.choose_calibration(
        args.calibration, profile, system=args.system, models=models, precisions=[args.precision]
    )
    if args.compute_from is not None:
        compute = pr.compute_from(args.compute_from)
        compute_text = (
            f"measured run: {compute.describe()}, each point's compute its 1-node step less the "
            f"communication predicted exposed there"
        )
    elif args.efficiency is None and args.efficiency_from is None and (gemms := _check_gemms(args)):
        # the check's GEMMs at the points' shapes; a point they do not cover takes the flat default
        compute = pr.ComputeSource(
            peak=pr.peak_tflops(profile, args.precision), efficiency=DEFAULT_EFFICIENCY, gemms=gemms
        )
        compute_text = f'{compute.describe()} (docs/plan.md, "Compute from the check\'s GEMMs")'
    else:
        efficiency, stated = _efficiency(args)
        compute = pr.compute_from_flops(pr.peak_tflops(profile, args.precision), efficiency, os.path.basename(profile))
        if args.efficiency_from is not None:
            # an MFU is its own model's: each point takes the median of its model's runs
            from vit_scale.record import reader

            compute.efficiencies = pr.efficiencies_from_runs(reader.collect([args.efficiency_from]).runs)
        compute_text = f"FLOPs x peak x efficiency: {compute.describe()} ({stated})"
    compute.device_spread = pr.device_spread(profile) or compute.device_spread
    blocking = pr.blocking_for(None, args.device)
    notes, by_model, curves = [], {}, {}
    predictions = pr.predict(scenarios, cal, compute, blocking)
    for row, sc, p in zip(rows, scenarios, predictions, strict=True):
        row["prediction"] = p.as_dict()
        if p.band is not None:
            curve = curves.setdefault((sc.model, sc.strategy), {})
            curve[sc.nodes] = None if p.images_per_s_per_gpu is None else (p.images_per_s_per_gpu, *p.end_ips)
        row["prediction"]["compute_from"] = by_model[sc.model] = compute_label(args, compute, sc)
        if compute.gemms and not compute.origin:
            why = why_not(compute.gemms, sc)
            if why and why not in notes:
                notes.append(why)
        step = row["prediction"]["step"]
        if step is not None and not step["optimizer_s"]:
            # no compute source times the optimizer apart (a measured step holds it, the FLOPs' efficiency
            # absorbs it): null, not a predicted 0
            step["optimizer_s"], step["optimizer"] = None, OPTIMIZER_NOTE
    return {
        "system": args.system,
        "calibration": {
            "kind": cal.kind,
            "label": cal.label,
            "source": cal.source,
            "notes": list(cal.notes),
            "text": cal.describe(),
        },
        "compute": {
            "kind": compute.kind,
            "text": compute_text + "".join(f"; {n}" for n in notes),
            "by_model": by_model,
            "notes": notes,
        },
        "interval": interval(cal, compute, any(p.band is not None for p in predictions)),
        "crossings": spread.crossings(curves),
        "not_worth_running": not_worth_running(rows),
        "rule": (
            f"not worth running: at the largest node count planned, the strategy does not fit, or its "
            f"predicted images/s is below {NOT_WORTH:.0%} of the best strategy's for the same model"
        ),
    }


def interval(cal, compute, banded: bool) -> dict:
    """What the rows' *_low / *_high are and where their spread comes from (`banded`: whether any row has
    a band), in a few words."""
    if not banded:
        return {"level": None, "method": None, "text": cal.spread_text()}
    inputs = cal.spread_text() if cal.network.ranges else "the calibration's figures carry no range"
    measured = "; compute: the fastest and slowest repeat of each measured rung" if compute.origin else ""
    if compute.device_spread:
        measured += f"; beyond the baseline, {compute.device_spread.text()} (device_spread)"
    return {
        "level": spread.LEVEL,
        "method": "bounds",
        "text": (
            f"{spread.LEVEL:.0%} band: every input at its cheap end and at its costly end ({inputs}{measured}; "
            'docs/plan.md, "How sure a prediction is")'
        ),
    }


def _check_gemms(args) -> dict:
    """--calibration's GEMM timings (check.json's compute), by (model, precision, batch); {} without."""
    if args.calibration is None:
        return {}
    from vit_scale.planning import predict as pr

    return read_compute(pr.read_check(args.calibration), args.calibration)


def compute_label(args, compute, sc) -> str:
    """Where a point's compute came from, in a few words (the row's prediction.compute_from)."""
    if compute.origin:
        return "1-node rung"
    if compute.gemms and why_not(compute.gemms, sc) is None:
        return LABEL
    if sc.model in compute.efficiencies:
        return "the model's recorded MFU (--efficiency-from)"
    if args.efficiency_from is not None:
        return "the median recorded MFU (--efficiency-from)"
    if args.efficiency is not None:
        return f"{compute.efficiency:.0%} of peak (--efficiency)"
    return f"flat {compute.efficiency:.0%} of peak (not derived)"


def _efficiency(args) -> tuple[float, str]:
    """The FLOPs' efficiency and where it came from: --efficiency, the median MFU of --efficiency-from's
    run records, else DEFAULT_EFFICIENCY, assumed."""
    from vit_scale.planning import predict as pr
    from vit_scale.record import reader

    if args.efficiency is not None:
        return args.efficiency, "--efficiency"
    if args.efficiency_from is not None:
        if not os.path.isdir(args.efficiency_from):
            raise UserError(
                f"--efficiency-from: {args.efficiency_from} is not a directory; expected a run or study directory"
            )
        runs = reader.collect([args.efficiency_from]).runs
        mfu = pr.efficiency_from_runs(runs)
        if mfu is None:
            raise UserError(
                f"--efficiency-from: {args.efficiency_from} holds no ok run that recorded an MFU; expected run "
                f"records of vit-scale train (their end record's mfu)"
            )
        n = sum(1 for r in runs if r.status == "ok" and isinstance((r.end or {}).get("mfu"), (int, float)))
        return mfu, f"the median MFU of {n} run(s) in {args.efficiency_from}"
    return DEFAULT_EFFICIENCY, "assumed; --efficiency F states another, --compute-from RUNDIR measures it"


def not_worth_running(rows: list, share: float = NOT_WORTH) -> list:
    """Per model, at its largest node count: the strategies that do not fit there, or whose predicted
    images/s is below `share` of the best strategy's (rows with a "prediction")."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model and "prediction" in r]
        if not mine:
            continue
        largest = max(r["nodes"] for r in mine)
        last = [r for r in mine if r["nodes"] == largest]
        speeds = {r["strategy"]: r["prediction"]["images_per_s"] for r in last}
        known = {k: v for k, v in speeds.items() if v}
        best = max(known, key=known.get) if known else None
        for r in last:
            ips = speeds[r["strategy"]]
            if r["prediction"]["fits"] is False or not ips:
                why = f"does not fit on {largest} node(s)"
            elif best and ips < share * known[best]:
                why = f"{ips / known[best]:.0%} of {best}'s images/s on {largest} node(s)"
            else:
                continue
            out.append({"model": model, "strategy": r["strategy"], "why": why})
    return out
