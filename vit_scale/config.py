"""Run configuration: dataclasses loaded from YAML, dotted key=value overrides, validated once.

Everything downstream trusts a validated Config. Every option of every strategy family is a key
here, so the resolved config written into the run directory says exactly what ran.
"""
from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from vit_scale.errors import UserError

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class TrainConfig:
    batch_size: int = 32          # per device; weak scaling keeps it fixed as ranks grow
    steps: int = 30               # optimizer steps, warm-up included
    warmup_steps: int = 5         # excluded from every summary figure
    lr: float = 1e-4              # AdamW learning rate
    weight_decay: float = 0.05    # AdamW (decoupled) weight decay
    seed: int = 0                 # model initialisation and synthetic data
    num_classes: int = 1000       # classifier head size
    precision: str = "fp32"       # autocast for DDP, MixedPrecision for FSDP (docs/strategies.md: what runs where)
    activation_checkpointing: bool = False  # recompute each timm Block in the backward (non-reentrant)
    log_every: int = 1            # a step record every k steps
    print_every: int = 10         # a progress line on rank 0 every k steps
    init: str = "auto"            # auto = meta above 1.5B parameters, else on the device
    optimizer: str = "auto"       # AdamW kernel; auto = fused on GPUs, torch's default on CPUs
    synthetic_batches: int = 4    # distinct synthetic batches cycled through
    tf32: bool = False            # fp32 runs on GPUs: matmuls and convolutions in TF32; MFU against the TF32 peak
    compile: bool = False         # torch.compile: each transformer Block under FSDP, the whole model under DDP


@dataclass
class FSDPConfig:
    version: int = 1                    # 1: FullyShardedDataParallel (the paper's); 2: fully_shard
    backward_prefetch: str = "pre"      # FSDP1: BACKWARD_PRE / BACKWARD_POST / none
    limit_all_gathers: bool = True      # FSDP1
    forward_prefetch: bool = False      # FSDP1
    use_orig_params: bool = False       # FSDP1
    cpu_offload: bool = False           # needs a GPU with FSDP1 (pinned memory)


@dataclass
class DeepSpeedConfig:
    offload_optimizer: bool = False     # to CPU; uses DeepSpeed's own optimizer, which offload requires
    offload_params: bool = False        # ZeRO-3 only (ZERO3, ZEROPP)
    overlap_comm: bool = True
    contiguous_gradients: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000   # ZeRO-1/2
    prefetch_bucket_size: int = 50_000_000     # ZeRO-3: stage3_prefetch_bucket_size
    param_persistence_threshold: int = 100_000  # ZeRO-3: parameters smaller than this stay gathered
    gradient_clipping: float = 0.0      # DeepSpeed clips at 1.0 by default; 0 keeps it equal to the others
    hpz_partition_size: int = 0         # ZEROPP: 0 = ranks per node
    quantized_weights: bool = True      # ZEROPP qwZ (GPU only)
    quantized_gradients: bool = True    # ZEROPP qgZ (GPU only)
    skip_shm_comm: bool = True          # CPU only: do not build DeepSpeed's shm op (inference all-reduce only)


@dataclass
class ColossalAIConfig:
    zero_stage: int = 2                 # CAI_LOW_LEVEL_ZERO: 1 or 2
    cpu_offload: bool = False           # CAI_LOW_LEVEL_ZERO
    placement_policy: str = "static"    # CAI_GEMINI
    offload_optim_frac: float = 0.0     # CAI_GEMINI (static placement)
    offload_param_frac: float = 0.0     # CAI_GEMINI (static placement)
    pin_memory: bool = False            # CAI_GEMINI
    preset: str = "none"                # seed000: offload_optim_frac=1.0, pin_memory=True (overrides both)
    initial_scale: float = 65536.0      # fp16 loss scale to start from (CAI_DDP_FP16 uses torch's GradScaler default)
    bucket_cap_mb: int = 25             # CAI_DDP, CAI_DDP_FP16: DDP gradient bucket size


@dataclass
class OutputConfig:
    dir: str = "runs"
    study: str = "default"
    run_id: str = ""                    # empty: <UTC time>[-j<job>.<step>]
    repetition: int = 0                 # which of a study's --repeat runs of its point (1, 2 ...); 0: not a study's


@dataclass
class SystemConfig:
    launcher: str = "auto"              # where rank and world size come from; auto detects it
    device: str = "auto"                # auto = the GPU when there is one (cuda also means ROCm)
    peak_tflops: Optional[float] = None  # per device, overrides the built-in table for MFU
    collective_timeout_s: int = 300     # a dead or stuck rank ends the job after this
    ranks_per_node: int = 0             # 0 = from the launcher (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE)


@dataclass
class PlanConfig:
    skip_if_not_fits: bool = False      # record the run as skipped instead of running into OOM
    device_memory_gib: Optional[float] = None


@dataclass
class DataConfig:
    """Real images for `vit-scale finetune` (the benchmark `train` uses synthetic data and ignores this)."""
    path: str = ""                      # dataset root; nothing is downloaded, a missing path is an error
    format: str = "auto"                # auto | imagefolder | cifar10 | cifar100 | hf (datasets.save_to_disk)
    train_split: str = "train"          # sub-folder (image folder) or split name (hf)
    val_split: str = "auto"             # auto: val, validation or test if present, else val_fraction of train
    val_fraction: float = 0.1           # held out of train (per class, seeded) when there is no validation split
    image_key: str = "auto"             # hf: image column (auto: image, img)
    label_key: str = "auto"             # hf: label column (auto: label, labels, fine_label)
    augment: str = "standard"           # standard (random resized crop + flip) | crop (no flip: digits, text) | none
    crop_scale_min: float = 0.08        # smallest area fraction a random resized crop keeps
    normalize: str = "inception"        # inception (mean=std=0.5, timm's ViT weights) | imagenet | none
    workers: int = 4                    # loader processes per rank; 0 loads in the training process
    pin_memory: bool = True             # page-locked host batches (GPU runs only)


@dataclass
class LoraConfig:
    """Low-rank adapters (peft) in place of training every weight: the model's weights stay frozen,
    the adapters and the new head train (docs/finetune.md, "LoRA")."""
    rank: int = 0                       # adapter rank r; 0 = no LoRA, every weight trains
    alpha: float = 16.0                 # the adapters' update is scaled by alpha / rank
    dropout: float = 0.0                # dropout on each adapter's input; below 1
    targets: str = "qkv,proj,fc1,fc2"   # Linear layers of each Block that get adapters (attn.qkv/proj, mlp.fc1/fc2)


@dataclass
class FinetuneConfig:
    """Schedule and evaluation of `vit-scale finetune`; batch size, lr, weight decay, seed and precision
    are train.* as for the benchmark."""
    epochs: int = 10
    steps: int = 0                      # optimizer steps in all; 0 = epochs x steps per epoch
    lr_warmup_steps: int = 0            # linear warm-up, then cosine decay to min_lr
    min_lr: float = 0.0
    accumulation_steps: int = 1         # micro-batches per optimizer step (gradients synchronised on the last)
    clip_grad_norm: float = 1.0         # 0 = no clipping
    label_smoothing: float = 0.1
    pretrained: str = ""                # local timm checkpoint (.pth, .pt, .bin) or .safetensors; empty = from scratch
    eval_batch_size: int = 0            # 0 = train.batch_size
    confusion_matrix: bool = True       # confusion_matrix.png/.csv and per_class_accuracy.csv at the end
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class CheckpointConfig:
    dir: str = ""                       # empty = <run directory>/checkpoints; set it to resume across jobs
    every_steps: int = 0                # 0 = only at the end and on a signal
    keep: int = 2                       # most recent checkpoints kept; 0 keeps all
    at_end: bool = True
    on_signal: bool = True              # SIGUSR1/SIGTERM: save, then exit 7 (requeue)
    resume: str = ""                    # empty = fresh start | auto (latest in dir, if any) | a checkpoint path
    signal_grace_s: int = 100           # after a signal, how long the save may take before the watcher ends the run


@dataclass
class ProfileConfig:
    """torch.profiler traces of a few extra steps after the timed window, one Chrome trace per rank in
    the run directory; no figure of the run includes the profiler (docs/profiling.md)."""
    enabled: bool = False
    steps: int = 3                      # steps recorded, run after train.steps
    ranks: str = "all"                  # all, or comma-separated ranks, e.g. 0,1


@dataclass
class TrackingConfig:
    """Where else the run's figures go, besides its record: TensorBoard event files in the run
    directory, or Weights & Biases (offline by default: compute nodes rarely reach the internet;
    `wandb sync` the run directory's wandb/ folder later)."""
    backend: str = "none"               # none | tensorboard | wandb
    project: str = "vit-scale"          # W&B project
    wandb_mode: str = "offline"         # offline | online


@dataclass
class Config:
    model: str = "vit_micro"          # a registered model (docs/models.md)
    strategy: str = "DDP"             # a strategy label (docs/strategies.md: what runs where)
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


CHOICES = {
    "train.precision": PRECISIONS,
    "train.init": ("auto", "device", "meta"),
    "train.optimizer": ("auto", "fused", "foreach", "single"),
    "fsdp.version": (1, 2),
    "fsdp.backward_prefetch": ("none", "pre", "post"),
    "colossalai.zero_stage": (1, 2),
    "colossalai.placement_policy": ("static", "auto"),
    "colossalai.preset": ("none", "seed000"),
    "system.launcher": ("auto", "torchrun", "srun", "mpi", "single"),
    "system.device": ("auto", "cuda", "cpu"),
    "data.format": ("auto", "imagefolder", "cifar10", "cifar100", "hf"),
    "data.augment": ("standard", "crop", "none"),
    "data.normalize": ("inception", "imagenet", "none"),
    "tracking.backend": ("none", "tensorboard", "wandb"),
    "tracking.wandb_mode": ("offline", "online"),
}
POSITIVE = ("train.batch_size", "train.steps", "train.num_classes", "train.log_every", "train.print_every",
            "train.synthetic_batches", "system.collective_timeout_s", "deepspeed.reduce_bucket_size",
            "deepspeed.allgather_bucket_size", "deepspeed.prefetch_bucket_size", "colossalai.initial_scale",
            "colossalai.bucket_cap_mb", "finetune.epochs", "finetune.accumulation_steps",
            "checkpoint.signal_grace_s", "profile.steps")
NON_NEGATIVE = ("train.warmup_steps", "train.lr", "train.weight_decay", "train.seed", "deepspeed.gradient_clipping",
                "deepspeed.hpz_partition_size", "deepspeed.param_persistence_threshold",
                "colossalai.offload_optim_frac", "colossalai.offload_param_frac", "system.ranks_per_node",
                "data.workers", "finetune.steps", "finetune.lr_warmup_steps", "finetune.min_lr",
                "finetune.clip_grad_norm", "finetune.label_smoothing", "finetune.eval_batch_size",
                "checkpoint.every_steps", "checkpoint.keep", "finetune.lora.rank", "finetune.lora.alpha",
                "output.repetition")
FRACTIONS = ("colossalai.offload_optim_frac", "colossalai.offload_param_frac", "data.val_fraction",
             "data.crop_scale_min", "finetune.label_smoothing", "finetune.lora.dropout")


# ---------------------------------------------------------------- loading

def _field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(key: str, raw: Any, typ: Any) -> Any:
    """Convert a YAML value or an override string to the field's type, or say what was expected."""
    origin = typing.get_origin(typ)
    if origin is typing.Union:  # Optional[X]
        inner = [a for a in typing.get_args(typ) if a is not type(None)][0]
        if raw is None or (isinstance(raw, str) and raw.lower() in ("null", "none", "")):
            return None
        return _convert(key, raw, inner)
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
            if dataclasses.is_dataclass(typ):
                if not isinstance(raw, dict):
                    raise UserError(f"{path}: expected a mapping of {', '.join(f.name for f in dataclasses.fields(typ))}")
                for sub, val in raw.items():
                    _apply(cfg, f"{path}.{sub}", val)
            else:
                setattr(obj, part, _convert(path, raw, typ))
            return
        obj = getattr(obj, part)


def load_config(path: Optional[str] = None, overrides: list[str] = ()) -> Config:
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

def _get(cfg: Config, key: str) -> Any:
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def validate(cfg: Config) -> None:
    from vit_scale.distributed import parse_strategy
    from vit_scale.models import get_spec

    get_spec(cfg.model)
    parse_strategy(cfg.strategy)
    for key, allowed in CHOICES.items():
        if _get(cfg, key) not in allowed:
            raise UserError(f"{key}: {_get(cfg, key)!r} is not allowed; allowed: {', '.join(map(str, allowed))}")
    for key in POSITIVE:
        if _get(cfg, key) < 1:
            raise UserError(f"{key}: must be at least 1, got {_get(cfg, key)}")
    for key in NON_NEGATIVE:
        if _get(cfg, key) < 0:
            raise UserError(f"{key}: must not be negative, got {_get(cfg, key)}")
    for key in FRACTIONS:
        if _get(cfg, key) > 1:
            raise UserError(f"{key}: must be between 0 and 1, got {_get(cfg, key)}")
    if cfg.train.warmup_steps >= cfg.train.steps:
        raise UserError(f"train.warmup_steps: must be less than train.steps ({cfg.train.steps}) so that some steps "
                        f"are timed, got {cfg.train.warmup_steps}")
    if cfg.train.tf32 and cfg.train.precision != "fp32":
        raise UserError(f"train.tf32: only for train.precision=fp32 (a {cfg.train.precision} run already does its "
                        f"matmuls in {cfg.train.precision}); set train.tf32=false or train.precision=fp32")
    if cfg.profile.ranks != "all" and not re.fullmatch(r"\d+(,\d+)*", cfg.profile.ranks.replace(" ", "")):
        raise UserError(f"profile.ranks: {cfg.profile.ranks!r} is not allowed; allowed: all, or ranks such as 0 or 0,1")
    if cfg.system.peak_tflops is not None and cfg.system.peak_tflops <= 0:
        raise UserError(f"system.peak_tflops: must be positive, got {cfg.system.peak_tflops}")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", cfg.output.study):
        raise UserError(f"output.study: {cfg.output.study!r} must be letters, digits, '.', '_' or '-'")
    if cfg.output.run_id and not re.fullmatch(r"[A-Za-z0-9._-]+", cfg.output.run_id):
        raise UserError(f"output.run_id: {cfg.output.run_id!r} must be letters, digits, '.', '_' or '-'")
    if not 0 < cfg.data.crop_scale_min:
        raise UserError(f"data.crop_scale_min: must be above 0 and at most 1, got {cfg.data.crop_scale_min}")
    if cfg.finetune.label_smoothing >= 1:
        raise UserError(f"finetune.label_smoothing: must be less than 1, got {cfg.finetune.label_smoothing}")
    from vit_scale.recipes.lora import BLOCK_PATHS, parse_targets

    lora = cfg.finetune.lora
    targets = parse_targets(lora.targets)
    if not targets or any(t not in BLOCK_PATHS for t in targets):
        raise UserError(f"finetune.lora.targets: {lora.targets!r} is not allowed; allowed: a comma-separated list of "
                        f"{', '.join(BLOCK_PATHS)}")
    if lora.dropout >= 1:
        raise UserError(f"finetune.lora.dropout: must be less than 1, got {lora.dropout}")
    if lora.rank and lora.alpha <= 0:
        raise UserError(f"finetune.lora.alpha: must be above 0 (the adapters' update is scaled by alpha / rank), "
                        f"got {lora.alpha}")
    if cfg.finetune.min_lr > cfg.train.lr:
        raise UserError(f"finetune.min_lr: must not exceed train.lr ({cfg.train.lr}), got {cfg.finetune.min_lr}")
    out = cfg.output.dir
    probe = out
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe.rstrip("/"))
    if probe and not os.path.isdir(probe):
        raise UserError(f"output.dir: {probe} is a file, not a directory; choose another output.dir")


def to_yaml(cfg: Config) -> str:
    import yaml

    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


# ---------------------------------------------------------------- help

# sections `vit-scale train` reads; `vit-scale finetune` reads every section
BENCHMARK_SECTIONS = ("train", "fsdp", "deepspeed", "colossalai", "output", "system", "plan", "profile",
                      "tracking")


def _field_comments(cls) -> dict[str, str]:
    """The comment beside each field in this file: the one description of a key, kept next to it."""
    import inspect

    comments = {}
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+):[^=#]*=[^#]*#\s*(.+)$", line)
        if m:
            comments[m.group(1)] = m.group(2).strip()
    return comments


def _allowed(key: str, typ: Any) -> str:
    from vit_scale.distributed import allowed_text
    from vit_scale.models import MODELS

    if key == "model":
        return ", ".join(MODELS)
    if key == "strategy":
        return allowed_text()
    if key in CHOICES:
        return " | ".join(map(str, CHOICES[key]))
    if typing.get_origin(typ) is typing.Union:
        inner = [a for a in typing.get_args(typ) if a is not type(None)][0]
        return _allowed(key, inner) + " or null"
    if typ is bool:
        return "true | false"
    kind = {int: "integer", float: "number", str: "text"}.get(typ, "value")
    if key in FRACTIONS:
        return f"{kind} from 0 to 1"
    if key in POSITIVE:
        return f"{kind} >= 1"
    if key in NON_NEGATIVE:
        return f"{kind} >= 0"
    return kind


def _keys_help(sections) -> str:
    import textwrap

    out = ["keys (key=value here, or the same keys nested in the --config YAML); default, then what is allowed:"]

    def entry(key, default, typ, comment):
        shown = "(empty)" if default == "" else ("null" if default is None else str(default).lower()
                                                 if isinstance(default, bool) else str(default))
        out.append(f"  {key} = {shown}    [{_allowed(key, typ)}]")
        if comment:
            out.extend(textwrap.wrap(comment, width=96, initial_indent="      ", subsequent_indent="      "))

    top = _field_comments(Config)
    hints = _field_types(Config)
    for f in dataclasses.fields(Config):
        if not dataclasses.is_dataclass(hints[f.name]):
            entry(f.name, f.default, hints[f.name], top.get(f.name, ""))
    for f in dataclasses.fields(Config):
        cls = hints[f.name]
        if not dataclasses.is_dataclass(cls) or f.name not in sections:
            continue
        out.append(f"{f.name}:")
        doc = (cls.__doc__ or "").strip()
        if doc and not doc.startswith(f"{cls.__name__}("):  # dataclasses make up a docstring when there is none
            out.extend(textwrap.wrap(" ".join(doc.split()), width=96, initial_indent="  ", subsequent_indent="  "))
        _section_entries(f.name, cls, entry)
    return "\n".join(out)


def _section_entries(prefix: str, cls, entry) -> None:
    """entry() for each key of a section, the keys of a nested section (finetune.lora) after them."""
    comments, types = _field_comments(cls), _field_types(cls)
    nested = []
    for sub in dataclasses.fields(cls):
        if dataclasses.is_dataclass(types[sub.name]):
            nested.append(sub)
        else:
            entry(f"{prefix}.{sub.name}", getattr(cls(), sub.name), types[sub.name], comments.get(sub.name, ""))
    for sub in nested:
        _section_entries(f"{prefix}.{sub.name}", types[sub.name], entry)


def parse_command_line(argv, prog: str, description: str, configs: str, example: str, sections=None):
    """`[--config FILE] [key=value ...]`, the command line every run-type command takes; --help
    lists every key of `sections` (default: all) with its default and allowed values."""
    import argparse

    names = sections or [f.name for f in dataclasses.fields(Config)]
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=_keys_help(names),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help=f"YAML file of keys (see {configs}); overrides come after it")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=f"e.g. {example}")
    return parser.parse_args(argv)
