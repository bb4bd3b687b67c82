"""Communication per step per device: bytes by collective, split into what crosses nodes and what
stays inside one (formulas: docs/plan.md).

Each family states its collectives in its `cost` module (vit_scale.distributed.<family>/cost.py:
`traffic` for the step's bytes, `units` for their sizes unit by unit); the ring accounting and the
groups' geometry are vit_scale.distributed.costing.traffic's. This module asks the family through
the registry and names none.
"""

from __future__ import annotations

from vit_scale.distributed import FAMILIES
from vit_scale.distributed.costing.traffic import COLLECTIVES, FACTORS, Ledger, ranks_per_node, spans_nodes
from vit_scale.planning.scenario import Layout, Scenario
from vit_scale.planning.shapes import Shape

__all__ = ["COLLECTIVES", "FACTORS", "Ledger", "per_unit", "predict", "ranks_per_node", "spans_nodes"]


def predict(sc: Scenario, lay: Layout, shape: Shape | None = None) -> dict:
    """{collective: {"intra", "inter"}, "intra_node", "inter_node", "total"}: bytes one device sends in a step."""
    shape = shape or sc.shape
    ledger = Ledger(sc)
    costs = FAMILIES[lay.family].costs
    if costs is not None:
        costs.traffic(sc, lay, shape, ledger)
    return ledger.result()


def per_unit(sc: Scenario, lay: Layout, shape: Shape | None = None) -> dict | None:
    """The sharded strategies' collectives unit by unit, at the sizes `predict` sums: the root unit
    (index 0: patch embedding, tokens, final norm, head) then one per Block. Each entry is a whole
    tensor in bytes (all-gather output, reduce-scatter input, all-reduce input) or 0.

    {"gather": group, "units": [{"gather_forward", "gather_backward", "reduce_scatter", "all_reduce"}],
     "reduce": group, "replicate": group} with group = (ranks, kind, group_param), and optionally
    "gather_backward" (its own group) and "after_step" (bytes gathered after the optimizer step).
    None for the bucketed strategies (DDP, NO_SHARD, ZeRO-1/2, LowLevelZero).
    """
    costs = FAMILIES[lay.family].costs
    return None if costs is None else costs.units(sc, lay, shape or sc.shape)
