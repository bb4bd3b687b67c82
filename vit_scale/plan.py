"""`vit-scale plan ...`: memory per device and communication per step, before spending an allocation.

    vit-scale plan --model vit_3b --nodes 1,8 [--strategy NO_SHARD,FULL_SHARD] [--json]

The trainer calls `predict_for_run(cfg, world)` and records the answer in the start record's
`plan`; with `plan.skip_if_not_fits=true` it records a run that cannot fit as skipped instead of
running into an out-of-memory error. No torch import: the model is analytic (docs/plan.md).
"""
from __future__ import annotations

import sys

from .planning import SCHEMA_VERSION, Scenario, plan_row, predict_for_run
from .planning.cli import PLAN_SCHEMA, ROW_SCHEMA, main

__all__ = ["PLAN_SCHEMA", "ROW_SCHEMA", "SCHEMA_VERSION", "Scenario", "main", "plan_row", "predict_for_run"]

if __name__ == "__main__":
    sys.exit(main())
