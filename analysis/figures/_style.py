"""The look every figure shares: print sizes, fonts, the rc settings, and one colour and one
marker per series across all figures.

Size: every figure is drawn at the width it will be printed (one paper column, 3.5 in, unless the
caller asks for another) with fonts of 6.5 to 7.5 pt. A figure drawn large and shrunk to a column
would print its text at a third of its size.
"""

from __future__ import annotations

import colorsys

import pandas as pd
from matplotlib.colors import to_hex, to_rgb
from matplotlib.lines import Line2D

from .. import table as tbl
from ._runs import scaling_runs

COLUMN_WIDTH = 3.5  # inches: one column of a two-column paper (IEEE, ACM and most others)
PAGE_WIDTH = 7.16  # inches: the full text width of a two-column page
MIN_PANEL_WIDTH = 1.65  # narrower and the tick labels of a log axis collide
FONT_PT = 7.0
SMALL_PT = 6.5  # ticks, legends, cell text: the smallest size journals accept is 6 pt
FAIL_MARK = dict(marker="x", s=24, linewidths=1.2, clip_on=False, zorder=5)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "p", "h", "*", "<", ">")
# A measured series: solid line with markers, the same in every figure.
LINE = dict(ms=3.2, lw=1.1, zorder=3)
# Legend spacing, in font sizes; _layout measures legends with the same numbers.
LEGEND_HANDLE, LEGEND_TEXT_PAD, LEGEND_COLUMN_GAP = 1.8, 0.4, 1.0

STYLE = {
    "font.size": FONT_PT,
    "axes.titlesize": FONT_PT + 0.5,
    "axes.labelsize": FONT_PT,
    "xtick.labelsize": SMALL_PT,
    "ytick.labelsize": SMALL_PT,
    "legend.fontsize": SMALL_PT,
    "figure.titlesize": SMALL_PT,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.major.size": 2.5,
    "ytick.major.size": 2.5,
    "xtick.major.pad": 2,
    "ytick.major.pad": 2,
    "axes.titlepad": 3,
    "axes.labelpad": 2,
    "lines.linewidth": 1.2,
    "lines.markersize": 3.5,
    "grid.linewidth": 0.5,
    "legend.handlelength": LEGEND_HANDLE,
    "legend.columnspacing": LEGEND_COLUMN_GAP,
    "legend.handletextpad": LEGEND_TEXT_PAD,
    "legend.borderaxespad": 0.2,
    "hatch.linewidth": 0.6,
    "pdf.fonttype": 42,
    "svg.fonttype": "none",
}


def style():
    """The rc settings of every figure; active while a figure is built and while it is saved
    (tick labels are created when the figure is drawn)."""
    import matplotlib

    return matplotlib.rc_context(STYLE)


# Legend entries of the marks that are not series: (label, a function making the handle).
IDEAL = ("ideal (linear)", lambda: Line2D([], [], color="grey", ls="--", lw=0.8))
CAPACITY = ("device memory", lambda: Line2D([], [], color="grey", ls=":", lw=1.0))
NOT_OK = ("not ok (see report)", lambda: Line2D([], [], color="grey", marker="x", ls="none", ms=4))


# ------------------------------------------------------------------------------ colours, markers


def _palette() -> list:
    import matplotlib

    # tab10 first (the paper-like look), then qualitative maps whose colours differ from it;
    # tab20 alone would give neighbouring series two shades of one hue. Greys are left out (grey
    # means ideal, capacity and "not ok" here) and so are yellows too pale to read on white.
    out = []
    for name in ("tab10", "Dark2", "Set1", "Accent"):
        for c in matplotlib.colormaps[name].colors:
            r, g, b = to_rgb(c)
            _, _, saturation = colorsys.rgb_to_hls(r, g, b)
            luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
            h = to_hex(c)
            if saturation >= 0.3 and luminance <= 0.72 and h not in out:
                out.append(h)
    return out


class SeriesStyle(dict):
    """series (or strategy) -> a palette entry, for every figure alike.

    Asking for a name it has not seen gives it the next entry instead of failing over to black,
    so a series first drawn by a later figure, or one from another table, still gets one of its
    own; a strategy whose runs all carry options in their series name takes its first series'
    entry, so a figure per strategy matches the figures per series. `get` ignores its default for
    the same reason."""

    def __init__(self, palette: list, aliases: dict | None = None):
        super().__init__()
        self._palette = palette
        self._aliases = dict(aliases or {})
        self._assigned = 0

    def __missing__(self, key):
        alias = self._aliases.get(key)
        if alias is not None and alias != key:
            value = self[alias]
        else:
            value = self._palette[self._assigned % len(self._palette)]
            self._assigned += 1
        self[key] = value
        return value

    def get(self, key, default=None):
        return self[key]


def _style_map(df: pd.DataFrame, palette: list) -> SeriesStyle:
    """The weak-scaling series take the first (most distinct) entries, in the paper's strategy
    order; every other series gets the next one when a figure first draws it, so a figure of
    one-off runs (the plugin comparison) is not left with the tail of the palette."""
    if df.empty:
        return SeriesStyle(palette)
    series = df.drop_duplicates("series")[["series", "strategy"]]
    ordered = sorted(series.itertuples(index=False), key=lambda r: (tbl.strategy_rank(r.strategy), r.series))
    aliases = {}
    for r in ordered:
        aliases.setdefault(r.strategy, r.series)
    out = SeriesStyle(palette, aliases)
    scaling = set(scaling_runs(df)["series"])
    for r in ordered:
        if r.series in scaling:
            out[r.series]
    return out


def series_colors(df: pd.DataFrame) -> SeriesStyle:
    """A fixed colour per series, shared by every figure: the weak-scaling series take the first
    (most distinct) colours, in the paper's strategy order; one-off configurations follow.
    Never black: an unknown name gets the next colour."""
    return _style_map(df, _palette())


def series_markers(df: pd.DataFrame) -> SeriesStyle:
    """A fixed marker per series, in the same order as the colours."""
    return _style_map(df, list(MARKERS))


def styles_for(df: pd.DataFrame, colors: dict | None, markers: dict | None) -> tuple:
    """(colours, markers): the caller's, shared across the figures of one report, else this table's."""
    return (colors if colors is not None else series_colors(df), markers if markers is not None else series_markers(df))
