"""`vit-scale plan`: which strategy fits a model on which node count, and what it communicates;
with `--system`, also how fast each point is predicted to run.

    vit-scale plan --model vit_3b --nodes 1,8 [--strategy NO_SHARD,FULL_SHARD ...] [--wide | --json]
    vit-scale plan --system frontier --model vit_base,vit_3b --nodes 1,2,4,8 [--calibration check.json]
                   [--compute-from RUNDIR | --efficiency F | --efficiency-from DIR] [--figure DIR | --no-figure]

A table by default (the columns a user chooses by; `--wide` adds the memory's components, the
communication and the step's split); `--json` for scripts, every column (schema: docs/plan.md,
`PLAN_SCHEMA`: schema.py). With `--system` the rows gain the prediction of vit_scale.planning.predict
(step time split, images/s, scaling efficiency against the baseline node count, whether it is
extrapolated) and the predicted weak-scaling figure is drawn into DIR (with --json only when
--figure DIR is given) by
analysis/plan_figure.py, run as a subprocess (vit_scale does not import analysis). Exit codes:
0 ok (whether or not everything fits), 1 the figure could not be drawn, 2 bad input (one line on
stderr, nothing written).

The parts: options.py (the parser and the options' rules), rows.py (the memory plan's rows),
prediction.py (with --system), table.py, schema.py (the --json schemas), figure.py.
"""

from __future__ import annotations

import json
import sys

from vit_scale.errors import UserError
from vit_scale.planning import SCHEMA_VERSION

from .figure import write_figure
from .options import DEFAULT_EFFICIENCY, FIGURE, check_prediction_options, figure_dir, parse_args, parser
from .prediction import NOT_WORTH, OPTIMIZER_NOTE, not_worth_running, predict_rows
from .rows import build, build_rows
from .schema import PLAN_SCHEMA, PREDICTION_SCHEMA, ROW_SCHEMA
from .table import COLUMNS, TABLE_WIDTH, columns_for, format_table, prediction_head

__all__ = [
    "COLUMNS",
    "DEFAULT_EFFICIENCY",
    "FIGURE",
    "NOT_WORTH",
    "OPTIMIZER_NOTE",
    "PLAN_SCHEMA",
    "PREDICTION_SCHEMA",
    "ROW_SCHEMA",
    "TABLE_WIDTH",
    "build",
    "build_rows",
    "columns_for",
    "figure_dir",
    "format_table",
    "main",
    "not_worth_running",
    "parse_args",
    "parser",
    "plan",
    "predict_rows",
    "prediction_head",
    "write_figure",
]


def plan(args) -> tuple[list, dict, dict | None]:
    """(rows, shared assumptions, the prediction or None without --system); UserError on bad input."""
    check_prediction_options(args)
    rows, shared, scenarios = build(args)
    prediction = predict_rows(args, rows, scenarios) if args.system else None
    return rows, shared, prediction


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
        rows, shared, prediction = plan(args)
    except UserError as exc:
        print(f"vit-scale plan: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        out = {"schema": SCHEMA_VERSION, "assumptions": shared, "rows": rows}
        print(json.dumps({**out, "prediction": prediction} if prediction else out, indent=1))
    else:
        print(format_table(rows, shared, prediction, wide=args.wide))
    figure = figure_dir(args)
    if prediction and figure is not None:
        try:
            written = write_figure(prediction, rows, shared, figure)
        except (OSError, RuntimeError) as exc:
            print(f"vit-scale plan: the predicted figure could not be drawn: {exc}", file=sys.stderr)
            return 1
        print(f"predicted figure: {', '.join(written[1:])}", file=sys.stderr if args.json else sys.stdout)
    return 0
