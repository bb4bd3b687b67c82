"""The figures of seed 003 (and the plugin comparison of seeds 000/001) from the results table.

Every function takes the tidy table and returns a Plot, or None when the table holds nothing to
draw it from. Plot.drawn records what was put on the axes (lines, bars, failure marks, cell
values) so tests can check a figure's content without reading pixels. Figures are built with
matplotlib's object API on the Agg canvas: no pyplot, so no global figure state and no display
is ever needed.

Conventions across figures: one colour per series everywhere; measured = solid line with dots;
ideal = dashed, same colour; device capacity = dotted grey; a run that did not finish ok = an ×
in its series' colour along the bottom of the axes at its node count.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from . import table as tbl

PANEL_W, PANEL_H = 4.2, 3.2  # inches per subplot: two columns of a paper page at 300 dpi
FAIL_MARK = dict(marker="x", s=46, linewidths=1.8, clip_on=False, zorder=5)
GRID_STRATEGIES = ("HYBRID_2GPU", "FULL_SHARD", "SHARD_GRAD_OP")  # Figure 1's order
PREFETCH_ORDER = ("none", "pre", "post")


@dataclass
class Plot:
    name: str                    # file stem, e.g. weak_scaling_ips
    title: str                   # for the report
    figure: Figure
    drawn: dict = field(default_factory=dict)
    caption: str = ""

    def save(self, out_dir: str, dpi: int = 300, formats=("png", "pdf")) -> list:
        paths = []
        for fmt in formats:
            path = os.path.join(out_dir, f"{self.name}.{fmt}")
            self.figure.savefig(path, dpi=dpi, bbox_inches="tight")
            paths.append(path)
        return paths


def _figure(nrows: int, ncols: int, w: float = PANEL_W, h: float = PANEL_H):
    fig = Figure(figsize=(w * ncols, h * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def _palette() -> list:
    import matplotlib

    # tab10 first (the paper-like look), then qualitative maps whose colours differ from it;
    # tab20 alone would give neighbouring series two shades of one hue.
    out = []
    for name in ("tab10", "Dark2", "Set1", "Accent"):
        for c in matplotlib.colormaps[name].colors:
            h = to_hex(c)
            if h not in out:
                out.append(h)
    return out


def series_colors(df: pd.DataFrame) -> dict:
    """A fixed colour per series, shared by every figure: the weak-scaling series take the first
    (most distinct) colours, in the paper's strategy order; one-off configurations follow."""
    if df.empty:
        return {}
    scaling = set(scaling_runs(df)["series"])
    series = df.drop_duplicates("series")[["series", "strategy"]]
    ordered = sorted(series.itertuples(index=False),
                     key=lambda r: (r.series not in scaling, tbl._rank(r.strategy, tbl.STRATEGY_ORDER), r.series))
    palette = _palette()
    return {r.series: palette[i % len(palette)] for i, r in enumerate(ordered)}


def _si(value: float, _pos=None) -> str:
    """Tick text such as 200, 1.5k, 20k, 1M: 2x10^3 is hard to read off a plot."""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def _log_y(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(_si))
    ax.yaxis.set_minor_locator(NullLocator())


def _models(df: pd.DataFrame) -> list:
    first = df.drop_duplicates("model")
    rows = sorted(first.itertuples(index=False),
                  key=lambda r: (0 if pd.isna(r.params) else r.params, tbl._rank(r.model, tbl.MODEL_ORDER)))
    return [r.model for r in rows]


def _model_title(df: pd.DataFrame, model: str) -> str:
    params = df.loc[df["model"] == model, "params"].dropna()
    if params.empty:
        return model
    p = params.iloc[0]
    size = f"{p / 1e9:.2g}B" if p >= 1e9 else f"{p / 1e6:.3g}M"
    return f"{model} ({size} params)"


LINE_COLUMNS = ["study", "series", "batch_per_device"]  # one line on a scaling plot


def _line_order(key) -> tuple:
    study, series, batch = key
    return (str(study), tbl._rank(series.split(" ")[0], tbl.STRATEGY_ORDER), series, batch)


def _lines(sub: pd.DataFrame):
    """(key, rows sorted by world size) for each line in sub, in legend order."""
    if sub.empty:
        return
    groups = sub.groupby(LINE_COLUMNS, sort=False)
    for key in sorted(groups.groups, key=_line_order):
        yield key, groups.get_group(key).sort_values("world_size")


def _labeller(df: pd.DataFrame):
    """Legend text for a line: the series, plus study and batch only where the figure mixes them."""
    many_studies = df["study"].nunique() > 1
    many_batches = df["batch_per_device"].nunique() > 1

    def label(key) -> str:
        study, series, batch = key
        text = series + (f" bs={batch}" if many_batches else "")
        return f"{study}: {text}" if many_studies else text
    return label


def scaling_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Runs on a line with at least two world sizes: the weak-scaling ladder, not one-off points."""
    if df.empty:
        return df
    sizes = df.groupby(LINE_COLUMNS + ["model"])["world_size"].transform("nunique")
    return df[sizes >= 2]


def _log2_x(ax, xs) -> None:
    xs = sorted({int(x) for x in xs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.minorticks_off()
    if len(xs) == 1:
        ax.set_xlim(xs[0] / 1.5, xs[0] * 1.5)


def _mark_failures(ax, points, color, slots: dict) -> int:
    """× at the bottom of the axes for each x in points; stacked when several fail at one x."""
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for x in points:
        k = slots.get(x, 0)
        slots[x] = k + 1
        ax.scatter([x], [0.04 + 0.06 * k], color=color, transform=trans, **FAIL_MARK)
    return len(points)


def _reserve_bottom_log(ax, slots: dict) -> None:
    """Lower a log y axis so the stacked × marks sit below the lowest measured point."""
    depth = max(slots.values(), default=0)
    if depth == 0 or not ax.get_lines():
        return
    lo, hi = (math.log10(v) for v in ax.get_ylim())
    share = 0.04 + 0.06 * depth  # the fraction of the axes the marks take, plus a gap
    new_lo = (lo - share * hi) / (1 - share)
    ax.set_ylim(10 ** new_lo, 10 ** hi)


def _not_ok(sub: pd.DataFrame) -> pd.DataFrame:
    return sub[(sub["status"] != "ok") | sub["ips_mean"].isna()]


def _shared_legend(fig, handles: dict, extra: list, label=str) -> None:
    """One legend for the figure: the same series has the same colour in every panel."""
    items = [(label(k), handles[k]) for k in sorted(handles, key=_line_order)] + extra
    if items:
        fig.legend([h for _, h in items], [n for n, _ in items], loc="outside right upper", fontsize=7, frameon=False)


def _extras(counts, **entries) -> list:
    """Legend entries for the ideal, capacity and failure marks, only where some panel has one."""
    return [(name, make()) for key, (name, make) in entries.items() if any(c.get(key) for c in counts)]


_IDEAL = ("ideal (linear from smallest run)", lambda: Line2D([], [], color="grey", ls="--"))
_CAPACITY = ("device capacity", lambda: Line2D([], [], color="grey", ls=":"))
_NOT_OK = ("not ok (see report)", lambda: Line2D([], [], color="grey", marker="x", ls="none"))


def _memory_label(measures) -> str:
    measures = {m for m in measures if isinstance(m, str)}
    if measures == {"allocated"}:
        return "peak allocated per GPU (GiB)"
    if measures == {"rss"}:
        return "peak RSS per rank (GiB), CPU"
    return "peak memory per rank (GiB)"


# ------------------------------------------------------------------------ Figures 2 and 3: ips

def weak_scaling(df: pd.DataFrame, colors: Optional[dict] = None) -> Optional[Plot]:
    runs = scaling_runs(df)
    if runs.empty:
        return None
    colors = colors or series_colors(df)
    models = _models(runs)
    ncols = min(3, len(models))
    nrows = math.ceil(len(models) / ncols)
    fig, axes = _figure(nrows, ncols)
    label = _labeller(runs)
    handles, drawn = {}, {}
    for i, model in enumerate(models):
        ax = axes[i // ncols][i % ncols]
        sub = runs[runs["model"] == model]
        xcol, xname = tbl.x_axis(sub)
        counts = {"measured": 0, "ideal": 0, "failed": 0}
        slots: dict = {}
        for key, line in _lines(sub):
            color = colors.get(key[1], "black")
            ok = tbl.usable(line)
            if not ok.empty:
                h, = ax.plot(ok[xcol], ok["ips_mean"], "-o", color=color, ms=3.5, lw=1.5)
                handles.setdefault(key, h)
                counts["measured"] += 1
                base = ok.iloc[0]
                ideal_x = line[xcol].to_numpy()
                ideal_y = base["ips_mean"] * line["world_size"].to_numpy() / base["world_size"]
                ax.plot(ideal_x, ideal_y, "--", color=color, lw=1.0, alpha=0.7)
                counts["ideal"] += 1
            counts["failed"] += _mark_failures(ax, list(_not_ok(line)[xcol]), color, slots)
        _log2_x(ax, sub[xcol])
        _log_y(ax)
        _reserve_bottom_log(ax, slots)
        ax.set_title(_model_title(df, model), fontsize=9)
        ax.set_xlabel(xname)
        ax.set_ylabel("images/s")
        ax.grid(True, which="major", alpha=0.3)
        drawn[model] = counts
    for j in range(len(models), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    extra = _extras(drawn.values(), ideal=_IDEAL, failed=_NOT_OK)
    _shared_legend(fig, handles, extra, label)
    return Plot("weak_scaling_ips", "Weak scaling: images/s", fig, drawn,
                "Measured images/s (solid) against the ideal linear scaling from each strategy's smallest run "
                "(dashed); × marks a run that did not finish ok.")


# --------------------------------------------------------------------------- memory per GPU

def memory(df: pd.DataFrame, colors: Optional[dict] = None) -> Optional[Plot]:
    runs = scaling_runs(df)
    if runs.empty:
        return None
    colors = colors or series_colors(df)
    models = _models(runs)
    # The paper draws FULL_SHARD apart: its memory falls with every node added while the others'
    # stays flat, and on one axis the flat lines would hide its curve.
    split = (runs["strategy"] == "FULL_SHARD").any() and (runs["strategy"] != "FULL_SHARD").any()
    ncols = 2 if split else 1
    fig, axes = _figure(len(models), ncols)
    label = _labeller(runs)
    handles, drawn = {}, {}
    ylabel = _memory_label(runs["memory_measure"])
    for i, model in enumerate(models):
        sub_all = runs[runs["model"] == model]
        xcol, xname = tbl.x_axis(sub_all)
        panels = [("FULL_SHARD", sub_all[sub_all["strategy"] == "FULL_SHARD"]),
                  ("other strategies", sub_all[sub_all["strategy"] != "FULL_SHARD"])] if split else \
                 [("all strategies", sub_all)]
        for j, (panel_name, sub) in enumerate(panels):
            ax = axes[i][j]
            counts = {"measured": 0, "capacity": 0, "failed": 0}
            slots: dict = {}
            for key, line in _lines(sub):
                color = colors.get(key[1], "black")
                ok = line[(line["status"] == "ok") & line["memory_gib"].notna()]
                if not ok.empty:
                    h, = ax.plot(ok[xcol], ok["memory_gib"], "-o", color=color, ms=3.5, lw=1.5)
                    handles.setdefault(key, h)
                    counts["measured"] += 1
                counts["failed"] += _mark_failures(ax, list(line[line["status"] != "ok"][xcol]), color, slots)
            capacity = sub_all["device_memory_gib"].dropna()
            if not capacity.empty:
                ax.axhline(capacity.max(), color="grey", ls=":", lw=1.2)
                counts["capacity"] = 1
            if sub.empty:
                ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", color="grey")
            _log2_x(ax, sub_all[xcol])
            ax.set_ylim(bottom=0)
            ax.set_title(f"{_model_title(df, model)}: {panel_name}", fontsize=9)
            ax.set_xlabel(xname)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            drawn[(model, panel_name)] = counts
    extra = _extras(drawn.values(), capacity=_CAPACITY, failed=_NOT_OK)
    _shared_legend(fig, handles, extra, label)
    return Plot("memory", "Peak memory per device", fig, drawn,
                f"{ylabel} (the maximum over ranks) against nodes; dotted: the device's memory.")


# ------------------------------------------------------------------------ efficiency heat map

def efficiency(df: pd.DataFrame) -> Optional[Plot]:
    runs = scaling_runs(df)
    if runs.empty:
        return None
    models = _models(runs)
    label = _labeller(runs)
    matrices = {}
    for model in models:
        sub = runs[runs["model"] == model]
        xcol, xname = tbl.x_axis(sub)
        lines = list(_lines(sub))
        cols = sorted(sub[xcol].astype(int).unique())
        values = pd.DataFrame(np.nan, index=[label(k) for k, _ in lines], columns=cols)
        text = pd.DataFrame("", index=values.index, columns=cols)
        for k, line in lines:
            for _, r in line.iterrows():
                x = int(r[xcol])
                if r["status"] == "ok" and not pd.isna(r["efficiency"]):
                    values.loc[label(k), x] = r["efficiency"]
                    text.loc[label(k), x] = f"{r['efficiency'] * 100:.0f}%"
                else:
                    text.loc[label(k), x] = "×\n" + str(r["status"]).upper()
        matrices[model] = (values, text, xname)
    ncols = min(2, len(models))
    nrows = math.ceil(len(models) / ncols)
    widest = max(len(v.columns) for v, _, _ in matrices.values())
    tallest = max(len(v.index) for v, _, _ in matrices.values())
    fig, axes = _figure(nrows, ncols, w=2.6 + 0.55 * widest, h=0.9 + 0.32 * tallest)
    every = np.concatenate([v.to_numpy().ravel() for v, _, _ in matrices.values()])
    every = every[~np.isnan(every)]
    vmin = min(0.5, float(every.min())) if every.size else 0.5
    vmax = max(1.0, float(every.max())) if every.size else 1.0
    image = None
    for i, model in enumerate(models):
        ax = axes[i // ncols][i % ncols]
        values, text, xname = matrices[model]
        image = ax.imshow(np.ma.masked_invalid(values.to_numpy(dtype=float)), cmap="RdYlGn", vmin=vmin, vmax=vmax,
                          aspect="auto")
        for (r, c), t in np.ndenumerate(text.to_numpy()):
            ax.text(c, r, t, ha="center", va="center", fontsize=6.5,
                    color="black" if "×" not in t else "firebrick")
        ax.set_xticks(range(len(values.columns)), [str(c) for c in values.columns])
        ax.set_yticks(range(len(values.index)), list(values.index), fontsize=7)
        ax.set_xlabel(xname)
        ax.set_title(_model_title(df, model), fontsize=9)
    for j in range(len(models), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="scaling efficiency")
    return Plot("efficiency", "Scaling efficiency", fig, {m: v for m, (v, _, _) in matrices.items()},
                "images/s as a fraction of ideal linear scaling from each strategy's smallest run; "
                "× marks a run that did not finish ok.")


# ------------------------------------------------------------------ Figure 1: the config grid

def _grid_rows(df: pd.DataFrame) -> pd.DataFrame:
    has = pd.Series(True, index=df.index)
    for col in ("opt_backward_prefetch", "opt_limit_all_gathers"):
        has &= df[col].notna() if col in df.columns else False
    return df[has & (df["family"] == "fsdp")]


def pick_grid(df: pd.DataFrame, model: Optional[str] = None, nodes: Optional[int] = None):
    """(study, model, nodes, batch) with the most FSDP prefetch × limit_all_gathers configurations.

    Raises ValueError naming what exists when --grid-model/--grid-nodes match nothing.
    """
    rows = _grid_rows(df)
    if model is not None:
        if model not in set(rows["model"]):
            have = ", ".join(sorted(set(rows["model"]))) or "none"
            raise ValueError(f"--grid-model: no FSDP runs with prefetch options for {model!r}; "
                             f"models with them: {have}")
        rows = rows[rows["model"] == model]
    if nodes is not None:
        if nodes not in set(rows["nodes"]):
            have = ", ".join(str(n) for n in sorted(set(rows["nodes"]))) or "none"
            raise ValueError(f"--grid-nodes: no FSDP runs with prefetch options at {nodes} nodes"
                             f"{' for ' + model if model else ''}; node counts with them: {have}")
        rows = rows[rows["nodes"] == nodes]
    if rows.empty:
        return None
    # A grid needs some strategy at two or more settings; several strategies at one setting each
    # is just a bar chart of the weak-scaling runs at that node count.
    distinct = rows.drop_duplicates(["study", "model", "nodes", "batch_per_device", "strategy",
                                     "opt_backward_prefetch", "opt_limit_all_gathers"])
    point = ["study", "model", "nodes", "batch_per_device"]
    per_strategy = distinct.groupby(point + ["strategy"]).size().groupby(level=point).max()
    configs = distinct.groupby(point).size()
    configs = configs[per_strategy.reindex(configs.index) >= 2]
    if configs.empty:
        return None
    best = configs.sort_values(ascending=False, kind="stable")
    top = best[best == best.iloc[0]].index
    return max(top, key=lambda k: (k[2], k[1]))  # ties: the larger node count


def config_grid(df: pd.DataFrame, model: Optional[str] = None, nodes: Optional[int] = None) -> Optional[Plot]:
    pick = pick_grid(df, model, nodes)
    if pick is None:
        return None
    study, model, nodes, batch = pick
    rows = _grid_rows(df)
    rows = rows[(rows["study"] == study) & (rows["model"] == model) & (rows["nodes"] == nodes)
                & (rows["batch_per_device"] == batch)]
    labels = [s for s in GRID_STRATEGIES if s in set(rows["strategy"])] + sorted(
        s for s in set(rows["strategy"]) if s not in GRID_STRATEGIES)
    combos = [(p, lag) for p in PREFETCH_ORDER for lag in (False, True)
              if ((rows["opt_backward_prefetch"] == p) & (rows["opt_limit_all_gathers"] == lag)).any()]
    fig, axes = _figure(1, 1, w=max(5.0, 1.1 * len(labels) * max(1, len(combos)) / 2 + 2.0), h=3.4)
    ax = axes[0][0]
    import matplotlib

    cmap = matplotlib.colormaps["Blues"]
    pcolor = {p: cmap(0.35 + 0.25 * i) for i, p in enumerate(PREFETCH_ORDER)}
    width = 0.8 / max(1, len(combos))
    values, failed, bars = {}, [], 0
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for gi, label in enumerate(labels):
        for ci, (p, lag) in enumerate(combos):
            x = gi - 0.4 + width * (ci + 0.5)
            cell = rows[(rows["strategy"] == label) & (rows["opt_backward_prefetch"] == p)
                        & (rows["opt_limit_all_gathers"] == lag)]
            ok = tbl.usable(cell)
            if not ok.empty:
                ips = ok["ips_mean"].max()
                ax.bar(x, ips, width * 0.92, color=pcolor[p], edgecolor="black", lw=0.5, hatch=None if lag else "///")
                ax.text(x, ips, f"{ips:.0f}", ha="center", va="bottom", fontsize=5.5, rotation=90)
                values[(label, p, bool(lag))] = float(ips)
                bars += 1
            elif not cell.empty:
                ax.scatter([x], [0.04], color="firebrick", transform=trans, **FAIL_MARK)
                failed.append((label, p, bool(lag), cell["status"].iloc[0]))
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("images/s")
    ax.set_ylim(0, max(values.values()) * 1.15 if values else 1)
    ax.set_title(f"{_model_title(df, model)}, {nodes} nodes, batch {batch} per device", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    handles = [Line2D([], [], color=pcolor[p], lw=6) for p in PREFETCH_ORDER if any(c[0] == p for c in combos)]
    names = [f"backward prefetch {p}" for p in PREFETCH_ORDER if any(c[0] == p for c in combos)]
    from matplotlib.patches import Patch

    handles += [Patch(facecolor="white", edgecolor="black", hatch="///"), Patch(facecolor="white", edgecolor="black")]
    names += ["limit_all_gathers off", "limit_all_gathers on"]
    if failed:
        handles.append(Line2D([], [], color="firebrick", marker="x", ls="none"))
        names.append("not ok (see report)")
    ax.legend(handles, names, fontsize=6.5, loc="upper right", ncols=2)
    return Plot("config_grid", "FSDP configurations (Figure 1)", fig,
                {"study": study, "model": model, "nodes": nodes, "batch": batch, "bars": bars, "failed": failed,
                 "values": values},
                f"images/s of {model} on {nodes} nodes for each sharding strategy, backward prefetch and "
                f"limit_all_gathers setting (hatched: off).")


# ------------------------------------------------------- seeds 000/001: one device, batch sizes

def plugin_groups(df: pd.DataFrame) -> list:
    """(study, model) pairs with single-device runs at two or more batch sizes."""
    one = df[df["world_size"] == 1]
    n = one.groupby(["study", "model"])["batch_per_device"].nunique()
    return [k for k, v in n.items() if v >= 2]


def plugin_comparison(df: pd.DataFrame, colors: Optional[dict] = None) -> Optional[Plot]:
    groups = plugin_groups(df)
    if not groups:
        return None
    colors = colors or series_colors(df)
    fig, axes = _figure(len(groups), 2)
    handles, drawn = {}, {}
    for i, (study, model) in enumerate(groups):
        sub = df[(df["world_size"] == 1) & (df["study"] == study) & (df["model"] == model)]
        counts = {"ips_lines": 0, "memory_lines": 0, "failed": 0}
        slots_ips: dict = {}
        slots_mem: dict = {}
        order = sorted(sub["series"].unique(), key=lambda s: (tbl._rank(s.split(" ")[0], tbl.STRATEGY_ORDER), s))
        for series in order:
            line = sub[sub["series"] == series].sort_values("batch_per_device")
            color = colors.get(series, "black")
            ok = tbl.usable(line)
            if not ok.empty:
                h, = axes[i][0].plot(ok["batch_per_device"], ok["ips_mean"], "-o", color=color, ms=3.5)
                handles.setdefault(("", series, 0), h)
                counts["ips_lines"] += 1
            mem = line[(line["status"] == "ok") & line["memory_gib"].notna()]
            if not mem.empty:
                axes[i][1].plot(mem["batch_per_device"], mem["memory_gib"], "-o", color=color, ms=3.5)
                counts["memory_lines"] += 1
            bad = list(_not_ok(line)["batch_per_device"])
            counts["failed"] += _mark_failures(axes[i][0], bad, color, slots_ips)
            _mark_failures(axes[i][1], bad, color, slots_mem)
        capacity = sub["device_memory_gib"].dropna()
        if not capacity.empty:
            axes[i][1].axhline(capacity.max(), color="grey", ls=":", lw=1.2)
            counts["capacity"] = 1
        for ax in axes[i]:
            _log2_x(ax, sub["batch_per_device"])
            ax.set_xlabel("batch size")
            ax.grid(True, alpha=0.3)
        axes[i][0].set_ylabel("images/s")
        axes[i][0].set_ylim(bottom=0)
        axes[i][1].set_ylabel(_memory_label(sub["memory_measure"]))
        axes[i][1].set_ylim(bottom=0)
        device = sub["device_name"].dropna()
        where = f" on one {device.iloc[0]}" if not device.empty else ""
        axes[i][0].set_title(f"{_model_title(df, model)}{where}: throughput", fontsize=9)
        axes[i][1].set_title(f"{model}: peak memory", fontsize=9)
        drawn[(study, model)] = counts
    extra = _extras(drawn.values(), capacity=_CAPACITY, failed=_NOT_OK)
    _shared_legend(fig, handles, extra, lambda k: k[1])
    return Plot("plugin_comparison", "Single-device strategy comparison", fig, drawn,
                "Throughput and peak memory on one device against batch size, one line per strategy "
                "(seeds 000/001).")


# ------------------------------------------------------------------------ planner against measurement

def predicted_memory(df: pd.DataFrame, colors: Optional[dict] = None) -> Optional[Plot]:
    """The planner's predicted peak allocated memory (recorded in each run's start) against the
    measured peak allocated (max over ranks). GPU runs only: a CPU run's RSS holds the whole
    process, not the tensors the planner counts."""
    if df.empty or "plan_peak_allocated_gib" not in df:
        return None
    runs = df[(df["status"] == "ok") & (df["memory_measure"] == "allocated")
              & df["plan_peak_allocated_gib"].notna() & df["memory_gib"].notna()]
    if runs.empty:
        return None
    colors = colors or series_colors(df)
    fig, axes = _figure(1, 1, w=4.8, h=4.2)
    ax = axes[0][0]
    drawn = {}
    for strategy, sub in runs.groupby("strategy", sort=True):
        ax.scatter(sub["plan_peak_allocated_gib"], sub["memory_gib"], s=22, color=colors.get(strategy, "black"),
                   label=strategy, zorder=3)
        drawn[strategy] = len(sub)
    top = float(max(runs["plan_peak_allocated_gib"].max(), runs["memory_gib"].max())) * 1.1
    xs = [0.0, top]
    ax.plot(xs, xs, color="grey", lw=1.0)
    ax.fill_between(xs, [0.0, top * 0.85], [0.0, top * 1.15], color="grey", alpha=0.12, lw=0)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("predicted peak allocated per GPU (GiB), vit-scale plan")
    ax.set_ylabel("measured peak allocated per GPU (GiB)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return Plot("predicted_memory", "Predicted against measured memory", fig, drawn,
                "Each point is one run; the line is equality and the band ±15%.")


def all_plots(df: pd.DataFrame, grid_model: Optional[str] = None, grid_nodes: Optional[int] = None) -> tuple:
    """Every figure the table supports, and a line for each one it does not, saying why."""
    colors = series_colors(df) if not df.empty else {}
    plots, missing = [], []
    makers = [
        ("weak scaling", lambda: weak_scaling(df, colors), "no strategy has runs at two or more world sizes"),
        ("memory", lambda: memory(df, colors), "no strategy has runs at two or more world sizes"),
        ("efficiency", lambda: efficiency(df), "no strategy has runs at two or more world sizes"),
        ("configuration grid", lambda: config_grid(df, grid_model, grid_nodes),
         "no model and node count has two or more FSDP backward-prefetch / limit_all_gathers configurations"),
        ("plugin comparison", lambda: plugin_comparison(df, colors),
         "no model has single-device runs at two or more batch sizes"),
        ("predicted against measured memory", lambda: predicted_memory(df, colors),
         "no GPU run carries a plan prediction (CPU runs measure RSS, which the planner does not model)"),
    ]
    for name, make, why in makers:
        plot = make()
        if plot is None:
            missing.append(f"{name}: {why}")
        else:
            plots.append(plot)
    return plots, missing
