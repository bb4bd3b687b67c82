"""The scaling-efficiency heat map: one cell per strategy and node count, per model, with the
status of a run that did not finish ok in its cell, and each efficiency's 95% confidence interval.

The interval is written in the cell as a second, smaller figure, "±3": the wider side of the
interval in percentage points, rounded up (the interval is a ratio's, so not symmetric; the wider
side keeps the claim safe). "88–95" under each "92" was tried and dropped: at 8 strategies × 6 node
counts in a column, two 2-digit numbers and a dash need a cell twice as wide as the efficiency alone,
which would either halve the panels per row or shrink the type below 6 pt. "±3" is as narrow as
the efficiency; it goes beside it where the cell is wide enough and under it (taller rows) where
not. The base of each strategy (exactly 100% by definition) carries none. The widest interval is
named in the caption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import table as tbl
from ._layout import Plot, facts_title, hide_unused, new_figure, text_width, ticks, title_height
from ._runs import INTERVAL, interval_how, labeller, lines, model_order, model_title, scaling_runs, scaling_support
from ._spec import FigureSpec
from ._style import COLUMN_WIDTH, SMALL_PT, style

# A status too wide for its cell is written as its code, explained above the figure.
ROW_H, STACKED_ROW_H = 0.16, 0.24  # inches a row of cells takes: one line of text, or an interval under it
CI_PT = 5.5  # the interval's type, as small as the status codes'
CI_GAP = 0.03  # inches between an efficiency and its interval beside it
STATUS_CODES = {"timeout": "TIME", "incomplete": "INC", "diverged": "DIV", "failed": "FAIL", "skipped": "SKIP"}


def efficiency_definition(runs: pd.DataFrame) -> str:
    """The formula, in the simple form when every strategy's baseline is one node (or one rank)."""
    names = {tbl.x_axis(runs[runs["model"] == m])[1] for m in set(runs["model"])}
    xname = next(iter(names)) if len(names) == 1 else "nodes or ranks"
    base_col = "efficiency_base_nodes" if xname == "nodes" else "efficiency_base_world_size"
    bases = runs[base_col].dropna()
    if not bases.empty and (bases == 1).all():
        return f"efficiency = ips(N) / (N × ips(1)), N = {xname}; 100% = ideal weak scaling"
    return f"efficiency = ips(N) / (N/N₀ × ips(N₀)), N = {xname}, N₀ = each strategy's smallest ok run; 100% = ideal"


def _matrices(runs: pd.DataFrame, models: list) -> dict:
    """model -> (efficiency per line and x, the cells' text, the x axis' name, the intervals' text)."""
    label = labeller(runs)
    matrices = {}
    for model in models:
        sub = runs[runs["model"] == model]
        xcol, xname = tbl.x_axis(sub)
        model_lines = list(lines(sub))
        cols = sorted(sub[xcol].astype(int).unique())
        values = pd.DataFrame(np.nan, index=[label(k) for k, _ in model_lines], columns=cols)
        text = pd.DataFrame("", index=values.index, columns=cols)
        spread = text.copy()
        for k, line in model_lines:
            for _, r in line.iterrows():
                x = int(r[xcol])
                if r["status"] == "ok" and not pd.isna(r["efficiency"]):
                    values.loc[label(k), x] = r["efficiency"]
                    text.loc[label(k), x] = f"{r['efficiency'] * 100:.0f}%"
                    spread.loc[label(k), x] = interval_points(
                        r["efficiency"], r.get("efficiency_ci_low"), r.get("efficiency_ci_high")
                    )
                else:
                    text.loc[label(k), x] = "×\n" + str(r["status"]).upper()
        matrices[model] = (values, text, xname, spread)
    return matrices


def interval_points(eff, low, high) -> str:
    """'±3': the wider side of an efficiency's 95% interval in percentage points, rounded up; ''
    without an interval, and at the base, whose efficiency is 1 by definition."""
    if any(v is None or pd.isna(v) for v in (eff, low, high)) or high <= low:
        return ""
    half = max(eff - low, high - eff) * 100
    if not math.isfinite(half):  # an interval that reaches 0 (two runs far apart) has no upper end
        return "±∞"
    return f"±{max(1, math.ceil(half - 1e-9))}"


def widest_interval(runs: pd.DataFrame) -> str:
    """'widest interval: FULL_SHARD at 16 nodes (vit_base), 72–78%' for the caption; '' without any."""
    if "efficiency_ci_high" not in runs:
        return ""
    ok = runs.dropna(subset=["efficiency", "efficiency_ci_low", "efficiency_ci_high"])
    if ok.empty:
        return ""
    r = ok.loc[(ok["efficiency_ci_high"] - ok["efficiency_ci_low"]).idxmax()]
    if r["efficiency_ci_high"] <= r["efficiency_ci_low"]:
        return ""
    xcol, xname = tbl.x_axis(runs[runs["model"] == r["model"]])
    where = f"widest interval: {r['series']} at {int(r[xcol])} {xname} ({r['model']})"
    if not math.isfinite(r["efficiency_ci_high"]):  # "0–inf%" would read as a typo
        return f"{where}, {r['efficiency_ci_low'] * 100:.0f}% upward, unbounded: a point's interval has no upper end"
    return f"{where}, {r['efficiency_ci_low'] * 100:.0f}–{r['efficiency_ci_high'] * 100:.0f}%"


def _grid(matrices: dict, n_models: int, width: float, label_w: float, shared: bool, row_h: float) -> tuple:
    """(panel height, rows, columns, cell width) of the panels, rows of cells row_h inches tall."""
    widest = max(len(v.columns) for v, _, _, _ in matrices.values())
    tallest = max(len(v.index) for v, _, _, _ in matrices.values())
    min_cell, gap = 0.22, 0.12  # "100" at 6.5 pt needs 0.16 in
    panel_h = 0.3 + row_h * tallest
    # Panels side by side only as far as the figure would otherwise grow past half a page
    # column: wider cells keep whole words (TIMEOUT) and the % sign.
    fits = [
        n
        for n in range(1, min(n_models, 4) + 1)
        if label_w * (1 if shared else n) + n * widest * min_cell + (n - 1) * gap <= width - 0.05
    ] or [1]
    ncols = next((n for n in fits if math.ceil(n_models / n) * panel_h + 0.8 <= 4.5), fits[-1])
    cell_w = min(0.5, (width - 0.05 - label_w * (1 if shared else ncols) - (ncols - 1) * gap) / (ncols * widest))
    return panel_h, math.ceil(n_models / ncols), ncols, cell_w


def _inline_width(matrices: dict, percent: bool) -> float:
    """Inches the widest efficiency with its interval beside it takes; 0 when no cell has an interval."""
    need = 0.0
    for _, text, _, spread in matrices.values():
        for t, ci in zip(text.to_numpy().ravel(), spread.to_numpy().ravel(), strict=True):
            if ci:
                need = max(need, text_width(t if percent else t.rstrip("%")) + CI_GAP + text_width(ci, CI_PT))
    return need


def efficiency(df: pd.DataFrame, width: float = COLUMN_WIDTH) -> Plot | None:
    runs = scaling_runs(df)
    if runs.empty or scaling_support(df) is not None:
        return None
    models = model_order(runs)
    matrices = _matrices(runs, models)
    cells = _cells(matrices, len(models), width)
    definition = efficiency_definition(runs) + ("" if cells.with_percent else " · cells in %")
    if cells.has_ci:
        definition += " · small: the 95% interval's wider side, ± points"
    status_codes = {}
    extra_h = 0.55 + title_height(definition + " · × = not ok: OOM, TIME = timeout", width)
    fig, axes = new_figure(cells.nrows, cells.ncols, width, cells.panel_h, extra_h)
    every = np.concatenate([v.to_numpy().ravel() for v, _, _, _ in matrices.values()])
    every = every[~np.isnan(every)]
    vmin = min(0.5, float(every.min())) if every.size else 0.5
    vmax = max(1.0, float(every.max())) if every.size else 1.0
    image = None
    with style():
        for i, model in enumerate(models):
            ax = axes[i // cells.ncols][i % cells.ncols]
            values, text, xname, spread = matrices[model]
            image = ax.imshow(
                np.ma.masked_invalid(values.to_numpy(dtype=float)), cmap="RdYlGn", vmin=vmin, vmax=vmax, aspect="auto"
            )
            _write_cells(ax, text, spread, cells, status_codes)
            ax.set_xticks(range(len(values.columns)), [str(c) for c in values.columns])
            ax.set_yticks(
                range(len(values.index)), list(values.index) if not (cells.shared and i % cells.ncols) else []
            )
            ax.tick_params(length=0)
            if i + cells.ncols >= len(models):
                ax.set_xlabel(xname)
            ax.set_title(model_title(df, model))
        hide_unused(axes, len(models))
        if status_codes:
            definition += " · × = not ok: " + ", ".join(f"{k} = {v}" for k, v in sorted(status_codes.items()))
        facts_title(fig, definition, width)
        if image is not None:
            _colour_bar(fig, axes, image)
    return Plot(
        "efficiency",
        "Scaling efficiency",
        fig,
        {m: v for m, (v, _, _, _) in matrices.items()},
        _caption(runs, status_codes, cells.has_ci),
        extra={
            "definition": efficiency_definition(runs),
            "status_codes": status_codes,
            "intervals": {m: sp for m, (_, _, _, sp) in matrices.items()},
            "interval_placement": ("beside" if cells.beside else "under") if cells.has_ci else None,
        },
    )


@dataclass
class _Cells:
    """How the panels are laid out and what each cell holds: the % sign or not, an interval beside its
    efficiency or under it."""

    shared: bool  # one set of row labels per row of panels
    panel_h: float
    nrows: int
    ncols: int
    cell_w: float
    has_ci: bool
    beside: bool
    with_percent: bool


def _cells(matrices: dict, n_models: int, width: float) -> _Cells:
    label_w = max(text_width(str(s)) for v, _, _, _ in matrices.values() for s in v.index) + 0.08
    # One set of row labels per row of panels when every model has the same series: a 3.5-inch
    # figure then holds two models side by side instead of stacking five panels 10 inches high.
    shared = len({tuple(v.index) for v, _, _, _ in matrices.values()}) == 1
    panel_h, nrows, ncols, cell_w = _grid(matrices, n_models, width, label_w, shared, ROW_H)
    # Narrow cells drop the % sign (the line above the figure says the cells are percentages):
    # "100%" would touch its neighbours. An interval goes beside its efficiency where the cell
    # holds both, with the % sign if it still fits; else under it, in rows tall enough for two lines.
    has_ci = _inline_width(matrices, False) > 0
    beside = has_ci and _inline_width(matrices, False) + 0.08 <= cell_w
    if has_ci and not beside:
        panel_h, nrows, ncols, cell_w = _grid(matrices, n_models, width, label_w, shared, STACKED_ROW_H)
    with_percent = _inline_width(matrices, True) + 0.08 <= cell_w if beside else cell_w >= text_width("100%") + 0.06
    return _Cells(shared, panel_h, nrows, ncols, cell_w, has_ci, beside, with_percent)


def _write_cells(ax, text: pd.DataFrame, spread: pd.DataFrame, cells: _Cells, status_codes: dict) -> None:
    """Each cell's efficiency (with its interval), or × and the status of a run not ok, shortened to a code
    where the cell is too narrow (the code is added to status_codes)."""
    for (r, c), t in np.ndenumerate(text.to_numpy()):
        failed = "×" in t
        if failed and text_width(t.split("\n")[-1], 5.5) > cells.cell_w * 0.95:
            status = t.split("\n")[-1]
            short = STATUS_CODES.get(status.lower(), status[:4])
            if short != status:
                status_codes[short] = status.lower()
            t = "×\n" + short
        if not failed and not cells.with_percent:
            t = t.rstrip("%")
        if failed or not cells.has_ci:
            ax.text(
                c,
                r,
                t,
                ha="center",
                va="center",
                fontsize=5.5 if failed else SMALL_PT,
                color="firebrick" if failed else "black",
                linespacing=0.85,
            )
        elif t:
            _cell_with_interval(ax, r, c, t, spread.iat[r, c], cells.beside)


def _colour_bar(fig, axes, image) -> None:
    from matplotlib.ticker import PercentFormatter

    bar = fig.colorbar(
        image,
        ax=[a for a in axes.ravel() if a.get_visible()],
        orientation="horizontal",
        location="bottom",
        shrink=0.6,
        aspect=30,
        pad=0.01,
    )
    bar.set_label("scaling efficiency", fontsize=SMALL_PT, labelpad=1)
    bar.ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ticks(bar.ax)


def _caption(runs: pd.DataFrame, status_codes: dict, has_ci: bool) -> str:
    codes = ", ".join(f"{k} = {v}" for k, v in sorted(status_codes.items()))
    widest = widest_interval(runs)
    intervals = (
        (
            " The smaller figure in a cell is the wider side of the efficiency's 95% interval, "
            "in percentage points, propagated from the intervals of the two throughputs (the point's and its "
            f"base's; {INTERVAL}: {interval_how(tbl.usable(runs))}); none at the base, 100% by definition"
            + (f"; {widest}." if widest else ".")
        )
        if has_ci
        else ""
    )
    return (
        f"Weak-scaling {efficiency_definition(runs)}. Cells in percent; × marks a run that did not finish ok"
        + (f" ({codes})." if codes else ".")
        + intervals
    )


def _cell_with_interval(ax, r: int, c: int, value: str, ci: str, beside: bool) -> None:
    """The efficiency and, smaller, its interval ("" for none): on one baseline and centred together,
    or the interval under it. Placed in points from the cell's centre, so whatever width the panel
    gives its cells, the pair stays together."""
    kw = dict(xy=(c, r), textcoords="offset points", annotation_clip=False)
    if beside:
        w_value, w_ci = text_width(value) * 72, (text_width(ci, CI_PT) + CI_GAP) * 72 if ci else 0.0
        left = -(w_value + w_ci) / 2
        ax.annotate(value, xytext=(left, -2.3), ha="left", va="baseline", fontsize=SMALL_PT, **kw)
        if ci:
            ax.annotate(ci, xytext=(left + w_value + CI_GAP * 72, -2.3), ha="left", va="baseline", fontsize=CI_PT, **kw)
        return
    ax.annotate(value, xytext=(0, 0.6 if ci else -2.3), ha="center", va="baseline", fontsize=SMALL_PT, **kw)
    if ci:
        ax.annotate(ci, xytext=(0, -0.6), ha="center", va="top", fontsize=CI_PT, **kw)


FIGURE = FigureSpec("efficiency", lambda i: efficiency(i.results, i.width), lambda i: scaling_support(i.results))
