"""Peak memory per device against nodes, one panel per model; FULL_SHARD in panels of its own when
other strategies ran too (its memory falls with every node added while theirs stays flat)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from .. import table as tbl
from ._axes import capacity_line, log2_x, mark_entries, mark_failures, measured_line
from ._layout import Plot, facts_title, hide_unused, legend_below, legend_height, new_figure, panel_grid, title_height
from ._runs import (
    RSS_NOTE,
    labeller,
    line_order,
    lines,
    memory_label,
    model_order,
    model_title,
    run_facts,
    scaling_runs,
    scaling_support,
    series_items,
)
from ._spec import FigureSpec
from ._style import CAPACITY, COLUMN_WIDTH, MIN_PANEL_WIDTH, NOT_OK, style, styles_for


def _coinciding(points: list, tolerance: float) -> list:
    """Groups (lists of keys, two or more) of series whose points lie on one another: a shared x
    and, at every shared x, values closer than tolerance. points: [(key, {x: y})]."""
    parent = {k: k for k, _ in points}

    def find(k):
        while parent[k] != k:
            k = parent[k]
        return k

    for a in range(len(points)):
        for b in range(a + 1, len(points)):
            (ka, pa), (kb, pb) = points[a], points[b]
            shared = set(pa) & set(pb)
            if shared and all(abs(pa[x] - pb[x]) <= tolerance for x in shared):
                parent[find(kb)] = find(ka)
    groups: dict = {}
    for k, _ in points:
        groups.setdefault(find(k), []).append(k)
    return [g for g in groups.values() if len(g) > 1]


def memory(
    df: pd.DataFrame, colors: dict | None = None, width: float = COLUMN_WIDTH, markers: dict | None = None
) -> Plot | None:
    runs = scaling_runs(df)
    if runs.empty or scaling_support(df, "memory_gib") is not None:
        return None
    colors, markers = styles_for(df, colors, markers)
    models = model_order(runs)
    # The paper draws FULL_SHARD apart: its memory falls with every node added while the others'
    # stays flat, and on one axis the flat lines would hide its curve.
    split = (runs["strategy"] == "FULL_SHARD").any() and (runs["strategy"] != "FULL_SHARD").any()
    if split:
        per_row = max(1, min(len(models), int(width // (2 * MIN_PANEL_WIDTH))))
        nrows, ncols = math.ceil(len(models) / per_row), 2 * per_row
    else:
        nrows, ncols = panel_grid(len(models), width, max_cols=3)
    label = labeller(runs)
    ylabel = memory_label(runs["memory_measure"])
    cpu = set(runs["memory_measure"].dropna()) == {"rss"}
    facts = run_facts(runs) + (f" · {RSS_NOTE}" if cpu else "")
    legend_runs = runs[runs["strategy"] != "FULL_SHARD"] if split else runs
    legend_labels = sorted({label(k) for k, _ in lines(legend_runs)}) + [CAPACITY[0], NOT_OK[0]]
    panel_h = min(2.0, max(1.45, 0.85 * width / ncols))
    extra_h = legend_height(legend_labels, width) + title_height(facts, width) + 0.2
    fig, axes = new_figure(nrows, ncols, width, panel_h, extra_h)
    pen = _Pen(colors, markers, label, width / ncols - 0.3)
    handles, drawn, shifted, tops = {}, {}, [], {}
    with style():
        for i, model in enumerate(models):
            sub_all = runs[runs["model"] == model]
            xcol, xname = tbl.x_axis(sub_all)
            panels = (
                [
                    ("FULL_SHARD", sub_all[sub_all["strategy"] == "FULL_SHARD"]),
                    ("other strategies", sub_all[sub_all["strategy"] != "FULL_SHARD"]),
                ]
                if split
                else [("all strategies", sub_all)]
            )
            for j, (panel_name, sub) in enumerate(panels):
                k = i * len(panels) + j
                ax = axes[k // ncols][k % ncols]
                # the FULL_SHARD panels' series are not in the legend: it is the other strategies'
                legend = handles if not (split and panel_name == "FULL_SHARD") else {}
                counts, top, groups = _draw_panel(ax, sub, sub_all, xcol, pen, legend)
                shifted += [(model, g) for g in groups]
                tops[(model, panel_name)] = top
                ax.set_title(f"{model}: {panel_name}" if split else model_title(df, model))
                if k + ncols >= len(models) * len(panels):  # the lowest panel of its column
                    ax.set_xlabel(xname)
                if k % ncols == 0:
                    ax.set_ylabel(ylabel)
                ax.grid(True, alpha=0.3)
                drawn[(model, panel_name)] = counts
        hide_unused(axes, len(models) * (2 if split else 1))
        extra = mark_entries(drawn.values(), capacity=CAPACITY, failed=NOT_OK)
        facts_title(fig, facts, width)
        legend_below(fig, series_items(handles, label) + extra, width)
    return Plot(
        "memory",
        "Peak memory per device",
        fig,
        drawn,
        _caption(ylabel, split, drawn, shifted, cpu),
        extra={"shifted": shifted, "ylim_top": tops, "facts": facts},
    )


@dataclass
class _Pen:
    """How the memory figure draws a series: its colour, marker and label, and the panels' width in inches."""

    colors: dict
    markers: dict
    label: Callable
    panel_w: float


def _draw_panel(ax, sub: pd.DataFrame, sub_all: pd.DataFrame, xcol: str, pen: _Pen, handles: dict) -> tuple:
    """One panel: each series' measured memory, its failures, the device's capacity. Adds the first handle of each
    series to handles; returns the panel's counts, its y top and the labels of each group shifted sideways."""
    capacity = sub_all["device_memory_gib"].dropna()
    counts = {"measured": 0, "capacity": 0, "failed": 0}
    slots: dict = {}
    series = []
    for key, line in lines(sub):
        ok = line[(line["status"] == "ok") & line["memory_gib"].notna()]
        series.append((key, line, ok))
    data_max = max([float(ok["memory_gib"].max()) for _, _, ok in series if not ok.empty], default=0.0)
    top = max(data_max, float(capacity.max()) if not capacity.empty else 0.0) * 1.12 or 1.0
    offset, groups = _sideways(series, xcol, sorted({int(x) for x in sub_all[xcol]}), top, pen)
    for key, line, ok in series:
        color, marker = pen.colors[key[1]], pen.markers[key[1]]
        if not ok.empty:
            xs = ok[xcol].to_numpy(float) * offset.get(key, 1.0)
            h = measured_line(ax, xs, ok["memory_gib"], color, marker, clip=False)
            handles.setdefault(key, h)
            counts["measured"] += 1
        counts["failed"] += mark_failures(ax, list(line[line["status"] != "ok"][xcol]), color, slots)
    if not capacity.empty:
        capacity_line(ax, capacity.max())
        counts["capacity"] = 1
    if sub.empty:
        ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", color="grey")
    log2_x(ax, sub_all[xcol])
    # Headroom above the highest point or the device line, so neither sits on the frame.
    ax.set_ylim(0, top)
    return counts, top, groups


def _sideways(series: list, xcol: str, xs_all: list, top: float, pen: _Pen) -> tuple[dict, list]:
    """Series with the same memory hide one another (DDP and NO_SHARD under SHARD_GRAD_OP): each such group
    is shifted sideways by about a marker's width. Only equal values (0.5% of the axis): merely close ones
    would chain into one wide group. Returns each shifted series' x factor, and each group's labels."""
    groups = _coinciding(
        [
            (key, dict(zip(ok[xcol].astype(int), ok["memory_gib"], strict=True)))
            for key, _, ok in series
            if not ok.empty
        ],
        0.005 * top,
    )
    doublings = max(1.0, math.log2(max(xs_all) / min(xs_all))) if xs_all else 1.0
    step = (4.5 / 72) * doublings / max(0.6, pen.panel_w)
    offset, labels = {}, []
    for g in groups:
        g = sorted(g, key=line_order)
        for n, key in enumerate(g):
            offset[key] = 2 ** ((n - (len(g) - 1) / 2) * step)
        labels.append([pen.label(key) for key in g])
    return offset, labels


def _caption(ylabel: str, split: bool, drawn: dict, shifted: list, cpu: bool) -> str:
    caption = f"{ylabel[0].upper()}{ylabel[1:]}, the maximum over ranks, against nodes."
    if split:
        caption += " FULL_SHARD has its own panels (its memory falls with every node); the legend is the others'."
    if any(c["capacity"] for c in drawn.values()):
        caption += " Dotted: the device's memory."
    names = list(dict.fromkeys(" = ".join(g) for _, g in shifted))
    if names:
        caption += " Series with equal memory are shifted sideways slightly so each shows: " + "; ".join(names) + "."
    if cpu:
        caption += (
            " These are CPU runs: the peak RSS of each process holds the interpreter, torch and the "
            "data buffers as well as the model state, so it says nothing about what sharding saves."
        )
    return caption


FIGURE = FigureSpec(
    "memory",
    lambda i: memory(i.results, i.colors, i.width, i.markers),
    lambda i: scaling_support(i.results, "memory_gib"),
)
