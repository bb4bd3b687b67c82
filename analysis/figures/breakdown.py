"""Where the time goes: stacked bars of the mean per-step time of the traced ranks (compute,
hidden and exposed communication, memory copies, idle) per strategy and node count, from
time_breakdown.csv (analysis/traces.py)."""

from __future__ import annotations

import pandas as pd
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from .. import table as tbl
from .. import traces
from ._axes import bar_x
from ._layout import Plot, hide_unused, legend_below, legend_height, new_figure, panel_grid
from ._spec import FigureSpec
from ._style import COLUMN_WIDTH, SMALL_PT, style

# compute_ms holds the hidden communication too (it is time the step computes): the bar splits it
BREAKDOWN_PARTS = (
    ("compute_only_ms", "compute", "#4c72b0", None),
    ("comm_overlapped_ms", "compute, communication hidden", "#8fbc8f", None),
    ("memory_ms", "memory copies and sets", "#dd8452", None),
    ("comm_exposed_ms", "communication, exposed", "#c44e52", None),
    ("idle_ms", "idle / host", "#d9d9d9", "///"),
)


def time_breakdown(bd: pd.DataFrame, width: float = COLUMN_WIDTH) -> Plot | None:
    """Stacked bars per strategy against node count: the mean per-step time of the traced ranks."""
    if bd.empty:
        return None
    runs = traces.per_run(bd)
    runs["compute_only_ms"] = runs["compute_ms"] - runs["comm_overlapped_ms"]
    models = list(dict.fromkeys(runs["model"]))
    nrows, ncols = panel_grid(len(models), width, max_cols=2)
    labels = [name for _, name, _, _ in BREAKDOWN_PARTS]
    fig, axes = new_figure(
        nrows, ncols, width, min(2.2, 0.62 * width / ncols * 1.3), legend_height(labels, width) + 0.1
    )
    drawn = {}
    with style():
        for i, model in enumerate(models):
            ax = axes[i // ncols][i % ncols]
            sub = runs[runs["model"] == model]
            one_machine = sub["nodes"].nunique() == 1 and sub["world_size"].nunique() > 1
            size_col = "world_size" if one_machine else "nodes"
            sizes = sorted(set(sub[size_col]))
            strategies = sorted(dict.fromkeys(sub["strategy"]), key=tbl.strategy_rank)
            bar_w = 0.8 / max(1, len(strategies))
            xticks, names = [], []
            for gi, size in enumerate(sizes):
                for si, strategy in enumerate(strategies):
                    row = sub[(sub[size_col] == size) & (sub["strategy"] == strategy)]
                    if row.empty:
                        continue
                    x = bar_x(gi, si, bar_w)
                    bottom = 0.0
                    for col, _, color, hatch in BREAKDOWN_PARTS:
                        value = float(row[col].iloc[0])
                        ax.bar(
                            x, value, bar_w * 0.9, bottom=bottom, color=color, hatch=hatch, edgecolor="black", lw=0.4
                        )
                        bottom += value
                    xticks.append(x)
                    names.append(strategy)
                    drawn[(model, strategy, int(size))] = bottom
            ax.set_xticks(xticks, names, rotation=90, fontsize=SMALL_PT - 0.5)
            for gi, size in enumerate(sizes):
                unit = (
                    ("GPUs" if bd["device"].eq("gpu").all() else "ranks")
                    if one_machine
                    else ("node" if size == 1 else "nodes")
                )
                ax.text(
                    gi,
                    1.01,
                    f"{size} {unit}",
                    ha="center",
                    va="bottom",
                    fontsize=SMALL_PT,
                    transform=blended_transform_factory(ax.transData, ax.transAxes),
                )
            ax.set_ylabel("ms per step, mean over ranks")
            ax.set_title(model, pad=10)
            ax.grid(True, axis="y", alpha=0.3)
        hide_unused(axes, len(models))
        legend_below(
            fig,
            [
                (name, Patch(facecolor=color, hatch=hatch, edgecolor="black", lw=0.4))
                for _, name, color, hatch in BREAKDOWN_PARTS
            ],
            width,
        )
    device = "GPU kernels" if bd["device"].eq("gpu").all() else "host threads (gloo on CPU)"
    return Plot(
        "time_breakdown",
        "Where the time goes",
        fig,
        drawn,
        f"Per-step time of the profiled steps (profile.enabled, recorded after the timed window), from "
        f"the {device}: compute alone, compute with communication hidden behind it, memory copies and sets "
        f"that nothing else covers (GPU only), communication exposed, and the "
        f"rest of the step (idle: host work, launch gaps, waiting on a peer). Mean over the traced ranks; "
        f"definitions in docs/profiling.md.",
    )


# Only profiled runs have traces: a study without them misses nothing, so no line says so.
FIGURE = FigureSpec(
    "time breakdown",
    lambda i: time_breakdown(i.breakdown, i.width) if i.breakdown is not None else None,
    lambda i: None,
)
