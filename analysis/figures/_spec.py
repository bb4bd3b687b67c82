"""What a figure module declares to the registry: a FigureSpec, made from the Inputs every figure of
one report shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Inputs:
    """The tables and choices the figures of one report are drawn from."""

    results: pd.DataFrame
    colors: dict  # series -> colour, shared by every figure
    markers: dict  # series -> marker
    width: float  # inches the figures are drawn (and printed) at
    grid_model: str | None = None
    grid_nodes: int | None = None
    breakdown: pd.DataFrame | None = None  # time_breakdown.csv's rows, when runs were profiled
    predictions: pd.DataFrame | None = None  # prediction.csv's rows (analysis/prediction.py)


@dataclass(frozen=True)
class FigureSpec:
    """One registry entry. draw gives the Plot or None; why_not then says why, in a line the
    report and the terminal show after the name; a why_not that returns None keeps quiet (a
    figure only some studies ask for)."""

    name: str
    draw: Callable[[Inputs], object]
    why_not: Callable[[Inputs], str | None]
