"""The figures of benchmarks/gpu_acceptance.py beside their bars: what its commands left (run records,
check.json, the overhead benchmark's and trace_vs_hta.py's JSON) read and turned into measurement
rows. Pure functions on dicts, no torch, so that they are tested on made records
(tests/test_gpu_acceptance.py).

A row: {step, name, value, unit, bar, pass, ...details}; pass is True/False against the bar, None
where there is no bar or nothing was measured (then `note` says why).
"""

from __future__ import annotations

import glob
import json
import os
import statistics

OVERHEAD_BAR = 0.97  # trainer / bare loop, issue 12
MEMORY_BAR = 0.05  # |predicted / measured - 1|, issue 39
METER_FLOOR = 0.90  # vit-scale check's own bar for its meter overhead line (vit_scale/check/meter.py)
TIMING_BAR = 0.05  # event-timed against host-synchronised mean step time (vit_scale/check/meter.py)
PAIRS = ("DDP", "NO_SHARD", "FULL_SHARD", "SHARD_GRAD_OP", "FSDP2")
TORCH_LABELS = ("DDP", "NO_SHARD", "FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_1GPU")
OPTIONAL_LABELS = {
    "deepspeed": ("ZERO1", "ZERO2", "ZERO3", "ZEROPP"),
    "colossalai": ("CAI_DDP", "CAI_DDP_FP16", "CAI_LOW_LEVEL_ZERO", "CAI_GEMINI", "CAI_FSDP"),
}
PRECISIONS = ("bf16", "fp32", "fp16")  # bf16 first: the check's GEMM line and meter are in the first


# ---------------------------------------------------------------- reading what the commands left


def read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_record(run_dir: str | None) -> dict | None:
    """A run's metrics.jsonl (docs/run_record.md) as {start, steps, end}; None without one."""
    if not run_dir:
        return None
    record: dict = {"start": None, "steps": [], "end": None}
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                if event.get("event") == "step":
                    record["steps"].append(event)
                elif event.get("event") in ("start", "end"):
                    record[event["event"]] = event
    except OSError:
        return None
    return record


def find_run(work: str, study: str, run_id: str) -> str | None:
    """The run directory the trainer made for output.run_id (a suffix is added if the id was taken)."""
    found = sorted(glob.glob(os.path.join(work, study, "*", "*", "*", f"{run_id}*", "metrics.jsonl")))
    return os.path.dirname(found[-1]) if found else None


def nested(obj, *keys):
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


# ---------------------------------------------------------------- measurement rows (pure)


def row(step: str, name: str, value, unit: str, bar: str, passed, **details) -> dict:
    """One figure beside its bar. passed: True/False against the bar, None where there is no bar or
    nothing was measured (then `details` says why)."""
    return {"step": step, "name": name, "value": value, "unit": unit, "bar": bar, "pass": passed, **details}


def not_measured(step: str, name: str, bar: str, why: str) -> dict:
    return row(step, name, None, "", bar, None, note=why)


def ratio_row(label: str, bare_ips: list, trainer_records: list) -> dict:
    """trainer/bare for one strategy: each round's trainer images/s (its record's end.images_per_s.mean)
    over the same round's bare loop, the median over rounds, against OVERHEAD_BAR."""
    bar = f">= {OVERHEAD_BAR}"
    name = f"trainer/bare {label}"
    trainer_ips = [nested(r, "end", "images_per_s", "mean") for r in trainer_records]
    pairs = [(t, b) for t, b in zip(trainer_ips, bare_ips, strict=False) if t and b]
    if not pairs:
        return not_measured("overhead", name, bar, "no round has both a bare loop's and a trainer record's images/s")
    ratios = [t / b for t, b in pairs]
    ratio = statistics.median(ratios)
    return row(
        "overhead",
        name,
        round(ratio, 4),
        "ratio",
        bar,
        ratio >= OVERHEAD_BAR,
        rounds=[round(x, 4) for x in ratios],
        bare_images_per_s=round(statistics.median(b for _, b in pairs), 2),
        trainer_images_per_s=round(statistics.median(t for t, _ in pairs), 2),
    )


def memory_rows(label: str, planned: dict | None, records: list) -> list:
    """The planner's peak allocated (and peak active, where both the plan and the record have it)
    against the trainer's measured peak, the median over its runs, against MEMORY_BAR."""
    bar = f"within {MEMORY_BAR:.0%}"
    out = []
    for measure in ("peak_allocated_gib", "peak_active_gib"):
        name = f"{measure.removesuffix('_gib').replace('_', ' ')} {label}"
        predicted = (planned or {}).get(measure)
        measured = [nested(r, "end", "memory", measure, "max") for r in records]
        measured = [m for m in measured if m]
        if predicted is None or not measured:
            if measure == "peak_active_gib":
                side = "vit-scale plan --json" if predicted is None else "the trainer's end record"
                why = f"{side} has no {measure} in this checkout: peak allocated compared alone"
            else:
                why = "no plan row" if predicted is None else "no measured peak in the overhead step's records"
            out.append(not_measured("memory", name, bar, why))
            continue
        value = statistics.median(measured)
        error = predicted / value - 1
        out.append(
            row(
                "memory",
                name,
                round(error, 4),
                "relative error",
                bar,
                abs(error) <= MEMORY_BAR,
                predicted_gib=predicted,
                measured_gib=round(value, 4),
                start_record_plan_gib=nested(records[0], "start", "plan", measure) if records else None,
            )
        )
    return out


def compile_rows(eager: dict | None, compiled: dict | None) -> list:
    """First-step time, images/s and MFU of vit_huge compiled against eager; the compile bar is that
    no graph was made inside the timed window (else its images/s include a compilation)."""
    names = ("first step", "images/s compiled/eager", "MFU", "graphs in the timed window")
    if not (eager and eager["end"] and compiled and compiled["end"]):
        which = "eager" if not (eager and eager["end"]) else "compiled"
        return [not_measured("compile", n, "", f"the {which} run left no end record") for n in names]
    e_end, c_end = eager["end"], compiled["end"]
    e_first = eager["steps"][0]["step_time_s"] if eager["steps"] else None
    c_first = nested(c_end, "compile", "first_step_s")
    e_ips, c_ips = nested(e_end, "images_per_s", "mean"), nested(c_end, "images_per_s", "mean")
    in_window = nested(c_end, "compile", "graphs_in_window")
    return [
        row("compile", "first step", c_first, "s", "reported", None, eager_first_step_s=e_first),
        row(
            "compile",
            "images/s compiled/eager",
            round(c_ips / e_ips, 4) if c_ips and e_ips else None,
            "ratio",
            "reported",
            None,
            compiled_images_per_s=c_ips,
            eager_images_per_s=e_ips,
            statuses=[e_end.get("status"), c_end.get("status")],
        ),
        row("compile", "MFU", c_end.get("mfu"), "share of peak", "reported", None, eager_mfu=e_end.get("mfu")),
        row(
            "compile",
            "graphs in the timed window",
            in_window,
            "graphs",
            "0",
            None if in_window is None else in_window == 0,
            graphs=nested(c_end, "compile", "graphs"),
        ),
    ]


def check_rows(check: dict | None, installed: dict) -> list:
    """From check.json: each precision's GEMM line, the meter's three lines and every label's."""
    if not check:
        return [not_measured("check", "check.json", "", "the check wrote no check.json")]
    out = []
    for e in nested(check, "compute", "entries") or []:
        eff = e.get("efficiency")
        out.append(
            row(
                "check",
                f"compute {e['precision']}",
                e.get("achieved_tflops"),
                "TFLOP/s",
                "timed, below the dense peak",
                None if eff is None else 0 < eff <= 1,
                efficiency=eff,
                peak_tflops=e.get("peak_tflops"),
                seconds=e.get("seconds"),
            )
        )
    if nested(check, "compute", "error"):
        out.append(row("check", "compute", None, "", "timed", False, error=check["compute"]["error"]))
    out += meter_rows(nested(check, "facts", "meter"))
    out += label_rows(nested(check, "facts", "strategies") or [], installed)
    return out


def meter_rows(meter: dict | None) -> list:
    names = ("meter overhead", "meter timing", "meter memory")
    if not meter or meter.get("error"):
        why = (meter or {}).get("error") or "no meter figures in check.json"
        return [not_measured("check", n, "", why) for n in names]
    mem = meter.get("memory_error")
    return [
        row(
            "check",
            "meter overhead",
            meter["ratio"],
            "ratio",
            f">= {METER_FLOOR}",
            meter["ratio"] >= METER_FLOOR,
            bare_images_per_s=meter["bare_images_per_s"],
            trainer_images_per_s=meter["trainer_images_per_s"],
        ),
        row(
            "check",
            "meter timing",
            meter["timing_difference"],
            "relative difference",
            f"within {TIMING_BAR:.0%}",
            abs(meter["timing_difference"]) <= TIMING_BAR,
            event_step_s=meter["event_step_s"],
            host_step_s=meter["host_step_s"],
        ),
        row(
            "check",
            "meter memory",
            mem,
            "relative error",
            f"within {MEMORY_BAR:.0%}",
            None if mem is None else abs(mem) <= MEMORY_BAR,
            predicted_gib=meter.get("predicted_peak_gib"),
            measured_gib=meter.get("measured_peak_gib"),
        ),
    ]


def label_rows(strategies: list, installed: dict) -> list:
    """Every label in every precision: it ran (ok, replicas agreeing) or was refused in one line."""
    bar = "ok, or refused in one line"
    seen = {(r["label"], r["precision"]): r for r in strategies}
    out = []
    for label in (*TORCH_LABELS, *(x for labels in OPTIONAL_LABELS.values() for x in labels)):
        package = next((p for p, labels in OPTIONAL_LABELS.items() if label in labels), None)
        for precision in PRECISIONS:
            name = f"{label} {precision}"
            if package and not installed.get(package):
                out.append(not_measured("check", name, bar, f"{package} not installed"))
                continue
            r = seen.get((label, precision))
            if r is None:
                out.append(not_measured("check", name, bar, "not run by the check (its time limit?)"))
                continue
            error = r.get("error") or ""
            if r["status"] == "refused":
                passed = bool(error) and "\n" not in error.strip()
            else:
                passed = r["status"] == "ok" and r.get("replicas_agree") is not False
            out.append(row("check", name, r["status"], "status", bar, passed, error=error or None))
    return out


def profile_rows(found: dict | None) -> list:
    if not found:
        return [
            not_measured("profile", "breakdown", "", "no trace_vs_hta.json: the profiled run or its reading failed")
        ]
    breakdown = found.get("breakdown")
    if breakdown:
        out = [row("profile", "breakdown: step", breakdown["step_ms"], "ms", "reported", None, **breakdown)]
    else:
        out = [not_measured("profile", "breakdown: step", "reported", "no vit_scale.step# ranges in the trace")]
    hta = found.get("hta") or {}
    if hta.get("error"):
        out.append(not_measured("profile", "against HTA", "", f"HTA: {hta['error']}"))
    for name, c in (found.get("comparison") or {}).items():
        value = c.get("difference", c.get("difference_of_kernel_time", c.get("difference_points")))
        details = {k: v for k, v in c.items() if k not in ("bar", "pass")}
        out.append(row("profile", f"{name} against HTA", value, "difference", c["bar"], c["pass"], **details))
    return out
