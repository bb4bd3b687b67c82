"""Figures 2 and 3 of seed 003: images/s of the whole job against nodes, one panel per model,
each point's throughput over wall time with its 95% interval and each strategy's ideal linear scaling."""

from __future__ import annotations

import pandas as pd

from .. import table as tbl
from ._axes import (
    error_bars,
    ips_panel,
    mark_entries,
    mark_failures,
    measured_line,
)
from ._layout import (
    Plot,
    facts_and_legend,
    free_slot,
    hide_unused,
    legend_height,
    new_figure,
    panel_grid,
    title_height,
)
from ._runs import (
    interval_facts,
    interval_text,
    ips_points,
    labeller,
    lines,
    model_order,
    model_title,
    not_ok,
    run_facts,
    scaling_runs,
    scaling_support,
    series_items,
)
from ._spec import FigureSpec
from ._style import COLUMN_WIDTH, IDEAL, NOT_OK, style, styles_for


def weak_scaling(
    df: pd.DataFrame, colors: dict | None = None, width: float = COLUMN_WIDTH, markers: dict | None = None
) -> Plot | None:
    runs = scaling_runs(df)
    if runs.empty or scaling_support(df) is not None:
        return None
    colors, markers = styles_for(df, colors, markers)
    models = model_order(runs)
    nrows, ncols = panel_grid(len(models), width, max_cols=3)
    label = labeller(runs)
    legend_labels = sorted({label(k) for k, _ in lines(runs)}) + [IDEAL[0], NOT_OK[0]]
    facts = run_facts(runs) + f" · bars: {interval_facts(tbl.usable(runs))}"
    panel_h = min(2.2, max(1.45, 0.8 * width / ncols))
    slot = free_slot(len(models), nrows, ncols, len(legend_labels), panel_h)
    extra_h = (0 if slot else legend_height(legend_labels, width)) + title_height(facts, width) + 0.1
    fig, axes = new_figure(nrows, ncols, width, panel_h, extra_h)
    handles, drawn, bars = {}, {}, {}
    with style():
        for i, model in enumerate(models):
            ax = axes[i // ncols][i % ncols]
            sub = runs[runs["model"] == model]
            xcol, xname = tbl.x_axis(sub)
            counts = {"measured": 0, "ideal": 0, "failed": 0}
            slots: dict = {}
            n_bars = 0
            for key, line in lines(sub):
                color, marker = colors[key[1]], markers[key[1]]
                ok = tbl.usable(line)
                if not ok.empty:
                    ips, low, high = ips_points(ok)
                    handles.setdefault(key, measured_line(ax, ok[xcol], ips, color, marker))
                    counts["measured"] += 1
                    n_bars += error_bars(ax, ok[xcol].to_numpy(float), ips, low, high, color, log_y=True)
                    # the ideal starts at the smallest run's marker, the throughput drawn there
                    ideal_x = line[xcol].to_numpy()
                    ideal_y = ips[0] * line["world_size"].to_numpy() / ok["world_size"].iloc[0]
                    ax.plot(ideal_x, ideal_y, "--", color=color, lw=0.7, alpha=0.6, zorder=2)
                    counts["ideal"] += 1
                counts["failed"] += mark_failures(ax, list(not_ok(line)[xcol]), color, slots)
            ips_panel(ax, sub[xcol], model_title(df, model), xname, i % ncols == 0, slots)
            drawn[model] = counts
            bars[model] = n_bars
        hide_unused(axes, len(models))
        extra = mark_entries(drawn.values(), ideal=IDEAL, failed=NOT_OK)
        facts_and_legend(fig, axes, slot, facts, series_items(handles, label) + extra, width)
    return Plot(
        "weak_scaling_ips",
        "Weak scaling: images/s",
        fig,
        drawn,
        "Images/s of the whole job (all ranks together), log scale, against nodes (log2): each point's "
        "throughput over wall time, stalled steps included "
        f"(solid; error bars: the {interval_text(tbl.usable(runs))}, often hidden by the marker) "
        "and ideal linear scaling from each strategy's smallest run (dashed); "
        "× marks a run that did not finish ok.",
        extra={"errorbars": bars, "facts": facts},
    )


FIGURE = FigureSpec(
    "weak scaling",
    lambda i: weak_scaling(i.results, i.colors, i.width, i.markers),
    lambda i: scaling_support(i.results),
)
