"""The plan's rows: every (model, node count, strategy) the options ask for, as the planner's
Scenarios and vit_scale.planning.plan_row's rows, with the assumptions they share."""

from __future__ import annotations

import dataclasses

from vit_scale.distributed import FAMILIES, GROUP_SIZE, all_labels, parse_strategy
from vit_scale.distributed.capabilities import refusal
from vit_scale.errors import UserError
from vit_scale.planning import assumptions, plan_row
from vit_scale.planning.scenario import Allowance, blas_workspace_mib, from_config

from .options import family_flags, positive_ints, split, system_defaults


def _default_strategies(gpus_per_node: int) -> list[str]:
    """Every label, a group-size label as groups of 1, 2 and a whole node."""
    out = []
    for label in all_labels():
        for size in (1, 2, gpus_per_node) if GROUP_SIZE in label else (0,):
            concrete = label.replace(GROUP_SIZE, str(size))
            if concrete not in out:
                out.append(concrete)
    return out


def build_rows(args) -> tuple[list[dict], dict]:
    rows, shared, _ = build(args)
    return rows, shared


def build(args) -> tuple[list[dict], dict, list]:
    """(rows, the assumptions they share, the Scenario of each row)."""
    from vit_scale.config import load_config

    system_defaults(args)
    for name in ("gpus_per_node", "batch_size", "num_classes"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(args, name)}")
    if args.device_memory_gib is not None and not args.device_memory_gib > 0:
        raise UserError(f"--device-memory-gib: must be positive, got {args.device_memory_gib}")
    if args.runtime_gib < 0 or args.fragmentation < 0:
        raise UserError("--runtime-gib and --fragmentation must not be negative")
    nodes = positive_ints(args.nodes, "--nodes")
    models = split(args.model)
    explicit = split(args.strategy)
    strategies = explicit or _default_strategies(args.gpus_per_node)
    overrides = list(args.set) + [
        f"train.batch_size={args.batch_size}",
        f"train.precision={args.precision}",
        f"train.activation_checkpointing={str(args.activation_checkpointing).lower()}",
        f"train.num_classes={args.num_classes}",
    ]
    for family, key, _, dest, _ in family_flags():
        value = getattr(args, dest)
        if value is not None:
            overrides.append(f"{family}.{key}={str(value).lower() if isinstance(value, bool) else value}")
    base = load_config(None, [f"model={models[0]}"] + overrides)
    allowance = Allowance(
        runtime_gib=args.runtime_gib,
        fragmentation=args.fragmentation,
        stream_held=args.stream_held,
        blas_workspace_mib=blas_workspace_mib(args.device),
    )
    refused = {}
    for strategy in list(strategies):
        error = refusal(strategy, args.precision, args.device, base)  # base: option rules see --set
        if error and explicit:
            raise UserError(f"--strategy: {strategy} with --precision {args.precision} on {args.device}: {error}")
        if not error:
            error = _unplanned(strategy)
            if error and explicit:
                raise UserError(f"--strategy: {error}")
        if error:
            refused[strategy] = error
            strategies.remove(strategy)
    rows, shared, scenarios = [], None, []
    for model in models:
        for n in nodes:
            for strategy in strategies:
                cfg = dataclasses.replace(base, model=model, strategy=strategy)
                sc = from_config(
                    cfg,
                    nodes=n,
                    gpus_per_node=args.gpus_per_node,
                    device_memory_gib=args.device_memory_gib,
                    attention=args.attention,
                    optimizer=args.optimizer,
                    allowance=allowance,
                )
                if not explicit and _skip_default(sc):
                    continue  # a default HYBRID_<g>GPU or ZEROPP layout this world cannot have
                rows.append(plan_row(sc))
                scenarios.append(sc)
                shared = shared or assumptions(sc)
    if shared is None:
        raise UserError(
            f"--strategy: none of {', '.join(explicit or strategies) or 'the labels'} can run on "
            f"{args.nodes} node(s) of {args.gpus_per_node} {args.device} GPU(s)"
        )
    shared = {**shared, "device": args.device, "refused": refused}
    return rows, shared, scenarios


def _unplanned(label: str) -> str | None:
    """Why the planner cannot size a label whose family declares no planner terms, or None."""
    family = parse_strategy(label).family
    if FAMILIES[family].costs is not None:
        return None
    return f"{label}: the {family} family has no planner model (Family.costs: its cost.py, docs/architecture.md)"


def _skip_default(sc) -> bool:
    try:
        sc.validate()
    except UserError:
        return True
    return False
