"""Seeds 000/001: strategies (ColossalAI plugins and others) on one device, throughput and peak
memory against batch size, found in any study by its data (single-device runs at two or more
batch sizes)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import table as tbl
from ._axes import capacity_line, error_bars, log2_x, mark_entries, mark_failures, measured_line
from ._layout import Plot, facts_title, legend_below, legend_height, new_figure, title_height
from ._runs import interval_facts, interval_text, ips_points, memory_label, not_ok, run_facts, series_items
from ._spec import FigureSpec
from ._style import CAPACITY, COLUMN_WIDTH, NOT_OK, style, styles_for


def plugin_groups(df: pd.DataFrame) -> list:
    """(study, model) pairs with single-device runs at two or more batch sizes."""
    one = df[df["world_size"] == 1]
    n = one.groupby(["study", "model"])["batch_per_device"].nunique()
    return [k for k, v in n.items() if v >= 2]


def plugin_support(df: pd.DataFrame) -> str | None:
    """None when the figure has a line to draw; else why not."""
    if df.empty:
        return "no runs"
    groups = plugin_groups(df)
    if not groups:
        return "no model has single-device runs at two or more batch sizes"
    for study, model in groups:
        sub = tbl.usable(df[(df["world_size"] == 1) & (df["study"] == study) & (df["model"] == model)])
        if (sub.groupby("series")["batch_per_device"].nunique() >= 2).any():
            return None
    return (
        "every strategy has at most one batch size that finished ok, so each line would be one point; "
        "the table holds the numbers"
    )


def plugin_comparison(
    df: pd.DataFrame, colors: dict | None = None, width: float = COLUMN_WIDTH, markers: dict | None = None
) -> Plot | None:
    groups = plugin_groups(df)
    if not groups or plugin_support(df) is not None:
        return None
    colors, markers = styles_for(df, colors, markers)
    one = df[(df["world_size"] == 1) & df.set_index(["study", "model"]).index.isin(groups)]
    facts = run_facts(one) + f" · bars: {interval_facts(tbl.usable(one))}"
    legend_labels = sorted(set(one["series"])) + [CAPACITY[0], NOT_OK[0]]
    panel_h = min(2.0, max(1.45, 0.42 * width))
    fig, axes = new_figure(
        len(groups), 2, width, panel_h, legend_height(legend_labels, width) + title_height(facts, width) + 0.1
    )
    handles, drawn, bars = {}, {}, {}
    with style():
        for i, (study, model) in enumerate(groups):
            ips_ax, mem_ax = axes[i]
            sub = df[(df["world_size"] == 1) & (df["study"] == study) & (df["model"] == model)]
            counts = {"ips_lines": 0, "memory_lines": 0, "failed": 0}
            slots_ips: dict = {}
            slots_mem: dict = {}
            order = sorted(sub["series"].unique(), key=lambda s: (tbl.strategy_rank(s.split(" ")[0]), s))
            for series in order:
                line = sub[sub["series"] == series].sort_values("batch_per_device")
                color, marker = colors[series], markers[series]
                ok = tbl.usable(line)
                if not ok.empty:
                    ips, low, high = ips_points(ok)
                    h = measured_line(ips_ax, ok["batch_per_device"], ips, color, marker, clip=False)
                    bars[(study, model)] = bars.get((study, model), 0) + error_bars(
                        ips_ax, ok["batch_per_device"].to_numpy(float), ips, low, high, color, log_y=False
                    )
                    handles.setdefault(("", series, 0), h)
                    counts["ips_lines"] += 1
                mem = line[(line["status"] == "ok") & line["memory_gib"].notna()]
                if not mem.empty:
                    measured_line(mem_ax, mem["batch_per_device"], mem["memory_gib"], color, marker, clip=False)
                    counts["memory_lines"] += 1
                bad = list(not_ok(line)["batch_per_device"])
                counts["failed"] += mark_failures(ips_ax, bad, color, slots_ips)
                mark_failures(mem_ax, bad, color, slots_mem)
            capacity = sub["device_memory_gib"].dropna()
            if not capacity.empty:
                capacity_line(mem_ax, capacity.max())
                counts["capacity"] = 1
            for ax in axes[i]:
                log2_x(ax, sub["batch_per_device"])
                ax.set_xlabel("batch size")
                ax.grid(True, alpha=0.3)
            ips_top = max(
                (v for v in np.concatenate(ips_points(tbl.usable(sub))) if not np.isnan(v)), default=np.nan
            )  # the highest marker or bar
            ips_ax.set_ylabel("images/s")
            ips_ax.set_ylim(0, (ips_top if not pd.isna(ips_top) else 1.0) * 1.12)
            mem_top = max([sub["memory_gib"].max()] + list(capacity))
            mem_ax.set_ylabel(memory_label(sub["memory_measure"]))
            mem_ax.set_ylim(0, (mem_top if not pd.isna(mem_top) else 1.0) * 1.12)
            ips_ax.set_title(f"{model}: throughput")
            mem_ax.set_title(f"{model}: peak memory")
            drawn[(study, model)] = counts
        extra = mark_entries(drawn.values(), capacity=CAPACITY, failed=NOT_OK)
        facts_title(fig, facts, width)
        legend_below(fig, series_items(handles, lambda k: k[1]) + extra, width)
    return Plot(
        "plugin_comparison",
        "Single-device strategy comparison",
        fig,
        drawn,
        f"Throughput over wall time (error bars: the {interval_text(tbl.usable(one))}) and peak memory "
        "on one device against batch size, one line per strategy (seeds 000/001).",
        extra={"facts": facts, "errorbars": bars},
    )


FIGURE = FigureSpec(
    "plugin comparison",
    lambda i: plugin_comparison(i.results, i.colors, i.width, i.markers),
    lambda i: plugin_support(i.results),
)
