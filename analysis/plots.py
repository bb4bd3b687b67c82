"""The figures of seed 003 (and the plugin comparison of seeds 000/001) from the results table.

Every function takes the tidy table and returns a Plot, or None when the table holds nothing to
draw it from. Plot.drawn records what was put on the axes (lines, bars, failure marks, cell
values) and Plot.extra what else a test or the report needs (error bars, shifted series,
residuals), so tests can check a figure's content without reading pixels. Figures are built with
matplotlib's object API on the Agg canvas: no pyplot, so no global figure state and no display
is ever needed.

Size: every figure is drawn at the width it will be printed (one paper column, 3.5 in, unless the
caller asks for another) with fonts of 6.5 to 7.5 pt, and its panels are laid out for that
width. A figure drawn large and shrunk to a column would print its text at a third of its size.

Conventions across figures: one colour and one marker per series everywhere (the marker keeps
series apart in grey-scale print); measured = solid line with markers; error bars = ± one
standard deviation of the per-step images/s over the timed steps; ideal = dashed, same colour;
device capacity = dotted grey; a run that did not finish ok = an × in its series' colour along
the bottom of the axes at its node count. A small grey line above each figure says what ran:
the devices, the batch per device, the precision and the steps.
"""
from __future__ import annotations

import colorsys
import math
import os
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import PathPatch
from matplotlib.path import Path
from matplotlib.transforms import blended_transform_factory

from . import table as tbl

COLUMN_WIDTH = 3.5   # inches: one column of a two-column paper (IEEE, ACM and most others)
PAGE_WIDTH = 7.16    # inches: the full text width of a two-column page
MIN_PANEL_WIDTH = 1.65  # narrower and the tick labels of a log axis collide
FONT_PT = 7.0
SMALL_PT = 6.5       # ticks, legends, cell text: the smallest size journals accept is 6 pt
FAIL_MARK = dict(marker="x", s=24, linewidths=1.2, clip_on=False, zorder=5)
GRID_STRATEGIES = ("HYBRID_2GPU", "FULL_SHARD", "SHARD_GRAD_OP")  # Figure 1's order
PREFETCH_ORDER = ("none", "pre", "post")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "p", "h", "*", "<", ">")

STYLE = {
    "font.size": FONT_PT, "axes.titlesize": FONT_PT + 0.5, "axes.labelsize": FONT_PT,
    "xtick.labelsize": SMALL_PT, "ytick.labelsize": SMALL_PT, "legend.fontsize": SMALL_PT,
    "figure.titlesize": SMALL_PT, "axes.linewidth": 0.6, "xtick.major.width": 0.6, "ytick.major.width": 0.6,
    "xtick.major.size": 2.5, "ytick.major.size": 2.5, "xtick.major.pad": 2, "ytick.major.pad": 2,
    "axes.titlepad": 3, "axes.labelpad": 2, "lines.linewidth": 1.2, "lines.markersize": 3.5,
    "grid.linewidth": 0.5, "legend.handlelength": 1.8, "legend.columnspacing": 1.0, "legend.handletextpad": 0.4,
    "legend.borderaxespad": 0.2, "hatch.linewidth": 0.6, "pdf.fonttype": 42, "svg.fonttype": "none",
}


def style():
    """The rc settings of every figure; active while a figure is built and while it is saved
    (tick labels are created when the figure is drawn)."""
    import matplotlib

    return matplotlib.rc_context(STYLE)


@dataclass
class Plot:
    name: str                    # file stem, e.g. weak_scaling_ips
    title: str                   # for the report
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


# ------------------------------------------------------------------------------ layout helpers

def _text_width(text: str, pt: float = SMALL_PT) -> float:
    """Inches a line of text takes in the default font, measured from its glyph outlines."""
    from matplotlib.textpath import TextPath

    return TextPath((0, 0), text, size=pt).get_extents().width / 72 if text else 0.0


def _wrap(text: str, width: float, pt: float = SMALL_PT) -> str:
    """text broken at ' · ' (else at spaces) so each line fits width inches."""
    parts, lines, line = text.split(" · "), [], ""
    for part in parts:
        candidate = f"{line} · {part}" if line else part
        if _text_width(candidate, pt) <= width:
            line = candidate
            continue
        if line:
            lines.append(line)
        line = ""
        for word in part.split(" "):
            candidate = f"{line} {word}" if line else word
            if line and _text_width(candidate, pt) > width:
                lines.append(line)
                candidate = word
            line = candidate
    if line:
        lines.append(line)
    return "\n".join(lines)


def _figure(nrows: int, ncols: int, width: float, panel_h: float, extra_h: float = 0.0, **kw):
    with style():
        fig = Figure(figsize=(width, panel_h * nrows + extra_h), layout="constrained")
        FigureCanvasAgg(fig)
        # a small pad: the default leaves a third of an inch unused around a 3.5-inch figure
        fig.get_layout_engine().set(w_pad=0.02, h_pad=0.02, wspace=0.04, hspace=0.04)
        axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    for ax in axes.ravel():
        _ticks(ax)
    return fig, axes


def _ticks(ax) -> None:
    # Set on the axes as well as in STYLE: ticks made later, outside style(), must keep the size.
    ax.tick_params(labelsize=SMALL_PT, width=0.6, length=2.5, pad=2)


def _panel_grid(n: int, width: float, min_w: float = MIN_PANEL_WIDTH, max_cols: int = 4) -> tuple:
    ncols = max(1, min(n, max_cols, int(width // min_w)))
    return math.ceil(n / ncols), ncols


def _legend_rows(labels: list, width: float) -> tuple:
    """(columns, rows) of a legend under a figure `width` inches wide: the most columns whose
    widths (each its widest entry, filled top to bottom as matplotlib does) fit."""
    if not labels:
        return 1, 0
    widths = [_text_width(t) for t in labels]
    handle = (1.8 + 0.4) * SMALL_PT / 72   # handlelength + handletextpad, in font sizes
    gap = 1.0 * SMALL_PT / 72              # columnspacing
    for ncols in range(len(labels), 0, -1):
        short, large = divmod(len(labels), ncols)  # matplotlib's split: the first columns one longer
        sizes = [short + 1] * large + [short] * (ncols - large)
        starts = np.cumsum([0] + sizes)
        columns = [widths[a:b] for a, b in zip(starts[:-1], starts[1:]) if b > a]
        total = sum(max(col) + handle for col in columns) + gap * (len(columns) - 1)
        if total <= width * 0.97:
            return ncols, max(sizes)
    return 1, len(labels)


def _legend_height(labels: list, width: float) -> float:
    return _legend_rows(labels, width)[1] * SMALL_PT * 1.45 / 72 + (0.05 if labels else 0)


def _legend_below(fig, items: list, width: float) -> None:
    """One compact legend under the panels, as many columns as fit: a legend beside a 3.5-inch
    figure would take half of it."""
    if not items:
        return
    labels = [n for n, _ in items]
    ncols, _ = _legend_rows(labels, width)
    fig.legend([h for _, h in items], labels, loc="outside lower center", ncols=ncols, fontsize=SMALL_PT,
               frameon=False, handlelength=1.8, columnspacing=1.0, handletextpad=0.4, borderaxespad=0.1)


def _legend_in_slot(ax, items: list) -> None:
    """The legend in an unused panel of the grid, where it costs no height."""
    ax.set_axis_off()
    ax.set_visible(True)
    if items:
        ax.legend([h for _, h in items], [n for n, _ in items], loc="center", fontsize=SMALL_PT, frameon=False,
                  handlelength=1.8, handletextpad=0.4, borderaxespad=0.0)


def _free_slot(n_used: int, nrows: int, ncols: int, n_items: int, panel_h: float):
    """(row, col) of the last unused panel when the legend's entries fit its height, else None."""
    if n_used >= nrows * ncols or n_items * SMALL_PT * 1.45 / 72 > panel_h * 0.95:
        return None
    last = nrows * ncols - 1
    return last // ncols, last % ncols


def _facts_title(fig, text: str, width: float) -> float:
    """The small grey line of facts above the panels; returns the height it takes."""
    if not text:
        return 0.0
    wrapped = _wrap(text, width * 0.98)
    fig.suptitle(wrapped, fontsize=SMALL_PT, color="0.3")
    return (wrapped.count("\n") + 1) * SMALL_PT * 1.35 / 72 + 0.04


def _title_height(text: str, width: float) -> float:
    return (_wrap(text, width * 0.98).count("\n") + 1) * SMALL_PT * 1.35 / 72 + 0.04 if text else 0.0


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

    def __init__(self, palette: list, aliases: Optional[dict] = None):
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

    def get(self, key, default=None):  # noqa: ARG002 - a default would bring back the black fallback
        return self[key]


def _style_map(df: pd.DataFrame, palette: list) -> SeriesStyle:
    """The weak-scaling series take the first (most distinct) entries, in the paper's strategy
    order; every other series gets the next one when a figure first draws it, so a figure of
    one-off runs (the plugin comparison) is not left with the tail of the palette."""
    if df.empty:
        return SeriesStyle(palette)
    series = df.drop_duplicates("series")[["series", "strategy"]]
    ordered = sorted(series.itertuples(index=False),
                     key=lambda r: (tbl.strategy_rank(r.strategy), r.series))
    aliases = {}
    for r in ordered:
        aliases.setdefault(r.strategy, r.series)
    out = SeriesStyle(palette, aliases)
    scaling = set(scaling_runs(df)["series"])
    for r in ordered:
        if r.series in scaling:
            out[r.series]  # noqa: B018 - assigns the next entry
    return out


def series_colors(df: pd.DataFrame) -> SeriesStyle:
    """A fixed colour per series, shared by every figure: the weak-scaling series take the first
    (most distinct) colours, in the paper's strategy order; one-off configurations follow.
    Never black: an unknown name gets the next colour."""
    return _style_map(df, _palette())


def series_markers(df: pd.DataFrame) -> SeriesStyle:
    """A fixed marker per series, in the same order as the colours."""
    return _style_map(df, list(MARKERS))


# ------------------------------------------------------------------------------ axes helpers

def _si(value: float, _pos=None) -> str:
    """Tick text such as 200, 1.5k, 20k, 1M: 2x10^3 is hard to read off a plot."""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def _log_y(ax) -> None:
    ax.set_yscale("log")


def _log_ticks(ax, max_ticks: int = 6) -> list:
    """Plain-number ticks on a log y axis, at least three of them.

    Matplotlib's log locator puts ticks at decades only, which over the factor of 2 to 20 a
    weak-scaling panel spans leaves one or two labels. Take the densest of 1-2-3-5-7, 1-2-5,
    1-3, 1 per decade that gives no more than max_ticks, and for a range within one decade that
    still has fewer than three, evenly spaced round numbers.
    """
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

    lo, hi = ax.get_ylim()
    ticks: list = []
    if lo > 0 and hi > lo:
        decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
        for subs in ((1, 1.5, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 5, 7), (1, 2, 5), (1, 3), (1,)):
            ticks = [m * 10.0 ** k for k in decades for m in subs if lo <= m * 10.0 ** k <= hi]
            if len(ticks) <= max_ticks:
                break
        while len(ticks) > max_ticks:
            ticks = ticks[::2]
        if len(ticks) < 3:
            ticks = [t for t in MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if lo <= t <= hi]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(_si))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(lo, hi)
    return ticks


def _models(df: pd.DataFrame) -> list:
    first = df.drop_duplicates("model")
    rows = sorted(first.itertuples(index=False),
                  key=lambda r: (0 if pd.isna(r.params) else r.params, tbl._rank(r.model, tbl.MODEL_ORDER)))
    return [r.model for r in rows]


def _model_title(df: pd.DataFrame, model: str) -> str:
    params = df.loc[df["model"] == model, "params"].dropna()
    if params.empty:
        return model
    p = params.iloc[0]
    size = f"{p / 1e9:.2g}B" if p >= 1e9 else f"{p / 1e6:.3g}M"
    return f"{model} ({size} params)"


LINE_COLUMNS = ["study", "series", "batch_per_device"]  # one line on a scaling plot


def _line_order(key) -> tuple:
    study, series, batch = key
    return (str(study), tbl.strategy_rank(series.split(" ")[0]), series, batch)


def _lines(sub: pd.DataFrame):
    """(key, rows sorted by world size) for each line in sub, in legend order."""
    if sub.empty:
        return
    groups = sub.groupby(LINE_COLUMNS, sort=False)
    for key in sorted(groups.groups, key=_line_order):
        yield key, groups.get_group(key).sort_values("world_size")


def _labeller(df: pd.DataFrame):
    """Legend text for a line: the series, plus study and batch only where the figure mixes them."""
    many_studies = df["study"].nunique() > 1
    many_batches = df["batch_per_device"].nunique() > 1

    def label(key) -> str:
        study, series, batch = key
        text = series + (f" bs={batch}" if many_batches else "")
        return f"{study}: {text}" if many_studies else text
    return label


def scaling_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Runs on a line with at least two world sizes: the weak-scaling ladder, not one-off points."""
    if df.empty:
        return df
    sizes = df.groupby(LINE_COLUMNS + ["model"])["world_size"].transform("nunique")
    return df[sizes >= 2]


def _usable_points(df: pd.DataFrame, value: str) -> pd.Series:
    """Per line (model + LINE_COLUMNS), how many runs give a number for `value`."""
    ok = tbl.usable(df) if value == "ips_mean" else df[(df["status"] == "ok") & df[value].notna()]
    if ok.empty:
        return pd.Series(dtype=int)
    return ok.groupby(["model"] + LINE_COLUMNS)["world_size"].nunique()


def single_point_lines(df: pd.DataFrame) -> list:
    """(model, series, x, status) of each series that ran at one world size only: no line on a
    scaling figure, so the report names them."""
    if df.empty:
        return []
    sizes = df.groupby(LINE_COLUMNS + ["model"])["world_size"].transform("nunique")
    out = []
    for _, r in df[sizes < 2].iterrows():
        xcol, xname = tbl.x_axis(df[df["model"] == r["model"]])
        out.append((r["model"], r["series"], f"{int(r[xcol])} {xname}", r["status"]))
    return out


def scaling_support(df: pd.DataFrame, value: str = "ips_mean") -> Optional[str]:
    """None when some line has two or more usable points of `value`; else why a scaling figure
    would have nothing to say."""
    runs = scaling_runs(df)
    if runs.empty:
        return "no strategy has runs at two or more world sizes"
    if (_usable_points(runs, value) >= 2).any():
        return None
    what = "a throughput" if value == "ips_mean" else "a memory figure"
    return (f"every strategy has at most one run with {what} (the others did not finish ok), so each line "
            f"would be one point; the tables hold the numbers")


def _log2_x(ax, xs) -> None:
    xs = sorted({int(x) for x in xs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.minorticks_off()
    if len(xs) == 1:
        ax.set_xlim(xs[0] / 1.5, xs[0] * 1.5)


def _mark_failures(ax, points, color, slots: dict) -> int:
    """× at the bottom of the axes for each x in points; stacked when several fail at one x."""
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for x in points:
        k = slots.get(x, 0)
        slots[x] = k + 1
        ax.scatter([x], [0.04 + 0.06 * k], color=color, transform=trans, **FAIL_MARK)
    return len(points)


def _reserve_bottom_log(ax, slots: dict) -> None:
    """Lower a log y axis so the stacked × marks sit below the lowest measured point."""
    depth = max(slots.values(), default=0)
    if depth == 0 or not ax.get_lines():
        return
    lo, hi = (math.log10(v) for v in ax.get_ylim())
    share = 0.04 + 0.06 * depth  # the fraction of the axes the marks take, plus a gap
    new_lo = (lo - share * hi) / (1 - share)
    ax.set_ylim(10 ** new_lo, 10 ** hi)


def _error_bars(ax, xs, ys, spreads, color, log_y: bool) -> int:
    """± spread at each (x, y) as one outline patch with caps; returns how many bars were drawn.

    One patch per series, not errorbar(): the bars belong to their line, and the figure's lines
    and collections keep meaning measured series and failure marks. The x axis is log2, so the
    caps are a fixed fraction of a doubling wide.
    """
    verts, codes, n = [], [], 0
    for x, y, s in zip(xs, ys, spreads):
        if pd.isna(s) or pd.isna(y) or s <= 0:
            continue
        lo, hi = y - s, y + s
        if log_y and lo <= 0:
            lo = y / 10  # a spread as large as the mean: show it reaching well down, not to -inf
        xl, xr = x * 2 ** -0.07, x * 2 ** 0.07
        verts += [(x, lo), (x, hi), (xl, lo), (xr, lo), (xl, hi), (xr, hi)]
        codes += [Path.MOVETO, Path.LINETO] * 3
        n += 1
    if verts:
        ax.add_patch(PathPatch(Path(verts, codes), fill=False, edgecolor=color, lw=0.7, zorder=2.6,
                               capstyle="butt"))
    return n


def _not_ok(sub: pd.DataFrame) -> pd.DataFrame:
    return sub[(sub["status"] != "ok") | sub["ips_mean"].isna()]


def _extras(counts, **entries) -> list:
    """Legend entries for the ideal, capacity and failure marks, only where some panel has one."""
    return [(name, make()) for key, (name, make) in entries.items() if any(c.get(key) for c in counts)]


_IDEAL = ("ideal (linear)", lambda: Line2D([], [], color="grey", ls="--", lw=0.8))
_CAPACITY = ("device memory", lambda: Line2D([], [], color="grey", ls=":", lw=1.0))
_NOT_OK = ("not ok (see report)", lambda: Line2D([], [], color="grey", marker="x", ls="none", ms=4))


def _series_items(handles: dict, label) -> list:
    return [(label(k), handles[k]) for k in sorted(handles, key=_line_order)]


def _memory_label(measures) -> str:
    measures = {m for m in measures if isinstance(m, str)}
    if measures == {"allocated"}:
        return "peak allocated per GPU (GiB)"
    if measures == {"rss"}:
        return "peak RSS per rank (GiB), CPU"
    return "peak memory per rank (GiB)"


RSS_NOTE = "CPU: peak RSS is the whole process (interpreter, torch, buffers), not the sharded model state"


def _span(values, fmt=str) -> str:
    vals = sorted({v for v in values if not pd.isna(v)})
    if not vals:
        return ""
    if len(vals) == 1:
        return fmt(vals[0])
    return f"{fmt(vals[0])}–{fmt(vals[-1])}" if len(vals) > 3 else "/".join(fmt(v) for v in vals)


def _int(v) -> str:
    return str(int(v))


def _devices(df: pd.DataFrame) -> str:
    """'8 × AMD Instinct MI250X per node', or the CPU with its cores: what ran the ranks."""
    parts = []
    for (dtype, name), sub in df.groupby([df["device_type"].fillna("?"), df["device_name"].fillna("?")],
                                         sort=False):
        per_node = _span(sub["ranks_per_node"], _int)
        if dtype == "cpu":
            model = _span(sub["cpu_model"]) if "cpu_model" in sub else ""
            cores = _span(sub["cpu_count"], _int) if "cpu_count" in sub else ""
            cpu = (model or f"{name} CPU (model not recorded)") + (f", {cores} logical CPUs" if cores else "")
            parts.append(f"{cpu}; {per_node} ranks per node, gloo" if per_node else cpu)
        else:
            parts.append(f"{per_node} × {name} per node" if per_node else name)
    return "; ".join(parts)


def run_facts(df: pd.DataFrame) -> str:
    """Devices · batch per device · precision · steps, from the runs a figure shows."""
    if df.empty:
        return ""
    parts = [_devices(df)]
    batch = _span(df["batch_per_device"], _int)
    if batch:
        parts.append(f"batch {batch} per {'rank' if (df['device_type'] == 'cpu').all() else 'device'}")
    if "opt_precision" in df:
        precision = _span(df["opt_precision"].dropna().astype(str))
        if precision:
            parts.append(precision)
    timed = _span(df.loc[df["status"] == "ok", "timed_steps"], _int) if "timed_steps" in df else ""
    warm = _span(df["warmup_steps"], _int) if "warmup_steps" in df else ""
    if timed:
        parts.append(f"{timed} timed steps" + (f" after {warm} warm-up" if warm else ""))
    return " · ".join(p for p in parts if p)


# ------------------------------------------------------------------------ Figures 2 and 3: ips

def weak_scaling(df: pd.DataFrame, colors: Optional[dict] = None, width: float = COLUMN_WIDTH,
                 markers: Optional[dict] = None) -> Optional[Plot]:
    runs = scaling_runs(df)
    if runs.empty or scaling_support(df) is not None:
        return None
    colors = colors if colors is not None else series_colors(df)
    markers = markers if markers is not None else series_markers(df)
    models = _models(runs)
    nrows, ncols = _panel_grid(len(models), width, max_cols=3)
    label = _labeller(runs)
    legend_labels = sorted({label(k) for k, _ in _lines(runs)}) + [_IDEAL[0], _NOT_OK[0]]
    facts = run_facts(runs) + " · bars: ± 1 s.d. of per-step images/s"
    panel_h = min(2.2, max(1.45, 0.8 * width / ncols))
    slot = _free_slot(len(models), nrows, ncols, len(legend_labels), panel_h)
    extra_h = (0 if slot else _legend_height(legend_labels, width)) + _title_height(facts, width) + 0.1
    fig, axes = _figure(nrows, ncols, width, panel_h, extra_h)
    handles, drawn, bars = {}, {}, {}
    with style():
        for i, model in enumerate(models):
            ax = axes[i // ncols][i % ncols]
            sub = runs[runs["model"] == model]
            xcol, xname = tbl.x_axis(sub)
            counts = {"measured": 0, "ideal": 0, "failed": 0}
            slots: dict = {}
            n_bars = 0
            for key, line in _lines(sub):
                color, marker = colors[key[1]], markers[key[1]]
                ok = tbl.usable(line)
                if not ok.empty:
                    h, = ax.plot(ok[xcol], ok["ips_mean"], "-", marker=marker, color=color, ms=3.2, lw=1.1,
                                 zorder=3)
                    handles.setdefault(key, h)
                    counts["measured"] += 1
                    n_bars += _error_bars(ax, ok[xcol].to_numpy(float), ok["ips_mean"].to_numpy(float),
                                          ok["ips_std"].to_numpy(float), color, log_y=True)
                    base = ok.iloc[0]
                    ideal_x = line[xcol].to_numpy()
                    ideal_y = base["ips_mean"] * line["world_size"].to_numpy() / base["world_size"]
                    ax.plot(ideal_x, ideal_y, "--", color=color, lw=0.7, alpha=0.6, zorder=2)
                    counts["ideal"] += 1
                counts["failed"] += _mark_failures(ax, list(_not_ok(line)[xcol]), color, slots)
            _log2_x(ax, sub[xcol])
            _log_y(ax)
            _reserve_bottom_log(ax, slots)
            _log_ticks(ax)
            ax.set_title(_model_title(df, model))
            ax.set_xlabel(xname)
            if i % ncols == 0:
                ax.set_ylabel("images/s, all ranks (log)")
            ax.grid(True, which="major", alpha=0.3)
            drawn[model] = counts
            bars[model] = n_bars
        for j in range(len(models), nrows * ncols):
            axes[j // ncols][j % ncols].set_visible(False)
        extra = _extras(drawn.values(), ideal=_IDEAL, failed=_NOT_OK)
        _facts_title(fig, facts, width)
        if slot:
            _legend_in_slot(axes[slot[0]][slot[1]], _series_items(handles, label) + extra)
        else:
            _legend_below(fig, _series_items(handles, label) + extra, width)
    return Plot("weak_scaling_ips", "Weak scaling: images/s", fig, drawn,
                "Images/s of the whole job (all ranks together), log scale, against nodes (log2): measured "
                "(solid, ± one standard deviation of the per-step images/s over the timed steps, often hidden by "
                "the marker) and ideal linear scaling from each strategy's smallest run (dashed); "
                "× marks a run that did not finish ok.",
                extra={"errorbars": bars, "facts": facts})


# --------------------------------------------------------------------------- memory per GPU

def _coinciding(points: list, tolerance: float) -> list:
    """Groups (lists of keys, two or more) of series whose points lie on one another: a shared x
    and, at every shared x, values closer than tolerance. points: [(key, {x: y})]."""
    parent = {k: k for k, _ in points}

    def find(k):
        while parent[k] != k:
            k = parent[k]
        return k

    for a in range(len(points)):
        for b in range(a + 1, len(points)):
            (ka, pa), (kb, pb) = points[a], points[b]
            shared = set(pa) & set(pb)
            if shared and all(abs(pa[x] - pb[x]) <= tolerance for x in shared):
                parent[find(kb)] = find(ka)
    groups: dict = {}
    for k, _ in points:
        groups.setdefault(find(k), []).append(k)
    return [g for g in groups.values() if len(g) > 1]


def memory(df: pd.DataFrame, colors: Optional[dict] = None, width: float = COLUMN_WIDTH,
           markers: Optional[dict] = None) -> Optional[Plot]:
    runs = scaling_runs(df)
    if runs.empty or scaling_support(df, "memory_gib") is not None:
        return None
    colors = colors if colors is not None else series_colors(df)
    markers = markers if markers is not None else series_markers(df)
    models = _models(runs)
    # The paper draws FULL_SHARD apart: its memory falls with every node added while the others'
    # stays flat, and on one axis the flat lines would hide its curve.
    split = (runs["strategy"] == "FULL_SHARD").any() and (runs["strategy"] != "FULL_SHARD").any()
    if split:
        per_row = max(1, min(len(models), int(width // (2 * MIN_PANEL_WIDTH))))
        nrows, ncols = math.ceil(len(models) / per_row), 2 * per_row
    else:
        nrows, ncols = _panel_grid(len(models), width, max_cols=3)
    label = _labeller(runs)
    ylabel = _memory_label(runs["memory_measure"])
    cpu = set(runs["memory_measure"].dropna()) == {"rss"}
    facts = run_facts(runs) + (f" · {RSS_NOTE}" if cpu else "")
    legend_runs = runs[runs["strategy"] != "FULL_SHARD"] if split else runs
    legend_labels = sorted({label(k) for k, _ in _lines(legend_runs)}) + [_CAPACITY[0], _NOT_OK[0]]
    panel_h = min(2.0, max(1.45, 0.85 * width / ncols))
    extra_h = _legend_height(legend_labels, width) + _title_height(facts, width) + 0.2
    fig, axes = _figure(nrows, ncols, width, panel_h, extra_h)
    handles, drawn, shifted, tops = {}, {}, [], {}
    panel_w = width / ncols - 0.3
    with style():
        for i, model in enumerate(models):
            sub_all = runs[runs["model"] == model]
            xcol, xname = tbl.x_axis(sub_all)
            panels = [("FULL_SHARD", sub_all[sub_all["strategy"] == "FULL_SHARD"]),
                      ("other strategies", sub_all[sub_all["strategy"] != "FULL_SHARD"])] if split else \
                     [("all strategies", sub_all)]
            capacity = sub_all["device_memory_gib"].dropna()
            xs_all = sorted({int(x) for x in sub_all[xcol]})
            for j, (panel_name, sub) in enumerate(panels):
                k = i * len(panels) + j
                ax = axes[k // ncols][k % ncols]
                counts = {"measured": 0, "capacity": 0, "failed": 0}
                slots: dict = {}
                series = []
                for key, line in _lines(sub):
                    ok = line[(line["status"] == "ok") & line["memory_gib"].notna()]
                    series.append((key, line, ok))
                data_max = max([float(ok["memory_gib"].max()) for _, _, ok in series if not ok.empty], default=0.0)
                top = max(data_max, float(capacity.max()) if not capacity.empty else 0.0) * 1.12 or 1.0
                # Series with the same memory hide one another (DDP and NO_SHARD under
                # SHARD_GRAD_OP): shift each such group sideways by about a marker's width. Only
                # equal values (0.5% of the axis): merely close ones would chain into one wide group.
                groups = _coinciding([(key, dict(zip(ok[xcol].astype(int), ok["memory_gib"])))
                                      for key, _, ok in series if not ok.empty], 0.005 * top)
                doublings = max(1.0, math.log2(max(xs_all) / min(xs_all))) if xs_all else 1.0
                step = (4.5 / 72) * doublings / max(0.6, panel_w)
                offset = {}
                for g in groups:
                    g = sorted(g, key=_line_order)
                    for n, key in enumerate(g):
                        offset[key] = 2 ** ((n - (len(g) - 1) / 2) * step)
                    shifted.append((model, [label(key) for key in g]))
                for key, line, ok in series:
                    color, marker = colors[key[1]], markers[key[1]]
                    if not ok.empty:
                        xs = ok[xcol].to_numpy(float) * offset.get(key, 1.0)
                        # clip_on=False: a marker on the axis edge is drawn whole
                        h, = ax.plot(xs, ok["memory_gib"], "-", marker=marker, color=color, ms=3.2, lw=1.1,
                                     clip_on=False, zorder=3)
                        if not (split and panel_name == "FULL_SHARD"):
                            handles.setdefault(key, h)
                        counts["measured"] += 1
                    counts["failed"] += _mark_failures(ax, list(line[line["status"] != "ok"][xcol]), color, slots)
                if not capacity.empty:
                    ax.axhline(capacity.max(), color="grey", ls=":", lw=1.0)
                    counts["capacity"] = 1
                if sub.empty:
                    ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", color="grey")
                _log2_x(ax, sub_all[xcol])
                # Headroom above the highest point or the device line, so neither sits on the frame.
                ax.set_ylim(0, top)
                tops[(model, panel_name)] = top
                ax.set_title(f"{model}: {panel_name}" if split else _model_title(df, model))
                if k + ncols >= len(models) * len(panels):  # the lowest panel of its column
                    ax.set_xlabel(xname)
                if k % ncols == 0:
                    ax.set_ylabel(ylabel)
                ax.grid(True, alpha=0.3)
                drawn[(model, panel_name)] = counts
        for j in range(len(models) * (2 if split else 1), nrows * ncols):
            axes[j // ncols][j % ncols].set_visible(False)
        extra = _extras(drawn.values(), capacity=_CAPACITY, failed=_NOT_OK)
        _facts_title(fig, facts, width)
        _legend_below(fig, _series_items(handles, label) + extra, width)
    caption = f"{ylabel[0].upper()}{ylabel[1:]}, the maximum over ranks, against nodes."
    if split:
        caption += " FULL_SHARD has its own panels (its memory falls with every node); the legend is the others'."
    if any(c["capacity"] for c in drawn.values()):
        caption += " Dotted: the device's memory."
    names = list(dict.fromkeys(" = ".join(g) for _, g in shifted))
    if names:
        caption += (" Series with equal memory are shifted sideways slightly so each shows: "
                    + "; ".join(names) + ".")
    if cpu:
        caption += (" These are CPU runs: the peak RSS of each process holds the interpreter, torch and the "
                    "data buffers as well as the model state, so it says nothing about what sharding saves.")
    return Plot("memory", "Peak memory per device", fig, drawn, caption,
                extra={"shifted": shifted, "ylim_top": tops, "facts": facts})


# ------------------------------------------------------------------------ efficiency heat map

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


def efficiency(df: pd.DataFrame, width: float = COLUMN_WIDTH) -> Optional[Plot]:
    runs = scaling_runs(df)
    if runs.empty or scaling_support(df) is not None:
        return None
    models = _models(runs)
    label = _labeller(runs)
    matrices = {}
    for model in models:
        sub = runs[runs["model"] == model]
        xcol, xname = tbl.x_axis(sub)
        lines = list(_lines(sub))
        cols = sorted(sub[xcol].astype(int).unique())
        values = pd.DataFrame(np.nan, index=[label(k) for k, _ in lines], columns=cols)
        text = pd.DataFrame("", index=values.index, columns=cols)
        for k, line in lines:
            for _, r in line.iterrows():
                x = int(r[xcol])
                if r["status"] == "ok" and not pd.isna(r["efficiency"]):
                    values.loc[label(k), x] = r["efficiency"]
                    text.loc[label(k), x] = f"{r['efficiency'] * 100:.0f}%"
                else:
                    text.loc[label(k), x] = "×\n" + str(r["status"]).upper()
        matrices[model] = (values, text, xname)
    widest = max(len(v.columns) for v, _, _ in matrices.values())
    tallest = max(len(v.index) for v, _, _ in matrices.values())
    label_w = max(_text_width(str(s)) for v, _, _ in matrices.values() for s in v.index) + 0.08
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
    with_percent = cell_w >= _text_width("100%") + 0.06
    definition = efficiency_definition(runs) + ("" if with_percent else " · cells in %")
    status_codes = {}
    extra_h = 0.55 + _title_height(definition + " · × = not ok: OOM, TIME = timeout", width)
    fig, axes = _figure(nrows, ncols, width, panel_h, extra_h)
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
                if failed and _text_width(t.split("\n")[-1], 5.5) > cell_w * 0.95:
                    # a status too wide for its cell gets a short code, explained above the figure
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
            ax.set_title(_model_title(df, model))
        for j in range(len(models), nrows * ncols):
            axes[j // ncols][j % ncols].set_visible(False)
        if status_codes:
            definition += " · × = not ok: " + ", ".join(f"{k} = {v}" for k, v in sorted(status_codes.items()))
        _facts_title(fig, definition, width)
        if image is not None:
            from matplotlib.ticker import PercentFormatter

            bar = fig.colorbar(image, ax=[a for a in axes.ravel() if a.get_visible()], orientation="horizontal",
                               location="bottom", shrink=0.6, aspect=30, pad=0.01)
            bar.set_label("scaling efficiency", fontsize=SMALL_PT, labelpad=1)
            bar.ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            _ticks(bar.ax)
    codes = ", ".join(f"{k} = {v}" for k, v in sorted(status_codes.items()))
    return Plot("efficiency", "Scaling efficiency", fig, {m: v for m, (v, _, _) in matrices.items()},
                f"Weak-scaling {efficiency_definition(runs)}. Cells in percent; × marks a run that did not finish ok"
                + (f" ({codes})." if codes else "."),
                extra={"definition": efficiency_definition(runs), "status_codes": status_codes})


STATUS_CODES = {"timeout": "TIME", "incomplete": "INC", "diverged": "DIV", "failed": "FAIL", "skipped": "SKIP"}


# ------------------------------------------------------------------ Figure 1: the config grid

def _grid_rows(df: pd.DataFrame) -> pd.DataFrame:
    has = pd.Series(True, index=df.index)
    for col in ("opt_backward_prefetch", "opt_limit_all_gathers"):
        has &= df[col].notna() if col in df.columns else False
    return df[has & (df["family"] == "fsdp")]


def pick_grid(df: pd.DataFrame, model: Optional[str] = None, nodes: Optional[int] = None):
    """(study, model, nodes, batch) with the most FSDP prefetch × limit_all_gathers configurations.

    Raises ValueError naming what exists when --grid-model/--grid-nodes match nothing.
    """
    rows = _grid_rows(df)
    if model is not None:
        if model not in set(rows["model"]):
            have = ", ".join(sorted(set(rows["model"]))) or "none"
            raise ValueError(f"--grid-model: no FSDP runs with prefetch options for {model!r}; "
                             f"models with them: {have}")
        rows = rows[rows["model"] == model]
    if nodes is not None:
        if nodes not in set(rows["nodes"]):
            have = ", ".join(str(n) for n in sorted(set(rows["nodes"]))) or "none"
            raise ValueError(f"--grid-nodes: no FSDP runs with prefetch options at {nodes} nodes"
                             f"{' for ' + model if model else ''}; node counts with them: {have}")
        rows = rows[rows["nodes"] == nodes]
    if rows.empty:
        return None
    # A grid needs some strategy at two or more settings; several strategies at one setting each
    # is just a bar chart of the weak-scaling runs at that node count.
    distinct = rows.drop_duplicates(["study", "model", "nodes", "batch_per_device", "strategy",
                                     "opt_backward_prefetch", "opt_limit_all_gathers"])
    point = ["study", "model", "nodes", "batch_per_device"]
    per_strategy = distinct.groupby(point + ["strategy"]).size().groupby(level=point).max()
    configs = distinct.groupby(point).size()
    configs = configs[per_strategy.reindex(configs.index) >= 2]
    if configs.empty:
        return None
    best = configs.sort_values(ascending=False, kind="stable")
    top = best[best == best.iloc[0]].index
    return max(top, key=lambda k: (k[2], k[1]))  # ties: the larger node count


def config_grid(df: pd.DataFrame, model: Optional[str] = None, nodes: Optional[int] = None,
                width: float = COLUMN_WIDTH) -> Optional[Plot]:
    pick = pick_grid(df, model, nodes)
    if pick is None:
        return None
    study, model, nodes, batch = pick
    rows = _grid_rows(df)
    rows = rows[(rows["study"] == study) & (rows["model"] == model) & (rows["nodes"] == nodes)
                & (rows["batch_per_device"] == batch)]
    labels = [s for s in GRID_STRATEGIES if s in set(rows["strategy"])] + sorted(
        s for s in set(rows["strategy"]) if s not in GRID_STRATEGIES)
    combos = [(p, lag) for p in PREFETCH_ORDER for lag in (False, True)
              if ((rows["opt_backward_prefetch"] == p) & (rows["opt_limit_all_gathers"] == lag)).any()]
    facts = run_facts(rows) + " · bars: ± 1 s.d. of per-step images/s"
    legend_labels = [f"backward prefetch {p}" for p in PREFETCH_ORDER] + ["limit_all_gathers off", "on", "not ok"]
    fig, axes = _figure(1, 1, width, min(2.6, 0.62 * width),
                        _legend_height(legend_labels, width) + _title_height(facts, width) + 0.1)
    ax = axes[0][0]
    import matplotlib

    cmap = matplotlib.colormaps["Blues"]
    pcolor = {p: cmap(0.35 + 0.25 * i) for i, p in enumerate(PREFETCH_ORDER)}
    bar_w = 0.8 / max(1, len(combos))
    values, failed, bars = {}, [], 0
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    with style():
        for gi, label in enumerate(labels):
            for ci, (p, lag) in enumerate(combos):
                x = gi - 0.4 + bar_w * (ci + 0.5)
                cell = rows[(rows["strategy"] == label) & (rows["opt_backward_prefetch"] == p)
                            & (rows["opt_limit_all_gathers"] == lag)]
                ok = tbl.usable(cell)
                if not ok.empty:
                    best = ok.loc[ok["ips_mean"].idxmax()]
                    ips = float(best["ips_mean"])
                    ax.bar(x, ips, bar_w * 0.92, color=pcolor[p], edgecolor="black", lw=0.5,
                           hatch=None if lag else "///")
                    if not pd.isna(best["ips_std"]) and best["ips_std"] > 0:
                        ax.errorbar([x], [ips], yerr=[best["ips_std"]], fmt="none", ecolor="black", elinewidth=0.6,
                                    capsize=1.2, capthick=0.6)
                    ax.text(x, ips + (best["ips_std"] if not pd.isna(best["ips_std"]) else 0), f" {ips:.0f}",
                            ha="center", va="bottom", fontsize=SMALL_PT - 0.5, rotation=90)
                    values[(label, p, bool(lag))] = ips
                    bars += 1
                elif not cell.empty:
                    ax.scatter([x], [0.04], color="firebrick", transform=trans, **FAIL_MARK)
                    failed.append((label, p, bool(lag), cell["status"].iloc[0]))
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylabel("images/s, all ranks")
        ax.set_ylim(0, max(values.values()) * 1.25 if values else 1)
        ax.set_title(f"{_model_title(df, model)}, {nodes} nodes")
        ax.grid(True, axis="y", alpha=0.3)
        from matplotlib.patches import Patch

        items = [(f"backward prefetch {p}", Patch(facecolor=pcolor[p], edgecolor="black", lw=0.5))
                 for p in PREFETCH_ORDER if any(c[0] == p for c in combos)]
        items += [("limit_all_gathers off", Patch(facecolor="white", edgecolor="black", hatch="///", lw=0.5)),
                  ("limit_all_gathers on", Patch(facecolor="white", edgecolor="black", lw=0.5))]
        if failed:
            items.append(("not ok (see report)", Line2D([], [], color="firebrick", marker="x", ls="none")))
        _facts_title(fig, facts, width)
        _legend_below(fig, items, width)
    return Plot("config_grid", "FSDP configurations (Figure 1)", fig,
                {"study": study, "model": model, "nodes": nodes, "batch": batch, "bars": bars, "failed": failed,
                 "values": values},
                f"Images/s of {model} on {nodes} nodes for each sharding strategy, backward prefetch and "
                f"limit_all_gathers setting (hatched: off); bars ± one standard deviation over the timed steps.",
                extra={"facts": facts})


# ------------------------------------------------------- seeds 000/001: one device, batch sizes

def plugin_groups(df: pd.DataFrame) -> list:
    """(study, model) pairs with single-device runs at two or more batch sizes."""
    one = df[df["world_size"] == 1]
    n = one.groupby(["study", "model"])["batch_per_device"].nunique()
    return [k for k, v in n.items() if v >= 2]


def plugin_support(df: pd.DataFrame) -> Optional[str]:
    groups = plugin_groups(df)
    if not groups:
        return "no model has single-device runs at two or more batch sizes"
    for study, model in groups:
        sub = tbl.usable(df[(df["world_size"] == 1) & (df["study"] == study) & (df["model"] == model)])
        if (sub.groupby("series")["batch_per_device"].nunique() >= 2).any():
            return None
    return ("every strategy has at most one batch size that finished ok, so each line would be one point; "
            "the table holds the numbers")


def plugin_comparison(df: pd.DataFrame, colors: Optional[dict] = None, width: float = COLUMN_WIDTH,
                      markers: Optional[dict] = None) -> Optional[Plot]:
    groups = plugin_groups(df)
    if not groups or plugin_support(df) is not None:
        return None
    colors = colors if colors is not None else series_colors(df)
    markers = markers if markers is not None else series_markers(df)
    one = df[(df["world_size"] == 1) & df.set_index(["study", "model"]).index.isin(groups)]
    facts = run_facts(one) + " · bars: ± 1 s.d. of per-step images/s"
    legend_labels = sorted(set(one["series"])) + [_CAPACITY[0], _NOT_OK[0]]
    panel_h = min(2.0, max(1.45, 0.42 * width))
    fig, axes = _figure(len(groups), 2, width, panel_h,
                        _legend_height(legend_labels, width) + _title_height(facts, width) + 0.1)
    handles, drawn = {}, {}
    with style():
        for i, (study, model) in enumerate(groups):
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
                    h, = axes[i][0].plot(ok["batch_per_device"], ok["ips_mean"], "-", marker=marker, color=color,
                                         ms=3.2, lw=1.1, clip_on=False, zorder=3)
                    _error_bars(axes[i][0], ok["batch_per_device"].to_numpy(float), ok["ips_mean"].to_numpy(float),
                                ok["ips_std"].to_numpy(float), color, log_y=False)
                    handles.setdefault(("", series, 0), h)
                    counts["ips_lines"] += 1
                mem = line[(line["status"] == "ok") & line["memory_gib"].notna()]
                if not mem.empty:
                    axes[i][1].plot(mem["batch_per_device"], mem["memory_gib"], "-", marker=marker, color=color,
                                    ms=3.2, lw=1.1, clip_on=False, zorder=3)
                    counts["memory_lines"] += 1
                bad = list(_not_ok(line)["batch_per_device"])
                counts["failed"] += _mark_failures(axes[i][0], bad, color, slots_ips)
                _mark_failures(axes[i][1], bad, color, slots_mem)
            capacity = sub["device_memory_gib"].dropna()
            if not capacity.empty:
                axes[i][1].axhline(capacity.max(), color="grey", ls=":", lw=1.0)
                counts["capacity"] = 1
            for ax in axes[i]:
                _log2_x(ax, sub["batch_per_device"])
                ax.set_xlabel("batch size")
                ax.grid(True, alpha=0.3)
            ips_top = (tbl.usable(sub)["ips_mean"] + tbl.usable(sub)["ips_std"].fillna(0)).max()
            axes[i][0].set_ylabel("images/s")
            axes[i][0].set_ylim(0, (ips_top if not pd.isna(ips_top) else 1.0) * 1.12)
            mem_top = max([sub["memory_gib"].max()] + list(capacity))
            axes[i][1].set_ylabel(_memory_label(sub["memory_measure"]))
            axes[i][1].set_ylim(0, (mem_top if not pd.isna(mem_top) else 1.0) * 1.12)
            axes[i][0].set_title(f"{model}: throughput")
            axes[i][1].set_title(f"{model}: peak memory")
            drawn[(study, model)] = counts
        extra = _extras(drawn.values(), capacity=_CAPACITY, failed=_NOT_OK)
        _facts_title(fig, facts, width)
        _legend_below(fig, _series_items(handles, lambda k: k[1]) + extra, width)
    return Plot("plugin_comparison", "Single-device strategy comparison", fig, drawn,
                "Throughput (± one standard deviation over the timed steps) and peak memory on one device against "
                "batch size, one line per strategy (seeds 000/001).", extra={"facts": facts})


# ------------------------------------------------------------------------ planner against measurement

FAMILY_NAMES = {"ddp": "DDP and FSDP", "fsdp": "DDP and FSDP", "deepspeed": "DeepSpeed ZeRO",
                "colossalai": "ColossalAI"}
FAMILY_SHORT = {"DDP and FSDP": "DDP/FSDP", "DeepSpeed ZeRO": "ZeRO"}  # for the figure's own text


def prediction_rows(df: pd.DataFrame) -> pd.DataFrame:
    """ok GPU runs with both the planner's predicted and the measured peak allocated memory, with
    residual = (predicted - measured) / measured. CPU runs are left out: their RSS holds the whole
    process, not the tensors the planner counts."""
    if df.empty or "plan_peak_allocated_gib" not in df:
        return df.iloc[0:0]
    runs = df[(df["status"] == "ok") & (df["memory_measure"] == "allocated")
              & df["plan_peak_allocated_gib"].notna() & df["memory_gib"].notna() & (df["memory_gib"] > 0)].copy()
    runs["residual"] = runs["plan_peak_allocated_gib"] / runs["memory_gib"] - 1.0
    runs["family_group"] = [FAMILY_NAMES.get(str(f), str(f)) for f in runs["family"]]
    return runs


def residual_summary(runs: pd.DataFrame) -> list:
    """(family group, runs, max |residual|, models) for each family group, in a fixed order."""
    out = []
    order = list(dict.fromkeys(FAMILY_NAMES.values()))
    for group, sub in sorted(runs.groupby("family_group"), key=lambda kv: tbl._rank(kv[0], order)):
        models = [m for m in _models(sub)]
        out.append((group, len(sub), float(sub["residual"].abs().max()), models))
    return out


def _short_model(model: str) -> str:
    return re.sub(r"^vit_", "", str(model))


def predicted_memory(df: pd.DataFrame, colors: Optional[dict] = None, width: float = COLUMN_WIDTH,
                     markers: Optional[dict] = None) -> Optional[Plot]:
    """The planner's predicted peak allocated memory (recorded in each run's start) against the
    measured peak allocated (max over ranks), each point named by its model, with the residual
    of every point in a panel below."""
    runs = prediction_rows(df)
    if runs.empty:
        return None
    colors = colors if colors is not None else series_colors(df)
    markers = markers if markers is not None else series_markers(df)
    summary = residual_summary(runs)
    facts = run_facts(runs)
    strategies = sorted(runs["strategy"].unique(), key=tbl.strategy_rank)
    legend_labels = list(strategies) + ["equal", "±15%"]
    # A scatter needs no more height on a page-wide figure than in a column.
    side = min(width, COLUMN_WIDTH + 0.1)
    fig, axes = _figure(2, 1, width, 0.5 * side,
                        _legend_height(legend_labels, width) + _title_height(facts, width) + 0.1,
                        sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    ax, res_ax = axes[0][0], axes[1][0]
    drawn = {}
    lo = float(min(runs["plan_peak_allocated_gib"].min(), runs["memory_gib"].min()))
    hi = float(max(runs["plan_peak_allocated_gib"].max(), runs["memory_gib"].max()))
    log = hi / max(lo, 1e-9) > 8  # a ViT-Base next to a ViT-3B: on a linear axis the small ones are one blob
    with style():
        items = []
        for strategy in strategies:
            sub = runs[runs["strategy"] == strategy]
            color, marker = colors[strategy], markers[strategy]
            sc = ax.scatter(sub["plan_peak_allocated_gib"], sub["memory_gib"], s=16, color=color, marker=marker,
                            zorder=3, lw=0.4, edgecolor="white")
            res_ax.scatter(sub["plan_peak_allocated_gib"], sub["residual"] * 100, s=14, color=color, marker=marker,
                           zorder=3, lw=0.4, edgecolor="white")
            drawn[strategy] = len(sub)
            items.append((strategy, sc))
        if log:
            edges = [lo / 1.35, hi * 1.35]
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            edges = [0.0, hi * 1.12]
        xs = np.geomspace(*edges, 50) if log else np.array(edges)
        ax.plot(xs, xs, color="grey", lw=0.8, zorder=1)
        ax.fill_between(xs, xs * 0.85, xs * 1.15, color="grey", alpha=0.12, lw=0)
        ax.set_xlim(*edges)
        ax.set_ylim(*edges)
        _label_points(ax, runs, log, (width - 0.75, side * 2.2 / 3.2 - 0.1))
        if log:
            for axis in (ax.xaxis, ax.yaxis):
                _log_axis_ticks(axis, edges)
        ax.set_ylabel("measured peak allocated\nper GPU (GiB)")
        ax.grid(True, alpha=0.3)
        worst = float(runs["residual"].abs().max()) * 100
        span = max(2.0, worst * 1.6)  # room for the summary line above the points
        res_ax.axhline(0, color="grey", lw=0.8)
        res_ax.set_ylim(-span, span)
        res_ax.set_ylabel("predicted −\nmeasured (%)")
        res_ax.set_xlabel("predicted peak allocated per GPU (GiB), vit-scale plan")
        res_ax.grid(True, alpha=0.3)
        _ticks(res_ax)
        stated = "max |residual|: " + ", ".join(f"{FAMILY_SHORT.get(g, g)} {m * 100:.1f}% ({n})"
                                                 for g, n, m, _ in summary)
        res_ax.text(0.01, 0.97, stated, transform=res_ax.transAxes, ha="left", va="top", fontsize=SMALL_PT - 0.5,
                    color="0.2", bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0.5))
        _facts_title(fig, facts, width)
        items += [("equal", Line2D([], [], color="grey", lw=0.8)),
                  ("±15%", PathPatch(Path([(0, 0), (1, 0), (1, 1)]), facecolor="grey", alpha=0.2, lw=0))]
        _legend_below(fig, items, width)
    caption = ("Each point is one ok GPU run, labelled with its model; the line is equality and the band ±15%. "
               "Below: the residual (predicted − measured) / measured of each point. Largest |residual|: "
               + "; ".join(f"{g} {m * 100:.1f}% over {n} run{'s' if n > 1 else ''} "
                           f"({', '.join(_short_model(x) for x in models)})" for g, n, m, models in summary) + ".")
    return Plot("predicted_memory", "Predicted against measured memory", fig, drawn, caption,
                extra={"residuals": {(r.model, r.series, int(r.nodes), int(r.world_size)): float(r.residual)
                                     for r in runs.itertuples()},
                       "max_residual": {g: m for g, _, m, _ in summary}, "log": log})


def _log_axis_ticks(axis, edges) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    lo, hi = edges
    ticks = []
    for subs in ((1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                 for m in subs if lo <= m * 10.0 ** k <= hi]
        if len(ticks) <= 6:
            break
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(_si))
    axis.set_minor_locator(NullLocator())


def _label_points(ax, runs: pd.DataFrame, log: bool, axes_size: tuple) -> None:
    """Each model's name once beside its group of points, where it covers no other label or point.

    Runs of one model under several strategies often sit close together, and a label per point
    would pile up; two models can share a spot too (ViT-1B DDP and ViT-3B FULL_SHARD), so each
    label tries left, right, above and below its group and takes the first free place. Positions
    are worked out in axes fractions from the axes' planned size in inches.
    """
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    tx = (lambda v: (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))) if log else \
        (lambda v: (v - x0) / (x1 - x0))
    ty = (lambda v: (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0))) if log else \
        (lambda v: (v - y0) / (y1 - y0))
    w_in, h_in = axes_size
    pts = [(r.model, tx(float(r.plan_peak_allocated_gib)), ty(float(r.memory_gib)))
           for r in runs.sort_values("plan_peak_allocated_gib").itertuples()]
    to_axes = {(m, x, y): (px, py) for (m, x, y), (px, py) in zip(
        pts, [(float(r.plan_peak_allocated_gib), float(r.memory_gib))
              for r in runs.sort_values("plan_peak_allocated_gib").itertuples()])}
    mark_w, mark_h = 3.5 / 72 / w_in, 3.5 / 72 / h_in
    taken = [(x - mark_w, y - mark_h, x + mark_w, y + mark_h) for _, x, y in pts]
    clusters: list = []  # [model, [(x, y)]]
    for model, x, y in pts:
        near = next((c for c in clusters if c[0] == model and abs(c[1][-1][0] - x) < 0.08
                     and abs(c[1][-1][1] - y) < 0.08), None)
        if near:
            near[1].append((x, y))
        else:
            clusters.append([model, [(x, y)]])
    pt = SMALL_PT - 0.5
    for model, members in clusters:
        text = _short_model(model)
        tw, th = _text_width(text, pt) / w_in, pt * 1.25 / 72 / h_in
        xs, ys = [m[0] for m in members], [m[1] for m in members]
        gap_x, gap_y = 2.5 / 72 / w_in, 2.0 / 72 / h_in
        # The points lie along the diagonal, so the free room is above-left and below-right of it;
        # farther out on each side in turn, with a hairline back to the group.
        cands = []
        for reach in (1.0, 2.5, 4.0, 5.5):
            cands.append((min(xs) - reach * gap_x - tw, max(ys) + reach * gap_y))
            cands.append((max(xs) + reach * gap_x, min(ys) - reach * gap_y - th))
        boxes = [(cx, cy, cx + tw, cy + th) for cx, cy in cands]
        free = [b for b in boxes if 0 <= b[0] and b[2] <= 1 and 0 <= b[1] and b[3] <= 1
                and not any(b[0] < o[2] and o[0] < b[2] and b[1] < o[3] and o[1] < b[3] for o in taken)]
        box = free[0] if free else boxes[0]
        taken.append(box)
        # A hairline to the nearest point of its group: two models' groups can sit side by side.
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        mx, my = min(members, key=lambda m: (m[0] - cx) ** 2 + (m[1] - cy) ** 2)
        ax.annotate(text, (to_axes[(model, mx, my)]), xytext=(box[0], box[1]), textcoords="axes fraction",
                    ha="left", va="bottom", fontsize=pt, color="0.25",
                    arrowprops=dict(arrowstyle="-", lw=0.4, color="0.55", shrinkA=0.5, shrinkB=2.5))


def all_plots(df: pd.DataFrame, grid_model: Optional[str] = None, grid_nodes: Optional[int] = None,
              width: float = COLUMN_WIDTH) -> tuple:
    """Every figure the table supports, and a line for each one it does not, saying why."""
    colors = series_colors(df) if not df.empty else series_colors(df.iloc[0:0])
    markers = series_markers(df) if not df.empty else series_markers(df.iloc[0:0])
    plots, missing = [], []
    scaling_why = scaling_support(df) if not df.empty else "no runs"
    memory_why = scaling_support(df, "memory_gib") if not df.empty else "no runs"
    makers = [
        ("weak scaling", lambda: weak_scaling(df, colors, width, markers), scaling_why),
        ("memory", lambda: memory(df, colors, width, markers), memory_why),
        ("efficiency", lambda: efficiency(df, width), scaling_why),
        ("configuration grid", lambda: config_grid(df, grid_model, grid_nodes, width),
         "no model and node count has two or more FSDP backward-prefetch / limit_all_gathers configurations"),
        ("plugin comparison", lambda: plugin_comparison(df, colors, width, markers),
         plugin_support(df) if not df.empty else "no runs"),
        ("predicted against measured memory", lambda: predicted_memory(df, colors, width, markers),
         "no GPU run carries a plan prediction (CPU runs measure RSS, which the planner does not model)"),
    ]
    for name, make, why in makers:
        plot = make()
        if plot is None:
            missing.append(f"{name}: {why}")
        else:
            plots.append(plot)
    return plots, missing


# ------------------------------------------------------------------------ where the time goes

# compute_ms holds the hidden communication too (it is time the step computes): the bar splits it
BREAKDOWN_PARTS = (("compute_only_ms", "compute", "#4c72b0", None),
                   ("comm_overlapped_ms", "compute, communication hidden", "#8fbc8f", None),
                   ("memory_ms", "memory copies and sets", "#dd8452", None),
                   ("comm_exposed_ms", "communication, exposed", "#c44e52", None),
                   ("idle_ms", "idle / host", "#d9d9d9", "///"))


def time_breakdown(bd: pd.DataFrame, width: float = COLUMN_WIDTH) -> Optional[Plot]:
    """Stacked bars per strategy against node count: the mean per-step time of the traced ranks."""
    from . import traces

    if bd.empty:
        return None
    runs = traces.per_run(bd)
    runs["compute_only_ms"] = runs["compute_ms"] - runs["comm_overlapped_ms"]
    models = list(dict.fromkeys(runs["model"]))
    nrows, ncols = _panel_grid(len(models), width, max_cols=2)
    labels = [name for _, name, _, _ in BREAKDOWN_PARTS]
    fig, axes = _figure(nrows, ncols, width, min(2.2, 0.62 * width / ncols * 1.3), _legend_height(labels, width) + 0.1)
    drawn = {}
    with style():
        from matplotlib.patches import Patch

        for i, model in enumerate(models):
            ax = axes[i // ncols][i % ncols]
            sub = runs[runs["model"] == model]
            one_machine = sub["nodes"].nunique() == 1 and sub["world_size"].nunique() > 1
            size_col = "world_size" if one_machine else "nodes"
            sizes = sorted(set(sub[size_col]))
            strategies = sorted(dict.fromkeys(sub["strategy"]), key=tbl.strategy_rank)
            bar_w = 0.8 / max(1, len(strategies))
            ticks, names = [], []
            for gi, size in enumerate(sizes):
                for si, strategy in enumerate(strategies):
                    row = sub[(sub[size_col] == size) & (sub["strategy"] == strategy)]
                    if row.empty:
                        continue
                    x = gi - 0.4 + bar_w * (si + 0.5)
                    bottom = 0.0
                    for col, _, color, hatch in BREAKDOWN_PARTS:
                        value = float(row[col].iloc[0])
                        ax.bar(x, value, bar_w * 0.9, bottom=bottom, color=color, hatch=hatch, edgecolor="black",
                               lw=0.4)
                        bottom += value
                    ticks.append(x)
                    names.append(strategy)
                    drawn[(model, strategy, int(size))] = bottom
            ax.set_xticks(ticks, names, rotation=90, fontsize=SMALL_PT - 0.5)
            for gi, size in enumerate(sizes):
                unit = ("GPUs" if bd["device"].eq("gpu").all() else "ranks") if one_machine else (
                    "node" if size == 1 else "nodes")
                ax.text(gi, 1.01, f"{size} {unit}", ha="center", va="bottom", fontsize=SMALL_PT,
                        transform=blended_transform_factory(ax.transData, ax.transAxes))
            ax.set_ylabel("ms per step, mean over ranks")
            ax.set_title(model, pad=10)
            ax.grid(True, axis="y", alpha=0.3)
        for j in range(len(models), nrows * ncols):
            axes[j // ncols][j % ncols].set_visible(False)
        _legend_below(fig, [(name, Patch(facecolor=color, hatch=hatch, edgecolor="black", lw=0.4))
                            for _, name, color, hatch in BREAKDOWN_PARTS], width)
    device = "GPU kernels" if bd["device"].eq("gpu").all() else "host threads (gloo on CPU)"
    return Plot("time_breakdown", "Where the time goes", fig, drawn,
                f"Per-step time of the profiled steps (profile.enabled, recorded after the timed window), from "
                f"the {device}: compute alone, compute with communication hidden behind it, memory copies and sets "
                f"that nothing else covers (GPU only), communication exposed, and the "
                f"rest of the step (idle: host work, launch gaps, waiting on a peer). Mean over the traced ranks; "
                f"definitions in docs/profiling.md.")
