"""Measured weak scaling against its prediction: the scaling figure's panels, axes and colours, each
measured line (solid, each point's median with its 95% confidence interval as error bars, as on the
scaling figure) with the curve vit_scale.planning.predict gives for the same points (dashed, same
colour). The predictions come from analysis/prediction.py (prediction.csv), held against the same medians."""

from __future__ import annotations

import pandas as pd
from matplotlib.lines import Line2D

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
    LINE_COLUMNS,
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
    series_items,
)
from ._spec import FigureSpec
from ._style import COLUMN_WIDTH, NOT_OK, style, styles_for

PREDICTED = ("predicted (dashed)", lambda: Line2D([], [], color="grey", ls="--", lw=0.9))
EXTRAPOLATED = (
    "extrapolated (open marker)",
    lambda: Line2D([], [], color="grey", marker="o", mfc="white", ls="none", ms=4),
)
KEY = ["model"] + LINE_COLUMNS + ["world_size"]


def _with_predictions(runs: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    pred = predictions.assign(
        extrapolated=predictions["extrapolated"].astype(bool) if "extrapolated" in predictions else False
    )
    # the 90% band (analysis/prediction.py); prediction.csv files written before it have none
    for side in ("predicted_ips_low", "predicted_ips_high"):
        if side not in pred:
            pred[side] = float("nan")
    pred = pred[KEY + ["predicted_ips", "predicted_ips_low", "predicted_ips_high", "extrapolated"]]
    pred = pred.drop_duplicates(KEY)
    return runs.merge(pred, on=KEY, how="left")


def support(df: pd.DataFrame, predictions: pd.DataFrame | None) -> str | None:
    """None when some scaling line has two or more predicted points; else why there is no figure."""
    if predictions is None or predictions.empty or predictions["predicted_ips"].notna().sum() == 0:
        return "no point could be predicted (report: Measured against predicted)"
    runs = scaling_runs(df)
    if runs.empty:
        return "no strategy has runs at two or more world sizes"
    merged = _with_predictions(runs, predictions)
    counts = merged[merged["predicted_ips"].notna()].groupby(["model"] + LINE_COLUMNS)["world_size"].nunique()
    return None if (counts >= 2).any() else "no scaling line has two predicted points"


def weak_scaling_predicted(
    df: pd.DataFrame,
    predictions: pd.DataFrame | None,
    colors: dict | None = None,
    width: float = COLUMN_WIDTH,
    markers: dict | None = None,
) -> Plot | None:
    if support(df, predictions) is not None:
        return None
    runs = _with_predictions(scaling_runs(df), predictions)
    colors, markers = styles_for(df, colors, markers)
    models = model_order(runs)
    nrows, ncols = panel_grid(len(models), width, max_cols=3)
    label = labeller(runs)
    legend_labels = sorted({label(k) for k, _ in lines(runs)}) + [PREDICTED[0], EXTRAPOLATED[0], NOT_OK[0]]
    cals = predictions["calibration"].dropna().unique() if "calibration" in predictions else []
    facts = (
        run_facts(runs)
        + f" · bars: {interval_facts(tbl.usable(runs))}"
        + f" · dashed: predicted, calibration {'; '.join(map(str, cals)) or 'none'}"
    )
    panel_h = min(2.2, max(1.45, 0.8 * width / ncols))
    slot = free_slot(len(models), nrows, ncols, len(legend_labels), panel_h)
    extra_h = (0 if slot else legend_height(legend_labels, width)) + title_height(facts, width) + 0.1
    fig, axes = new_figure(nrows, ncols, width, panel_h, extra_h)
    handles, drawn, curves, bars = {}, {}, {}, {}
    with style():
        for i, model in enumerate(models):
            ax = axes[i // ncols][i % ncols]
            sub = runs[runs["model"] == model]
            xcol, xname = tbl.x_axis(sub)
            counts = {"measured": 0, "predicted": 0, "extrapolated": 0, "failed": 0}
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
                pred = line[line["predicted_ips"].notna()]
                if len(pred) >= 1:
                    ax.plot(pred[xcol], pred["predicted_ips"], "--", color=color, lw=0.9, alpha=0.9, zorder=2)
                    counts["predicted"] += 1
                    xs = pred[xcol].astype(int)
                    banded = pred[pred["predicted_ips_low"].notna() & pred["predicted_ips_high"].notna()]
                    if not banded.empty:
                        ax.fill_between(
                            banded[xcol],
                            banded["predicted_ips_low"].astype(float),
                            banded["predicted_ips_high"].astype(float),
                            color=color,
                            alpha=0.15,
                            lw=0,
                            zorder=1,
                        )
                        counts["banded"] = counts.get("banded", 0) + len(banded)
                    curves[(model, *key)] = list(zip(xs, pred["predicted_ips"], strict=True))
                    far = pred[pred["extrapolated"] == True]  # noqa: E712 - a NaN (no prediction) is not extrapolated
                    if not far.empty:
                        ax.plot(far[xcol], far["predicted_ips"], ls="none", marker=marker, mfc="white", mec=color, ms=4)
                        counts["extrapolated"] += len(far)
                counts["failed"] += mark_failures(ax, list(not_ok(line)[xcol]), color, slots)
            ips_panel(ax, sub[xcol], model_title(df, model), xname, i % ncols == 0, slots)
            drawn[model] = counts
            bars[model] = n_bars
        hide_unused(axes, len(models))
        extra = mark_entries(drawn.values(), predicted=PREDICTED, extrapolated=EXTRAPOLATED, failed=NOT_OK)
        facts_and_legend(fig, axes, slot, facts, series_items(handles, label) + extra, width)
    return Plot(
        "weak_scaling_predicted",
        "Weak scaling: measured against predicted",
        fig,
        drawn,
        "Images/s of the whole job, log scale, against nodes (log2): measured, each point's throughput (solid; "
        f"error bars: the {interval_text(tbl.usable(runs))}, often hidden by the marker), and the images/s "
        "vit_scale.planning.predict gives for the same points (dashed, same colour), its compute from the "
        "median of the study's 1-node rung and its collectives from the calibration named above "
        "(prediction.csv); the shaded band, where the calibration's figures carry ranges, the prediction's 90% "
        "band from them; an open marker, a prediction extrapolated beyond the largest group whose collectives "
        "the calibration measured; × marks a run that did not finish ok.",
        extra={"predicted": curves, "errorbars": bars, "facts": facts},
    )


def _why_not(i) -> str | None:
    """Quiet where there are no predictions to hold against, or no scaling lines (the scaling figure says so)."""
    if i.predictions is None or scaling_runs(i.results).empty:
        return None
    return support(i.results, i.predictions)


FIGURE = FigureSpec(
    "weak scaling against prediction",
    lambda i: weak_scaling_predicted(i.results, i.predictions, i.colors, i.width, i.markers),
    _why_not,
)
