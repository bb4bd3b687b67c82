"""`vit-scale plan`: which strategy fits a model on which node count, and what it communicates;
with `--system`, also how fast each point is predicted to run.

    vit-scale plan --model vit_3b --nodes 1,8 [--strategy NO_SHARD,FULL_SHARD ...] [--json]
    vit-scale plan --system frontier --model vit_base,vit_3b --nodes 1,2,4,8 [--calibration check.json]
                   [--compute-from RUNDIR | --efficiency F | --efficiency-from DIR] [--figure DIR | --no-figure]

A table by default; `--json` for scripts (schema: docs/plan.md, `PLAN_SCHEMA` below). With
`--system` the rows gain the prediction of vit_scale.planning.predict (step time split, images/s,
scaling efficiency against 1 node) and the predicted weak-scaling figure is drawn into DIR by
analysis/plan_figure.py, run as a subprocess (vit_scale does not import analysis). Exit codes:
0 ok (whether or not everything fits), 1 the figure could not be drawn, 2 bad input (one line on
stderr, nothing written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

from vit_scale.distributed import GROUP_SIZE, all_labels
from vit_scale.distributed.capabilities import refusal
from vit_scale.errors import UserError
from vit_scale.planning import SCHEMA_VERSION, assumptions, plan_row
from vit_scale.planning.scenario import ATTENTION, OPTIMIZER_IMPLS, PRECISIONS, Allowance, from_config

GB = 1e9
# Without --system the device is a Frontier GCD, as before; with it, the profile says (unless given)
NO_SYSTEM = {"gpus_per_node": 8, "device_memory_gib": 64.0, "device": "rocm"}
DEFAULT_EFFICIENCY = 0.4  # of the profile's dense peak, when FLOPs give the compute and no --efficiency
OPTIMIZER_NOTE = "not modelled: inside compute"  # no compute source times the optimizer step apart
NOT_WORTH = 0.5  # a strategy below this share of the best at the largest node count
FIGURE = "weak_scaling_plan"  # DIR/FIGURE.json (the prediction), .png and .pdf (the figure)

_NUM = {"type": "number"}
_GIB_PARTS = ("params", "grads", "optimizer", "in_flight", "activations", "buckets", "workspace", "allocator")
_COMM = {
    "type": "object",
    "required": ["intra", "inter"],
    "properties": {"intra": {"type": "integer", "minimum": 0}, "inter": {"type": "integer", "minimum": 0}},
}
ROW_SCHEMA = {
    "type": "object",
    "required": [
        "model",
        "params",
        "strategy",
        "family",
        "implementation",
        "sharding",
        "nodes",
        "gpus_per_node",
        "world_size",
        "shard_group_size",
        "replicate_group_size",
        "memory_gib",
        "peak_allocated_gib",
        "peak_allocated_phase",
        "components_gib",
        "allocator_gib",
        "peak_phase",
        "phases_gib",
        "device_memory_gib",
        "fits",
        "headroom_gib",
        "optimizer_impl",
        "communication",
        "notes",
    ],
    "properties": {
        "model": {"type": "string"},
        "params": {"type": "integer", "minimum": 1},
        "strategy": {"type": "string"},
        "family": {"enum": ["ddp", "fsdp", "deepspeed", "colossalai"]},
        "implementation": {"type": "string"},
        "nodes": {"type": "integer", "minimum": 1},
        "gpus_per_node": {"type": "integer", "minimum": 1},
        "world_size": {"type": "integer", "minimum": 1},
        "shard_group_size": {"type": "integer", "minimum": 1},
        "replicate_group_size": {"type": "integer", "minimum": 1},
        "memory_gib": {"type": "number", "exclusiveMinimum": 0},
        "peak_allocated_gib": {"type": "number", "exclusiveMinimum": 0},
        "components_gib": {
            "type": "object",
            "required": list(_GIB_PARTS),
            "additionalProperties": False,
            "properties": {k: {"type": "number", "minimum": 0} for k in _GIB_PARTS},
        },
        "allocator_gib": {
            "type": "object",
            "required": ["runtime", "fragmentation", "stream_held"],
            "properties": {k: {"type": "number", "minimum": 0} for k in ("runtime", "fragmentation", "stream_held")},
        },
        "peak_phase": {"enum": ["forward_end", "backward_start", "backward_end", "optimizer_step"]},
        "peak_allocated_phase": {"enum": ["forward_end", "backward_start", "backward_end", "optimizer_step"]},
        "phases_gib": {
            "type": "object",
            "required": ["forward_end", "backward_start", "backward_end", "optimizer_step"],
        },
        "device_memory_gib": {"type": ["number", "null"]},
        "fits": {"type": ["boolean", "null"]},
        "headroom_gib": {"type": ["number", "null"]},
        "optimizer_impl": {"enum": ["foreach", "single", "fused"]},
        "communication": {
            "type": "object",
            "required": ["all_gather", "reduce_scatter", "all_reduce", "intra_node", "inter_node", "total"],
            "properties": {
                "all_gather": _COMM,
                "reduce_scatter": _COMM,
                "all_reduce": _COMM,
                "intra_node": {"type": "integer", "minimum": 0},
                "inter_node": {"type": "integer", "minimum": 0},
                "total": {"type": "integer", "minimum": 0},
            },
        },
        "notes": {"type": "array", "items": {"type": "string"}},
        # with --system: vit_scale.planning.step_time.StepPrediction.as_dict
        "prediction": {
            "type": "object",
            "required": [
                "fits",
                "step",
                "images_per_s_per_gpu",
                "images_per_s",
                "scaling_efficiency",
                "rules",
                "compute_source",
                "network_source",
            ],
            "properties": {
                "step": {"type": ["object", "null"]},
                "images_per_s_per_gpu": {"type": ["number", "null"]},
                "images_per_s": {"type": ["number", "null"]},
                "scaling_efficiency": {"type": ["number", "null"]},
            },
        },
    },
}
PREDICTION_SCHEMA = {
    "type": "object",
    "required": ["system", "calibration", "compute", "not_worth_running", "rule"],
    "properties": {
        "system": {"type": "string"},
        "calibration": {
            "type": "object",
            "required": ["kind", "label", "source", "notes", "text"],
            "properties": {"kind": {"enum": ["check", "profile", "none"]}, "label": {"type": "string"}},
        },
        "compute": {
            "type": "object",
            "required": ["kind", "text"],
            "properties": {"kind": {"enum": ["measured", "flops"]}},
        },
        "not_worth_running": {"type": "array", "items": {"type": "object", "required": ["model", "strategy", "why"]}},
        "rule": {"type": "string"},
    },
}
PLAN_SCHEMA = {
    "type": "object",
    "required": ["schema", "assumptions", "rows"],
    "properties": {
        "schema": {"const": SCHEMA_VERSION},
        "assumptions": {
            "type": "object",
            "required": [
                "batch_size",
                "precision",
                "activation_checkpointing",
                "attention",
                "gpus_per_node",
                "device_memory_gib",
                "optimizer",
                "allowance",
            ],
        },
        "rows": {"type": "array", "items": ROW_SCHEMA},
        "prediction": PREDICTION_SCHEMA,
    },
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        raise UserError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vit-scale plan", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="M",
        help="model name (repeat or comma-separate for several), e.g. vit_3b",
    )
    p.add_argument(
        "--strategy",
        action="append",
        metavar="S",
        help="strategy label (repeat or comma-separate); default: every label",
    )
    p.add_argument("--nodes", default="1", help="node counts, comma-separated (default 1)")
    p.add_argument(
        "--gpus-per-node", type=int, help="ranks per node (default: the --system profile's, else 8, a Frontier node)"
    )
    p.add_argument("--batch-size", type=int, default=32, help="per device (default 32)")
    p.add_argument("--precision", default="bf16", choices=PRECISIONS, help="default bf16 (the study's)")
    p.add_argument(
        "--activation-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="checkpoint every Block (default off, as the trainer)",
    )
    p.add_argument(
        "--attention",
        default="fused",
        choices=ATTENTION,
        help="fused: scaled_dot_product_attention (timm's default); materialised: scores in memory",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "rocm", "cpu"),
        help="device kind (default: the --system profile's, else rocm, a Frontier GCD): pairs it cannot "
        "run are left out, with why",
    )
    p.add_argument(
        "--device-memory-gib", type=float, help="per device (default: the --system profile's, else 64, an MI250X GCD)"
    )
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument(
        "--optimizer",
        default="auto",
        choices=OPTIMIZER_IMPLS,
        help="AdamW implementation; auto: what torch picks for the trainer's parameters",
    )
    p.add_argument("--fsdp-version", type=int, choices=(1, 2), help="default 1 (fsdp.version)")
    p.add_argument("--backward-prefetch", choices=("none", "pre", "post"), help="default pre")
    p.add_argument("--limit-all-gathers", action=argparse.BooleanOptionalAction, default=None, help="default on")
    p.add_argument("--forward-prefetch", action=argparse.BooleanOptionalAction, default=None, help="default off")
    p.add_argument("--use-orig-params", action=argparse.BooleanOptionalAction, default=None, help="default off")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any trainer config key, e.g. deepspeed.reduce_bucket_size=2e8 colossalai.zero_stage=1",
    )
    p.add_argument(
        "--runtime-gib",
        type=float,
        default=Allowance.runtime_gib,
        help="device memory outside torch's allocator: context, NCCL/RCCL buffers (default 1.0)",
    )
    p.add_argument(
        "--fragmentation",
        type=float,
        default=Allowance.fragmentation,
        help="allocator allowance as a share of the peak (default 0.05)",
    )
    p.add_argument(
        "--stream-held",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count memory the allocator holds for communication streams (default on)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (docs/plan.md)")
    pred = p.add_argument_group('predicted step time and images/s (docs/plan.md, "Before the allocation")')
    pred.add_argument(
        "--system",
        metavar="NAME",
        help="system profile (configs/systems/NAME.yaml): predict each point's speed with its network "
        "defaults and peak; also its ranks per node, device memory and device kind unless given",
    )
    pred.add_argument(
        "--calibration",
        metavar="CHECK_JSON",
        help="the collectives' fits of `vit-scale check` (full mode) on this system, over the profile's defaults",
    )
    pred.add_argument(
        "--compute-from",
        metavar="PATH",
        help="compute from a measured run of the same model, batch and precision (a run directory, or "
        "a study directory: its 1-node rung); default: counted FLOPs x peak x efficiency",
    )
    pred.add_argument(
        "--efficiency",
        type=float,
        metavar="F",
        help=f"share of the profile's peak the FLOPs run at (default {DEFAULT_EFFICIENCY:g}, assumed)",
    )
    pred.add_argument(
        "--efficiency-from",
        metavar="PATH",
        help="the FLOPs' efficiency from run records: the median MFU of the ok runs under PATH (a run or "
        "study directory; any model)",
    )
    pred.add_argument(
        "--figure",
        metavar="DIR",
        default=".",
        help=f"where the predicted weak-scaling figure goes ({FIGURE}.png/.pdf and the prediction "
        f"{FIGURE}.json; default: the current directory)",
    )
    pred.add_argument("--no-figure", action="store_true", help="print the prediction only")
    return p


def _split(values) -> list[str]:
    out = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def _positive_ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what}: expected positive integers separated by commas, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UserError(f"{what}: expected positive integers separated by commas, got {text!r}")
    return values


def _default_strategies(gpus_per_node: int) -> list[str]:
    """Every label, a group-size label as groups of 1, 2 and a whole node."""
    out = []
    for label in all_labels():
        for size in (1, 2, gpus_per_node) if GROUP_SIZE in label else (0,):
            concrete = label.replace(GROUP_SIZE, str(size))
            if concrete not in out:
                out.append(concrete)
    return out


def _system_defaults(args) -> None:
    """Fill ranks per node, device memory and device kind from --system's profile where not given
    (without --system: a Frontier GCD, as always)."""
    defaults = dict(NO_SYSTEM)
    if getattr(args, "system", None):
        from vit_scale.planning import predict as pr

        profile = pr.read_profile(pr.profile_path(args.system))
        per_node, memory = profile.get("ranks_per_node"), profile.get("device_memory_gib")
        defaults["gpus_per_node"] = per_node if isinstance(per_node, int) and not isinstance(per_node, bool) else 8
        defaults["device_memory_gib"] = memory if isinstance(memory, (int, float)) and memory > 0 else None
        backend, text = str(profile.get("backend", "")), str(profile.get("description", "")).lower()
        defaults["device"] = "cpu" if backend == "gloo" else "rocm" if "rocm" in text else "cuda"
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def build_rows(args) -> tuple[list[dict], dict]:
    rows, shared, _ = build(args)
    return rows, shared


def build(args) -> tuple[list[dict], dict, list]:
    """(rows, the assumptions they share, the Scenario of each row)."""
    from vit_scale.config import load_config

    _system_defaults(args)
    for name in ("gpus_per_node", "batch_size", "num_classes"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(args, name)}")
    if args.device_memory_gib is not None and not args.device_memory_gib > 0:
        raise UserError(f"--device-memory-gib: must be positive, got {args.device_memory_gib}")
    if args.runtime_gib < 0 or args.fragmentation < 0:
        raise UserError("--runtime-gib and --fragmentation must not be negative")
    nodes = _positive_ints(args.nodes, "--nodes")
    models = _split(args.model)
    explicit = _split(args.strategy)
    strategies = explicit or _default_strategies(args.gpus_per_node)
    overrides = list(args.set) + [
        f"train.batch_size={args.batch_size}",
        f"train.precision={args.precision}",
        f"train.activation_checkpointing={str(args.activation_checkpointing).lower()}",
        f"train.num_classes={args.num_classes}",
    ]
    for key, value in (
        ("fsdp.version", args.fsdp_version),
        ("fsdp.backward_prefetch", args.backward_prefetch),
        ("fsdp.limit_all_gathers", args.limit_all_gathers),
        ("fsdp.forward_prefetch", args.forward_prefetch),
        ("fsdp.use_orig_params", args.use_orig_params),
    ):
        if value is not None:
            overrides.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    base = load_config(None, [f"model={models[0]}"] + overrides)
    allowance = Allowance(runtime_gib=args.runtime_gib, fragmentation=args.fragmentation, stream_held=args.stream_held)
    refused = {}
    for strategy in list(strategies):
        error = refusal(strategy, args.precision, args.device, base)  # base: option rules see --set
        if error and explicit:
            raise UserError(f"--strategy: {strategy} with --precision {args.precision} on {args.device}: {error}")
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


def _skip_default(sc) -> bool:
    try:
        sc.validate()
    except UserError:
        return True
    return False


# ---------------------------------------------------------------- the prediction (--system)


def _prediction_options(args) -> None:
    """The prediction's options need --system; --efficiency is for FLOPs, not a measured run."""
    if not args.system:
        for name in ("calibration", "compute_from", "efficiency", "efficiency_from"):
            if getattr(args, name) is not None:
                raise UserError(
                    f"--{name.replace('_', '-')}: needs --system (the profile whose network and peak "
                    f"the prediction uses)"
                )
        return
    if args.compute_from is not None and args.efficiency is not None:
        raise UserError("--efficiency: applies to compute from counted FLOPs; --compute-from measures it instead")
    if args.efficiency_from is not None and (args.efficiency is not None or args.compute_from is not None):
        other = "--efficiency" if args.efficiency is not None else "--compute-from"
        raise UserError(f"--efficiency-from: gives the FLOPs' efficiency; {other} cannot be given with it")
    if not args.no_figure and os.path.exists(args.figure) and not os.path.isdir(args.figure):
        raise UserError(f"--figure: {args.figure} is a file; expected a directory (created when missing)")


def predict_rows(args, rows: list, scenarios: list) -> dict:
    """Each row's prediction (row["prediction"]) and what they share: the calibration, the compute
    source and the strategies predicted not worth running. Bad input raises UserError, before anything
    is written."""
    from vit_scale.planning import predict as pr

    profile = pr.profile_path(args.system)
    models = list(dict.fromkeys(r["model"] for r in rows))
    cal = pr.choose_calibration(
        args.calibration, profile, system=args.system, models=models, precisions=[args.precision]
    )
    if args.compute_from is not None:
        compute = pr.compute_from(args.compute_from)
        compute_text = (
            f"measured run: {compute.describe()}, each point's compute its 1-node step less the "
            f"communication predicted exposed there"
        )
    else:
        efficiency, stated = _efficiency(args)
        compute = pr.compute_from_flops(pr.peak_tflops(profile, args.precision), efficiency, os.path.basename(profile))
        if args.efficiency_from is not None:
            # an MFU is its own model's: each point takes the median of its model's runs
            from vit_scale.record import reader

            compute.efficiencies = pr.efficiencies_from_runs(reader.collect([args.efficiency_from]).runs)
        compute_text = f"FLOPs x peak x efficiency: {compute.describe()} ({stated})"
    blocking = pr.blocking_for(None, args.device)
    for row, p in zip(rows, pr.predict(scenarios, cal, compute, blocking), strict=True):
        row["prediction"] = p.as_dict()
        step = row["prediction"]["step"]
        if step is not None and not step["optimizer_s"]:
            # no compute source times the optimizer apart (a measured step holds it, the FLOPs' efficiency
            # absorbs it): null, not a predicted 0
            step["optimizer_s"], step["optimizer"] = None, OPTIMIZER_NOTE
    return {
        "system": args.system,
        "calibration": {
            "kind": cal.kind,
            "label": cal.label,
            "source": cal.source,
            "notes": list(cal.notes),
            "text": cal.describe(),
        },
        "compute": {"kind": compute.kind, "text": compute_text},
        "not_worth_running": not_worth_running(rows),
        "rule": (
            f"not worth running: at the largest node count planned, the strategy does not fit, or its "
            f"predicted images/s is below {NOT_WORTH:.0%} of the best strategy's for the same model"
        ),
    }


def _efficiency(args) -> tuple[float, str]:
    """The FLOPs' efficiency and where it came from: --efficiency, the median MFU of --efficiency-from's
    run records, else DEFAULT_EFFICIENCY, assumed."""
    from vit_scale.planning import predict as pr
    from vit_scale.record import reader

    if args.efficiency is not None:
        return args.efficiency, "--efficiency"
    if args.efficiency_from is not None:
        if not os.path.isdir(args.efficiency_from):
            raise UserError(
                f"--efficiency-from: {args.efficiency_from} is not a directory; expected a run or study directory"
            )
        runs = reader.collect([args.efficiency_from]).runs
        mfu = pr.efficiency_from_runs(runs)
        if mfu is None:
            raise UserError(
                f"--efficiency-from: {args.efficiency_from} holds no ok run that recorded an MFU; expected run "
                f"records of vit-scale train (their end record's mfu)"
            )
        n = sum(1 for r in runs if r.status == "ok" and isinstance((r.end or {}).get("mfu"), (int, float)))
        return mfu, f"the median MFU of {n} run(s) in {args.efficiency_from}"
    return DEFAULT_EFFICIENCY, "assumed; --efficiency F states another, --compute-from RUNDIR measures it"


def not_worth_running(rows: list, share: float = NOT_WORTH) -> list:
    """Per model, at its largest node count: the strategies that do not fit there, or whose predicted
    images/s is below `share` of the best strategy's (rows with a "prediction")."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model and "prediction" in r]
        if not mine:
            continue
        largest = max(r["nodes"] for r in mine)
        last = [r for r in mine if r["nodes"] == largest]
        speeds = {r["strategy"]: r["prediction"]["images_per_s"] for r in last}
        known = {k: v for k, v in speeds.items() if v}
        best = max(known, key=known.get) if known else None
        for r in last:
            ips = speeds[r["strategy"]]
            if r["prediction"]["fits"] is False or not ips:
                why = f"does not fit on {largest} node(s)"
            elif best and ips < share * known[best]:
                why = f"{ips / known[best]:.0%} of {best}'s images/s on {largest} node(s)"
            else:
                continue
            out.append({"model": model, "strategy": r["strategy"], "why": why})
    return out


def write_figure(prediction: dict, rows: list, shared: dict, directory: str) -> list:
    """DIR/weak_scaling_plan.json (the prediction) and the figure analysis/plan_figure.py draws from it
    (a subprocess: vit_scale does not import analysis). Returns the files written; raises RuntimeError
    with the drawing's last line when it fails."""
    script = _plan_figure_script()
    os.makedirs(directory, exist_ok=True)
    data = {
        "schema": SCHEMA_VERSION,
        **prediction,
        "batch_size": shared["batch_size"],
        "precision": shared["precision"],
        "gpus_per_node": shared["gpus_per_node"],
        "device": shared["device"],
        "rows": [
            {
                "model": r["model"],
                "params": r["params"],
                "strategy": r["strategy"],
                "nodes": r["nodes"],
                "world_size": r["world_size"],
                "fits": r["prediction"]["fits"],
                "images_per_s": r["prediction"]["images_per_s"],
                "images_per_s_per_gpu": r["prediction"]["images_per_s_per_gpu"],
                "scaling_efficiency": r["prediction"]["scaling_efficiency"],
            }
            for r in rows
        ],
    }
    path = os.path.join(directory, f"{FIGURE}.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
    proc = subprocess.run([sys.executable, script, path, "--out", directory], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit code {proc.returncode}")
    return [path] + [os.path.join(directory, f"{FIGURE}.{ext}") for ext in ("png", "pdf")]


def _plan_figure_script() -> str:
    """analysis/plan_figure.py of this checkout, else of VIT_SCALE_HOME (an installed copy)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for home in (here, os.environ.get("VIT_SCALE_HOME", "")):
        path = os.path.join(home, "analysis", "plan_figure.py")
        if home and os.path.isfile(path):
            return path
    raise RuntimeError("analysis/plan_figure.py not found; set VIT_SCALE_HOME to the vit-scale checkout")


# ---------------------------------------------------------------- the table

COLUMNS = [
    ("strategy", 18),
    ("nodes", 5),
    ("GPUs", 5),
    ("params", 7),
    ("grads", 7),
    ("optim", 7),
    ("act", 7),
    ("in-fl", 6),
    ("bufs", 6),
    ("work", 6),
    ("alloc", 6),
    ("total", 7),
    ("fits", 4),
    ("peak at", 7),
    ("intra", 7),
    ("inter", 7),
]
PREDICTED_COLUMNS = [
    ("step ms", 8),
    ("comp", 7),
    ("x-intra", 7),
    ("x-inter", 7),
    ("optim", 6),
    ("img/s/GPU", 9),
    ("img/s", 9),
    ("eff", 5),
]
PHASE_SHORT = {"forward_end": "fwd", "backward_start": "bwd-1st", "backward_end": "bwd-end", "optimizer_step": "step"}


def _f(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.1f}"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def _predicted_cells(p: dict) -> list:
    if p["fits"] is False or p["step"] is None:
        return ["does not fit", "", "", "", "", "", "", ""]
    b = p["step"]
    eff = p["scaling_efficiency"]
    return [
        _ms(b["step_s"]),
        _ms(b["forward_s"] + b["backward_s"]),
        _ms(b["exposed_intra_s"]),
        _ms(b["exposed_inter_s"]),
        "-" if b["optimizer_s"] is None else _ms(b["optimizer_s"]),
        _rate(p["images_per_s_per_gpu"]),
        _rate(p["images_per_s"]),
        "" if eff is None else f"{eff:.0%}",
    ]


def _rate(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _memory(gib) -> str:
    return "device memory not known" if gib is None else f"{gib:g} GiB/device"


def prediction_head(prediction: dict) -> list:
    """The output's first lines: which calibration and which compute the prediction used."""
    return [
        f"predicted for {prediction['system']}: calibration: {prediction['calibration']['text']}",
        f"predicted compute: {prediction['compute']['text']}",
    ]


def format_table(rows: list[dict], shared: dict, prediction: dict | None = None) -> str:
    out = prediction_head(prediction) if prediction else []
    a = shared
    head = (
        f"batch {a['batch_size']}/device, {a['precision']}, activation checkpointing "
        f"{'on' if a['activation_checkpointing'] else 'off'}, {a['attention']} attention, "
        f"{a['gpus_per_node']} {a['device']} GPUs/node, {_memory(a['device_memory_gib'])}, AdamW {a['optimizer']}; "
        f"FSDP{a['fsdp']['version']} prefetch={a['fsdp']['backward_prefetch']} "
        f"limit_all_gathers={'on' if a['fsdp']['limit_all_gathers'] else 'off'}"
    )
    out.append(head)
    al = a["allowance"]
    for strategy, error in a.get("refused", {}).items():
        out.append(f"left out: {strategy} ({error.split(': ', 1)[1]})")
    out.append(
        f"allocator allowance: {al['runtime_gib']:g} GiB runtime + {al['fragmentation']:.0%} of the peak"
        f"{' + memory held for communication streams' if al['stream_held'] else ''}"
    )
    columns = COLUMNS + (PREDICTED_COLUMNS if prediction else [])
    header = "  ".join(name.rjust(w) if i > 0 else name.ljust(w) for i, (name, w) in enumerate(columns))
    by_model: dict = {}
    for row in rows:
        by_model.setdefault(row["model"], []).append(row)
    for model, model_rows in by_model.items():
        out.append("")
        params = model_rows[0]["params"]
        size = f"{params / 1e9:.3f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
        out.append(f"{model}: {size} parameters — memory per device in GiB, communication per step per device in GB")
        out.append(header)
        out.append("-" * len(header))
        for r in model_rows:
            c = r["components_gib"]
            fits = {True: "yes", False: "NO", None: "?"}[r["fits"]]
            cells = [
                r["strategy"],
                str(r["nodes"]),
                str(r["world_size"]),
                _f(c["params"]),
                _f(c["grads"]),
                _f(c["optimizer"]),
                _f(c["activations"]),
                _f(c["in_flight"]),
                _f(c["buckets"]),
                _f(c["workspace"]),
                _f(c["allocator"]),
                _f(r["memory_gib"]),
                fits,
                PHASE_SHORT[r["peak_phase"]],
                _f(r["communication"]["intra_node"] / GB),
                _f(r["communication"]["inter_node"] / GB),
            ]
            if prediction:
                cells += _predicted_cells(r["prediction"])
            out.append(
                "  ".join(
                    cell.rjust(w) if i > 0 else cell.ljust(w)
                    for i, (cell, (_, w)) in enumerate(zip(cells, columns, strict=True))
                ).rstrip()
            )
    out.append("")
    out.append(
        "params/grads/optim: what the rank holds (optim: AdamW states + a separate fp32 master where kept); "
        "act: activations and input batches; in-fl: unsharded units / gathered or cast parameters in flight; "
        "bufs: communication buckets; work: backward and optimizer temporaries; alloc: allocator allowance; "
        "total = sum, against the device memory; components are those of the step's peak (peak at: end of "
        "forward, first or last block of the backward, optimizer step). intra/inter: GB sent per device per step "
        "inside a node / across nodes. Assumptions: docs/plan.md"
    )
    if prediction:
        out.append(
            "predicted: step ms = comp (forward + backward) + x-intra + x-inter (communication compute does "
            "not hide, inside a node / across nodes) + optim (-: not modelled, inside comp); img/s/GPU = batch / "
            "step; img/s: all GPUs; eff: "
            'img/s/GPU against 1 node\'s. Model: docs/plan.md, "Predicted step time"'
        )
        out.extend(f"  note: {n}" for n in prediction["calibration"]["notes"])
        worth = prediction["not_worth_running"]
        out.append(
            f"predicted not worth running ({prediction['rule'].split(': ', 1)[1]}): "
            + ("none" if not worth else "; ".join(f"{w['model']} {w['strategy']} ({w['why']})" for w in worth))
        )
    return "\n".join(out)


def parse_args(argv: list):
    return _parser().parse_args(argv)


def plan(args) -> tuple[list, dict, dict | None]:
    """(rows, shared assumptions, the prediction or None without --system); UserError on bad input."""
    _prediction_options(args)
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
        print(format_table(rows, shared, prediction))
    if prediction and not args.no_figure:
        try:
            written = write_figure(prediction, rows, shared, args.figure)
        except (OSError, RuntimeError) as exc:
            print(f"vit-scale plan: the predicted figure could not be drawn: {exc}", file=sys.stderr)
            return 1
        print(f"predicted figure: {', '.join(written[1:])}", file=sys.stderr if args.json else sys.stdout)
    return 0
