"""`vit-scale study --check`: `vit-scale check --quick` on what the study is about to use, run in
this process through the check's entry point (main(argv, supervisor)) after the kernels are built
and before the first run, under the study's supervisor so that a signal to the study stops it.

A check whose only broken lines are slow nodes (its nodes part) does not stop the study: with
--exclude-slow-nodes the study leaves them out (StudyRun.left_out, OUT/STUDY/nodes_left_out.json), else
it runs on them and says so, and the report flags the points they ran.

Its check.json is kept per node count, OUT/STUDY/check-n<N>.json: the jobs of jobs/submit_sweep.sh
share the study directory, one node count each, and each one's check belongs beside its points. A
study of one model keeps it as check-n<N>-<MODEL>.json: a --per-model sweep runs one job per node
count and model side by side, each checking its model (vit_scale.record.check_file names both).
OUT/STUDY/check.json is a copy of the latest, what one allocation's study has always shown."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys

from vit_scale.check.cli import main as run_check
from vit_scale.cluster import launchers
from vit_scale.record.check_file import LEFT_OUT_FILE, check_path, named_slow


def check_first(study, supervisor) -> int:
    """The check's exit code: 0 ready, 1 a needed line failed (each printed as one line), 2, 143.
    `supervisor` None: a dry run, which prints the check's command instead."""
    argv = check_argv(study, f"{study.prog} --check")
    if supervisor is None:
        print(f"  check first: vit-scale check {launchers.show_command(argv)}")
        return 0
    code = run_check(argv, supervisor)
    path = argv[argv.index("--json") + 1]
    if os.path.isfile(path):
        # the latest check also as check.json (copied: a link would not survive a copy of the directory)
        # the jobs of a sweep may share the directory across hosts: a pid alone is not unique there
        tmp = os.path.join(study.study_dir, f".check.json.tmp.{socket.gethostname()}.{os.getpid()}")
        shutil.copyfile(path, tmp)
        os.replace(tmp, os.path.join(study.study_dir, "check.json"))
    if code == 1 and only_slow_nodes_broken(read_json(path)):
        code = slow_nodes_found(study, path)
    if code == 1:
        print(
            f"{study.prog}: the check found the system not ready (the lines above; {path}); no run was started",
            file=sys.stderr,
        )
    print(flush=True)
    return code


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def only_slow_nodes_broken(check: dict | None) -> bool:
    """True when every broken line of the check is a slow node's (vit_scale.check.nodes): the system
    works, some node is slow."""
    lines = (check or {}).get("lines") or []
    broken = [line for line in lines if line.get("needed") and line["status"] in ("fail", "refused")]
    return bool(broken) and all(line["check"].startswith("node ") for line in broken)


def write_left_out(study_dir: str, left_out: dict, check: str) -> None:
    """OUT/STUDY/nodes_left_out.json: which nodes the study left out, why, and which check named them
    (the report shows it: vit_scale.record.check_file.read_left_out)."""
    path = os.path.join(study_dir, LEFT_OUT_FILE)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"left_out": left_out, "check": check}, f, indent=1)
    os.replace(tmp, path)


def slow_nodes_found(study, path: str) -> int:
    """The check found the system working but named slow nodes: the study goes on (0), leaving them out
    with --exclude-slow-nodes (study.left_out, written beside the runs), else on every node, said."""
    named = named_slow(read_json(path))
    listed = "; ".join(f"{host} ({why})" for host, why in named.items())
    if "--exclude-slow-nodes" in study.opts.flags:
        study.left_out = named
        write_left_out(study.study_dir, named, path)
        print(f"{study.prog}: leaving out the node(s) the check named slow: {listed}", flush=True)
    else:
        print(
            f"{study.prog}: the check named slow node(s): {listed}; the study runs on them all the same "
            f"(--exclude-slow-nodes leaves them out) and the report flags the points they ran",
            flush=True,
        )
    return 0


def check_argv(study, prog: str) -> list[str]:
    """The check's options for a study (vit_scale.study.cli.StudyRun): its system, largest node
    count, ranks per node, launcher, strategies, precisions and largest model; check.json into the
    study's directory as check-n<N>.json, or check-n<N>-<MODEL>.json for a study of one model (the
    report shows it beside the points of N nodes), the rest beside that directory (its records must
    not read as the study's runs)."""
    from vit_scale.config import TrainConfig
    from vit_scale.models import MODELS
    from vit_scale.planning.shapes import Shape

    plan = study.plan
    precisions = [s.split("=", 1)[1] for run in plan.runs for s in run.settings if s.startswith("train.precision=")]
    model = max(plan.models, key=lambda m: Shape.from_spec(MODELS[m]).params)
    nodes = max(plan.nodes or [1])
    # the GEMMs are timed at the first run's batch (the trainer's default where the study sets none)
    first = dict(s.split("=", 1) for s in plan.runs[0].settings) if plan.runs else {}
    batch = first.get("train.batch_size") or TrainConfig().batch_size
    return [
        "--system",
        study.system.name,
        "--nodes",
        str(nodes),
        "--ranks-per-node",
        str(plan.ranks_per_node),
        "--launcher",
        plan.launcher,
        "--strategies",
        ",".join(plan.strategies),
        "--precision",
        ",".join(dict.fromkeys(precisions)) or "fp32",
        "--model",
        model,
        "--batch-size",
        str(batch),
        "--quick",
        "--out",
        os.path.join(study.out, f"{plan.name}.check"),
        "--json",
        check_path(study.study_dir, nodes, model if len(plan.models) == 1 else None),
        "--prog",
        prog,
        # the study's emulated nodes, a slow one included, are the check's too
        *[word for item in plan.emulation_sets for word in ("--set", item)],
    ]
