"""Run configuration: dataclasses loaded from YAML, dotted key=value overrides, validated once.

Everything downstream trusts a validated Config. Every option of every strategy family is a key
here, so the resolved config written into the run directory says exactly what ran. Each key is a
field declared with `vit_scale.options.option`: its default, its one-line description (what
--help shows) and its rules; choices are Literal types; a rule between keys is its section's
`check()`. Each strategy family declares its own section in its package (FSDPConfig in
vit_scale/distributed/fsdp ...), and Config declares one field per family that has options,
named after the family, in registry order (a check at import says which line is missing).
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from vit_scale.distributed import Precision, allowed_text, family_options, parse_strategy
from vit_scale.distributed.colossalai import ColossalAIConfig
from vit_scale.distributed.deepspeed import DeepSpeedConfig
from vit_scale.distributed.fsdp import FSDPConfig
from vit_scale.errors import UserError
from vit_scale.models import BLOCK_LINEARS, MODELS, get_spec, parse_block_linears
from vit_scale.options import (
    AT_LEAST_1,
    BELOW_1,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    Rule,
    check_keys,
    check_sections,
    choices,
    description,
    is_section,
    option,
    optional_inner,
    rules,
)


def _is_name(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9._-]+", text) is not None


# a name that becomes part of a path: the study's folder, the run's id
NAME = Rule("letters, digits, '.', '_' or '-'", _is_name, "{key}: {value!r} must be letters, digits, '.', '_' or '-'")


@dataclass
class TrainConfig:
    batch_size: int = option(32, "per device; weak scaling keeps it fixed as ranks grow", AT_LEAST_1)
    steps: int = option(30, "optimizer steps, warm-up included", AT_LEAST_1)
    warmup_steps: int = option(5, "excluded from every summary figure", NON_NEGATIVE)
    lr: float = option(1e-4, "AdamW learning rate", NON_NEGATIVE)
    weight_decay: float = option(0.05, "AdamW (decoupled) weight decay", NON_NEGATIVE)
    seed: int = option(0, "model initialisation and synthetic data", NON_NEGATIVE)
    num_classes: int = option(1000, "classifier head size", AT_LEAST_1)
    precision: Precision = option(
        "fp32", "autocast for DDP, MixedPrecision for FSDP (docs/strategies.md: what runs where)"
    )
    activation_checkpointing: bool = option(False, "recompute each timm Block in the backward (non-reentrant)")
    log_every: int = option(1, "a step record every k steps", AT_LEAST_1)
    print_every: int = option(10, "a progress line on rank 0 every k steps", AT_LEAST_1)
    init: Literal["auto", "device", "meta"] = option("auto", "auto = meta above 1.5B parameters, else on the device")
    optimizer: Literal["auto", "fused", "foreach", "single"] = option(
        "auto", "AdamW kernel; auto = fused on GPUs, torch's default on CPUs"
    )
    synthetic_batches: int = option(4, "distinct synthetic batches cycled through", AT_LEAST_1)
    tf32: bool = option(False, "fp32 runs on GPUs: matmuls and convolutions in TF32; MFU against the TF32 peak")
    compile: bool = option(False, "torch.compile: each transformer Block under FSDP, the whole model under DDP")
    health_probe_s: float = option(
        1.0,
        "after the timed window, each rank's GEMM and memory-copy probe (nodes_health), about this long; 0: none",
        NON_NEGATIVE,
    )

    def check(self) -> None:
        if self.warmup_steps >= self.steps:
            raise UserError(
                f"train.warmup_steps: must be less than train.steps ({self.steps}) so that some steps "
                f"are timed, got {self.warmup_steps}"
            )
        if self.tf32 and self.precision != "fp32":
            raise UserError(
                f"train.tf32: only for train.precision=fp32 (a {self.precision} run already does its "
                f"matmuls in {self.precision}); set train.tf32=false or train.precision=fp32"
            )


@dataclass
class OutputConfig:
    dir: str = option("runs")
    study: str = option("default", "", NAME)
    run_id: str = option(
        "",
        "empty: <UTC time>[-j<job>.<step>]",
        Rule(f"empty, or {NAME.allowed}", lambda v: not v or _is_name(v), NAME.says),
    )
    repetition: int = option(
        0, "which of a study's --repeat runs of its point (1, 2 ...); 0: not a study's", NON_NEGATIVE
    )

    def check(self) -> None:
        probe = self.dir
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe.rstrip("/"))
        if probe and not os.path.isdir(probe):
            raise UserError(f"output.dir: {probe} is a file, not a directory; choose another output.dir")


@dataclass
class SystemConfig:
    launcher: Literal["auto", "torchrun", "srun", "mpi", "single"] = option(
        "auto", "where rank and world size come from; auto detects it"
    )
    device: Literal["auto", "cuda", "cpu"] = option("auto", "auto = the GPU when there is one (cuda also means ROCm)")
    peak_tflops: float | None = option(None, "per device, overrides the built-in table for MFU", POSITIVE)
    collective_timeout_s: int = option(300, "a dead or stuck rank ends the job after this", AT_LEAST_1)
    ranks_per_node: int = option(0, "0 = from the launcher (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE)", NON_NEGATIVE)


@dataclass
class PlanConfig:
    skip_if_not_fits: bool = option(False, "record the run as skipped instead of running into OOM")
    device_memory_gib: float | None = option(None, "", POSITIVE)


@dataclass
class DataConfig:
    """Real images for `vit-scale finetune` (the benchmark `train` uses synthetic data and ignores this)."""

    path: str = option("", "dataset root; nothing is downloaded, a missing path is an error")
    format: Literal["auto", "imagefolder", "cifar10", "cifar100", "hf"] = option(
        "auto", "auto | imagefolder | cifar10 | cifar100 | hf (datasets.save_to_disk)"
    )
    train_split: str = option("train", "sub-folder (image folder) or split name (hf)")
    val_split: str = option("auto", "auto: val, validation or test if present, else val_fraction of train")
    val_fraction: float = option(
        0.1, "held out of train (per class, seeded) when there is no validation split", FRACTION
    )
    image_key: str = option("auto", "hf: image column (auto: image, img)")
    label_key: str = option("auto", "hf: label column (auto: label, labels, fine_label)")
    augment: Literal["standard", "crop", "none"] = option(
        "standard", "standard (random resized crop + flip) | crop (no flip: digits, text) | none"
    )
    crop_scale_min: float = option(
        0.08,
        "smallest area fraction a random resized crop keeps",
        Rule("{kind} from 0 to 1", lambda v: 0 < v <= 1, "{key}: must be above 0 and at most 1, got {value}"),
    )
    normalize: Literal["inception", "imagenet", "none"] = option(
        "inception", "inception (mean=std=0.5, timm's ViT weights) | imagenet | none"
    )
    workers: int = option(4, "loader processes per rank; 0 loads in the training process", NON_NEGATIVE)
    pin_memory: bool = option(True, "page-locked host batches (GPU runs only)")


def _block_linears(text: str) -> bool:
    named = parse_block_linears(text)
    return bool(named) and all(t in BLOCK_LINEARS for t in named)


@dataclass
class LoraConfig:
    """Low-rank adapters (peft) in place of training every weight: the model's weights stay frozen,
    the adapters and the new head train (docs/finetune.md, "LoRA")."""

    rank: int = option(0, "adapter rank r; 0 = no LoRA, every weight trains", NON_NEGATIVE)
    alpha: float = option(16.0, "the adapters' update is scaled by alpha / rank", NON_NEGATIVE)
    dropout: float = option(0.0, "dropout on each adapter's input; below 1", FRACTION, BELOW_1)
    targets: str = option(
        "qkv,proj,fc1,fc2",
        "Linear layers of each Block that get adapters (attn.qkv/proj, mlp.fc1/fc2)",
        Rule(
            f"a comma-separated list of {', '.join(BLOCK_LINEARS)}",
            _block_linears,
            "{key}: {value!r} is not allowed; allowed: a comma-separated list of " + ", ".join(BLOCK_LINEARS),
        ),
    )

    def check(self) -> None:
        if self.rank and self.alpha <= 0:
            raise UserError(
                f"finetune.lora.alpha: must be above 0 (the adapters' update is scaled by alpha / rank), "
                f"got {self.alpha}"
            )


@dataclass
class FinetuneConfig:
    """Schedule and evaluation of `vit-scale finetune`; batch size, lr, weight decay, seed and precision
    are train.* as for the benchmark."""

    epochs: int = option(10, "", AT_LEAST_1)
    steps: int = option(0, "optimizer steps in all; 0 = epochs x steps per epoch", NON_NEGATIVE)
    lr_warmup_steps: int = option(0, "linear warm-up, then cosine decay to min_lr", NON_NEGATIVE)
    min_lr: float = option(0.0, "", NON_NEGATIVE)
    accumulation_steps: int = option(
        1, "micro-batches per optimizer step (gradients synchronised on the last)", AT_LEAST_1
    )
    clip_grad_norm: float = option(1.0, "0 = no clipping", NON_NEGATIVE)
    label_smoothing: float = option(0.1, "", FRACTION, BELOW_1)
    pretrained: str = option("", "local timm checkpoint (.pth, .pt, .bin) or .safetensors; empty = from scratch")
    eval_batch_size: int = option(0, "0 = train.batch_size", NON_NEGATIVE)
    confusion_matrix: bool = option(True, "confusion_matrix.png/.csv and per_class_accuracy.csv at the end")
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class CheckpointConfig:
    dir: str = option("", "empty = <run directory>/checkpoints; set it to resume across jobs")
    every_steps: int = option(0, "0 = only at the end and on a signal", NON_NEGATIVE)
    keep: int = option(2, "most recent checkpoints kept; 0 keeps all", NON_NEGATIVE)
    at_end: bool = option(True)
    on_signal: bool = option(True, "SIGUSR1/SIGTERM: save, then exit 7 (requeue)")
    resume: str = option("", "empty = fresh start | auto (latest in dir, if any) | a checkpoint path")
    signal_grace_s: int = option(
        100, "after a signal, how long the save may take before the watcher ends the run", AT_LEAST_1
    )


@dataclass
class ProfileConfig:
    """torch.profiler traces of a few extra steps after the timed window, one Chrome trace per rank in
    the run directory; no figure of the run includes the profiler (docs/profiling.md)."""

    enabled: bool = option(False)
    steps: int = option(3, "steps recorded, run after train.steps", AT_LEAST_1)
    ranks: str = option(
        "all",
        "all, or comma-separated ranks, e.g. 0,1",
        Rule(
            "{kind}",
            lambda v: v == "all" or re.fullmatch(r"\d+(,\d+)*", v.replace(" ", "")),
            "{key}: {value!r} is not allowed; allowed: all, or ranks such as 0 or 0,1",
        ),
    )


@dataclass
class TrackingConfig:
    """Where else the run's figures go, besides its record: TensorBoard event files in the run
    directory, or Weights & Biases (offline by default: compute nodes rarely reach the internet;
    `wandb sync` the run directory's wandb/ folder later)."""

    backend: Literal["none", "tensorboard", "wandb"] = option("none", "none | tensorboard | wandb")
    project: str = option("vit-scale", "W&B project")
    wandb_mode: Literal["offline", "online"] = option("offline", "offline | online")


@dataclass
class Config:
    """Every key of a run: the model and strategy, then one section per concern, the strategy
    families' sections (one per family with options, vit_scale.distributed.FAMILIES) after train."""

    model: str = option("vit_micro", "a registered model (docs/models.md)", Rule(", ".join(MODELS), get_spec))
    strategy: str = option(
        "DDP", "a strategy label (docs/strategies.md: what runs where)", Rule(allowed_text(), parse_strategy)
    )
    train: TrainConfig = field(default_factory=TrainConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    colossalai: ColossalAIConfig = field(default_factory=ColossalAIConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    data: DataConfig = field(default_factory=DataConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def check(self) -> None:
        """The rules between sections (each section's own check has run)."""
        if self.finetune.min_lr > self.train.lr:
            raise UserError(f"finetune.min_lr: must not exceed train.lr ({self.train.lr}), got {self.finetune.min_lr}")


def _check_family_sections() -> None:
    """The registry's families with options and Config's sections between train and output must be
    the same, in the same order: a family added to FAMILIES needs its line in Config (and the reverse)."""
    names = [f.name for f in dataclasses.fields(Config)]
    declared = names[names.index("train") + 1 : names.index("output")]
    hints = typing.get_type_hints(Config)
    wanted = family_options()
    if declared != list(wanted) or any(hints[name] is not wanted[name] for name in declared):
        lines = "; ".join(
            f"{name}: {options.__name__} = field(default_factory={options.__name__})"
            for name, options in wanted.items()
        )
        raise TypeError(f"vit_scale.config.Config: the family sections after train must be, in this order: {lines}")


_check_family_sections()


# ---------------------------------------------------------------- loading


def _field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(key: str, raw: Any, typ: Any) -> Any:
    """Convert a YAML value or an override string to the field's type, or say what was expected."""
    inner = optional_inner(typ)
    if inner is not None:
        if raw is None or (isinstance(raw, str) and raw.lower() in ("null", "none", "")):
            return None
        return _convert(key, raw, inner)
    if choices(typ):  # a Literal: converted as its values' type, checked against them by validate
        return _convert(key, raw, type(choices(typ)[0]))
    if typ is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return raw.lower() in ("true", "yes", "on", "1")
        raise UserError(f"{key}: expected true or false, got {raw!r}")
    if typ is int:
        if isinstance(raw, bool):
            raise UserError(f"{key}: expected an integer, got {raw!r}")
        if isinstance(raw, int):
            return raw
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if isinstance(raw, str):
            try:
                return int(float(raw)) if re.fullmatch(r"[-+]?\d+(\.0*)?([eE]\+?\d+)?", raw.strip()) else int(raw)
            except ValueError:
                pass
        raise UserError(f"{key}: expected an integer, got {raw!r}")
    if typ is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, str):
            try:
                return float(raw)
            except ValueError:
                pass
        raise UserError(f"{key}: expected a number, got {raw!r}")
    if typ is str:
        if isinstance(raw, (str, int, float)) and not isinstance(raw, bool):
            return str(raw)
        raise UserError(f"{key}: expected a string, got {raw!r}")
    raise UserError(f"{key}: unsupported value {raw!r}")


def _apply(cfg: Config, key: str, raw: Any) -> None:
    parts = key.split(".")
    obj: Any = cfg
    for i, part in enumerate(parts):
        path = ".".join(parts[: i + 1])
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            allowed = ", ".join(f.name for f in dataclasses.fields(obj)) if dataclasses.is_dataclass(obj) else ""
            where = ".".join(parts[:i]) or "top level"
            raise UserError(f"{path}: unknown key; allowed at {where}: {allowed}")
        typ = _field_types(type(obj))[part]
        if i == len(parts) - 1:
            if is_section(typ):
                if not isinstance(raw, dict):
                    raise UserError(
                        f"{path}: expected a mapping of {', '.join(f.name for f in dataclasses.fields(typ))}"
                    )
                for sub, val in raw.items():
                    _apply(cfg, f"{path}.{sub}", val)
            else:
                setattr(obj, part, _convert(path, raw, typ))
            return
        obj = getattr(obj, part)


def load_config(path: str | None = None, overrides: list[str] = ()) -> Config:
    """Defaults, then the YAML file, then key=value overrides; then validate."""
    import yaml

    cfg = Config()
    if path:
        if not os.path.isfile(path):
            raise UserError(f"--config: no such file: {path}")
        try:
            with open(path) as f:
                data = yaml.safe_load(f) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise UserError(f"--config: YAML syntax error in {path}{where}: {getattr(exc, 'problem', exc)}") from None
        except OSError as exc:
            raise UserError(f"--config: cannot read {path}: {exc.strerror}") from None
        if not isinstance(data, dict):
            raise UserError(f"--config: {path} must hold a mapping of keys, not {type(data).__name__}")
        for key, val in data.items():
            _apply(cfg, str(key), val)
    for item in overrides:
        if "=" not in item:
            raise UserError(f"override '{item}': expected key=value, e.g. model=vit_micro or train.steps=30")
        key, raw = item.split("=", 1)
        _apply(cfg, key.strip(), _parse_scalar(raw))
    validate(cfg)
    return cfg


def _parse_scalar(raw: str) -> Any:
    """Overrides arrive as strings; YAML rules give true/false/numbers/null their meaning."""
    import yaml

    try:
        val = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    return val if isinstance(val, (bool, int, float, str)) or val is None else raw


# ---------------------------------------------------------------- validation


def validate(cfg: Config) -> None:
    """Every key against its own choices and rules, in declaration order (model and strategy
    first), then each section's check() of the rules between its keys, then Config's."""
    check_keys(cfg)
    check_sections(cfg)


def to_yaml(cfg: Config) -> str:
    import yaml

    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


# ---------------------------------------------------------------- help

# the sections `vit-scale train` reads; `vit-scale finetune` reads every section
FINETUNE_SECTIONS = ("data", "finetune", "checkpoint")
BENCHMARK_SECTIONS = tuple(
    f.name
    for f in dataclasses.fields(Config)
    if is_section(_field_types(Config)[f.name]) and f.name not in FINETUNE_SECTIONS
)


def _allowed(typ: Any, key_rules: tuple) -> str:
    """What --help shows a key allows: its choices, else its kind and first rule."""
    inner = optional_inner(typ)
    if inner is not None:
        return _allowed(inner, key_rules) + " or null"
    if choices(typ):
        return " | ".join(map(str, choices(typ)))
    if typ is bool:
        return "true | false"
    kind = {int: "integer", float: "number", str: "text"}.get(typ, "value")
    return key_rules[0].allowed.format(kind=kind) if key_rules else kind


def _keys_help(sections) -> str:
    import textwrap

    out = ["keys (key=value here, or the same keys nested in the --config YAML); default, then what is allowed:"]

    def entry(key, default, typ, f):
        shown = (
            "(empty)"
            if default == ""
            else ("null" if default is None else str(default).lower() if isinstance(default, bool) else str(default))
        )
        out.append(f"  {key} = {shown}    [{_allowed(typ, rules(f))}]")
        if description(f):
            out.extend(textwrap.wrap(description(f), width=96, initial_indent="      ", subsequent_indent="      "))

    hints = _field_types(Config)
    for f in dataclasses.fields(Config):
        if not is_section(hints[f.name]):
            entry(f.name, f.default, hints[f.name], f)
    for f in dataclasses.fields(Config):
        cls = hints[f.name]
        if not is_section(cls) or f.name not in sections:
            continue
        out.append(f"{f.name}:")
        doc = (cls.__doc__ or "").strip()
        if doc and not doc.startswith(f"{cls.__name__}("):  # dataclasses make up a docstring when there is none
            out.extend(textwrap.wrap(" ".join(doc.split()), width=96, initial_indent="  ", subsequent_indent="  "))
        _section_entries(f.name, cls, entry)
    return "\n".join(out)


def _section_entries(prefix: str, cls, entry) -> None:
    """entry() for each key of a section, the keys of a nested section (finetune.lora) after them."""
    types, defaults = _field_types(cls), cls()
    nested = []
    for sub in dataclasses.fields(cls):
        if is_section(types[sub.name]):
            nested.append(sub)
        else:
            entry(f"{prefix}.{sub.name}", getattr(defaults, sub.name), types[sub.name], sub)
    for sub in nested:
        _section_entries(f"{prefix}.{sub.name}", types[sub.name], entry)


def parse_command_line(argv, prog: str, description: str, configs: str, example: str, sections=None):
    """`[--config FILE] [key=value ...]`, the command line every run-type command takes; --help
    lists every key of `sections` (default: all) with its default and allowed values."""
    import argparse

    names = sections or [f.name for f in dataclasses.fields(Config)]
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=_keys_help(names),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help=f"YAML file of keys (see {configs}); overrides come after it")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=f"e.g. {example}")
    return parser.parse_args(argv)
