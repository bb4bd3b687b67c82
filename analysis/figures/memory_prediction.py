"""The planner's predicted peak allocated memory (recorded in each run's start) against the
measured peak, each point named by its model, with the residual of every point in a panel below."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import PathPatch
from matplotlib.path import Path

from .. import table as tbl
from ._axes import log_axis_ticks
from ._layout import Plot, facts_title, legend_below, legend_height, new_figure, text_width, ticks, title_height
from ._runs import model_order, run_facts
from ._spec import FigureSpec
from ._style import COLUMN_WIDTH, SMALL_PT, style, styles_for

FAMILY_NAMES = {
    "ddp": "DDP and FSDP",
    "fsdp": "DDP and FSDP",
    "deepspeed": "DeepSpeed ZeRO",
    "colossalai": "ColossalAI",
}
FAMILY_SHORT = {"DDP and FSDP": "DDP/FSDP", "DeepSpeed ZeRO": "ZeRO"}  # for the figure's own text
NO_PREDICTION = "no GPU run carries a plan prediction (CPU runs measure RSS, which the planner does not model)"


def prediction_rows(df: pd.DataFrame) -> pd.DataFrame:
    """ok GPU runs with both the planner's predicted and the measured peak allocated memory, with
    residual = (predicted - measured) / measured. CPU runs are left out: their RSS holds the whole
    process, not the tensors the planner counts."""
    if df.empty or "plan_peak_allocated_gib" not in df:
        return df.iloc[0:0]
    runs = df[
        (df["status"] == "ok")
        & (df["memory_measure"] == "allocated")
        & df["plan_peak_allocated_gib"].notna()
        & df["memory_gib"].notna()
        & (df["memory_gib"] > 0)
    ].copy()
    runs["residual"] = runs["plan_peak_allocated_gib"] / runs["memory_gib"] - 1.0
    runs["family_group"] = [FAMILY_NAMES.get(str(f), str(f)) for f in runs["family"]]
    return runs


def residual_summary(runs: pd.DataFrame) -> list:
    """(family group, runs, max |residual|, models) for each family group, in a fixed order."""
    out = []
    order = list(dict.fromkeys(FAMILY_NAMES.values()))
    for group, sub in sorted(runs.groupby("family_group"), key=lambda kv: tbl._rank(kv[0], order)):
        out.append((group, len(sub), float(sub["residual"].abs().max()), model_order(sub)))
    return out


def _short_model(model: str) -> str:
    return re.sub(r"^vit_", "", str(model))


def predicted_memory(
    df: pd.DataFrame, colors: dict | None = None, width: float = COLUMN_WIDTH, markers: dict | None = None
) -> Plot | None:
    runs = prediction_rows(df)
    if runs.empty:
        return None
    colors, markers = styles_for(df, colors, markers)
    summary = residual_summary(runs)
    facts = run_facts(runs)
    strategies = sorted(runs["strategy"].unique(), key=tbl.strategy_rank)
    legend_labels = list(strategies) + ["equal", "±15%"]
    # A scatter needs no more height on a page-wide figure than in a column.
    side = min(width, COLUMN_WIDTH + 0.1)
    fig, axes = new_figure(
        2,
        1,
        width,
        0.5 * side,
        legend_height(legend_labels, width) + title_height(facts, width) + 0.1,
        sharex=True,
        gridspec_kw={"height_ratios": [2.2, 1]},
    )
    ax, res_ax = axes[0][0], axes[1][0]
    lo = float(min(runs["plan_peak_allocated_gib"].min(), runs["memory_gib"].min()))
    hi = float(max(runs["plan_peak_allocated_gib"].max(), runs["memory_gib"].max()))
    log = hi / max(lo, 1e-9) > 8  # a ViT-Base next to a ViT-3B: on a linear axis the small ones are one blob
    with style():
        drawn, items = _scatter(ax, res_ax, runs, strategies, colors, markers)
        edges = _equality_band(ax, lo, hi, log)
        _label_points(ax, runs, log, (width - 0.75, side * 2.2 / 3.2 - 0.1))
        if log:
            for axis in (ax.xaxis, ax.yaxis):
                log_axis_ticks(axis, edges)
        ax.set_ylabel("measured peak allocated\nper GPU (GiB)")
        ax.grid(True, alpha=0.3)
        _residual_axes(res_ax, runs, summary)
        facts_title(fig, facts, width)
        items += [
            ("equal", Line2D([], [], color="grey", lw=0.8)),
            ("±15%", PathPatch(Path([(0, 0), (1, 0), (1, 1)]), facecolor="grey", alpha=0.2, lw=0)),
        ]
        legend_below(fig, items, width)
    caption = (
        "Each point is one ok GPU run, labelled with its model; the line is equality and the band ±15%. "
        "Below: the residual (predicted − measured) / measured of each point. Largest |residual|: "
        + "; ".join(
            f"{g} {m * 100:.1f}% over {n} run{'s' if n > 1 else ''} ({', '.join(_short_model(x) for x in models)})"
            for g, n, m, models in summary
        )
        + "."
    )
    return Plot(
        "predicted_memory",
        "Predicted against measured memory",
        fig,
        drawn,
        caption,
        extra={
            "residuals": {
                (r.model, r.series, int(r.nodes), int(r.world_size)): float(r.residual) for r in runs.itertuples()
            },
            "max_residual": {g: m for g, _, m, _ in summary},
            "log": log,
        },
    )


def _scatter(ax, res_ax, runs: pd.DataFrame, strategies: list, colors: dict, markers: dict) -> tuple[dict, list]:
    """Each strategy's runs, measured against predicted above and their residual below; returns the points
    drawn per strategy and the legend's items."""
    drawn, items = {}, []
    for strategy in strategies:
        sub = runs[runs["strategy"] == strategy]
        point = dict(color=colors[strategy], marker=markers[strategy], zorder=3, lw=0.4, edgecolor="white")
        sc = ax.scatter(sub["plan_peak_allocated_gib"], sub["memory_gib"], s=16, **point)
        res_ax.scatter(sub["plan_peak_allocated_gib"], sub["residual"] * 100, s=14, **point)
        drawn[strategy] = len(sub)
        items.append((strategy, sc))
    return drawn, items


def _equality_band(ax, lo: float, hi: float, log: bool) -> list:
    """The line of equality and the ±15% band around it, over square axes; returns the axes' edges."""
    if log:
        edges = [lo / 1.35, hi * 1.35]
        ax.set_xscale("log")
        ax.set_yscale("log")
    else:
        edges = [0.0, hi * 1.12]
    xs = np.geomspace(*edges, 50) if log else np.array(edges)
    ax.plot(xs, xs, color="grey", lw=0.8, zorder=1)
    ax.fill_between(xs, xs * 0.85, xs * 1.15, color="grey", alpha=0.12, lw=0)
    ax.set_xlim(*edges)
    ax.set_ylim(*edges)
    return edges


def _residual_axes(res_ax, runs: pd.DataFrame, summary: list) -> None:
    """The residual panel's axes and, at its top, each family group's largest |residual|."""
    worst = float(runs["residual"].abs().max()) * 100
    span = max(2.0, worst * 1.6)  # room for the summary line above the points
    res_ax.axhline(0, color="grey", lw=0.8)
    res_ax.set_ylim(-span, span)
    res_ax.set_ylabel("predicted −\nmeasured (%)")
    res_ax.set_xlabel("predicted peak allocated per GPU (GiB), vit-scale plan")
    res_ax.grid(True, alpha=0.3)
    ticks(res_ax)
    stated = "max |residual|: " + ", ".join(f"{FAMILY_SHORT.get(g, g)} {m * 100:.1f}% ({n})" for g, n, m, _ in summary)
    res_ax.text(
        0.01,
        0.97,
        stated,
        transform=res_ax.transAxes,
        ha="left",
        va="top",
        fontsize=SMALL_PT - 0.5,
        color="0.2",
        bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0.5),
    )


def _label_points(ax, runs: pd.DataFrame, log: bool, axes_size: tuple) -> None:
    """Each model's name once beside its group of points, where it covers no other label or point.

    Runs of one model under several strategies often sit close together, and a label per point
    would pile up; two models can share a spot too (ViT-1B DDP and ViT-3B FULL_SHARD), so each
    label tries left, right, above and below its group and takes the first free place. Positions
    are worked out in axes fractions from the axes' planned size in inches.
    """
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    tx = (
        (lambda v: (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)))
        if log
        else (lambda v: (v - x0) / (x1 - x0))
    )
    ty = (
        (lambda v: (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)))
        if log
        else (lambda v: (v - y0) / (y1 - y0))
    )
    w_in, h_in = axes_size
    ordered = runs.sort_values("plan_peak_allocated_gib")
    data = [(r.model, float(r.plan_peak_allocated_gib), float(r.memory_gib)) for r in ordered.itertuples()]
    pts = [(m, tx(px), ty(py)) for m, px, py in data]
    to_data = {p: (px, py) for p, (_, px, py) in zip(pts, data, strict=True)}
    mark_w, mark_h = 3.5 / 72 / w_in, 3.5 / 72 / h_in
    taken = [(x - mark_w, y - mark_h, x + mark_w, y + mark_h) for _, x, y in pts]
    clusters: list = []  # [model, [(x, y)]]
    for model, x, y in pts:
        near = next(
            (c for c in clusters if c[0] == model and abs(c[1][-1][0] - x) < 0.08 and abs(c[1][-1][1] - y) < 0.08), None
        )
        if near:
            near[1].append((x, y))
        else:
            clusters.append([model, [(x, y)]])
    pt = SMALL_PT - 0.5
    for model, members in clusters:
        text = _short_model(model)
        tw, th = text_width(text, pt) / w_in, pt * 1.25 / 72 / h_in
        xs, ys = [m[0] for m in members], [m[1] for m in members]
        gap_x, gap_y = 2.5 / 72 / w_in, 2.0 / 72 / h_in
        # The points lie along the diagonal, so the free room is above-left and below-right of it;
        # farther out on each side in turn, with a hairline back to the group.
        cands = []
        for reach in (1.0, 2.5, 4.0, 5.5):
            cands.append((min(xs) - reach * gap_x - tw, max(ys) + reach * gap_y))
            cands.append((max(xs) + reach * gap_x, min(ys) - reach * gap_y - th))
        boxes = [(cx, cy, cx + tw, cy + th) for cx, cy in cands]
        free = [
            b
            for b in boxes
            if 0 <= b[0]
            and b[2] <= 1
            and 0 <= b[1]
            and b[3] <= 1
            and not any(b[0] < o[2] and o[0] < b[2] and b[1] < o[3] and o[1] < b[3] for o in taken)
        ]
        box = free[0] if free else boxes[0]
        taken.append(box)
        # A hairline to the nearest point of its group: two models' groups can sit side by side.
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        mx, my = min(members, key=lambda m: (m[0] - cx) ** 2 + (m[1] - cy) ** 2)
        ax.annotate(
            text,
            to_data[(model, mx, my)],
            xytext=(box[0], box[1]),
            textcoords="axes fraction",
            ha="left",
            va="bottom",
            fontsize=pt,
            color="0.25",
            arrowprops=dict(arrowstyle="-", lw=0.4, color="0.55", shrinkA=0.5, shrinkB=2.5),
        )


FIGURE = FigureSpec(
    "predicted against measured memory",
    lambda i: predicted_memory(i.results, i.colors, i.width, i.markers),
    lambda i: NO_PREDICTION,
)
