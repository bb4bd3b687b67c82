"""Which runs a figure draws, in which order, and the words that describe them: the lines of a
scaling plot, the models' panel order and titles, the legend labels, the line of facts above a
figure, the images/s a point is drawn at and the words for its error bar. Pandas only; nothing
here draws."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import stats
from .. import table as tbl

LINE_COLUMNS = ["study", "series", "batch_per_device"]  # one line on a scaling plot
RSS_NOTE = "CPU: peak RSS is the whole process (interpreter, torch, buffers), not the sharded model state"


def model_order(df: pd.DataFrame) -> list:
    """The models of df, smallest first: the order of the panels and of the report's tables."""
    first = df.drop_duplicates("model")
    rows = sorted(
        first.itertuples(index=False),
        key=lambda r: (0 if pd.isna(r.params) else r.params, tbl._rank(r.model, tbl.MODEL_ORDER)),
    )
    return [r.model for r in rows]


def model_title(df: pd.DataFrame, model: str) -> str:
    params = df.loc[df["model"] == model, "params"].dropna()
    if params.empty:
        return model
    p = params.iloc[0]
    size = f"{p / 1e9:.2g}B" if p >= 1e9 else f"{p / 1e6:.3g}M"
    return f"{model} ({size} params)"


def line_order(key) -> tuple:
    study, series, batch = key
    return (str(study), tbl.strategy_rank(series.split(" ")[0]), series, batch)


def lines(sub: pd.DataFrame):
    """(key, rows sorted by world size) for each line in sub, in legend order."""
    if sub.empty:
        return
    groups = sub.groupby(LINE_COLUMNS, sort=False)
    for key in sorted(groups.groups, key=line_order):
        yield key, groups.get_group(key).sort_values("world_size")


def labeller(df: pd.DataFrame):
    """Legend text for a line: the series, plus study and batch only where the figure mixes them."""
    many_studies = df["study"].nunique() > 1
    many_batches = df["batch_per_device"].nunique() > 1

    def label(key) -> str:
        study, series, batch = key
        text = series + (f" bs={batch}" if many_batches else "")
        return f"{study}: {text}" if many_studies else text

    return label


def series_items(handles: dict, label) -> list:
    """(legend text, handle) of each drawn line, in legend order."""
    return [(label(k), handles[k]) for k in sorted(handles, key=line_order)]


def scaling_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Runs on a line with at least two world sizes: the weak-scaling ladder, not one-off points."""
    if df.empty:
        return df
    sizes = df.groupby(LINE_COLUMNS + ["model"])["world_size"].transform("nunique")
    return df[sizes >= 2]


def _usable_points(df: pd.DataFrame, value: str) -> pd.Series:
    """Per line (model + LINE_COLUMNS), how many runs give a number for `value`."""
    ok = tbl.usable(df) if value == "ips_mean" else df[(df["status"] == "ok") & df[value].notna()]
    if ok.empty:
        return pd.Series(dtype=int)
    return ok.groupby(["model"] + LINE_COLUMNS)["world_size"].nunique()


def single_point_lines(df: pd.DataFrame) -> list:
    """(model, series, x, status) of each series that ran at one world size only: no line on a
    scaling figure, so the report names them."""
    if df.empty:
        return []
    sizes = df.groupby(LINE_COLUMNS + ["model"])["world_size"].transform("nunique")
    out = []
    for _, r in df[sizes < 2].iterrows():
        xcol, xname = tbl.x_axis(df[df["model"] == r["model"]])
        out.append((r["model"], r["series"], f"{int(r[xcol])} {xname}", r["status"]))
    return out


def scaling_support(df: pd.DataFrame, value: str = "ips_mean") -> str | None:
    """None when some line has two or more usable points of `value`; else why a scaling figure
    would have nothing to say."""
    if df.empty:
        return "no runs"
    runs = scaling_runs(df)
    if runs.empty:
        return "no strategy has runs at two or more world sizes"
    if (_usable_points(runs, value) >= 2).any():
        return None
    what = "a throughput" if value == "ips_mean" else "a memory figure"
    return (
        f"every strategy has at most one run with {what} (the others did not finish ok), so each line "
        f"would be one point; the tables hold the numbers"
    )


def ips_points(ok: pd.DataFrame) -> tuple:
    """(throughput, low, high) images/s of each row, as arrays: the point's throughput over wall time and
    its interval, the table's ips_point and ips_ci_low/high; a row without the point columns (a table
    written before them) is drawn at its run's throughput, without a bar."""
    mean = ok["ips_mean"].to_numpy(float)
    if "ips_point" not in ok:
        return mean, np.full(len(ok), np.nan), np.full(len(ok), np.nan)
    point = ok["ips_point"].to_numpy(float)
    return (
        np.where(np.isnan(point), mean, point),
        ok["ips_ci_low"].to_numpy(float),
        ok["ips_ci_high"].to_numpy(float),
    )


INTERVAL = "95% interval"
# How each interval method is said: in a caption, and shorter in the facts line above a figure.
_HOW = {
    stats.WITHIN_RUN: "within one run (batch means of its step times; silent on run-to-run variation)",
    stats.T_LOG_RUNS: "t over {} runs (log throughputs)",
}
_HOW_SHORT = {
    stats.WITHIN_RUN: "within-run, 1 run",
    stats.T_LOG_RUNS: "t, {} runs",
}


def interval_how(ok: pd.DataFrame, short: bool = False) -> str:
    """How the error bars of these usable rows were worked out, in words: 'within one run (...)', 't over
    3 runs (log throughputs)', joined by 'or' when the points differ, and a note when some point has no
    interval (too few timed steps). short: the facts line's words."""
    if "ips_ci_method" not in ok or ok.empty:
        return "none in this table"
    words = _HOW_SHORT if short else _HOW
    methods = ok["ips_ci_method"].where(ok["ips_ci_method"].map(lambda m: isinstance(m, str) and m != ""))
    parts = [words[m].format(_span(ok.loc[methods == m, "ips_runs"], _int)) for m in words if (methods == m).any()]
    parts += [m for m in dict.fromkeys(methods.dropna()) if m not in words]
    if not parts:
        return f"none: every point has fewer than {stats.MIN_STEPS} timed steps"
    lacking = int(methods.isna().sum())
    if short:
        return "; ".join(parts + ([f"none below {stats.MIN_STEPS} timed steps"] if lacking else []))
    return " or ".join(parts) + (
        f" (none on {lacking} point{'s' if lacking > 1 else ''} with fewer than {stats.MIN_STEPS} timed steps)"
        if lacking
        else ""
    )


def interval_text(ok: pd.DataFrame) -> str:
    """'95% interval: t over 3 runs (log throughputs)': what a figure's error bars are, for its caption."""
    return f"{INTERVAL}: {interval_how(ok)}"


def interval_facts(ok: pd.DataFrame) -> str:
    """'95% interval (t, 3 runs)': the same for the facts line above a figure."""
    return f"{INTERVAL} ({interval_how(ok, short=True)})"


def not_ok(sub: pd.DataFrame) -> pd.DataFrame:
    """Runs drawn as a failure mark: not ok, or ok without a throughput."""
    return sub[(sub["status"] != "ok") | sub["ips_mean"].isna()]


def memory_label(measures) -> str:
    measures = {m for m in measures if isinstance(m, str)}
    if measures == {"allocated"}:
        return "peak allocated per GPU (GiB)"
    if measures == {"rss"}:
        return "peak RSS per rank (GiB), CPU"
    return "peak memory per rank (GiB)"


def _span(values, fmt=str) -> str:
    vals = sorted({v for v in values if not pd.isna(v)})
    if not vals:
        return ""
    if len(vals) == 1:
        return fmt(vals[0])
    return f"{fmt(vals[0])}–{fmt(vals[-1])}" if len(vals) > 3 else "/".join(fmt(v) for v in vals)


def _int(v) -> str:
    return str(int(v))


def _devices(df: pd.DataFrame) -> str:
    """'8 × AMD Instinct MI250X per node', or the CPU with its cores: what ran the ranks."""
    parts = []
    for (dtype, name), sub in df.groupby([df["device_type"].fillna("?"), df["device_name"].fillna("?")], sort=False):
        per_node = _span(sub["ranks_per_node"], _int)
        if dtype == "cpu":
            model = _span(sub["cpu_model"]) if "cpu_model" in sub else ""
            cores = _span(sub["cpu_count"], _int) if "cpu_count" in sub else ""
            cpu = (model or f"{name} CPU (model not recorded)") + (f", {cores} logical CPUs" if cores else "")
            parts.append(f"{cpu}; {per_node} ranks per node, gloo" if per_node else cpu)
        else:
            parts.append(f"{per_node} × {name} per node" if per_node else name)
    return "; ".join(parts)


def run_facts(df: pd.DataFrame) -> str:
    """Devices · batch per device · precision · steps, from the runs a figure shows."""
    if df.empty:
        return ""
    parts = [_devices(df)]
    batch = _span(df["batch_per_device"], _int)
    if batch:
        parts.append(f"batch {batch} per {'rank' if (df['device_type'] == 'cpu').all() else 'device'}")
    if "opt_precision" in df:
        precision = _span(df["opt_precision"].dropna().astype(str))
        if precision:
            parts.append(precision)
    timed = _span(df.loc[df["status"] == "ok", "timed_steps"], _int) if "timed_steps" in df else ""
    warm = _span(df["warmup_steps"], _int) if "warmup_steps" in df else ""
    if timed:
        parts.append(f"{timed} timed steps" + (f" after {warm} warm-up" if warm else ""))
    return " · ".join(p for p in parts if p)
