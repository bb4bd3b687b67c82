"""The figures of seed 003 (and the plugin comparison of seeds 000/001) from the results table.

One module per figure family; each draws from the tidy table and returns a Plot (_layout.py), or
None when the table holds nothing to draw it from. The shared look lives in private modules:
_style (sizes, rc settings, one colour and marker per series), _layout (canvas, panel grid,
legend, facts title, saving), _axes (log ticks, failure marks, error bars), _runs (which runs a
figure draws and the words for them). No figure module imports another.

FIGURES is the registry: the figures a report draws, in order. Adding a figure is one module
that defines FIGURE (a _spec.FigureSpec) and one line here.
"""

from __future__ import annotations

import pandas as pd

from . import breakdown, heat_map, memory_prediction, memory_scaling, plugins, predicted, prefetch_grid, scaling
from ._layout import Plot
from ._runs import model_order, run_facts, scaling_runs, scaling_support, single_point_lines
from ._spec import FigureSpec, Inputs
from ._style import COLUMN_WIDTH, PAGE_WIDTH, SeriesStyle, series_colors, series_markers
from .breakdown import time_breakdown
from .heat_map import efficiency, efficiency_definition
from .memory_prediction import predicted_memory, prediction_rows, residual_summary
from .memory_scaling import memory
from .plugins import plugin_comparison, plugin_groups, plugin_support
from .prefetch_grid import config_grid, pick_grid
from .scaling import weak_scaling

FIGURES: tuple = (
    scaling.FIGURE,  # weak_scaling_ips: images/s against nodes, with ideal lines
    memory_scaling.FIGURE,  # memory: peak memory per device against nodes
    heat_map.FIGURE,  # efficiency: the scaling-efficiency heat map
    prefetch_grid.FIGURE,  # config_grid: FSDP prefetch × limit_all_gathers (Figure 1)
    plugins.FIGURE,  # plugin_comparison: one device against batch size (seeds 000/001)
    memory_prediction.FIGURE,  # predicted_memory: the planner against measurement
    breakdown.FIGURE,  # time_breakdown: where the time goes, from profiler traces
    predicted.FIGURE,  # weak_scaling_predicted: each measured curve beside its prediction
)


def all_plots(
    df: pd.DataFrame,
    grid_model: str | None = None,
    grid_nodes: int | None = None,
    width: float = COLUMN_WIDTH,
    breakdown: pd.DataFrame | None = None,
    predictions: pd.DataFrame | None = None,
) -> tuple:
    """(plots, missing): every figure the tables support, and a line for each one they do not,
    saying why. breakdown: time_breakdown.csv's rows, when some run was profiled; predictions:
    prediction.csv's rows."""
    inputs = Inputs(df, series_colors(df), series_markers(df), width, grid_model, grid_nodes, breakdown, predictions)
    plots, missing = [], []
    for figure in FIGURES:
        plot = figure.draw(inputs)
        if plot is not None:
            plots.append(plot)
            continue
        why = figure.why_not(inputs)
        if why is not None:
            missing.append(f"{figure.name}: {why}")
    return plots, missing


__all__ = [
    "COLUMN_WIDTH",
    "FIGURES",
    "PAGE_WIDTH",
    "FigureSpec",
    "Inputs",
    "Plot",
    "SeriesStyle",
    "all_plots",
    "config_grid",
    "efficiency",
    "efficiency_definition",
    "memory",
    "model_order",
    "pick_grid",
    "plugin_comparison",
    "plugin_groups",
    "plugin_support",
    "predicted_memory",
    "prediction_rows",
    "residual_summary",
    "run_facts",
    "scaling_runs",
    "scaling_support",
    "series_colors",
    "series_markers",
    "single_point_lines",
    "time_breakdown",
    "weak_scaling",
]
