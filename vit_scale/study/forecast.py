"""`predict: true` in a study file (or `--predict true`): before the first run, the table of
`vit-scale plan --system` for the study's models, strategies and node counts, the predicted
weak-scaling figure in the study's report directory, and the strategies predicted not worth
running (vit_scale.plan.not_worth_running states the rule). It names them; it runs them all.

Calibration: the study's check.json when it carries fits (a full `vit-scale check`), else the system
profile's defaults. Compute: the study's own 1-node runs when an earlier submission left some (of
every point's model, batch and precision), else the counted FLOPs over the profile's peak at the
median MFU of the study's earlier runs (`plan --efficiency-from`) when they recorded one, else the
Block's GEMMs the study's check timed (for its model, batch and precision), else the plan's assumed
efficiency. Where the prediction cannot be made (a CPU profile has no peak and nothing
ran yet), or the planner fails in any way, one line says why and the study goes on. A dry run prints
the table and writes nothing. `predict` itself is checked with the study's other keys (study/plan.py).
"""

from __future__ import annotations

import os
import shlex

from vit_scale.cluster.values import TRUE
from vit_scale.errors import UserError

KEY = "predict"
# settings the plan takes as its own options, or that do not change a step (steps, the skip rule)
OWN = (
    "model",
    "strategy",
    "train.batch_size",
    "train.precision",
    "train.activation_checkpointing",
    "train.steps",
    "train.warmup_steps",
)


def wanted(study) -> bool:
    """The study's `predict` (study file, then --predict), checked when the plan was made."""
    return bool(getattr(study.plan, "predict", False))


def plan_argv(study) -> tuple[list, str]:
    """`vit-scale plan` options for the study's plan, and a note when its grid has several variants
    (the first is predicted)."""
    from vit_scale.config import TrainConfig

    p = study.plan
    first = p.runs[0]
    trainer = TrainConfig()  # what a run that does not set them gets
    same = [r for r in p.runs if r.variant == first.variant]
    shared = [s for s in first.settings if all(s in r.settings for r in same)]
    values = dict(s.split("=", 1) for s in first.settings)
    argv = [
        "--system",
        study.system.name,
        "--model",
        ",".join(p.models),
        "--strategy",
        ",".join(p.strategies),
        "--nodes",
        ",".join(map(str, p.nodes)),
        "--gpus-per-node",
        str(p.ranks_per_node),
        "--batch-size",
        values.get("train.batch_size", str(trainer.batch_size)),
        "--precision",
        values.get("train.precision", trainer.precision),
    ]
    if values.get("train.activation_checkpointing", str(trainer.activation_checkpointing)).lower() in TRUE:
        argv.append("--activation-checkpointing")
    for setting in shared:
        key = setting.split("=", 1)[0]
        if key not in OWN and not key.startswith(("system.", "plan.")):
            argv += ["--set", setting]
    note = f"the grid's first variant ({first.variant})" if first.variant != "-" else ""
    return argv, note


def _has_mfu(directory: str) -> bool:
    from vit_scale.planning.predict import efficiency_from_runs
    from vit_scale.record import reader

    return efficiency_from_runs(reader.collect([directory]).runs) is not None


def forecast(study) -> None:
    """Print the predicted table and write the figure, when the study asks for them. Nothing here ends
    the study: a prediction that fails, for whatever reason, is one line and the runs go on."""
    if not wanted(study) or not study.plan.runs:
        return
    try:
        _forecast(study)
    except (Exception, SystemExit) as exc:  # a planner bug, or argparse's exit: the study still runs
        print(f"predicted: not available: {' '.join(str(exc).split()) or type(exc).__name__}")


def _forecast(study) -> None:
    from vit_scale import plan as plan_cli

    print()
    if study.one_machine:
        print(f"predicted: not for a ladder of GPUs on one machine ({KEY}: true predicts node counts)")
        return
    argv, note = plan_argv(study)
    check = os.path.join(study.study_dir, "check.json")
    extra = []
    if os.path.isfile(check):
        extra.append(["--calibration", check])
    if os.path.isdir(study.study_dir):
        extra.append(["--compute-from", study.study_dir])
    notes = [f"predicted for {note}"] if note else []
    # the check and the earlier runs when they serve, else the profile's defaults and the FLOPs
    while True:
        args = plan_cli.parse_args(argv + [x for pair in extra for x in pair] + ["--no-figure"])
        try:
            rows, shared, prediction = plan_cli.plan(args)
            break
        except UserError as exc:
            text = " ".join(str(exc).split())
            named = [pair for pair in extra if text.startswith(pair[0] + ":")]
            if not named:
                print(f"predicted: not available: {text}")
                return
            extra.remove(named[0])
            notes.append(f"{named[0][1]} not used: {text}")
            if named[0][0] == "--compute-from" and _has_mfu(named[0][1]):
                # FLOPs then, at the efficiency the study's earlier runs measured
                extra.append(["--efficiency-from", named[0][1]])
    shown = argv + [x for pair in extra for x in pair] + ["--figure", study.report]
    print(f"predicted ({KEY}: true), as `vit-scale plan {shlex.join(shown)}` prints it:")
    for line in notes:
        print(f"  {line}")
    print(plan_cli.format_table(rows, shared, prediction))
    if study.dry_run:
        print("predicted figure: not written in a dry run")
        return
    try:
        written = plan_cli.write_figure(prediction, rows, shared, study.report)
        print(f"predicted figure: {', '.join(written[1:])}")
    except (OSError, RuntimeError) as exc:
        print(f"predicted figure: not drawn: {exc}")
