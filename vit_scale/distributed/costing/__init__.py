"""The vocabulary a strategy family's cost model is written in, below the planner: torch-free.

A family states what one training step costs it in its own folder (`<family>/cost.py`): memory per
device by component and phase, the bytes its collectives send, and when it issues them in a step.
The planner (vit_scale.planning) sums and times those terms without naming any family. Since the
planner sits above `distributed` in the layer order, the records and helpers both sides share live
here, under the families:

  memory.py    StateMemory (a family's components per phase) and the optimizer's rules
  traffic.py   Ledger (bytes per collective, inside and across nodes) and the ring's group geometry
  timeline.py  Coll, Unit and UnitPlan (what a family hands the step-time timeline) and bucket fills

A family's functions receive the planner's Scenario and read it by attribute (`sc.world`,
`sc.precision`, `sc.<family>` for its options, `sc.shape` for the model's tensors) rather than
importing its class: the scenario is the context object passed in, as a run's Config is to the
family's `layout`, so nothing here or in a family imports the planner.

`Costs` is what a family registers (`Family.costs`); a family without one is not sized by
`vit-scale plan`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _no_units(sc, lay, shape):
    return None


def _no_check(sc, label) -> None:
    return None


def _no_groups(sc, label) -> tuple:
    return ()


@dataclass(frozen=True)
class Costs:
    """A family's planner terms. Each reads the scenario `sc`, its Layout `lay` and the model's Shape."""

    # (sc, shape, lay) -> memory.StateMemory: the family's components per phase (the planner adds
    # activations, the backward's workspace and the allocator)
    memory: Callable
    # (sc, lay, shape, ledger): adds the step's collectives to a traffic.Ledger
    traffic: Callable
    # (sc, lay, net, units, c) -> timeline.UnitPlan: attaches its collectives to the units (forward
    # order: stem, Blocks, head) and says how far ahead the library issues them. net: the planner's
    # Network (its seconds(collective, bytes, ranks, spans_nodes, ranks_per_node)); c: bytes per element
    step_plan: Callable
    # (sc, lay, shape) -> the collectives unit by unit (root, then one per Block) or None where the
    # family's collectives are bucketed, not per unit (format: vit_scale.planning.communication.per_unit)
    units: Callable = _no_units
    # (sc, label): a UserError for an option the world size cannot have (one line, naming the key)
    check: Callable = _no_check
    # (sc, label) -> group sizes beyond HYBRID_<g>GPU's g that the world must be a multiple of
    # (the weak-scaling baseline is the fewest nodes they all divide)
    groups: Callable = _no_groups
    # what the planner adds to the layout's notes: how far the formulas are checked
    note: str = ""
