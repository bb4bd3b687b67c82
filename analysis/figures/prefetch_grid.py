"""Figure 1 of seed 003: images/s of one model at one node count for each FSDP sharding strategy,
backward prefetch and limit_all_gathers setting, as grouped bars: each configuration's throughput over wall time with
its 95% confidence interval."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from .. import table as tbl
from ._axes import bar_x
from ._layout import Plot, facts_title, legend_below, legend_height, new_figure, title_height
from ._runs import interval_facts, interval_text, ips_points, model_title, run_facts
from ._spec import FigureSpec
from ._style import COLUMN_WIDTH, FAIL_MARK, SMALL_PT, style

GRID_STRATEGIES = ("HYBRID_2GPU", "FULL_SHARD", "SHARD_GRAD_OP")  # Figure 1's order
PREFETCH_ORDER = ("none", "pre", "post")
NO_GRID = "no model and node count has two or more FSDP backward-prefetch / limit_all_gathers configurations"


def _grid_rows(df: pd.DataFrame) -> pd.DataFrame:
    has = pd.Series(True, index=df.index)
    for col in ("opt_backward_prefetch", "opt_limit_all_gathers"):
        has &= df[col].notna() if col in df.columns else False
    return df[has & (df["family"] == "fsdp")]


def pick_grid(df: pd.DataFrame, model: str | None = None, nodes: int | None = None):
    """(study, model, nodes, batch) with the most FSDP prefetch × limit_all_gathers configurations.

    Raises ValueError naming what exists when --grid-model/--grid-nodes match nothing.
    """
    rows = _grid_rows(df)
    if model is not None:
        if model not in set(rows["model"]):
            have = ", ".join(sorted(set(rows["model"]))) or "none"
            raise ValueError(
                f"--grid-model: no FSDP runs with prefetch options for {model!r}; models with them: {have}"
            )
        rows = rows[rows["model"] == model]
    if nodes is not None:
        if nodes not in set(rows["nodes"]):
            have = ", ".join(str(n) for n in sorted(set(rows["nodes"]))) or "none"
            raise ValueError(
                f"--grid-nodes: no FSDP runs with prefetch options at {nodes} nodes"
                f"{' for ' + model if model else ''}; node counts with them: {have}"
            )
        rows = rows[rows["nodes"] == nodes]
    if rows.empty:
        return None
    # A grid needs some strategy at two or more settings; several strategies at one setting each
    # is just a bar chart of the weak-scaling runs at that node count.
    distinct = rows.drop_duplicates(
        ["study", "model", "nodes", "batch_per_device", "strategy", "opt_backward_prefetch", "opt_limit_all_gathers"]
    )
    point = ["study", "model", "nodes", "batch_per_device"]
    per_strategy = distinct.groupby(point + ["strategy"]).size().groupby(level=point).max()
    configs = distinct.groupby(point).size()
    configs = configs[per_strategy.reindex(configs.index) >= 2]
    if configs.empty:
        return None
    best = configs.sort_values(ascending=False, kind="stable")
    top = best[best == best.iloc[0]].index
    return max(top, key=lambda k: (k[2], k[1]))  # ties: the larger node count


def config_grid(
    df: pd.DataFrame, model: str | None = None, nodes: int | None = None, width: float = COLUMN_WIDTH
) -> Plot | None:
    pick = pick_grid(df, model, nodes)
    if pick is None:
        return None
    study, model, nodes, batch = pick
    rows, labels, combos = _grid_data(df, pick)
    facts = run_facts(rows) + f" · error bars: {interval_facts(tbl.usable(rows))}"
    legend_labels = [f"backward prefetch {p}" for p in PREFETCH_ORDER] + ["limit_all_gathers off", "on", "not ok"]
    fig, axes = new_figure(
        1, 1, width, min(2.6, 0.62 * width), legend_height(legend_labels, width) + title_height(facts, width) + 0.1
    )
    ax = axes[0][0]
    import matplotlib

    cmap = matplotlib.colormaps["Blues"]
    pcolor = {p: cmap(0.35 + 0.25 * i) for i, p in enumerate(PREFETCH_ORDER)}
    with style():
        drawn = _draw_bars(ax, rows, labels, combos, pcolor)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylabel("images/s, all ranks")
        ax.set_ylim(0, max(drawn.tops) * 1.25 if drawn.tops else 1)  # room for the numbers above the error bars
        ax.set_title(f"{model_title(df, model)}, {nodes} nodes")
        ax.grid(True, axis="y", alpha=0.3)
        items = [
            (f"backward prefetch {p}", Patch(facecolor=pcolor[p], edgecolor="black", lw=0.5))
            for p in PREFETCH_ORDER
            if any(c[0] == p for c in combos)
        ]
        items += [
            ("limit_all_gathers off", Patch(facecolor="white", edgecolor="black", hatch="///", lw=0.5)),
            ("limit_all_gathers on", Patch(facecolor="white", edgecolor="black", lw=0.5)),
        ]
        if drawn.failed:
            items.append(("not ok (see report)", Line2D([], [], color="firebrick", marker="x", ls="none")))
        facts_title(fig, facts, width)
        legend_below(fig, items, width)
    return Plot(
        "config_grid",
        "FSDP configurations (Figure 1)",
        fig,
        {
            "study": study,
            "model": model,
            "nodes": nodes,
            "batch": batch,
            "bars": len(drawn.values),
            "failed": drawn.failed,
            "values": drawn.values,
        },
        f"Images/s of {model} on {nodes} nodes for each sharding strategy, backward prefetch and "
        f"limit_all_gathers setting (hatched: off): each configuration's throughput over wall time; error bars: the "
        f"{interval_text(tbl.usable(rows))}.",
        extra={"facts": facts, "errorbars": drawn.error_bars},
    )


def _grid_data(df: pd.DataFrame, pick: tuple) -> tuple[pd.DataFrame, list, list]:
    """The runs of the picked (study, model, nodes, batch); its strategies in Figure 1's order, then the others;
    the (backward prefetch, limit_all_gathers) settings some run has, in the figure's order."""
    study, model, nodes, batch = pick
    rows = _grid_rows(df)
    rows = rows[
        (rows["study"] == study)
        & (rows["model"] == model)
        & (rows["nodes"] == nodes)
        & (rows["batch_per_device"] == batch)
    ]
    labels = [s for s in GRID_STRATEGIES if s in set(rows["strategy"])] + sorted(
        s for s in set(rows["strategy"]) if s not in GRID_STRATEGIES
    )
    combos = [
        (p, lag)
        for p in PREFETCH_ORDER
        for lag in (False, True)
        if ((rows["opt_backward_prefetch"] == p) & (rows["opt_limit_all_gathers"] == lag)).any()
    ]
    return rows, labels, combos


@dataclass
class _Bars:
    """What the grid drew: each bar's images/s and error bar by (strategy, prefetch, limit_all_gathers), the
    settings whose runs were not ok (with the status), and each bar's top with its error bar."""

    values: dict = field(default_factory=dict)
    error_bars: dict = field(default_factory=dict)
    failed: list = field(default_factory=list)
    tops: list = field(default_factory=list)


def _draw_bars(ax, rows: pd.DataFrame, labels: list, combos: list, pcolor: dict) -> _Bars:
    """A group of bars per strategy, a bar per setting (hatched: limit_all_gathers off), × where none ran ok."""
    drawn = _Bars()
    bar_w = 0.8 / max(1, len(combos))
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for gi, label in enumerate(labels):
        for ci, (p, lag) in enumerate(combos):
            x = bar_x(gi, ci, bar_w)
            cell = rows[
                (rows["strategy"] == label)
                & (rows["opt_backward_prefetch"] == p)
                & (rows["opt_limit_all_gathers"] == lag)
            ]
            ok = tbl.usable(cell)
            key = (label, p, bool(lag))
            if not ok.empty:
                _draw_bar(ax, x, ok, bar_w, pcolor[p], lag, key, drawn)
            elif not cell.empty:
                ax.scatter([x], [0.04], color="firebrick", transform=trans, **FAIL_MARK)
                drawn.failed.append((*key, cell["status"].iloc[0]))
    return drawn


def _draw_bar(ax, x: float, ok: pd.DataFrame, bar_w: float, color, lag, key: tuple, drawn: _Bars) -> None:
    """One setting's bar, its error bar and its figure above."""
    ips_all, low_all, high_all = ips_points(ok)
    i = int(ips_all.argmax())  # several series in one cell (another option varies): the fastest
    ips, low, high = float(ips_all[i]), low_all[i], high_all[i]
    ax.bar(x, ips, bar_w * 0.92, color=color, edgecolor="black", lw=0.5, hatch=None if lag else "///")
    top = ips
    if not (pd.isna(low) or pd.isna(high)) and high > low:
        ax.errorbar(
            [x],
            [ips],
            yerr=[[ips - low], [high - ips]],
            fmt="none",
            ecolor="black",
            elinewidth=0.6,
            capsize=1.2,
            capthick=0.6,
        )
        drawn.error_bars[key] = (float(low), float(high))
        top = max(ips, float(high))
    ax.text(x, top, f" {ips:.0f}", ha="center", va="bottom", fontsize=SMALL_PT - 0.5, rotation=90)
    drawn.values[key] = ips
    drawn.tops.append(top)


FIGURE = FigureSpec(
    "configuration grid", lambda i: config_grid(i.results, i.grid_model, i.grid_nodes, i.width), lambda i: NO_GRID
)
