"""The predicted weak-scaling figure of `vit-scale plan --system` (and of a study with `predict: true`),
drawn before any run: images/s of the whole job against nodes, one panel per model, each strategy's
predicted curve dashed in the colour and marker the study's figures give it (analysis/figures: the
same axes as weak_scaling_ips and weak_scaling_predicted); a point predicted not to fit is an × at the
bottom of its panel.

    python analysis/plan_figure.py DIR/weak_scaling_plan.json --out DIR

The JSON is what vit_scale/plan/figure.py writes (docs/plan.md, "Before the allocation"). vit_scale
runs this as a subprocess: it may not import analysis. Exit codes: 0 drawn, 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    # run as a script: the repository root first on the path, as analysis/weak_scaling.py does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from analysis.figures._axes import ips_panel, mark_entries, mark_failures
from analysis.figures._layout import (
    Plot,
    facts_and_legend,
    free_slot,
    hide_unused,
    legend_height,
    new_figure,
    panel_grid,
    title_height,
)
from analysis.figures._runs import labeller, lines, model_order, model_title, series_items
from analysis.figures._style import COLUMN_WIDTH, LINE, series_colors, series_markers, style

NAME = "weak_scaling_plan"
ROW_KEYS = ("model", "params", "strategy", "nodes", "world_size", "fits", "images_per_s")
NOT_FIT = ("does not fit (predicted)", lambda: Line2D([], [], color="grey", marker="x", ls="none", ms=4))
# a point whose groups are larger than any the calibration measured: the model's reach, not a measurement's
EXTRAPOLATED = (
    "extrapolated (open marker)",
    lambda: Line2D([], [], color="grey", marker="o", mfc="white", ls="none", ms=4),
)
# the 90% band from the inputs' ranges (vit_scale.planning.spread)
BAND = ("90% band (the inputs' ranges)", lambda: Patch(color="grey", alpha=0.15, lw=0))


class BadInput(Exception):
    """One line, exit 2."""


def read(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError:
        raise BadInput(f"{path}: not JSON; expected the prediction vit-scale plan --system writes") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if (
        not isinstance(rows, list)
        or not rows
        or any(not isinstance(r, dict) or any(k not in r for k in ROW_KEYS) for r in rows)
    ):
        raise BadInput(f"{path}: expected rows with the keys {', '.join(ROW_KEYS)} (vit-scale plan --system)")
    return data


def table(data: dict) -> pd.DataFrame:
    """The rows as the figures' tidy table: one study, each strategy its own series (as the study's
    runs without options are), so that colours and markers are the study's."""
    df = pd.DataFrame([{k: r[k] for k in ROW_KEYS} for r in data["rows"]])
    df["study"] = "plan"
    df["series"] = df["strategy"]
    df["batch_per_device"] = int(data.get("batch_size") or 0)
    df["predicted_ips"] = pd.to_numeric(df["images_per_s"], errors="coerce")
    # the 90% band (vit_scale.planning.spread); a prediction without ranges, or written before them, has none
    for side in ("low", "high"):
        df[f"predicted_ips_{side}"] = pd.to_numeric(
            pd.Series([r.get(f"images_per_s_{side}") for r in data["rows"]], dtype=object), errors="coerce"
        )
    # older predictions (before the per-step latency model) carry no flag: none extrapolated
    df["extrapolated"] = [bool(r.get("extrapolated")) for r in data["rows"]]
    return df


def draw(data: dict, width: float = COLUMN_WIDTH) -> Plot:
    df = table(data)
    colors, markers = series_colors(df), series_markers(df)
    models = model_order(df)
    nrows, ncols = panel_grid(len(models), width, max_cols=3)
    label = labeller(df)
    legend_labels = sorted({label(k) for k, _ in lines(df)}) + [NOT_FIT[0], EXTRAPOLATED[0], BAND[0]]
    cal = (data.get("calibration") or {}).get("kind", "none")
    compute = (data.get("compute") or {}).get("kind", "?")
    facts = (
        f"predicted for {data.get('system', '?')}, before any run · {data.get('gpus_per_node', '?')} "
        f"{data.get('device', '')} GPUs per node · batch {data.get('batch_size', '?')} per device · "
        f"{data.get('precision', '?')} · calibration: {cal} · compute: {compute}"
    )
    panel_h = min(2.2, max(1.45, 0.8 * width / ncols))
    slot = free_slot(len(models), nrows, ncols, len(legend_labels), panel_h)
    extra_h = (0 if slot else legend_height(legend_labels, width)) + title_height(facts, width) + 0.1
    fig, axes = new_figure(nrows, ncols, width, panel_h, extra_h)
    handles, drawn, curves = {}, {}, {}
    with style():
        for i, model in enumerate(models):
            ax = axes[i // ncols][i % ncols]
            sub = df[df["model"] == model]
            counts = {"predicted": 0, "not_fit": 0, "extrapolated": 0}
            slots: dict = {}
            for key, line in lines(sub):
                color, marker = colors[key[1]], markers[key[1]]
                fit = line[line["predicted_ips"].notna() & (line["fits"] != False)]  # noqa: E712 - None: unknown
                if not fit.empty:
                    (h,) = ax.plot(
                        fit["nodes"], fit["predicted_ips"], "--", marker=marker, color=color, **{**LINE, "lw": 0.9}
                    )
                    handles.setdefault(key, h)
                    counts["predicted"] += 1
                    banded = fit[fit["predicted_ips_low"].notna() & fit["predicted_ips_high"].notna()]
                    if not banded.empty:
                        ax.fill_between(
                            banded["nodes"],
                            banded["predicted_ips_low"],
                            banded["predicted_ips_high"],
                            color=color,
                            alpha=0.15,
                            lw=0,
                        )
                        counts["banded"] = counts.get("banded", 0) + len(banded)
                    curves[(model, key[1])] = list(zip(fit["nodes"].astype(int), fit["predicted_ips"], strict=True))
                    far = fit[fit["extrapolated"]]
                    if not far.empty:
                        ax.plot(
                            far["nodes"], far["predicted_ips"], ls="none", marker=marker, mfc="white", mec=color, ms=4
                        )
                        counts["extrapolated"] += len(far)
                missing = line[line["predicted_ips"].isna() | (line["fits"] == False)]  # noqa: E712
                counts["not_fit"] += mark_failures(ax, list(missing["nodes"]), color, slots)
            ips_panel(ax, sub["nodes"], model_title(df, model), "nodes", i % ncols == 0, slots)
            drawn[model] = counts
        hide_unused(axes, len(models))
        extra = mark_entries(drawn.values(), not_fit=NOT_FIT, extrapolated=EXTRAPOLATED, banded=BAND)
        facts_and_legend(fig, axes, slot, facts, series_items(handles, label) + extra, width)
    return Plot(
        NAME,
        "Weak scaling: predicted before the runs",
        fig,
        drawn,
        "Images/s of the whole job predicted by vit_scale.planning.predict, log scale, against nodes (log2), "
        "dashed as every prediction is in the study's figures, in each strategy's colour; × marks a point "
        "predicted not to fit in device memory; an open marker, a point extrapolated beyond the largest group "
        "whose collectives the calibration measured; the shaded band, where the inputs carry ranges, the 90% "
        "band from their spread (every input at its cheap and at its costly end).",
        extra={"predicted": curves, "facts": facts},
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="analysis/plan_figure.py", description=__doc__.split("\n\n")[0])
    p.add_argument("prediction", help="the JSON vit-scale plan --system writes (weak_scaling_plan.json)")
    p.add_argument("--out", default=".", help="directory for weak_scaling_plan.png and .pdf (default: .)")
    args = p.parse_args(argv)
    try:
        data = read(args.prediction)
        os.makedirs(args.out, exist_ok=True)
    except BadInput as exc:
        print(f"analysis/plan_figure.py: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"analysis/plan_figure.py: --out: cannot create {args.out} ({exc.strerror or exc})", file=sys.stderr)
        return 2
    for path in draw(data).save(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
