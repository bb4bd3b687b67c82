"""report.md and report.html: the tables, figures, best runs and failures of a study.

The report is built once as a list of blocks (heading, paragraph, table, image, list) and
rendered twice, so the Markdown a user pastes into a paper draft and the HTML they open in a
browser (images inline, one self-contained file to attach to a ticket) never disagree.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import math
import os
import re
from dataclasses import dataclass, field

import pandas as pd

from vit_scale.record.health import SLOW_SHARE
from vit_scale.record.reader import Collection

from . import stats
from . import table as tbl


@dataclass
class Block:
    kind: str  # h1 h2 h3 p table img ul
    text: str = ""
    header: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    items: list = field(default_factory=list)


# ---------------------------------------------------------------------------- formatting


def _f(value, fmt: str = "{:.4g}", missing: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return fmt.format(value)


def _s(value) -> str:
    """Text of a possibly missing cell: None and NaN (pandas turns one into the other) are blank."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _pct(value) -> str:
    return _f(value, "{:.0%}") if not isinstance(value, str) else value


def _one_line(text, limit: int = 160) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_counts(df: pd.DataFrame) -> str:
    counts = df["status"].value_counts()
    order = ["ok", "oom", "timeout", "failed", "diverged", "skipped", "incomplete"]
    keys = [k for k in order if k in counts] + sorted(k for k in counts.index if k not in order)
    return ", ".join(f"{counts[k]} {k}" for k in keys)


# ----------------------------------------------------------------------------- sections


METHOD_SHORT = {stats.WITHIN_RUN: "within-run", stats.T_LOG_RUNS: "t over runs"}
TEST_SHORT = {stats.PAIRED: "paired t", stats.WELCH: "Welch t"}


def _ratio_text(r) -> str:
    """'1.102 (1.051–1.155, paired t, 95%): separated', or '1.031: one run each: not compared'."""
    ratio, test = r.get("ratio"), r.get("ratio_test")
    if ratio is None or pd.isna(ratio):
        return ""
    if test not in TEST_SHORT:
        return f"{ratio:.3f}: {_s(test)}"
    return f"{ratio:.3f} ({r['ratio_low']:.3f}–{r['ratio_high']:.3f}, {TEST_SHORT[test]}, 95%): {r['verdict']}"


def _ci_text(r) -> str:
    """'194.2–205.8 (within-run)' or '796.0–812.9 (t over runs)': the interval and its method."""
    if pd.isna(r.get("ips_ci_low")) or pd.isna(r.get("ips_ci_high")):
        return ""
    high = "∞" if math.isinf(r["ips_ci_high"]) else f"{r['ips_ci_high']:,.1f}"
    method = METHOD_SHORT.get(r.get("ips_ci_method"), _s(r.get("ips_ci_method")))
    return f"{r['ips_ci_low']:,.1f}–{high} ({method})"


def _runs_text(r) -> str:
    """'3 of 3 ok', with the runs marked not steady after it ('; 1 not steady')."""
    ok, planned = r.get("ips_runs"), r.get("ips_runs_planned")
    if ok is None or pd.isna(ok):
        return ""
    text = f"{int(ok)} of {int(planned if not pd.isna(planned) else ok)} ok"
    drifting = r.get("ips_not_steady")
    if drifting is not None and not pd.isna(drifting) and drifting > 0:
        text += f"; {int(drifting)} not steady"
    return text


def _statistics_text(results: pd.DataFrame) -> str:
    """What the images/s, intervals and ratios of the best-run table rest on (docs/analysis.md, Statistics)."""
    ok = tbl.usable(results)
    runs = sorted({int(n) for n in ok["ips_runs"].dropna()}) if "ips_runs" in ok else []
    text = (
        "Statistics: images/s is throughput over wall time (a run's timed images over its timed window's "
        "seconds, so stalled steps count in full; with repeated runs the geometric mean of the runs'), with "
        "the median step rate and the share of steps slower than twice their run's median beside it. "
        "Intervals, nominal 95%: over repeated runs (t over runs) the t interval of the mean log throughput "
        "of the runs, which covers the point's typical throughput; for a point that ran once (within-run) "
        "batch means of that run's step times, which says how precisely its steps fix that run's throughput "
        "and nothing of how a second run would differ. The ratio to the next best is of the two points' "
        "throughputs, its 95% interval from a t test on the log run throughputs (paired t on the repetition "
        "rounds both points have, else Welch t); separated when the interval excludes 1, which happens to "
        "equal points at most about 5% of the time (paired t about 5%, Welch t 3-5%, 1-2% when the runs share "
        "rounds but cannot be paired; docs/analysis.md gives the simulated rates and power). A point that ran "
        "once is not compared."
    )
    if runs == [1]:
        return text + (
            " Every point here ran once: no ratio is tested, and each interval is within-run "
            "(vit-scale study --repeat 3, the default, runs each point 3 times)."
        )
    if runs:
        cv = ok["ips_run_cv"].dropna()
        count = f"{runs[0]}" if len(runs) == 1 else f"{runs[0]} to {runs[-1]}"
        spread = f"; run-to-run coefficient of variation {cv.min():.1%} to {cv.max():.1%}" if len(cv) else ""
        return text + f" Ok runs per point: {count}{spread}."
    return text


def _point_name(r) -> str:
    return f"{r['model']} {r['series']} on {int(r['nodes'])} node(s)"


def _slow_left_out(results: pd.DataFrame, what: str) -> list:
    """A paragraph naming the points left out of `what` because a slow node ran them, or none."""
    slow = tbl.slow_node_runs(results)
    if slow.empty:
        return []
    named = "; ".join(f"{_point_name(r)} ({r['slow_node']})" for _, r in slow.iterrows())
    return [
        Block(
            "p",
            f"Left out of {what}, a node of their run more than {SLOW_SHARE:.0%} below the run's median node "
            f"(its figures are that node's, not the strategy's; docs/analysis.md, A slow node): {named}.",
        )
    ]


def _best_section(results: pd.DataFrame) -> list:
    best = tbl.best_runs(results)
    blocks = [Block("h2", "Best run per model and node count")]
    if best.empty:
        return (
            blocks
            + [Block("p", "No run finished ok with a measured throughput.")]
            + _slow_left_out(results, "the comparison")
        )
    blocks.append(
        Block(
            "p",
            "The fastest point (highest images/s over wall time) that finished ok (replicas agreeing where "
            "checked), with the ratio of its throughput to the next fastest's.",
        )
    )
    dev = "GPU" if (results["device_type"] != "cpu").all() else "rank"
    header = [
        "model",
        "nodes",
        f"{dev}s",
        "best",
        f"batch/{dev}",
        "images/s (wall)",
        "95% interval (method)",
        "median step images/s",
        "slow steps (>2× median)",
        "runs",
        f"per {dev}",
        "efficiency",
        "memory GiB",
        "MFU",
        "next best",
        "ratio to next (95% interval, test)",
        "run",
    ]
    rows = []
    for _, r in best.iterrows():
        ips = r["ips_point"] if not pd.isna(r["ips_point"]) else r["ips_mean"]
        rows.append(
            [
                r["model"],
                int(r["nodes"]),
                int(r["world_size"]),
                r["series"],
                int(r["batch_per_device"]),
                _f(ips, "{:,.1f}"),
                _ci_text(r),
                _f(r["ips_step_median"], "{:,.1f}"),
                _f(r["ips_slow_share"], "{:.1%}"),
                _runs_text(r),
                _f(ips / r["world_size"], "{:,.1f}"),
                _pct(r["efficiency"]),
                _f(r["memory_gib"], "{:.1f}"),
                _pct(r["mfu"]),
                _s(r["runner_up"]),
                _ratio_text(r),
                r["run_id"],
            ]
        )
    blocks.append(Block("table", header=header, rows=rows))
    blocks += _slow_left_out(results, "the comparison")
    verdicts, tests = best["verdict"], best["ratio_test"]
    apart = int((verdicts == tbl.NOT_SEPARATED).sum())
    single = int(tests.isin([stats.NOT_COMPARED, stats.ONE_SIDE_NOT_COMPARED]).sum())
    if apart:
        blocks.append(
            Block(
                "p",
                f"{apart} ratio(s) are not separated: their 95% interval includes 1, so these runs do not "
                "settle which of the two is faster (nor that they are equal).",
            )
        )
    if single:
        blocks.append(
            Block(
                "p",
                f"{single} ratio(s) are not compared: a point ran once, so run-to-run variation (node "
                "placement, network neighbours, clock boosts), which on shared machines is often larger than "
                "the spread within a run, is unmeasured and no test can be made.",
            )
        )
    usable = tbl.usable(results)
    drifting = usable[usable["ips_not_steady"].fillna(0) > 0]
    if not drifting.empty:
        named = "; ".join(
            f"{r['model']} {r['series']} on {int(r['nodes'])} node(s) ({int(r['ips_not_steady'])} of "
            f"{int(r['ips_runs'])} runs)"
            for _, r in drifting.iterrows()
        )
        blocks.append(
            Block(
                "p",
                f"Not steady (the step rate of its first and last thirds differ beyond the run's noise, a t test "
                f"at {stats.STEADY_LEVEL:.0%}): {named}. A trend (warming up, throttling, a neighbour arriving) "
                "makes a run's figure depend on its length; look at its steps before comparing it.",
            )
        )
    blocks.append(Block("p", _statistics_text(results)))
    return blocks


def _figure_block(plot, images: set) -> list:
    """The figure and its caption, when its PNG was written (--formats may leave it out)."""
    if f"{plot.name}.png" not in images:
        return []
    return [Block("img", f"{plot.name}.png", items=[plot.title]), Block("p", f"*{plot.caption}*")]


def _scaling_section(results: pd.DataFrame, plots_by_name: dict, images: set, missing: list) -> list:
    from .figures import model_order, scaling_runs, single_point_lines

    runs = scaling_runs(results)
    if runs.empty:
        return []
    blocks = [Block("h2", "Weak scaling")]
    if "weak_scaling_ips" in plots_by_name:
        blocks += _figure_block(plots_by_name["weak_scaling_ips"], images)
    else:
        blocks += _not_drawn("weak scaling", missing)
    # One-off runs of a study with a ladder for that model; a configuration grid or a single-device
    # comparison is one-off by design and has its own figure.
    laddered = set(zip(runs["study"], runs["model"], strict=True))
    alone = [
        a
        for a in single_point_lines(
            results[[k in laddered for k in zip(results["study"], results["model"], strict=True)]]
        )
    ]
    if alone:
        named = "; ".join(f"{m} {series} ({x}, {status})" for m, series, x, status in alone[:12])
        more = f" and {len(alone) - 12} more" if len(alone) > 12 else ""
        blocks.append(
            Block(
                "p",
                f"Not drawn as lines, having run at one size only: {named}{more}. "
                "They are in results.csv and the best-run table.",
            )
        )
    for model in model_order(runs):
        t = tbl.scaling_table(runs, model)
        xname = tbl.x_axis(runs[runs["model"] == model])[1]
        blocks.append(Block("h3", f"{model}: images/s over wall time (scaling efficiency) by {xname}"))
        blocks.append(
            Block(
                "table",
                header=["strategy"] + [str(c) for c in t.columns],
                rows=[[idx] + list(row) for idx, row in zip(t.index, t.values.tolist(), strict=True)],
            )
        )
    for name, heading, what in (
        ("memory", "Peak memory per device", "memory"),
        ("efficiency", "Scaling efficiency", "efficiency"),
    ):
        if name in plots_by_name:
            blocks += [Block("h2", heading)] + _figure_block(plots_by_name[name], images)
        elif _not_drawn(what, missing):
            blocks += [Block("h2", heading)] + _not_drawn(what, missing)
    return blocks


def _not_drawn(name: str, missing: list) -> list:
    """The one sentence that stands where a figure the runs cannot support would be."""
    for m in missing:
        if m.startswith(name + ":"):
            why = m.split(":", 1)[1].strip()
            return [Block("p", f"The {name} figure is not drawn: {why}.")]
    return []


def _grid_section(results: pd.DataFrame, plots_by_name: dict, images: set) -> list:
    plot = plots_by_name.get("config_grid")
    if plot is None:
        return []
    d = plot.drawn
    blocks = [Block("h2", "FSDP configurations (Figure 1)")] + _figure_block(plot, images)
    combos = sorted(
        {(p, lag) for (_, p, lag) in d["values"]} | {(p, lag) for (_, p, lag, _) in d["failed"]},
        key=lambda c: (("none", "pre", "post").index(c[0]) if c[0] in ("none", "pre", "post") else 9, c[1]),
    )
    labels = list(dict.fromkeys([k[0] for k in d["values"]] + [f[0] for f in d["failed"]]))
    failed = {(f[0], f[1], f[2]): f[3] for f in d["failed"]}
    header = ["strategy"] + [f"prefetch {p}, limit_ag {'on' if lag else 'off'}" for p, lag in combos]
    rows = []
    for label in labels:
        row = [label]
        for p, lag in combos:
            v = d["values"].get((label, p, lag))
            row.append(_f(v, "{:,.1f}") if v is not None else failed.get((label, p, lag), "").upper())
        rows.append(row)
    blocks.append(
        Block("p", f"images/s, {d['model']} on {d['nodes']} nodes, batch {d['batch']} per device (study {d['study']}).")
    )
    return blocks + [Block("table", header=header, rows=rows)]


def _plugin_section(results: pd.DataFrame, plots_by_name: dict, images: set) -> list:
    plot = plots_by_name.get("plugin_comparison")
    if plot is None:
        return []
    blocks = [Block("h2", "Single-device comparison (seeds 000/001)")] + _figure_block(plot, images)
    for study, model in plot.drawn:
        sub = results[(results["world_size"] == 1) & (results["study"] == study) & (results["model"] == model)]
        header = ["strategy", "batch", "status", "images/s", "memory GiB", "MFU"]
        rows = [
            [
                r["series"],
                int(r["batch_per_device"]),
                r["status"],
                _f(r["ips_mean"], "{:,.1f}"),
                _f(r["memory_gib"], "{:.2f}"),
                _pct(r["mfu"]),
            ]
            for _, r in sub.sort_values(["batch_per_device"], kind="stable").iterrows()
        ]
        blocks += [Block("h3", f"{model} ({study})"), Block("table", header=header, rows=rows)]
    return blocks


def _breakdown_section(breakdown: pd.DataFrame | None, plots_by_name: dict, images: set) -> list:
    """Where the time goes: from the profiler traces of runs with profile.enabled."""
    from . import traces

    if breakdown is None or breakdown.empty:
        return []
    blocks = [Block("h2", "Where the time goes (profiler traces)")]
    line = traces.most_exposed(breakdown)
    if line:
        blocks.append(Block("p", line))
    plot = plots_by_name.get("time_breakdown")
    if plot is not None:
        blocks += _figure_block(plot, images)
    runs = traces.per_run(breakdown)
    header = [
        "model",
        "strategy",
        "nodes",
        "ranks",
        "step ms",
        "compute",
        "memory",
        "comm hidden",
        "comm exposed",
        "idle",
    ]
    rows = [
        [r["model"], r["strategy"], int(r["nodes"]), int(r["world_size"])] + [f"{r[c]:.1f}" for c in traces.PARTS]
        for _, r in runs.iterrows()
    ]
    return blocks + [
        Block("table", header=header, rows=rows),
        Block(
            "p", "Per-rank rows: time_breakdown.csv. How kernels are classified and overlap counted: docs/profiling.md."
        ),
    ]


def _failures_section(results: pd.DataFrame) -> list:
    bad = results[results["status"] != "ok"]
    blocks = [Block("h2", "Runs that did not finish ok")]
    if bad.empty:
        return blocks + [Block("p", "None.")]
    blocks.append(Block("p", f"{len(bad)} run(s): {status_counts(bad)}."))
    header = ["model", "strategy", "nodes", "GPUs", "status", "steps", "failed rank", "job", "error", "run directory"]
    rows = []
    for _, r in bad.iterrows():
        steps = _f(r["steps_done"], "{:.0f}", "?") + (
            "/" + _f(r["steps_planned"], "{:.0f}") if not pd.isna(r["steps_planned"]) else ""
        )
        rows.append(
            [
                r["model"],
                r["series"],
                int(r["nodes"]),
                int(r["world_size"]),
                r["status"],
                steps,
                _f(r["failed_rank"], "{:.0f}"),
                _s(r["job_id"]),
                _one_line(_s(r["error"])),
                os.path.dirname(r["path"]),
            ]
        )
    return blocks + [Block("table", header=header, rows=rows)]


def _slow_node_items(results: pd.DataFrame, set_aside: pd.DataFrame) -> list:
    """A line per run that ran on a slow node (results.csv's and set_aside.csv's slow_node), and what
    the analysis did with it."""
    items = []
    for frame, kept in ((results, True), (set_aside, False)):
        if "slow_node" not in frame:
            continue
        for _, r in frame[frame["slow_node"].map(_s) != ""].iterrows():
            if r["status"] != "ok":
                done = f"status {r['status']}"
            elif kept:
                done = "left out of the best-run comparison and the prediction's errors"
            else:
                done = f"set aside for run {_s(r.get('set_aside_for'))}" + (
                    "" if r.get("pooled") is True else ", not pooled into its point's figure"
                )
            items.append(f"{r['slow_node']}: {_point_name(r)} ({os.path.dirname(r['path'])}); {done}")
    return items


def _warnings_section(results: pd.DataFrame, coll: Collection, set_aside: pd.DataFrame, missing_plots: list) -> list:
    items = []
    disagree = results[results["replicas_agree"] == False]  # noqa: E712
    for _, r in disagree.iterrows():
        items.append(
            f"replicas disagree: {r['model']} {r['series']} on {int(r['nodes'])} node(s) "
            f"({os.path.dirname(r['path'])}); its throughput is left out of the best-run picks"
        )
    items += _slow_node_items(results, set_aside)
    for _, r in results[results["notes"].map(_s) != ""].iterrows():
        items.append(f"{os.path.dirname(r['path'])}: {_one_line(r['notes'], 300)}")
    for s in coll.unknown_schema:
        items.append(f"not read: {s.path}: {s.reason}")
    items += [f"figure not drawn: {m}" for m in missing_plots]
    blocks = []
    if items:
        blocks += [Block("h2", "Warnings"), Block("ul", items=items)]
    if coll.skipped:
        blocks += [
            Block("h2", "Skipped files"),
            Block("p", f"{len(coll.skipped)} file(s) or directories gave no run."),
            Block("table", header=["path", "reason"], rows=[[s.path, s.reason] for s in coll.skipped]),
        ]
    aside = set_aside[set_aside["pooled"] != True] if "pooled" in set_aside else set_aside  # noqa: E712
    if not aside.empty:
        header = ["model", "strategy", "nodes", "status", "run", "kept instead"]
        rows = [
            [r["model"], r["series"], int(r["nodes"]), r["status"], _s(r["run_id"]), _s(r["set_aside_for"])]
            for _, r in aside.iterrows()
        ]
        text = (
            f"{len(aside)} failed or unusable rerun(s) of a point were set aside for the point's kept run; they "
            "are in set_aside.csv (with the point's ok repetitions, whose throughputs count in its figure and "
            "interval: `pooled` true)."
        )
        blocks += [Block("h2", "Reruns set aside"), Block("p", text), Block("table", header=header, rows=rows)]
    return blocks


def _allocation_section(results: pd.DataFrame, set_aside: pd.DataFrame) -> list:
    """Where the allocation went: node-hours (nodes x each run's wall time from its launch to its end record,
    the record's time_split) in all, by node count and per point, and the share in timed windows."""
    if "run_node_s" not in results:
        return []
    frames = [results] + ([set_aside] if not set_aside.empty and "run_node_s" in set_aside else [])
    runs = pd.concat(frames, ignore_index=True)
    split = runs[runs["run_node_s"].notna()]
    blocks = [Block("h2", "Where the allocation went")]
    if split.empty:
        return blocks + [
            Block(
                "p",
                f"None of the {len(runs)} run record(s) splits its wall time (time_split, written from the "
                "records of this version on): no node-hours to account.",
            )
        ]

    def part(frame, column):
        return float((frame["nodes"] * frame[column].fillna(0.0)).sum())

    spent = float(split["run_node_s"].sum())
    shares = {c: part(split, c) / spent for c in ("startup_s", "warmup_s", "timed_window_s", "rest_s")}
    unknown_launch = int(split["startup_s"].isna().sum())
    missing = len(runs) - len(split)
    text = (
        f"Nodes × each run's wall time, from its launch to its end record, as the record splits it: start-up "
        f"(launch to the first step: processes, imports, process group, model), warm-up, the timed window whose "
        f"images/s the report states, and the rest (end-of-run checks, the record). Over {len(split)} run(s), "
        f"repetitions and failures included: {spent / 3600:.3g} node-hours ({spent:,.0f} node-seconds), "
        f"{shares['timed_window_s']:.1%} in timed windows, {shares['startup_s']:.1%} start-up, "
        f"{shares['warmup_s']:.1%} warm-up, {shares['rest_s']:.1%} the rest."
    )
    if unknown_launch:
        text += (
            f" {unknown_launch} run(s) were not launched by vit-scale study (no launch time): their start-up is "
            "not known and not counted."
        )
    if missing:
        text += f" {missing} run(s) have no split in their record (older records, or killed outright): not counted."
    text += " The study's own last line counts from launch to the processes' exit."
    blocks.append(Block("p", text))
    header = ["nodes", "points", "runs", "node-hours", "timed", "start-up", "warm-up", "rest"]
    rows = []
    for nodes, grp in split.groupby("nodes"):
        total = float(grp["run_node_s"].sum())
        rows.append(
            [int(nodes), int(results[results["nodes"] == nodes].shape[0]), len(grp), f"{total / 3600:.3g}"]
            + [_pct_of(part(grp, c), total) for c in ("timed_window_s", "startup_s", "warmup_s", "rest_s")]
        )
    blocks.append(Block("table", header=header, rows=rows))
    header = ["model", "strategy", "nodes", "runs", "node-hours", "timed"]
    rows = [
        [
            r["model"],
            r["series"],
            int(r["nodes"]),
            int(r["point_runs_split"]),
            f"{r['point_node_s'] / 3600:.3g}",
            _pct_of(r["point_timed_node_s"], r["point_node_s"]),
        ]
        for _, r in results.iterrows()
        if not pd.isna(r.get("point_node_s"))
    ]
    return blocks + [Block("p", "Per point, every run of it counted (results.csv: point_node_s, point_timed_share):"),
                     Block("table", header=header, rows=rows)]  # fmt: skip


def _pct_of(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole and not pd.isna(whole) and not pd.isna(part) else ""


EMULATED_HOST = re.compile(r"^local\d+$")  # the node names jobs/weak_scaling.sh gives its process groups


def _host_names(df: pd.DataFrame) -> list:
    return list(dict.fromkeys(h for hosts in df["hosts"].map(_s) for h in hosts.split(",") if h))


def _cpu_text(df: pd.DataFrame) -> str:
    """'AMD EPYC 7763 64-Core Processor, 128 logical CPUs', or what the records have of it."""
    models = sorted({m for m in df["cpu_model"].map(_s) if m}) if "cpu_model" in df else []
    counts = sorted({int(c) for c in df["cpu_count"].dropna()}) if "cpu_count" in df else []
    text = " / ".join(models) or "CPU model not recorded"
    if counts:
        text += f", {' / '.join(map(str, counts))} logical CPUs"
    return text


def emulation_note(results: pd.DataFrame) -> str | None:
    """What the images/s of runs that did not have real nodes (or any GPU) can and cannot say.

    Emulated nodes: several "nodes" in one run whose host names are the process groups
    jobs/weak_scaling.sh starts without Slurm (local0, local1 ...), or CPU runs on more than one
    node (tools/local-slurm-cluster.sh emulates a cluster on one host: a CPU study across real
    nodes is not what this toolkit is for). Ranks sharing one machine's CPUs are also no scaling
    measurement, with one node or several.
    """
    if results.empty:
        return None
    hosts = _host_names(results)
    named_local = bool(hosts) and all(EMULATED_HOST.match(h) for h in hosts)
    cpu = results[results["device_type"] == "cpu"]
    several = (results["nodes"] > 1).any()
    kinds = set(results["emulation"].dropna()) if "emulation" in results else set()
    if "isolated" in kinds:
        mixed = " Some runs shared the machine instead (emulation: shared); compare only like with like." * (
            "shared" in kinds
        )
        return (
            f"Note: these runs come from emulated nodes on one machine, isolated ({_cpu_text(results)}): each "
            "node's ranks ran in a network namespace of their own, linked to the others through a bridge at the "
            "system profile's emulated inter-node bandwidth (within a node: loopback), and within a fixed CPU "
            "quota (emulation: isolated in the records). So the curves part by what each strategy sends across "
            "nodes at that bandwidth; the absolute images/s are a CPU's, and there is no added latency." + mixed
        )
    if named_local and several or (not cpu.empty and (cpu["nodes"] > 1).any()):
        where = (
            f"the node names {', '.join(hosts[:4])}{' …' if len(hosts) > 4 else ''} are groups of processes "
            "that jobs/weak_scaling.sh started on one machine"
            if named_local
            else "several nodes of CPU ranks, which this toolkit only emulates on one machine "
            "(tools/local-slurm-cluster.sh)"
        )
        return (
            f"Note: these runs come from emulated nodes ({where}; {_cpu_text(cpu if not cpu.empty else results)})."
            " Every rank shares that machine's cores and memory"
            + (" and loopback (emulation: shared)" if "shared" in kinds else "")
            + ", so the images/s below show the toolkit at work, not how a strategy scales; measuring that "
            "needs real nodes (or the isolated emulation: root and a cgroup cpu controller, docs/jobs.md)."
        )
    if not cpu.empty and (cpu["world_size"] > 1).any():
        return (
            f"Note: these runs are CPU ranks sharing one machine ({_cpu_text(cpu)}), so the images/s below show "
            "the toolkit at work, not how a strategy scales; measuring that needs GPUs on real nodes."
        )
    if not cpu.empty:
        return (
            f"Note: these runs are on a CPU ({_cpu_text(cpu)}): their images/s show the toolkit at work and say "
            "nothing of training on GPUs."
        )
    return None


LAUNCHED_BY = {
    "torchrun": "torchrun",
    "torchrun under srun": "torchrun under srun",
    "srun": "srun",
    "srun (MPI)": "srun with MPI (mpi4py)",
    "mpirun": "mpirun (mpi4py)",
    "single": "one process, no launcher",
}


def _launcher_text(df: pd.DataFrame) -> str:
    """What really started the ranks. The record's `launcher` is how the trainer read its rank:
    `torchrun` for any process given RANK and WORLD_SIZE, such as the processes jobs/weak_scaling.sh
    starts itself without Slurm; `launched_by` (recorded since it was added) tells them apart."""
    out = []
    for _, r in df.drop_duplicates(["launcher", "launched_by", "job_id"]).iterrows():
        recorded, started = _s(r["launcher"]), _s(r.get("launched_by"))
        local = all(EMULATED_HOST.match(h) for h in _s(r["hosts"]).split(",") if h) and not _s(r["job_id"])
        if started == "env":
            text = (
                "processes started by jobs/weak_scaling.sh without Slurm (env://)"
                if local
                else "processes started with RANK and WORLD_SIZE set (env://)"
            )
        elif started:
            text = LAUNCHED_BY.get(started, started)
        elif recorded == "torchrun" and local:
            text = "torchrun or jobs/weak_scaling.sh's own processes (env://; this record does not say which)"
        else:
            text = recorded or "not recorded"
        if _s(r["job_id"]) and "srun" not in text:
            text += " in a Slurm job"
        out.append(text)
    return "; ".join(dict.fromkeys(out))


def _steps_text(df: pd.DataFrame) -> str:
    """'30 (5 warm-up + 25 timed)' for each distinct plan; timed steps from the runs that finished."""
    out = []
    for (planned, warmup), sub in df.groupby(["steps_planned", "warmup_steps"], dropna=False, sort=True):
        if pd.isna(planned):
            continue
        parts = [f"{int(warmup)} warm-up"] if not pd.isna(warmup) else []
        timed = sorted({int(t) for t in sub.loc[sub["status"] == "ok", "timed_steps"].dropna()})
        if timed:
            parts.append(f"{'/'.join(map(str, timed))} timed")
        out.append(f"{int(planned)}" + (f" ({' + '.join(parts)})" if parts else ""))
    return "; ".join(out)


def _environment_section(results: pd.DataFrame) -> list:
    """What ran, one fact a row; a fact that differs between runs lists each value."""
    if results.empty:
        return []
    df = results

    def values(col, fmt=_s):
        if col not in df:
            return ""
        return "; ".join(dict.fromkeys(v for v in (fmt(x) for x in df[col]) if v))

    gpu = df[df["device_type"] != "cpu"]
    rows = []
    if not gpu.empty:
        rows.append(
            [
                "device",
                "; ".join(dict.fromkeys(f"{_s(r['device_name'])} ({_s(r['device_type'])})" for _, r in gpu.iterrows())),
            ]
        )
    rows.append(["ranks per node", values("ranks_per_node", lambda v: _f(v, "{:.0f}"))])
    rows.append(["host CPU" if not gpu.empty else "CPU", _cpu_text(df)])
    rows.append(["backend", values("backend")])
    rows.append(["launcher", _launcher_text(df)])
    hosts = _host_names(df)
    if hosts:
        rows.append(["host names", ", ".join(hosts[:16]) + (f" and {len(hosts) - 16} more" if len(hosts) > 16 else "")])
    jobs = values("job_id")
    if jobs:
        rows.append(["Slurm job(s)", jobs + (f" (partition {values('partition')})" if values("partition") else "")])
    rows.append(["precision", values("opt_precision")])
    rows.append(
        [
            "batch per device" if not gpu.empty else "batch per rank",
            values("batch_per_device", lambda v: _f(v, "{:.0f}")),
        ]
    )
    rows.append(["steps per run", _steps_text(df)])
    for key in tbl.VERSION_KEYS:
        rows.append([key, values(f"v_{key}")])
    revisions = values("git_revision")
    rows.append(["vit-scale revision", revisions or "unknown"])
    rows = [r for r in rows if r[1]]
    return [Block("h2", "Environment"), Block("table", header=["", "as recorded in the runs"], rows=rows)]


def _check_files(directory: str) -> list:
    """(title, path, check) of each check in a study directory: one per node count (and model, where
    a --per-model sweep's jobs kept one each), else check.json."""
    from vit_scale.record.check_file import check_files, read_check

    found = check_files(directory)
    if found:
        shared = {n for n, *_ in found if sum(1 for m, *_ in found if m == n) > 1}  # the model tells them apart
        return [
            (
                f"System check: {n} node{'s' if n != 1 else ''}{f', {model}' if model and n in shared else ''}",
                path,
                check,
            )
            for n, model, path, check in found
        ]
    check = read_check(directory)
    return [("System check", os.path.join(directory, "check.json"), check)] if check else []


def _check_section(inputs: list, results: pd.DataFrame | None = None) -> list:
    """What `vit-scale check` found on the system (check-n<N>[-MODEL].json in a study directory, written by
    `vit-scale study --check`): versions, the transport between nodes and each collective's bus
    bandwidth, the facts that explain the scaling figures; one per node count, beside its points."""
    blocks = []
    for directory in inputs:
        for title, path, check in _check_files(directory) if os.path.isdir(directory) else []:
            blocks += _one_check(title, path, check)
            blocks += _slow_nodes_named(check, directory, results)
    return blocks


def _slow_nodes_named(check: dict, directory: str, results: pd.DataFrame | None) -> list:
    """The nodes a check named slow (vit_scale.check.nodes): left out of the study's runs
    (--exclude-slow-nodes, OUT/STUDY/nodes_left_out.json), or else the points that ran on them."""
    from vit_scale.record.check_file import named_slow, read_left_out

    named = named_slow(check)
    if not named:
        return []
    listed = "; ".join(f"{host} ({why})" for host, why in named.items())
    left_out = read_left_out(directory)
    if left_out and set(named) <= set(left_out):
        return [Block("p", f"The check named slow node(s) {listed}; the study left them out of every run.")]
    spoiled = []
    if results is not None and not results.empty and "hosts" in results:
        for _, r in results.iterrows():
            on = [h for h in _s(r["hosts"]).split(",") if h in named]
            if on:
                spoiled.append(f"{r['model']} {r['strategy']} n{_f(r['nodes'], '{:.0f}')}: {', '.join(on)}")
    text = f"The check named slow node(s) {listed}; the study ran on them all the same"
    if not spoiled:
        return [Block("p", text + ", and no run recorded here used them.")]
    return [
        Block("p", text + ": these points ran on a node it named (--exclude-slow-nodes leaves such nodes out):")
    ] + [Block("ul", items=list(dict.fromkeys(spoiled)))]


def _one_check(title: str, path: str, check: dict) -> list:
    """One check's facts; one of several (a sweep's jobs) says which node count's runs it preceded."""
    nodes = check.get("nodes")
    before = f", before its runs on {nodes} node{'s' if nodes != 1 else ''}" if title != "System check" else ""
    blocks = [
        Block("h2", title),
        Block(
            "p",
            f"From {path}: what vit-scale check found on the nodes and through the launcher this "
            f"study used{before}. "
            f"Bus bandwidth is nccl-tests' busbw (what each rank's link carries); a scaling curve "
            f"that bends where busbw across nodes is far below within a node is the network's.",
        ),
        Block("table", header=["", "found"], rows=_check_facts(check)),
    ]
    rows = _check_bandwidths(check)
    if rows:
        blocks.append(
            Block(
                "table", header=["collective", "scope", "ranks", "size", "busbw GB/s", "algbw GB/s", "time"], rows=rows
            )
        )
    broken = [
        f"{line['check']}: {_one_line(line['text'])}"
        for line in check.get("lines") or []
        if line.get("needed") and line.get("status") in ("fail", "refused")
    ]
    if broken:
        blocks += [Block("p", "Broken when the check ran:"), Block("ul", items=broken)]
    return blocks


def _check_facts(check: dict) -> list:
    from vit_scale.record.check_file import transport, verdict, versions

    nodes = check.get("nodes")
    lines = {line["check"]: line for line in check.get("lines") or []}
    rows = [
        [
            "verdict",
            f"{verdict(check)} ({check.get('time_iso', '?')}, {check.get('system')}: {nodes} "
            f"node{'s' if nodes != 1 else ''} x {check.get('ranks_per_node')} ranks)",
        ],
        ["versions", versions(check)],
        ["transport between nodes", transport(check)],
    ]
    rows += [
        [name, _one_line(lines[name]["text"], 200)]
        for name in ("devices", "nodes", "meter overhead", "meter timing", "meter memory")
        if name in lines
    ]
    return [row for row in rows if row[1]]


def _check_bandwidths(check: dict) -> list:
    """Each collective's bandwidth at the strategies' sizes, then its latency at the smallest size."""
    from vit_scale.record.check_file import bandwidth_rows, latency_rows
    from vit_scale.text import human_bytes, human_seconds

    def scope(m):
        return "within a node" if m["scope"] == "node" else "across nodes"

    rows = [
        [
            m["collective"],
            scope(m),
            m["ranks"],
            f"{human_bytes(m['bytes'])} ({m['what']})",
            _f(m["busbw_gbs"], "{:.3g}"),
            _f(m["algbw_gbs"], "{:.3g}"),
            human_seconds(m["time_s"]),
        ]
        for m in bandwidth_rows(check)
    ]
    return rows + [
        [
            m["collective"],
            scope(m),
            m["ranks"],
            f"{human_bytes(m['bytes'])} (latency)",
            "",
            "",
            human_seconds(m["time_s"]),
        ]
        for m in latency_rows(check)
    ]


def _prediction_section(results: pd.DataFrame, plots_by_name: dict, images: set) -> list:
    """The planner's predicted peak memory against the measured: the figure file and every residual."""
    from .figures import prediction_rows, residual_summary

    runs = prediction_rows(results)
    if runs.empty:
        return []
    summary = residual_summary(runs)
    stated = "; ".join(
        f"{g}: within {m * 100:.1f}% over {n} run{'s' if n > 1 else ''} ({', '.join(models)})"
        for g, n, m, models in summary
    )
    blocks = [
        Block("h2", "Predicted against measured memory"),
        Block(
            "p",
            f"The peak allocated memory per GPU that vit-scale plan predicted for each run (in its start "
            f"record) against the measured peak (the maximum over ranks), for {len(runs)} ok GPU runs. "
            f"Largest |residual|, (predicted − measured) / measured: {stated}.",
        ),
    ]
    plot = plots_by_name.get("predicted_memory")
    if plot is not None:
        # Named, not inlined: the report inlines the scaling figures; this one sits beside it.
        blocks.append(Block("p", f"Figure: {plot.name} beside this report (in the formats written). {plot.caption}"))
    header = ["model", "strategy", "nodes", "GPUs", "predicted GiB", "measured GiB", "residual"]
    rows = [
        [
            r["model"],
            r["series"],
            int(r["nodes"]),
            int(r["world_size"]),
            _f(r["plan_peak_allocated_gib"], "{:.2f}"),
            _f(r["memory_gib"], "{:.2f}"),
            _f(r["residual"], "{:+.1%}"),
        ]
        for _, r in runs.iterrows()
    ]
    return blocks + [Block("table", header=header, rows=rows)]


def _measured_predicted_section(predicted, plots_by_name: dict, images: set) -> list:
    """Each point's measured images/s against its prediction (analysis/prediction.py), the calibration used,
    and for points more than 20% below their prediction where the difference is."""
    from .prediction import BELOW

    if predicted is None or (predicted.rows.empty and not predicted.notes):
        return []
    from .prediction import COMPUTE

    rows = predicted.rows
    blocks = [Block("h2", "Measured against predicted")]
    given = rows[rows["role"] == COMPUTE]
    rows = rows[rows["role"] != COMPUTE]
    compared = rows[rows["error"].notna()]
    if not compared.empty:
        median = f" Median |error| over {len(compared)} predicted point(s): {compared['error'].abs().median():.1%}."
    else:
        median = " No point was predicted beyond the ones that gave the compute: no error to report."
    slow = rows[rows["slow_node"].map(_s) != ""] if "slow_node" in rows else rows.iloc[0:0]
    if not slow.empty:
        median += (
            f" Left out of the errors, a node of their run more than {SLOW_SHARE:.0%} below its median node: "
            + "; ".join(f"{_point_name(r)} ({r['slow_node']})" for _, r in slow.iterrows())
            + "."
        )
    if not given.empty:
        median += (
            f" Left out of the errors, as the prediction's input: {len(given)} point(s) whose step gave the "
            f"compute ("
            + ", ".join(f"{r['model']} {r['series']} on {int(r['nodes'])} node(s)" for _, r in given.iterrows())
            + ")."
        )
    used = "; ".join(predicted.calibrations) or "none"
    banded = [bool(x) for x in compared.get("inside_band", pd.Series(dtype=object)) if x is not None and x == x]
    inside = f" Inside their band: {sum(banded)} of {len(banded)}." if banded else ""
    blocks.append(
        Block(
            "p",
            f"Each point's median images/s (over its runs, as in the best-run table and the figures) "
            f"against what vit_scale.planning.predict gives for the same model, "
            f"strategy and options, batch, precision, nodes and ranks (docs/plan.md, Predictions: "
            f"calibration and compute): compute from the study's own 1-node rung (each strategy's "
            f"1-node step at its median images/s less the exposed communication the model predicts "
            f"for it), collectives from the calibration. "
            f"Calibration used: {used}. Error: measured median / predicted - 1.{median} In band: whether the "
            f"measured point lies in the 90% band the calibration's ranges give its prediction (docs/plan.md, "
            f'"How sure a prediction is"; empty where no input carries a range).{inside}',
        )
    )
    plot = plots_by_name.get("weak_scaling_predicted")
    if plot is not None:
        # Named, not inlined, as the memory prediction's: the report inlines the measured scaling figures
        blocks.append(Block("p", f"Figure: {plot.name} beside this report (in the formats written). {plot.caption}"))
    if not rows.empty:
        header = ["model", "strategy", "nodes", "ranks", "measured images/s", "predicted images/s", "error", "in band"]
        table_rows = [
            [
                r["model"],
                r["series"],
                int(r["nodes"]),
                int(r["world_size"]),
                tbl.format_ips(r["measured_ips"]) if not math.isnan(r["measured_ips"]) else r["status"].upper(),
                (tbl.format_ips(r["predicted_ips"]) if not math.isnan(r["predicted_ips"]) else "")
                + (" (extrapolated)" if bool(r["extrapolated"]) else ""),
                _f(r["error"], "{:+.1%}"),
                _band(r),
            ]
            for _, r in rows.iterrows()
        ]
        blocks.append(Block("table", header=header, rows=table_rows))
    below = [
        f"{r['model']} {r['series']} on {int(r['nodes'])} node(s): {r['explanation']}"
        for _, r in rows.iterrows()
        if r["explanation"]
    ]
    if below:
        blocks += [Block("p", f"More than {BELOW:.0%} below their prediction:"), Block("ul", items=below)]
    if predicted.notes:
        blocks += [Block("p", "Not predicted, or not calibrated as asked:"), Block("ul", items=predicted.notes)]
    return blocks + [
        Block(
            "p",
            "Per point, with the predicted step split into compute, optimizer and exposed "
            "communication: prediction.csv.",
        )
    ]


def _band(r) -> str:
    """Whether the measured point lies in its prediction's 90% band: "yes (low-high)", "no (low-high)", or ""
    where there is no band (no range in the calibration) or nothing to hold against it."""
    low, high = r.get("predicted_ips_low", math.nan), r.get("predicted_ips_high", math.nan)
    inside = r.get("inside_band")
    if inside is None or (isinstance(inside, float) and math.isnan(inside)) or math.isnan(low):
        return ""
    return f"{'yes' if bool(inside) else 'no'} ({tbl.format_ips(low)}-{tbl.format_ips(high)})"


def build(
    results: pd.DataFrame,
    set_aside: pd.DataFrame,
    coll: Collection,
    plots: list,
    missing_plots: list,
    written: list,
    breakdown: pd.DataFrame | None = None,
    predicted=None,
) -> list:
    by_name = {p.name: p for p in plots}
    images = {os.path.basename(p) for p in written if p.endswith(".png")}
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    studies = ", ".join(sorted(map(str, results["study"].unique()))) or "none"
    pooled = int((set_aside["pooled"] == True).sum()) if "pooled" in set_aside else 0  # noqa: E712
    runs = len(results) + len(set_aside)
    summary = (
        f"{len(results)} point(s) from {runs} run(s) in {', '.join(coll.inputs)} (studies: {studies}): "
        f"{status_counts(results)} (each point's kept run); {pooled} further repetition(s) pooled into their "
        f"points, {len(set_aside) - pooled} rerun(s) set aside; {len(coll.skipped)} file(s) skipped. "
        f"Generated {now}."
    )
    blocks = [Block("h1", "Weak-scaling report"), Block("p", summary)]
    caveat = emulation_note(results)
    if caveat:
        blocks.append(Block("p", caveat))
    blocks += _best_section(results)
    blocks += _scaling_section(results, by_name, images, missing_plots)
    blocks += _prediction_section(results, by_name, images)
    blocks += _measured_predicted_section(predicted, by_name, images)
    blocks += _grid_section(results, by_name, images)
    blocks += _plugin_section(results, by_name, images)
    blocks += _breakdown_section(breakdown, by_name, images)
    blocks += _allocation_section(results, set_aside)
    blocks += _failures_section(results)
    blocks += _warnings_section(results, coll, set_aside, missing_plots)
    blocks += _check_section(coll.inputs, results)
    blocks += _environment_section(results)
    blocks += [
        Block("h2", "Files"),
        Block("ul", items=[os.path.basename(p) for p in written] + ["report.md", "report.html"]),
    ]
    return blocks


# ----------------------------------------------------------------------------- rendering


def _md_cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list) -> str:
    out = []
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            out.append("#" * int(b.kind[1]) + " " + b.text)
        elif b.kind == "p":
            out.append(b.text)
        elif b.kind == "ul":
            out.append("\n".join(f"- {_md_cell(i)}" for i in b.items))
        elif b.kind == "img":
            out.append(f"![{b.items[0] if b.items else ''}]({b.text})")
        elif b.kind == "table":
            lines = [
                "| " + " | ".join(_md_cell(h) for h in b.header) + " |",
                "|" + "|".join("---" for _ in b.header) + "|",
            ]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f3f3f3}img{max-width:100%}h2{margin-top:1.6em}"""


def _inline(text: str) -> str:
    text = html.escape(text)
    if text.startswith("*") and text.endswith("*") and len(text) > 1:
        return f"<em>{text[1:-1]}</em>"
    return text


def to_html(blocks: list, out_dir: str) -> str:
    out = [
        "<!DOCTYPE html>",
        "<html><head><meta charset='utf-8'><title>Weak-scaling report</title>",
        f"<style>{_CSS}</style></head><body>",
    ]
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            out.append(f"<{b.kind}>{html.escape(b.text)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{_inline(b.text)}</p>")
        elif b.kind == "ul":
            out.append("<ul>" + "".join(f"<li>{html.escape(str(i))}</li>" for i in b.items) + "</ul>")
        elif b.kind == "img":
            # Inline so the single file can be attached to a ticket or mailed.
            with open(os.path.join(out_dir, b.text), "rb") as f:
                data = base64.b64encode(f.read()).decode("ascii")
            alt = html.escape(b.items[0] if b.items else "")
            out.append(f"<img alt='{alt}' src='data:image/png;base64,{data}'>")
        elif b.kind == "table":
            head = "".join(f"<th>{html.escape(str(h))}</th>" for h in b.header)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in b.rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
