"""`vit-scale plan`'s options: the parser, the defaults a --system profile fills in, and the rules
between the prediction's options (each broken one a UserError: one line, exit 2, nothing written)."""

from __future__ import annotations

import argparse
import os
import typing

from vit_scale.distributed import FAMILIES
from vit_scale.errors import UserError
from vit_scale.planning.scenario import ATTENTION, OPTIMIZER_IMPLS, PRECISIONS, Allowance

DESCRIPTION = (
    "`vit-scale plan`: which strategy fits a model on which node count, and what it communicates; with "
    "`--system`, also how fast each point is predicted to run."
)
NO_SYSTEM = {"gpus_per_node": 8, "device_memory_gib": 64.0, "device": "rocm"}
DEFAULT_EFFICIENCY = 0.4  # of the profile's dense peak, when FLOPs give the compute and no --efficiency
FIGURE = "weak_scaling_plan"  # DIR/FIGURE.json (the prediction), .png and .pdf (the figure)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, like every other bad input
        raise UserError(message)


def _point_options(p) -> None:
    """What is planned: models, strategies, node counts, the device and the training step."""
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


def family_flags():
    """(family, key, flag, argparse dest, help) of each option a family offers as a flag (Family.plan_flags)."""
    for name, family in FAMILIES.items():
        for key, flag, text in family.plan_flags:
            yield name, key, flag, flag.removeprefix("--").replace("-", "_"), text


def _flag_kind(options: type, key: str) -> dict:
    """argparse's type and choices for an option's flag, from its field's type: a boolean as --x/--no-x,
    a Literal as its choices; None when not given, so the configuration's default applies."""
    typ = typing.get_type_hints(options)[key]
    if typ is bool:
        return {"action": argparse.BooleanOptionalAction, "default": None}
    if typing.get_origin(typ) is typing.Literal:
        choices = typing.get_args(typ)
        return {"type": type(choices[0]), "choices": choices}
    return {"type": typ}


def _strategy_options(p) -> None:
    """The families' own flags and any trainer key (--set)."""
    for name, key, flag, _, text in family_flags():
        p.add_argument(flag, help=text, **_flag_kind(FAMILIES[name].options, key))
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any trainer config key, e.g. deepspeed.reduce_bucket_size=2e8 colossalai.zero_stage=1",
    )


def _output_options(p) -> None:
    """The allocator's allowance and the output's form."""
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
    p.add_argument("--json", action="store_true", help="machine-readable output, every column (docs/plan.md)")
    p.add_argument(
        "--wide",
        action="store_true",
        help="the table with the memory's components, the communication per step and the predicted step's split",
    )


def _prediction_options(p) -> None:
    """--system and what the prediction is made from."""
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
        help="the collectives' fits of `vit-scale check` (full mode) on this system, over the profile's defaults; "
        "its timed GEMMs (check.json's compute) give the compute of its model, precision and batch",
    )
    pred.add_argument(
        "--compute-from",
        metavar="PATH",
        help="compute from a measured run of the same model, batch and precision (a run directory, or "
        "a study directory: its 1-node rung); default: the GEMMs --calibration's check timed for the "
        "model, batch and precision, else counted FLOPs x peak x efficiency",
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
        help=f"where the predicted weak-scaling figure goes ({FIGURE}.png/.pdf and the prediction "
        f"{FIGURE}.json; default: the current directory for the table, none with --json)",
    )
    pred.add_argument("--no-figure", action="store_true", help="print the prediction only")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vit-scale plan", description=DESCRIPTION)
    for add in (_point_options, _strategy_options, _output_options, _prediction_options):
        add(p)
    return p


def parse_args(argv: list):
    return parser().parse_args(argv)


def split(values) -> list[str]:
    out = []
    for v in values or []:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def positive_ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what}: expected positive integers separated by commas, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UserError(f"{what}: expected positive integers separated by commas, got {text!r}")
    return values


def system_defaults(args) -> None:
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


def check_prediction_options(args) -> None:
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
    figure = figure_dir(args)
    if figure is not None and os.path.exists(figure) and not os.path.isdir(figure):
        raise UserError(f"--figure: {figure} is a file; expected a directory (created when missing)")


def figure_dir(args) -> str | None:
    """Where the predicted figure goes, or None for none: --figure DIR; without it the current directory
    for the table and nothing for --json (a script's output goes to stdout alone); --no-figure: none."""
    if not args.system or args.no_figure:
        return None
    if args.figure is not None:
        return args.figure
    return None if args.json else "."
