"""Every strategy label a few steps of a small model, in the check's process group, as the
study would run it: refused (the capability table's reason, before anything starts), ok with the
replicas agreeing, or failed (the end record's error).

Each run is the trainer's own (vit_scale.recipes.train.Run, keep_process_group=True, as
tests/run_many.py runs several in one launch); its record goes under the check's records/ and is
read back with vit_scale.record.reader. A run that fails takes its ranks down (the session leaves
the process rather than trust a process group after a failure); the orchestrator then names the
label that was running and starts the remaining labels in a new launch.
"""

from __future__ import annotations

import time

from vit_scale.check.collectives import COLLECTIVE_TIMEOUT_S

# a few steps: enough for each family's first step (where most failures are) and a timed one
STEPS = {"quick": (3, 1), "full": (6, 2)}  # (steps, warm-up steps)
MODEL = "vit_micro"
BATCH_SIZE = 4


def concrete(label: str, ranks_per_node: int) -> str:
    """HYBRID_<g>GPU, as a list of every label names it, becomes a node's worth of ranks."""
    return label.replace("<g>", str(ranks_per_node))


def run_id(prefix: str, label: str, precision: str, attempt: int) -> str:
    """Unique to this check and launch, so that the orchestrator finds the run of a label that
    took the ranks down."""
    return f"{prefix}.{label}.{precision}.{attempt}"


def overrides(label: str, precision: str, world, spec: dict, run_id: str, needs: tuple) -> list[str]:
    steps, warmup = STEPS["quick" if spec["quick"] else "full"]
    return [
        f"model={MODEL}",
        f"strategy={label}",
        f"train.precision={precision}",
        f"train.steps={steps}",
        f"train.warmup_steps={warmup}",
        f"train.batch_size={BATCH_SIZE}",
        "train.print_every=1000000",
        # no node-health probe after each label: the check's nodes part measures every node once
        "train.health_probe_s=0",
        # the runs reuse the check's world group: the record names the timeout that group holds
        f"system.launcher={world.launcher}",
        f"system.collective_timeout_s={COLLECTIVE_TIMEOUT_S}",
        f"output.dir={spec['records']}",
        "output.study=check",
        f"output.run_id={run_id}",
        *needs,
    ]


def refused(label: str, precision: str, world, cfg_overrides: list) -> str | None:
    """The table's reason (and the family's option rules) for a pair that cannot run here."""
    from vit_scale.config import load_config
    from vit_scale.distributed import parse_strategy, strategy_class
    from vit_scale.errors import UserError

    try:
        parsed = parse_strategy(label)
        cfg = load_config(None, cfg_overrides)
        strategy_class(parsed.family).check(cfg, parsed, world)
    except UserError as exc:
        return str(exc)
    return None


def run_label(label: str, precision: str, world, spec: dict, attempt: int) -> dict:
    """One label on every rank; the row (rank 0's is the one written)."""
    from vit_scale.config import load_config
    from vit_scale.distributed.capabilities import capability
    from vit_scale.recipes.train import Run

    row = {
        "label": label,
        "precision": precision,
        "status": None,
        "error": None,
        "replicas_agree": None,
        "images_per_s": None,
        "steps": None,
        "seconds": None,
        "run_dir": None,
    }
    needs = capability(label, precision, world.device_type).needs  # e.g. ZEROPP without quantisation on a CPU
    settings = overrides(
        label, precision, world, spec, run_id(spec["run_prefix"], label, precision, attempt), tuple(needs)
    )
    reason = refused(label, precision, world, settings)
    if reason:
        return {**row, "status": "refused", "error": reason}
    started = time.monotonic()
    run = Run(load_config(None, settings), world)
    run.execute(keep_process_group=True)
    row.update(seconds=round(time.monotonic() - started, 2), run_dir=run.run_dir)
    if world.is_main:
        row.update(from_record(run.run_dir))
    return row


def from_record(run_dir: str) -> dict:
    """status, error, replicas_agree, images/s and steps from a run's end record."""
    from vit_scale.record.reader import read_run_dir

    rec = read_run_dir(run_dir)
    if rec is None or rec.end is None:
        return {"status": "failed", "error": "the run wrote no end record"}
    end = rec.end
    return {
        "status": end.get("status"),
        "error": end.get("error"),
        "replicas_agree": end.get("replicas_agree"),
        "images_per_s": (end.get("images_per_s") or {}).get("mean"),
        "steps": end.get("steps_done"),
    }
