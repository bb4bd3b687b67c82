"""`vit-scale plan`: which strategy fits a model on which node count, and what it communicates.

    vit-scale plan --model vit_3b --nodes 1,8 [--strategy NO_SHARD,FULL_SHARD ...] [--json]

A table by default; `--json` for scripts (schema: docs/plan.md, `PLAN_SCHEMA` below). Exit codes:
0 ok (whether or not everything fits), 2 bad input (one line on stderr).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from vit_scale.distributed import GROUP_SIZE, all_labels
from vit_scale.distributed.capabilities import refusal
from vit_scale.errors import UserError
from vit_scale.planning import SCHEMA_VERSION, assumptions, plan_row
from vit_scale.planning.scenario import ATTENTION, OPTIMIZER_IMPLS, PRECISIONS, Allowance, from_config

GB = 1e9

_NUM = {"type": "number"}
_GIB_PARTS = ("params", "grads", "optimizer", "in_flight", "activations", "buckets", "workspace", "allocator")
_COMM = {"type": "object", "required": ["intra", "inter"],
         "properties": {"intra": {"type": "integer", "minimum": 0}, "inter": {"type": "integer", "minimum": 0}}}
ROW_SCHEMA = {
    "type": "object",
    "required": ["model", "params", "strategy", "family", "implementation", "sharding", "nodes", "gpus_per_node",
                 "world_size", "shard_group_size", "replicate_group_size", "memory_gib", "peak_allocated_gib",
                 "peak_allocated_phase", "components_gib", "allocator_gib", "peak_phase", "phases_gib", "device_memory_gib", "fits",
                 "headroom_gib", "optimizer_impl", "communication", "notes"],
    "properties": {
        "model": {"type": "string"}, "params": {"type": "integer", "minimum": 1}, "strategy": {"type": "string"},
        "family": {"enum": ["ddp", "fsdp", "deepspeed", "colossalai"]}, "implementation": {"type": "string"},
        "nodes": {"type": "integer", "minimum": 1}, "gpus_per_node": {"type": "integer", "minimum": 1},
        "world_size": {"type": "integer", "minimum": 1}, "shard_group_size": {"type": "integer", "minimum": 1},
        "replicate_group_size": {"type": "integer", "minimum": 1},
        "memory_gib": {"type": "number", "exclusiveMinimum": 0},
        "peak_allocated_gib": {"type": "number", "exclusiveMinimum": 0},
        "components_gib": {"type": "object", "required": list(_GIB_PARTS), "additionalProperties": False,
                           "properties": {k: {"type": "number", "minimum": 0} for k in _GIB_PARTS}},
        "allocator_gib": {"type": "object", "required": ["runtime", "fragmentation", "stream_held"],
                          "properties": {k: {"type": "number", "minimum": 0}
                                         for k in ("runtime", "fragmentation", "stream_held")}},
        "peak_phase": {"enum": ["forward_end", "backward_start", "backward_end", "optimizer_step"]},
        "peak_allocated_phase": {"enum": ["forward_end", "backward_start", "backward_end", "optimizer_step"]},
        "phases_gib": {"type": "object", "required": ["forward_end", "backward_start", "backward_end",
                                                      "optimizer_step"]},
        "device_memory_gib": {"type": ["number", "null"]}, "fits": {"type": ["boolean", "null"]},
        "headroom_gib": {"type": ["number", "null"]},
        "optimizer_impl": {"enum": ["foreach", "single", "fused"]},
        "communication": {"type": "object",
                          "required": ["all_gather", "reduce_scatter", "all_reduce", "intra_node", "inter_node",
                                       "total"],
                          "properties": {"all_gather": _COMM, "reduce_scatter": _COMM, "all_reduce": _COMM,
                                         "intra_node": {"type": "integer", "minimum": 0},
                                         "inter_node": {"type": "integer", "minimum": 0},
                                         "total": {"type": "integer", "minimum": 0}}},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
}
PLAN_SCHEMA = {
    "type": "object",
    "required": ["schema", "assumptions", "rows"],
    "properties": {"schema": {"const": SCHEMA_VERSION},
                   "assumptions": {"type": "object",
                                   "required": ["batch_size", "precision", "activation_checkpointing", "attention",
                                                "gpus_per_node", "device_memory_gib", "optimizer", "allowance"]},
                   "rows": {"type": "array", "items": ROW_SCHEMA}},
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        raise UserError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vit-scale plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, metavar="M",
                   help="model name (repeat or comma-separate for several), e.g. vit_3b")
    p.add_argument("--strategy", action="append", metavar="S",
                   help="strategy label (repeat or comma-separate); default: every label")
    p.add_argument("--nodes", default="1", help="node counts, comma-separated (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default 8, a Frontier node)")
    p.add_argument("--batch-size", type=int, default=32, help="per device (default 32)")
    p.add_argument("--precision", default="bf16", choices=PRECISIONS, help="default bf16 (the study's)")
    p.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=False,
                   help="checkpoint every Block (default off, as the trainer)")
    p.add_argument("--attention", default="fused", choices=ATTENTION,
                   help="fused: scaled_dot_product_attention (timm's default); materialised: scores in memory")
    p.add_argument("--device", default="rocm", choices=("cuda", "rocm"),
                   help="device kind (default rocm, a Frontier GCD): pairs it cannot run are left out, with why")
    p.add_argument("--device-memory-gib", type=float, default=64.0, help="per device (default 64, an MI250X GCD)")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--optimizer", default="auto", choices=OPTIMIZER_IMPLS,
                   help="AdamW implementation; auto: what torch picks for the trainer's parameters")
    p.add_argument("--fsdp-version", type=int, choices=(1, 2), help="default 1 (fsdp.version)")
    p.add_argument("--backward-prefetch", choices=("none", "pre", "post"), help="default pre")
    p.add_argument("--limit-all-gathers", action=argparse.BooleanOptionalAction, default=None,
                   help="default on")
    p.add_argument("--forward-prefetch", action=argparse.BooleanOptionalAction, default=None, help="default off")
    p.add_argument("--use-orig-params", action=argparse.BooleanOptionalAction, default=None, help="default off")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any trainer config key, e.g. deepspeed.reduce_bucket_size=2e8 colossalai.zero_stage=1")
    p.add_argument("--runtime-gib", type=float, default=Allowance.runtime_gib,
                   help="device memory outside torch's allocator: context, NCCL/RCCL buffers (default 1.0)")
    p.add_argument("--fragmentation", type=float, default=Allowance.fragmentation,
                   help="allocator allowance as a share of the peak (default 0.05)")
    p.add_argument("--stream-held", action=argparse.BooleanOptionalAction, default=True,
                   help="count memory the allocator holds for communication streams (default on)")
    p.add_argument("--json", action="store_true", help="machine-readable output (docs/plan.md)")
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
        for size in ((1, 2, gpus_per_node) if GROUP_SIZE in label else (0,)):
            concrete = label.replace(GROUP_SIZE, str(size))
            if concrete not in out:
                out.append(concrete)
    return out


def build_rows(args) -> tuple[list[dict], dict]:
    from vit_scale.config import load_config

    for name in ("gpus_per_node", "batch_size", "num_classes"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: must be a positive integer, got {getattr(args, name)}")
    if not args.device_memory_gib > 0:
        raise UserError(f"--device-memory-gib: must be positive, got {args.device_memory_gib}")
    if args.runtime_gib < 0 or args.fragmentation < 0:
        raise UserError("--runtime-gib and --fragmentation must not be negative")
    nodes = _positive_ints(args.nodes, "--nodes")
    models = _split(args.model)
    explicit = _split(args.strategy)
    strategies = explicit or _default_strategies(args.gpus_per_node)
    overrides = list(args.set) + [f"train.batch_size={args.batch_size}", f"train.precision={args.precision}",
                                  f"train.activation_checkpointing={str(args.activation_checkpointing).lower()}",
                                  f"train.num_classes={args.num_classes}"]
    for key, value in (("fsdp.version", args.fsdp_version), ("fsdp.backward_prefetch", args.backward_prefetch),
                       ("fsdp.limit_all_gathers", args.limit_all_gathers),
                       ("fsdp.forward_prefetch", args.forward_prefetch),
                       ("fsdp.use_orig_params", args.use_orig_params)):
        if value is not None:
            overrides.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    base = load_config(None, [f"model={models[0]}"] + overrides)
    allowance = Allowance(runtime_gib=args.runtime_gib, fragmentation=args.fragmentation,
                          stream_held=args.stream_held)
    refused = {}
    for strategy in list(strategies):
        error = refusal(strategy, args.precision, args.device, base)  # base: option rules see --set
        if error and explicit:
            raise UserError(f"--strategy: {strategy} with --precision {args.precision} on {args.device}: {error}")
        if error:
            refused[strategy] = error
            strategies.remove(strategy)
    rows, shared = [], None
    for model in models:
        for n in nodes:
            for strategy in strategies:
                cfg = dataclasses.replace(base, model=model, strategy=strategy)
                sc = from_config(cfg, nodes=n, gpus_per_node=args.gpus_per_node,
                                 device_memory_gib=args.device_memory_gib, attention=args.attention,
                                 optimizer=args.optimizer, allowance=allowance)
                if not explicit and _skip_default(sc):
                    continue  # a default HYBRID_<g>GPU or ZEROPP layout this world cannot have
                rows.append(plan_row(sc))
                shared = shared or assumptions(sc)
    shared = {**shared, "device": args.device, "refused": refused}
    return rows, shared


def _skip_default(sc) -> bool:
    try:
        sc.validate()
    except UserError:
        return True
    return False


# ---------------------------------------------------------------- the table

COLUMNS = [("strategy", 18), ("nodes", 5), ("GPUs", 5), ("params", 7), ("grads", 7), ("optim", 7), ("act", 7),
           ("in-fl", 6), ("bufs", 6), ("work", 6), ("alloc", 6), ("total", 7), ("fits", 4), ("peak at", 7),
           ("intra", 7), ("inter", 7)]
PHASE_SHORT = {"forward_end": "fwd", "backward_start": "bwd-1st", "backward_end": "bwd-end",
               "optimizer_step": "step"}


def _f(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.1f}"


def format_table(rows: list[dict], shared: dict) -> str:
    out = []
    a = shared
    head = (f"batch {a['batch_size']}/device, {a['precision']}, activation checkpointing "
            f"{'on' if a['activation_checkpointing'] else 'off'}, {a['attention']} attention, "
            f"{a['gpus_per_node']} {a['device']} GPUs/node, {a['device_memory_gib']:g} GiB/device, AdamW {a['optimizer']}; "
            f"FSDP{a['fsdp']['version']} prefetch={a['fsdp']['backward_prefetch']} "
            f"limit_all_gathers={'on' if a['fsdp']['limit_all_gathers'] else 'off'}")
    out.append(head)
    al = a["allowance"]
    for strategy, error in a.get("refused", {}).items():
        out.append(f"left out: {strategy} ({error.split(': ', 1)[1]})")
    out.append(f"allocator allowance: {al['runtime_gib']:g} GiB runtime + {al['fragmentation']:.0%} of the peak"
               f"{' + memory held for communication streams' if al['stream_held'] else ''}")
    header = "  ".join(name.rjust(w) if i > 0 else name.ljust(w) for i, (name, w) in enumerate(COLUMNS))
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
            cells = [r["strategy"], str(r["nodes"]), str(r["world_size"]), _f(c["params"]), _f(c["grads"]),
                     _f(c["optimizer"]), _f(c["activations"]), _f(c["in_flight"]), _f(c["buckets"]),
                     _f(c["workspace"]), _f(c["allocator"]), _f(r["memory_gib"]), fits,
                     PHASE_SHORT[r["peak_phase"]], _f(r["communication"]["intra_node"] / GB), _f(r["communication"]["inter_node"] / GB)]
            out.append("  ".join(cell.rjust(w) if i > 0 else cell.ljust(w)
                                 for i, (cell, (_, w)) in enumerate(zip(cells, COLUMNS))))
    out.append("")
    out.append("params/grads/optim: what the rank holds (optim: AdamW states + a separate fp32 master where kept); "
               "act: activations and input batches; in-fl: unsharded units / gathered or cast parameters in flight; "
               "bufs: communication buckets; work: backward and optimizer temporaries; alloc: allocator allowance; "
               "total = sum, against the device memory; components are those of the step's peak (peak at: end of "
               "forward, first or last block of the backward, optimizer step). intra/inter: GB sent per device per step inside a node / "
               "across nodes. Assumptions: docs/plan.md")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        rows, shared = build_rows(args)
    except UserError as exc:
        print(f"vit-scale plan: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps({"schema": SCHEMA_VERSION, "assumptions": shared, "rows": rows}, indent=1))
    else:
        print(format_table(rows, shared))
    return 0
