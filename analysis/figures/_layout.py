"""Where things go on a figure: the canvas and its panel grid, the legend under the panels (or in
a free panel), the grey line of facts above them, and saving. Figures are built with matplotlib's
object API on the Agg canvas: no pyplot, so no global figure state and no display is ever needed.

Heights are worked out in inches from the text they hold, measured from the glyph outlines, so a
figure is as tall as its legend and title need at the width it is drawn.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ._style import LEGEND_COLUMN_GAP, LEGEND_HANDLE, LEGEND_TEXT_PAD, MIN_PANEL_WIDTH, SMALL_PT, style

LEGEND_ROW = 1.45  # a legend row's height, in font sizes
TITLE_ROW = 1.35  # a line of the facts title, in font sizes


@dataclass
class Plot:
    """A drawn figure. drawn records what was put on the axes (lines, bars, failure marks, cell
    values) and extra what else a test or the report needs (error bars, shifted series,
    residuals), so tests can check a figure's content without reading pixels."""

    name: str  # file stem, e.g. weak_scaling_ips
    title: str  # for the report
    figure: Figure
    drawn: dict = field(default_factory=dict)
    caption: str = ""
    extra: dict = field(default_factory=dict)  # what a test or the report needs besides drawn

    def savefig(self, path: str, dpi: int = 300) -> None:
        with style():
            self.figure.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.02)

    def save(self, out_dir: str, dpi: int = 300, formats=("png", "pdf")) -> list:
        paths = []
        for fmt in formats:
            path = os.path.join(out_dir, f"{self.name}.{fmt}")
            self.savefig(path, dpi)
            paths.append(path)
        return paths


def text_width(text: str, pt: float = SMALL_PT) -> float:
    """Inches a line of text takes in the default font, measured from its glyph outlines."""
    from matplotlib.textpath import TextPath

    return _outline_width(TextPath((0, 0), text, size=pt)) / 72 if text else 0.0


def _outline_width(path) -> float:
    """path.get_extents().width, to the bit, for outlines of lines and quadratic curves (TrueType
    glyphs, such as the default DejaVu Sans): the on-curve points and each curve's turning point.
    get_extents builds a Bezier object per segment, and took most of a figure's time (a minute of
    the test suite's); other outlines still go through it."""
    import numpy as np
    from matplotlib.path import Path

    x, codes = path.vertices[:, 0], path.codes
    if codes is None or not len(x) or (codes == Path.CURVE4).any():
        return path.get_extents().width
    starts, i = [], 0
    while i < len(codes):  # a CURVE3 piece is (control, end) after the point before it
        if codes[i] == Path.CURVE3:
            starts.append(i - 1)
            i += 2
        else:
            i += 1
    q = np.array(starts, dtype=int)
    p0, p1, p2 = x[q], x[q + 1], x[q + 2]
    bend = p0 - 2 * p1 + p2
    t = np.divide(p0 - p1, bend, out=np.full_like(p0, -1.0), where=bend != 0)
    inside = (t > 0) & (t < 1)
    t, p0, p1, p2 = t[inside], p0[inside], p1[inside], p2[inside]
    turning = (1 - t) ** 2 * p0 + 2 * t * (1 - t) * p1 + t**2 * p2
    on_curve = x[(codes == Path.MOVETO) | (codes == Path.LINETO)]
    points = np.concatenate([on_curve, x[q + 2], turning])
    return float(points.max() - points.min())


def wrap(text: str, width: float, pt: float = SMALL_PT) -> str:
    """text broken at ' · ' (else at spaces) so each line fits width inches."""
    parts, lines, line = text.split(" · "), [], ""
    for part in parts:
        candidate = f"{line} · {part}" if line else part
        if text_width(candidate, pt) <= width:
            line = candidate
            continue
        if line:
            lines.append(line)
        line = ""
        for word in part.split(" "):
            candidate = f"{line} {word}" if line else word
            if line and text_width(candidate, pt) > width:
                lines.append(line)
                candidate = word
            line = candidate
    if line:
        lines.append(line)
    return "\n".join(lines)


def new_figure(nrows: int, ncols: int, width: float, panel_h: float, extra_h: float = 0.0, **kw):
    """(figure, 2-D array of axes): panels of panel_h inches, plus extra_h for legend and title."""
    with style():
        fig = Figure(figsize=(width, panel_h * nrows + extra_h), layout="constrained")
        FigureCanvasAgg(fig)
        # a small pad: the default leaves a third of an inch unused around a 3.5-inch figure
        fig.get_layout_engine().set(w_pad=0.02, h_pad=0.02, wspace=0.04, hspace=0.04)
        axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    for ax in axes.ravel():
        ticks(ax)
    return fig, axes


def ticks(ax) -> None:
    # Set on the axes as well as in STYLE: ticks made later, outside style(), must keep the size.
    ax.tick_params(labelsize=SMALL_PT, width=0.6, length=2.5, pad=2)


def panel_grid(n: int, width: float, min_w: float = MIN_PANEL_WIDTH, max_cols: int = 4) -> tuple:
    """(rows, columns) for n panels, as many columns as the width holds."""
    ncols = max(1, min(n, max_cols, int(width // min_w)))
    return math.ceil(n / ncols), ncols


def hide_unused(axes, n_used: int) -> None:
    """The grid's panels past the first n_used left blank."""
    nrows, ncols = axes.shape
    for j in range(n_used, nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)


def legend_rows(labels: list, width: float) -> tuple:
    """(columns, rows) of a legend under a figure `width` inches wide: the most columns whose
    widths (each its widest entry, filled top to bottom as matplotlib does) fit."""
    if not labels:
        return 1, 0
    widths = [text_width(t) for t in labels]
    handle = (LEGEND_HANDLE + LEGEND_TEXT_PAD) * SMALL_PT / 72
    gap = LEGEND_COLUMN_GAP * SMALL_PT / 72
    for ncols in range(len(labels), 0, -1):
        short, large = divmod(len(labels), ncols)  # matplotlib's split: the first columns one longer
        sizes = [short + 1] * large + [short] * (ncols - large)
        starts = np.cumsum([0] + sizes)
        columns = [widths[a:b] for a, b in itertools.pairwise(starts) if b > a]
        total = sum(max(col) + handle for col in columns) + gap * (len(columns) - 1)
        if total <= width * 0.97:
            return ncols, max(sizes)
    return 1, len(labels)


def legend_height(labels: list, width: float) -> float:
    return legend_rows(labels, width)[1] * SMALL_PT * LEGEND_ROW / 72 + (0.05 if labels else 0)


def legend_below(fig, items: list, width: float) -> None:
    """One compact legend under the panels, as many columns as fit: a legend beside a 3.5-inch
    figure would take half of it."""
    if not items:
        return
    labels = [n for n, _ in items]
    ncols, _ = legend_rows(labels, width)
    fig.legend(
        [h for _, h in items],
        labels,
        loc="outside lower center",
        ncols=ncols,
        fontsize=SMALL_PT,
        frameon=False,
        handlelength=LEGEND_HANDLE,
        columnspacing=LEGEND_COLUMN_GAP,
        handletextpad=LEGEND_TEXT_PAD,
        borderaxespad=0.1,
    )


def legend_in_slot(ax, items: list) -> None:
    """The legend in an unused panel of the grid, where it costs no height."""
    ax.set_axis_off()
    ax.set_visible(True)
    if items:
        ax.legend(
            [h for _, h in items],
            [n for n, _ in items],
            loc="center",
            fontsize=SMALL_PT,
            frameon=False,
            handlelength=LEGEND_HANDLE,
            handletextpad=LEGEND_TEXT_PAD,
            borderaxespad=0.0,
        )


def free_slot(n_used: int, nrows: int, ncols: int, n_items: int, panel_h: float):
    """(row, col) of the last unused panel when the legend's entries fit its height, else None."""
    if n_used >= nrows * ncols or n_items * SMALL_PT * LEGEND_ROW / 72 > panel_h * 0.95:
        return None
    last = nrows * ncols - 1
    return last // ncols, last % ncols


def title_height(text: str, width: float) -> float:
    """Inches the facts title takes at this width (0 without one)."""
    return (wrap(text, width * 0.98).count("\n") + 1) * SMALL_PT * TITLE_ROW / 72 + 0.04 if text else 0.0


def facts_title(fig, text: str, width: float) -> float:
    """The small grey line of facts above the panels; returns the height it takes."""
    if not text:
        return 0.0
    fig.suptitle(wrap(text, width * 0.98), fontsize=SMALL_PT, color="0.3")
    return title_height(text, width)


def facts_and_legend(fig, axes, slot, facts: str, items: list, width: float) -> None:
    """The facts line on top, and the legend in a spare panel (`slot`: its row and column) when the
    grid has one, else below the panels."""
    facts_title(fig, facts, width)
    if slot:
        legend_in_slot(axes[slot[0]][slot[1]], items)
    else:
        legend_below(fig, items, width)
