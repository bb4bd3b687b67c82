"""The scaling-efficiency heat map: one cell per strategy and node count, per model, with the
status of a run that did not finish ok in its cell."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd

from .. import table as tbl
from ._layout import Plot, facts_title, hide_unused, new_figure, text_width, ticks, title_height
from ._runs import labeller, lines, model_order, model_title, scaling_runs, scaling_support
from ._spec import FigureSpec
from ._style import COLUMN_WIDTH, SMALL_PT, style

# A status too wide for its cell is written as its code, explained above the figure.
STATUS_CODES = {"timeout": "TIME", "incomplete": "INC", "diverged": "DIV", "failed": "FAIL", "skipped": "SKIP"}


def efficiency_definition(runs: pd.DataFrame) -> str:
    """The formula, in the simple form when every strategy's baseline is one node (or one rank)."""
    names = {tbl.x_axis(runs[runs["model"] == m])[1] for m in set(runs["model"])}
    xname = next(iter(names)) if len(names) == 1 else "nodes or ranks"
    base_col = "efficiency_base_nodes" if xname == "nodes" else "efficiency_base_world_size"
    bases = runs[base_col].dropna()
    if not bases.empty and (bases == 1).all():
        return f"efficiency = ips(N) / (N × ips(1)), N = {xname}; 100% = ideal weak scaling"
    return (f"efficiency = ips(N) / (N/N₀ × ips(N₀)), N = {xname}, N₀ = each strategy's smallest ok run; "
            f"100% = ideal")


def _matrices(runs: pd.DataFrame, models: list) -> dict:
    """model -> (efficiency per line and x, the cells' text, the x axis' name)."""
    label = labeller(runs)
    matrices = {}
    for model in models:
        sub = runs[runs["model"] == model]
        xcol, xname = tbl.x_axis(sub)
        model_lines = list(lines(sub))
        cols = sorted(sub[xcol].astype(int).unique())
        values = pd.DataFrame(np.nan, index=[label(k) for k, _ in model_lines], columns=cols)
        text = pd.DataFrame("", index=values.index, columns=cols)
        for k, line in model_lines:
            for _, r in line.iterrows():
                x = int(r[xcol])
                if r["status"] == "ok" and not pd.isna(r["efficiency"]):
                    values.loc[label(k), x] = r["efficiency"]
                    text.loc[label(k), x] = f"{r['efficiency'] * 100:.0f}%"
                else:
                    text.loc[label(k), x] = "×\n" + str(r["status"]).upper()
        matrices[model] = (values, text, xname)
    return matrices


def efficiency(df: pd.DataFrame, width: float = COLUMN_WIDTH) -> Optional[Plot]:
    runs = scaling_runs(df)
    if runs.empty or scaling_support(df) is not None:
        return None
    models = model_order(runs)
    matrices = _matrices(runs, models)
    widest = max(len(v.columns) for v, _, _ in matrices.values())
    tallest = max(len(v.index) for v, _, _ in matrices.values())
    label_w = max(text_width(str(s)) for v, _, _ in matrices.values() for s in v.index) + 0.08
    # One set of row labels per row of panels when every model has the same series: a 3.5-inch
    # figure then holds two models side by side instead of stacking five panels 10 inches high.
    shared = len({tuple(v.index) for v, _, _ in matrices.values()}) == 1
    min_cell, gap = 0.22, 0.12  # "100" at 6.5 pt needs 0.16 in
    panel_h = 0.3 + 0.16 * tallest
    # Panels side by side only as far as the figure would otherwise grow past half a page
    # column: wider cells keep whole words (TIMEOUT) and the % sign.
    fits = [n for n in range(1, min(len(models), 4) + 1)
            if label_w * (1 if shared else n) + n * widest * min_cell + (n - 1) * gap <= width - 0.05] or [1]
    ncols = next((n for n in fits if math.ceil(len(models) / n) * panel_h + 0.8 <= 4.5), fits[-1])
    nrows = math.ceil(len(models) / ncols)
    cell_w = min(0.5, (width - 0.05 - label_w * (1 if shared else ncols) - (ncols - 1) * gap) / (ncols * widest))
    # Narrow cells drop the % sign (the line above the figure says the cells are percentages):
    # "100%" would touch its neighbours.
    with_percent = cell_w >= text_width("100%") + 0.06
    definition = efficiency_definition(runs) + ("" if with_percent else " · cells in %")
    status_codes = {}
    extra_h = 0.55 + title_height(definition + " · × = not ok: OOM, TIME = timeout", width)
    fig, axes = new_figure(nrows, ncols, width, panel_h, extra_h)
    every = np.concatenate([v.to_numpy().ravel() for v, _, _ in matrices.values()])
    every = every[~np.isnan(every)]
    vmin = min(0.5, float(every.min())) if every.size else 0.5
    vmax = max(1.0, float(every.max())) if every.size else 1.0
    image = None
    with style():
        for i, model in enumerate(models):
            ax = axes[i // ncols][i % ncols]
            values, text, xname = matrices[model]
            image = ax.imshow(np.ma.masked_invalid(values.to_numpy(dtype=float)), cmap="RdYlGn", vmin=vmin,
                              vmax=vmax, aspect="auto")
            for (r, c), t in np.ndenumerate(text.to_numpy()):
                failed = "×" in t
                if failed and text_width(t.split("\n")[-1], 5.5) > cell_w * 0.95:
                    status = t.split("\n")[-1]
                    short = STATUS_CODES.get(status.lower(), status[:4])
                    if short != status:
                        status_codes[short] = status.lower()
                    t = "×\n" + short
                if not failed and not with_percent:
                    t = t.rstrip("%")
                ax.text(c, r, t, ha="center", va="center", fontsize=5.5 if failed else SMALL_PT,
                        color="firebrick" if failed else "black", linespacing=0.85)
            ax.set_xticks(range(len(values.columns)), [str(c) for c in values.columns])
            ax.set_yticks(range(len(values.index)), list(values.index) if not (shared and i % ncols) else [])
            ax.tick_params(length=0)
            if i + ncols >= len(models):
                ax.set_xlabel(xname)
            ax.set_title(model_title(df, model))
        hide_unused(axes, len(models))
        if status_codes:
            definition += " · × = not ok: " + ", ".join(f"{k} = {v}" for k, v in sorted(status_codes.items()))
        facts_title(fig, definition, width)
        if image is not None:
            from matplotlib.ticker import PercentFormatter

            bar = fig.colorbar(image, ax=[a for a in axes.ravel() if a.get_visible()], orientation="horizontal",
                               location="bottom", shrink=0.6, aspect=30, pad=0.01)
            bar.set_label("scaling efficiency", fontsize=SMALL_PT, labelpad=1)
            bar.ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            ticks(bar.ax)
    codes = ", ".join(f"{k} = {v}" for k, v in sorted(status_codes.items()))
    return Plot("efficiency", "Scaling efficiency", fig, {m: v for m, (v, _, _) in matrices.items()},
                f"Weak-scaling {efficiency_definition(runs)}. Cells in percent; × marks a run that did not finish ok"
                + (f" ({codes})." if codes else "."),
                extra={"definition": efficiency_definition(runs), "status_codes": status_codes})


FIGURE = FigureSpec("efficiency", lambda i: efficiency(i.results, i.width), lambda i: scaling_support(i.results))
