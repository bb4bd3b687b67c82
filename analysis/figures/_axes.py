"""What goes on one panel besides the data: log axes with plain-number ticks, the × of a run that
did not finish ok, error bars, the device-capacity line, and the legend entries of such marks.

Conventions across figures: measured = solid line with markers at the point's throughput (images/s over wall time);
error bars = the 95% interval of that throughput (the table's ips_ci_low/high; the caption
says how it was worked out); ideal = dashed, same colour; device
capacity = dotted grey; a run that did not finish ok = an × in its series' colour along the
bottom of the axes at its x.
"""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.patches import PathPatch
from matplotlib.path import Path
from matplotlib.transforms import blended_transform_factory

from ._style import FAIL_MARK, LINE

# Tick multiples per decade, densest first: the first that gives few enough ticks is taken.
LOG_SUBS = ((1, 1.5, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 5, 7), (1, 2, 5), (1, 3), (1,))


def si(value: float, _pos=None) -> str:
    """Tick text such as 200, 1.5k, 20k, 1M: 2x10^3 is hard to read off a plot."""
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:g}{suffix}"
    return f"{value:g}"


def _decade_ticks(lo: float, hi: float, max_ticks: int, subs_choices) -> list:
    """Round numbers in [lo, hi] from the densest of subs_choices that gives at most max_ticks,
    halved until they do."""
    ticks: list = []
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
    for subs in subs_choices:
        ticks = [m * 10.0**k for k in decades for m in subs if lo <= m * 10.0**k <= hi]
        if len(ticks) <= max_ticks:
            break
    while len(ticks) > max_ticks:
        ticks = ticks[::2]
    return ticks


def _fixed_log_ticks(axis, ticks: list) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(si))
    axis.set_minor_locator(NullLocator())


def log_ticks(ax, max_ticks: int = 6) -> list:
    """Plain-number ticks on a log y axis, at least three of them.

    Matplotlib's log locator puts ticks at decades only, which over the factor of 2 to 20 a
    weak-scaling panel spans leaves one or two labels. Take the densest of 1-2-3-5-7, 1-2-5,
    1-3, 1 per decade that gives no more than max_ticks, and for a range within one decade that
    still has fewer than three, evenly spaced round numbers.
    """
    from matplotlib.ticker import MaxNLocator

    lo, hi = ax.get_ylim()
    ticks: list = []
    if lo > 0 and hi > lo:
        ticks = _decade_ticks(lo, hi, max_ticks, LOG_SUBS)
        if len(ticks) < 3:
            ticks = [t for t in MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(lo, hi) if lo <= t <= hi]
    _fixed_log_ticks(ax.yaxis, ticks)
    ax.set_ylim(lo, hi)
    return ticks


def log_axis_ticks(axis, edges) -> None:
    """1-2-5 (else 1-3, else decade) ticks on a log axis spanning edges, which may cover decades."""
    _fixed_log_ticks(axis, _decade_ticks(*edges, 6, LOG_SUBS[2:]))


def log2_x(ax, xs) -> None:
    """A log2 x axis ticked at exactly the node (or rank, or batch) counts that ran."""
    xs = sorted({int(x) for x in xs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])
    ax.minorticks_off()
    if len(xs) == 1:
        ax.set_xlim(xs[0] / 1.5, xs[0] * 1.5)


def measured_line(ax, xs, ys, color, marker, clip: bool = True):
    """A measured series, drawn the same in every figure; clip=False draws a marker on the edge whole."""
    (h,) = ax.plot(xs, ys, "-", marker=marker, color=color, clip_on=clip, **LINE)
    return h


def capacity_line(ax, gib: float) -> None:
    ax.axhline(gib, color="grey", ls=":", lw=1.0)


def mark_failures(ax, points, color, slots: dict) -> int:
    """× at the bottom of the axes for each x in points; stacked when several fail at one x."""
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for x in points:
        k = slots.get(x, 0)
        slots[x] = k + 1
        ax.scatter([x], [0.04 + 0.06 * k], color=color, transform=trans, **FAIL_MARK)
    return len(points)


def reserve_bottom_log(ax, slots: dict) -> None:
    """Lower a log y axis so the stacked × marks sit below the lowest measured point."""
    depth = max(slots.values(), default=0)
    if depth == 0 or not ax.get_lines():
        return
    lo, hi = (math.log10(v) for v in ax.get_ylim())
    share = 0.04 + 0.06 * depth  # the fraction of the axes the marks take, plus a gap
    new_lo = (lo - share * hi) / (1 - share)
    ax.set_ylim(10**new_lo, 10**hi)


def error_bars(ax, xs, ys, lows, highs, color, log_y: bool) -> int:
    """A bar from low to high at each (x, y) as one outline patch with caps; returns how many were drawn.

    One patch per series, not errorbar(): the bars belong to their line, and the figure's lines
    and collections keep meaning measured series and failure marks. The x axis is log2, so the
    caps are a fixed fraction of a doubling wide. A point without an interval gets no bar.
    """
    verts, codes, n = [], [], 0
    for x, y, lo, hi in zip(xs, ys, lows, highs, strict=True):
        if pd.isna(lo) or pd.isna(hi) or pd.isna(y) or hi <= lo:
            continue
        if log_y and lo <= 0:
            lo = y / 10  # an interval reaching 0: show it reaching well down, not to -inf
        xl, xr = x * 2**-0.07, x * 2**0.07
        verts += [(x, lo), (x, hi), (xl, lo), (xr, lo), (xl, hi), (xr, hi)]
        codes += [Path.MOVETO, Path.LINETO] * 3
        n += 1
    if verts:
        ax.add_patch(PathPatch(Path(verts, codes), fill=False, edgecolor=color, lw=0.7, zorder=2.6, capstyle="butt"))
    return n


def mark_entries(counts, **entries) -> list:
    """Legend entries for the ideal, capacity and failure marks, only where some panel has one.
    counts: a {mark: number drawn} per panel; entries: mark=(label, make handle)."""
    return [(name, make()) for key, (name, make) in entries.items() if any(c.get(key) for c in counts)]


def bar_x(group: int, i: int, bar_w: float) -> float:
    """x of bar i in a group one unit wide centred on group, bars bar_w wide (0.8 / bars per group)."""
    return group - 0.4 + bar_w * (i + 0.5)


def ips_panel(ax, xs, title: str, xname: str, first_column: bool, slots: dict) -> None:
    """The axes of an images/s-against-nodes panel (measured, ideal or predicted): log2 x over `xs`,
    log y with room at the bottom for failure marks, the title, the x label and, on a row's first
    panel, the y label."""
    log2_x(ax, xs)
    ax.set_yscale("log")
    reserve_bottom_log(ax, slots)
    log_ticks(ax)
    ax.set_title(title)
    ax.set_xlabel(xname)
    if first_column:
        ax.set_ylabel("images/s, all ranks (log)")
    ax.grid(True, which="major", alpha=0.3)
