"""The tidy results table: one row per run, the derived columns, reruns and the best picks.

Terms used throughout the analysis:
- series: the strategy label plus the options that distinguish configurations of that label
  within a study (e.g. `FULL_SHARD [prefetch=pre, limit_ag=on]` when a study holds several
  prefetch settings, plain `FULL_SHARD` when it holds one). A line on a weak-scaling plot.
- point: one series at one world size and per-device batch: what a rerun repeats.
- throughput: a run's images over its timed window's seconds (the end record's images_per_s.mean,
  ips_mean), stalls included; a point's is ips_point (analysis/stats.py: the run's own, or the
  geometric mean over its runs), what the figures plot and the interval is of.
- efficiency: images/s against the ideal line from the same series' smallest ok world size:
  ips_N / (ips_base × world_N / world_base), ips the point's throughput (ips_point). With a fixed
  number of ranks per node this is the paper's ips_N / (ips_base × N / N_base); using ranks keeps it
  right for single-node runs with 1, 2, 4 ... ranks as well.
- repetitions: the runs of one point (a study's repeats, or reruns of it); the ok ones' throughputs make
  the point's statistics (analysis/stats.py), while the row shows the newest one's record.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from vit_scale.distributed import all_labels, label_pattern
from vit_scale.record.health import slow_node_text
from vit_scale.record.reader import Collection, RunRecord, timed_step_ips

from . import stats

# Strategies appear in legends and tables in the registry's order (each family's labels as its
# file declares them), HYBRID_<g>GPU by g; a label the registry does not know goes last.
_LABELS = all_labels()
MODEL_ORDER = ["vit_micro", "vit_tiny", "vit_small", "vit_base", "vit_huge", "vit_1b", "vit_3b", "vit_5b", "vit_15b"]

# Short names for options in series labels; a legend entry has little room.
OPTION_SHORT = {
    "backward_prefetch": "prefetch",
    "limit_all_gathers": "limit_ag",
    "forward_prefetch": "fwd_prefetch",
    "activation_checkpointing": "ckpt",
    "use_orig_params": "orig_params",
}

VERSION_KEYS = ("python", "torch", "timm", "deepspeed", "colossalai", "cuda", "hip", "nccl")
MEMORY_MEASURES = (("peak_allocated_gib", "allocated"), ("peak_reserved_gib", "reserved"), ("peak_rss_gib", "rss"))

# The point's statistics over its ok runs (analysis/stats.py), in the kept row only.
POINT_COLUMNS = [
    "ips_point",
    "ips_ci_low",
    "ips_ci_high",
    "ips_ci_level",
    "ips_ci_method",
    "ips_step_median",
    "ips_slow_share",
    "ips_runs",
    "ips_runs_planned",
    "ips_not_steady",
    "ips_timed_steps",
    "ips_run_cv",
    "ips_run_values",
    "ips_run_rounds",
]

# A run's wall time split as its end record's time_split gives it (launch to the loop: start-up; the loop to
# the timed window: warm-up; the window; the rest), the whole, and nodes x the whole (docs/analysis.md)
TIME_COLUMNS = ["startup_s", "warmup_s", "timed_window_s", "rest_s", "run_wall_s", "run_node_s"]
# The point's allocation, in its kept row: every run of the point (ok or not, kept or set aside) with a split
ALLOCATION_COLUMNS = ["point_runs_split", "point_node_s", "point_timed_node_s", "point_timed_share"]

# Columns in the order a reader scans them; option columns (opt_*) and version columns follow.
LEADING_COLUMNS = [
    "study",
    "model",
    "params",
    "series",
    "strategy",
    "family",
    "implementation",
    "nodes",
    "world_size",
    "ranks_per_node",
    "batch_per_device",
    "batch_global",
    "status",
    "ips_mean",
    "ips_std",
    "ips_min",
    "ips_max",
    "ips_median",
    *POINT_COLUMNS,
    "ips_per_device",
    "efficiency",
    "efficiency_base_nodes",
    "efficiency_base_world_size",
    "efficiency_ci_low",
    "efficiency_ci_high",
    "memory_gib",
    "memory_measure",
    "mem_allocated_max_gib",
    "mem_allocated_mean_gib",
    "mem_reserved_max_gib",
    "mem_reserved_mean_gib",
    "mem_rss_max_gib",
    "mem_rss_mean_gib",
    "mem_window",
    "device_memory_gib",
    "tflops_per_device",
    "mfu",
    "peak_tflops_per_device",
    "steps_done",
    "steps_planned",
    "timed_steps",
    "warmup_steps",
    "wall_time_s",
    *TIME_COLUMNS,
    *ALLOCATION_COLUMNS,
    "replicas_agree",
    "slow_node",
    "final_loss",
    "error",
    "failed_rank",
    "reruns_set_aside",
    "run_id",
    "time_iso",
    "start_time",
    "job_id",
    "step_id",
    "job_name",
    "partition",
    "nodelist",
    "hosts",
    "launcher",
    "launched_by",
    "device_type",
    "device_name",
    "cpu_model",
    "cpu_count",
    "backend",
    "emulation",
    "shard_group_size",
    "replicate_group_size",
    "flops_per_image",
    "peak_tflops_source",
    "plan_memory_gib",
    "plan_peak_allocated_gib",
    "plan_fits",
    "git_revision",
    "notes",
    "path",
]


@dataclass
class Tables:
    results: pd.DataFrame  # the kept runs, one per point, with the point's statistics over its ok runs
    set_aside: pd.DataFrame  # the other runs of a point: older ok ones (pooled) and failed ones


def _num(x):
    """Numbers from JSON, with null, bools and junk as NaN so columns stay numeric."""
    if isinstance(x, bool) or x is None:
        return math.nan
    if isinstance(x, (int, float)):
        return float(x)
    return math.nan


def _d(x) -> dict:
    return x if isinstance(x, dict) else {}


def _fmt_option(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def run_row(run: RunRecord) -> dict:
    """Flatten one run's start and end records into a row of the tidy table."""
    s, e = run.start, run.end or {}
    strat, mem = _d(s.get("strategy")), _d(e.get("memory"))
    row = {
        **_setup_columns(s),
        "status": run.status,
        **_result_columns(run, e, _d(_d(s.get("config")).get("train"))),
        "repetition": _repetition(s),
        **_time_columns(e, _num(_d(s.get("world")).get("nodes"))),
        "replicas_agree": e.get("replicas_agree") if isinstance(e.get("replicas_agree"), bool) else None,
        # vit_scale.record.health's rule on the end record's nodes_health: "" when no node was slow
        "slow_node": slow_node_text(e.get("nodes_health")),
        "final_loss": _num(e.get("final_loss")),
        "error": e.get("error"),
        "failed_rank": _num(e.get("failed_rank")),
        "mem_window": mem.get("window"),
        **_provenance_columns(s),
        "notes": "; ".join([str(n) for n in (strat.get("notes") or [])] + run.notes),
        "path": run.path,
        "_options": _d(strat.get("options")),
    }
    if math.isnan(row["start_time"]):
        row["start_time"] = run.mtime
    # A run's own step figures, in order, for the interval of its median; read only where there is a result.
    row["_steps"] = timed_step_ips(run.path) if run.status == "ok" and not math.isnan(row["ips_mean"]) else []
    if math.isnan(row["ips_per_device"]) and not math.isnan(row["ips_mean"]):
        row["ips_per_device"] = row["ips_mean"] / row["world_size"]
    _add_memory(row, mem)
    if run.end is None:
        row["error"] = _unfinished_error(run, row["steps_planned"])
    versions = _d(s.get("versions"))
    for key in VERSION_KEYS:
        row[f"v_{key}"] = versions.get(key)
    for key, val in row["_options"].items():
        row[f"opt_{key}"] = val if isinstance(val, (str, int, float, bool)) or val is None else json.dumps(val)
    return row


def _setup_columns(s: dict) -> dict:
    """What ran where: the model, the strategy and its groups, the world and the batch."""
    model, strat, world, batch = _d(s.get("model")), _d(s.get("strategy")), _d(s.get("world")), _d(s.get("batch"))
    return {
        "study": s.get("study") or "",
        "model": model["name"],
        "params": _num(model.get("params")),
        "flops_per_image": _num(model.get("flops_per_image")),
        "strategy": strat["label"],
        "family": strat.get("family"),
        "implementation": strat.get("implementation"),
        "shard_group_size": _num(strat.get("shard_group_size")),
        "replicate_group_size": _num(strat.get("replicate_group_size")),
        "nodes": int(world["nodes"]),
        "world_size": int(world["world_size"]),
        "ranks_per_node": _num(world.get("ranks_per_node")),
        "device_type": world.get("device_type"),
        "device_name": world.get("device_name"),
        "device_memory_gib": _num(world.get("device_memory_gib")),
        "backend": world.get("backend"),
        "emulation": world.get("emulation"),
        "peak_tflops_per_device": _num(world.get("peak_tflops_per_device")),
        "peak_tflops_source": world.get("peak_tflops_source"),
        "batch_per_device": int(batch["per_device"]),
        "batch_global": _num(batch.get("global")),
    }


def _result_columns(run: RunRecord, e: dict, cfg_train: dict) -> dict:
    """The throughput the end record gives, and how many steps ran of those planned."""
    ips = _d(e.get("images_per_s"))
    return {
        "ips_mean": _num(ips.get("mean")),
        "ips_std": _num(ips.get("std")),
        "ips_min": _num(ips.get("min")),
        "ips_max": _num(ips.get("max")),
        "ips_median": _num(ips.get("median")),
        "ips_per_device": _num(e.get("images_per_s_per_device")),
        "tflops_per_device": _num(e.get("tflops_per_device")),
        "mfu": _num(e.get("mfu")),
        "steps_done": _num(e.get("steps_done")) if run.end else _num(run.last_step),
        "steps_planned": _num(cfg_train.get("steps")),
        "timed_steps": _num(e.get("timed_steps")),
        "warmup_steps": _num(cfg_train.get("warmup_steps")),
        "wall_time_s": _num(e.get("wall_time_s")),
    }


def _time_columns(e: dict, nodes: float) -> dict:
    """TIME_COLUMNS from the end record's time_split (NaN where a record has none: older runs, killed ones)."""
    split = _d(e.get("time_split"))
    wall = _num(split.get("wall_s"))
    return {
        "startup_s": _num(split.get("startup_s")),
        "warmup_s": _num(split.get("warmup_s")),
        "timed_window_s": _num(split.get("timed_s")),
        "rest_s": _num(split.get("rest_s")),
        "run_wall_s": wall,
        "run_node_s": nodes * wall,
    }


def _point_allocation(keep: dict, group: list) -> None:
    """ALLOCATION_COLUMNS into the kept row: node-seconds of all the point's runs with a time split."""
    split = [r for r in group if not math.isnan(r["run_node_s"])]
    spent = sum(r["run_node_s"] for r in split)
    timed = sum(r["nodes"] * r["timed_window_s"] for r in split if not math.isnan(r["timed_window_s"]))
    keep.update(
        point_runs_split=len(split),
        point_node_s=spent if split else math.nan,
        point_timed_node_s=timed if split else math.nan,
        point_timed_share=timed / spent if spent > 0 else math.nan,
    )


def _repetition(s: dict) -> int:
    repetition = _d(_d(s.get("config")).get("output")).get("repetition")
    return int(repetition) if isinstance(repetition, int) and not isinstance(repetition, bool) else 0


def repetition_of_record(run: RunRecord) -> int:
    """The study's repetition round a run record names (0: none)."""
    return _repetition(run.start)


def _provenance_columns(s: dict) -> dict:
    """When and where it ran: the run id, the Slurm job, the hosts, the launcher, the CPU, the plan's memory."""
    slurm, versions, plan = _d(s.get("slurm")), _d(s.get("versions")), _d(s.get("plan"))
    return {
        "run_id": s.get("run_id"),
        "time_iso": s.get("time_iso"),
        "start_time": _num(s.get("time")),
        "job_id": slurm.get("job_id"),
        "step_id": slurm.get("step_id"),
        "job_name": slurm.get("job_name"),
        "partition": slurm.get("partition"),
        "nodelist": slurm.get("nodelist"),
        "hosts": ",".join(map(str, s.get("hosts") or [])),
        "launcher": s.get("launcher"),
        # Written by vit_scale/record/versions.py since the CPU model and the process starter were added;
        # older records lack them, and the report says "not recorded" instead of guessing.
        "launched_by": versions.get("launched_by"),
        "cpu_model": versions.get("cpu_model") if isinstance(versions.get("cpu_model"), str) else None,
        "cpu_count": _num(versions.get("cpu_count")),
        "plan_memory_gib": _num(plan.get("memory_gib")),
        "plan_peak_allocated_gib": _num(plan.get("peak_allocated_gib")),
        "plan_fits": plan.get("fits") if isinstance(plan.get("fits"), bool) else None,
        "git_revision": s.get("git_revision"),
    }


def _add_memory(row: dict, mem: dict) -> None:
    for key, short in MEMORY_MEASURES:
        m = _d(mem.get(key))
        row[f"mem_{short}_max_gib"] = _num(m.get("max"))
        row[f"mem_{short}_mean_gib"] = _num(m.get("mean"))
    # The plots use one memory figure per run: what the allocator holds on a GPU, else the
    # process's RSS on CPU-only runs, where there is no allocator to ask.
    if not math.isnan(row["mem_allocated_max_gib"]):
        row["memory_gib"], row["memory_measure"] = row["mem_allocated_max_gib"], "allocated"
    elif not math.isnan(row["mem_rss_max_gib"]):
        row["memory_gib"], row["memory_measure"] = row["mem_rss_max_gib"], "rss"
    else:
        row["memory_gib"], row["memory_measure"] = math.nan, None


def _unfinished_error(run: RunRecord, steps_planned: float) -> str:
    """A run without an end record: how far it got, and what its ranks said."""
    how_far = f"stopped after step {run.last_step}"
    if not math.isnan(steps_planned):
        how_far += f" of {int(steps_planned)}"
    if run.partial_ips is not None:
        how_far += f" ({run.partial_ips:.1f} images/s over the timed steps logged)"
    rank_err = "; ".join(f"rank {r.get('rank')}: {r.get('status')}: {r.get('error')}" for r in run.rank_errors)
    return f"no end record; {how_far}" + (f"; {rank_err}" if rank_err else "")


def _point_key(row: dict) -> tuple:
    opts = json.dumps(row["_options"], sort_keys=True, default=str)
    return (
        row["study"],
        row["model"],
        row["strategy"],
        row["implementation"],
        opts,
        row["nodes"],
        row["world_size"],
        row["batch_per_device"],
        row["device_type"],
    )


def _usable_row(row: dict) -> bool:
    """As usable() below, for one row before the frame exists."""
    return row["status"] == "ok" and not math.isnan(row["ips_mean"]) and row["replicas_agree"] is not False


def _run_throughput(row: dict) -> float:
    """A run's figure: images over its timed window's seconds (the end record's images_per_s.mean)."""
    return row["ips_mean"]


def _repetitions_planned(group: list) -> int:
    """n of 'k of n ok': the point's repetition rounds seen (1..R from a study's --repeat), each run
    recorded without a round counting as one, and never fewer than its ok runs."""
    rounds = {r["repetition"] for r in group if r["repetition"] > 0}
    return len(rounds) + sum(1 for r in group if r["repetition"] <= 0)


def _point_statistics(keep: dict, group: list) -> None:
    """The point's throughput, its interval, step figures and how many of its runs were ok, into the kept row.
    A run a slow node spoiled is not pooled with runs it did not (the kept run is one of the latter where
    the point has any)."""
    pooled = [r for r in group if _usable_row(r) and bool(r["slow_node"]) == bool(keep["slow_node"])]
    pooled = pooled if _usable_row(keep) else []
    for r in group:
        r["_pooled"] = any(r is p for p in pooled)
    # a run and its steps travel together: dropping one drops both
    runs = [stats.Run(_run_throughput(r), r["_steps"], r["repetition"]) for r in pooled]
    runs = stats.usable_runs(runs)
    est = stats.point_estimate(runs)
    keep.update(
        ips_point=est.value,
        ips_ci_low=est.low,
        ips_ci_high=est.high,
        ips_ci_level=est.level,
        ips_ci_method=est.method or None,
        ips_step_median=est.median_step_ips,
        ips_slow_share=est.slow_share,
        ips_runs=est.runs,
        ips_runs_planned=max(_repetitions_planned(group), est.runs),
        ips_not_steady=est.not_steady,
        ips_timed_steps=est.steps,
        ips_run_cv=est.cv,
        ips_run_values=";".join(f"{r.throughput:.6g}" for r in runs),
        ips_run_rounds=";".join(str(r.repetition) for r in runs),
    )


def _dedupe(rows: list) -> tuple[list, list]:
    """Keep the newest ok run of each point without a slow node (else its newest ok run, else its newest
    run); the others are set aside, the ok ones among them pooled into the point's statistics (their
    `pooled` column says so)."""
    by_point: dict = {}
    for row in rows:
        by_point.setdefault(_point_key(row), []).append(row)
    kept, aside = [], []
    for group in by_point.values():
        group.sort(key=lambda r: (r["status"] == "ok", not r["slow_node"], r["start_time"]), reverse=True)
        keep = group[0]
        keep["reruns_set_aside"] = len(group) - 1
        _point_statistics(keep, group)
        _point_allocation(keep, group)
        kept.append(keep)
        for other in group[1:]:
            other["_kept"] = keep  # run ids need not be unique across run directories
            other["set_aside_for"] = keep["run_id"]
            other["set_aside_for_path"] = keep["path"]
            aside.append(other)
    return kept, aside


def _add_series(rows: list) -> None:
    """Name each row's series after the options that vary within its (study, strategy)."""
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["study"], row["strategy"]), []).append(row)
    for group in groups.values():
        keys = sorted({k for r in group for k in r["_options"]})
        varying = [k for k in keys if len({json.dumps(r["_options"].get(k), default=str) for r in group}) > 1]
        if len({r["implementation"] for r in group}) > 1:
            varying = ["implementation"] + varying
        for r in group:
            parts = []
            for k in varying:
                val = r["implementation"] if k == "implementation" else r["_options"].get(k)
                parts.append(f"{OPTION_SHORT.get(k, k)}={_fmt_option(val)}")
            r["series"] = r["strategy"] + (f" [{', '.join(parts)}]" if parts else "")


def runs_of(row) -> list:
    """A results row's ok runs as analysis/stats.py compares them: their throughputs and rounds, from
    ips_run_values and ips_run_rounds (what results.csv keeps of them, so a reader can redo the test)."""
    values, rounds = row.get("ips_run_values"), row.get("ips_run_rounds")
    if not isinstance(values, str) or not values:
        return []
    numbers = [float(v) for v in values.split(";")]
    rounds = [int(r) for r in rounds.split(";")] if isinstance(rounds, str) and rounds else [0] * len(numbers)
    return [stats.Run(v, (), r) for v, r in zip(numbers, rounds, strict=True)]


def point_ips(df: pd.DataFrame) -> pd.Series:
    """Each row's images/s as the analysis compares them: the point's throughput over wall time
    (ips_point), the statistic the figures plot and the intervals are of; the kept run's own
    throughput only where a row has no point figure (a frame built without the point's statistics)."""
    if "ips_point" not in df:
        return df["ips_mean"].astype(float)
    return df["ips_point"].astype(float).fillna(df["ips_mean"].astype(float))


def add_efficiency(df: pd.DataFrame) -> pd.DataFrame:
    """Scaling efficiency of each ok run's point against its series' smallest ok world size, from the
    points' throughputs (point_ips), and its interval propagated from the two points' intervals
    (stats.ratio_interval; exactly 1 at the base itself)."""
    df = df.copy()
    df["efficiency"] = np.nan
    df["efficiency_base_nodes"] = np.nan
    df["efficiency_base_world_size"] = np.nan
    df["efficiency_ci_low"] = np.nan
    df["efficiency_ci_high"] = np.nan
    ips = point_ips(df)
    ok = usable(df)
    ok = ok[ips.loc[ok.index] > 0]
    if ok.empty:
        return df
    # The base of each row is its group's row with the fewest ranks (idxmin: one label per row).
    base = ok.groupby(["study", "model", "series", "batch_per_device"], dropna=False)["world_size"].transform("idxmin")
    base_ips = ips.loc[base.to_numpy()].to_numpy()
    base_world = df.loc[base.to_numpy(), "world_size"].to_numpy()
    df.loc[ok.index, "efficiency"] = ips.loc[ok.index].to_numpy() / (
        base_ips * ok["world_size"].to_numpy() / base_world
    )
    df.loc[ok.index, "efficiency_base_nodes"] = df.loc[base.to_numpy(), "nodes"].to_numpy()
    df.loc[ok.index, "efficiency_base_world_size"] = base_world
    cols = ["ips_point", "ips_ci_low", "ips_ci_high"]
    point, at_base = df.loc[ok.index, cols].to_numpy(float).T, df.loc[base.to_numpy(), cols].to_numpy(float).T
    lo, hi = stats.ratio_interval(df.loc[ok.index, "efficiency"].to_numpy(float), point, at_base)
    own = ok.index.to_numpy() == base.to_numpy()  # the base against itself: 1 by definition
    df.loc[ok.index, "efficiency_ci_low"] = np.where(own, 1.0, lo)
    df.loc[ok.index, "efficiency_ci_high"] = np.where(own, 1.0, hi)
    return df


def _rank(value, order) -> tuple:
    return (order.index(value) if value in order else len(order), str(value))


def strategy_rank(label) -> tuple:
    for i, known in enumerate(_LABELS):
        found = re.fullmatch(label_pattern(known), str(label))
        if found:
            return (i, int(found.group(1)) if found.groups() else 0, "")
    return (len(_LABELS), 0, str(label))


def sort_table(df: pd.DataFrame) -> pd.DataFrame:
    """Study, then models by size, strategies in the paper's order, series, batch, ranks, time."""
    if df.empty:
        return df.reset_index(drop=True)
    keys = list(
        zip(
            df["study"].astype(str),
            df["params"].fillna(0),
            [_rank(m, MODEL_ORDER) for m in df["model"]],
            [strategy_rank(s) for s in df["strategy"]],
            df["series"].astype(str),
            df["batch_per_device"],
            df["world_size"],
            df["start_time"].fillna(0),
            strict=True,
        )
    )
    order = sorted(range(len(df)), key=keys.__getitem__)
    return df.iloc[order].reset_index(drop=True)


def _frame(rows: list) -> pd.DataFrame:
    df = pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    if df.empty:
        return pd.DataFrame(columns=LEADING_COLUMNS)
    for col in LEADING_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
    rest = [c for c in df.columns if c not in LEADING_COLUMNS]
    opts = sorted(c for c in rest if c.startswith("opt_"))
    vers = [f"v_{k}" for k in VERSION_KEYS if f"v_{k}" in rest]
    other = [c for c in rest if c not in opts and c not in vers]
    return df[LEADING_COLUMNS + opts + vers + other]


def build(coll: Collection) -> Tables:
    rows = [run_row(r) for r in coll.runs]
    kept, aside = _dedupe(rows)
    _add_series(kept)
    _add_series_for_aside(aside)
    results = sort_table(add_efficiency(_frame(kept)))
    set_aside = _frame(aside)
    if not set_aside.empty:
        # the point's statistics and efficiency belong to its kept row
        set_aside = set_aside.drop(
            columns=[
                "efficiency",
                "efficiency_base_nodes",
                "efficiency_base_world_size",
                "efficiency_ci_low",
                "efficiency_ci_high",
            ]
            + POINT_COLUMNS
            + ALLOCATION_COLUMNS
        )
    return Tables(results=results, set_aside=set_aside)


def _add_series_for_aside(aside: list) -> None:
    for r in aside:
        r["series"] = r["_kept"]["series"]
        r["pooled"] = r["_pooled"]  # an ok run whose median counts in the kept row's statistics


# ------------------------------------------------------------------------------ derived views


def usable(df: pd.DataFrame) -> pd.DataFrame:
    """Runs whose throughput can be compared: ok, measured, and not flagged as wrong.

    A run whose replicas disagree trained something other than what it claims (e.g. FSDP1
    HYBRID_SHARD with a shard group of 1 never synchronises), so its speed is not a result.
    """
    ok = (df["status"] == "ok") & df["ips_mean"].notna()
    return df[ok & (df["replicas_agree"] != False)]  # noqa: E712 - None means not checked


def slow_node_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Usable runs that ran on a slow node (slow_node not empty): their figures are that node's, so the
    comparison of strategies (best_runs) and the prediction's errors leave them out."""
    ok = usable(df)
    if "slow_node" not in ok:
        return ok.iloc[0:0]
    return ok[ok["slow_node"].fillna("").astype(str) != ""]


SEPARATED, NOT_SEPARATED = "separated", "not separated"
BEST_COLUMNS = ["runner_up", "ratio", "ratio_low", "ratio_high", "ratio_test", "verdict", "candidates"]


def best_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The fastest usable point (highest throughput, ips_point) for each model and node count, with the
    ratio of its throughput to the next one's and stats.compare's test of it: ratio_low/high the 95%
    interval, ratio_test the test (paired or Welch t on the log run throughputs) or why there is none
    (a point ran once), verdict `separated` when the interval excludes 1, `not separated` when it does
    not, empty when not compared.

    Grouped by rank count too: on one node, 1 rank and 2 ranks are different points (on a
    cluster with fixed ranks per node the two are the same grouping). A point whose run had a slow node
    (slow_node_runs) is not a candidate."""
    good = usable(df)
    good = good.drop(slow_node_runs(df).index).copy()
    good["_rank_ips"] = point_ips(good)
    out = []
    for _, grp in good.groupby(["model", "nodes", "world_size"], sort=False):
        grp = grp.sort_values(["_rank_ips", "memory_gib"], ascending=[False, True])
        best = grp.iloc[0].copy()
        best["runner_up"], best["ratio"], best["ratio_low"], best["ratio_high"] = None, np.nan, np.nan, np.nan
        best["ratio_test"], best["verdict"] = None, None
        if len(grp) > 1:
            nxt = grp.iloc[1]
            test = stats.compare(runs_of(best), runs_of(nxt))
            best["runner_up"] = nxt["series"]
            best["ratio"] = best["_rank_ips"] / nxt["_rank_ips"]
            best["ratio_low"], best["ratio_high"], best["ratio_test"] = test.low, test.high, test.method
            best["verdict"] = {True: SEPARATED, False: NOT_SEPARATED, None: None}[test.separated]
        best["candidates"] = len(grp)
        out.append(best.drop("_rank_ips"))
    if not out:
        return pd.DataFrame(columns=list(df.columns) + BEST_COLUMNS)
    res = pd.DataFrame(out)
    params = res["params"].fillna(0).tolist()
    keys = [
        (params[i], _rank(m, MODEL_ORDER), n, w)
        for i, (m, n, w) in enumerate(zip(res["model"], res["nodes"], res["world_size"], strict=True))
    ]
    return res.iloc[sorted(range(len(res)), key=keys.__getitem__)].reset_index(drop=True)


def format_ips(value: float) -> str:
    """Throughput as a paper prints it: 12,679 or 292.2 or 3.41, never 1.268e+04."""
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}" if value >= 1 else f"{value:.3g}"


def x_axis(df: pd.DataFrame) -> tuple[str, str]:
    """Nodes on the x axis, unless every run is on one node and only the rank count varies (GPUs
    when the ranks are GPUs: the ladder of one GPU machine without Slurm)."""
    if df["nodes"].nunique() <= 1 and df["world_size"].nunique() > 1:
        gpus = "device_type" in df and df["device_type"].isin(["cuda", "rocm"]).all()
        return "world_size", "GPUs" if gpus else "ranks"
    return "nodes", "nodes"


def scaling_table(df: pd.DataFrame, model: str) -> pd.DataFrame:
    """Series × x (nodes or ranks) with 'ips (eff%)' cells or the failure status: the paper's table.
    ips is the point's median (point_ips), the figure the efficiency beside it is worked out from."""
    sub = df[df["model"] == model]
    xcol, _ = x_axis(sub)
    multi_batch = sub["batch_per_device"].nunique() > 1
    multi_study = sub["study"].nunique() > 1
    cells: dict = {}
    ips = point_ips(sub)
    for i, r in sub.iterrows():
        name = r["series"] + (f" bs={r['batch_per_device']}" if multi_batch else "")
        name = (f"{r['study']}: " if multi_study else "") + name
        if r["status"] == "ok" and not math.isnan(r["ips_mean"]):
            eff = "" if math.isnan(r["efficiency"]) else f" ({r['efficiency'] * 100:.0f}%)"
            text = f"{format_ips(ips.at[i])}{eff}"
        else:
            text = r["status"].upper()
        cells.setdefault(name, {})[int(r[xcol])] = text
    cols = sorted({x for v in cells.values() for x in v})
    return pd.DataFrame([[cells[n].get(x, "") for x in cols] for n in cells], index=list(cells), columns=cols)
