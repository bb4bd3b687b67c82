"""Which strategy label trains in which precision on which kind of device: one table.

Validation (`Strategy.check`), `docs/strategies.md` (the table between its markers is this
module's `markdown()`, and a test fails when they differ) and `vit-scale plan` all read it, so a
pair that is refused is refused everywhere with the same reason, and a pair that is allowed is
one the project believes trains. Where a pair was actually seen training is said too: on this
project's CPU test suite, or on an H100 (torch 2.11, CUDA 13, ColossalAI 0.5.0). "allowed, not
yet run" is the honest state of everything else.

Option-level rules (hpZ dividing the world, parameter offload on ZeRO-3 only...) stay in each
family's `check`; this table is label x precision x device kind. A refusal that depends on an
option's value as well as on the device (a Rule with `options`) is here too, so the trainer and
`vit-scale plan` give it the same line; it applies only where the caller passes the config
(`refusal(..., cfg)`), and the docs' table marks such a pair. No torch import here.

    python -m vit_scale.distributed.capabilities      # prints the markdown table
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vit_scale.distributed import PRECISIONS, all_labels, family_labels, label_pattern

DEVICE_KINDS = ("cpu", "cuda", "rocm")
ANY = None  # a rule field that matches every value

# the rows of the table, as the family packages declare them; HYBRID_<g>GPU stands for every g
FSDP_LABELS = family_labels()["fsdp"]
DEEPSPEED_LABELS = family_labels()["deepspeed"]
TABLE_LABELS = tuple(all_labels())


@dataclass(frozen=True)
class Rule:
    labels: tuple | None  # None: every label
    precisions: tuple | None
    devices: tuple | None
    key: str  # the config key the error names
    reason: str
    options: tuple = ()  # ((dotted config key, value), ...): refused only with these set

    def matches(self, label: str, precision: str, device: str) -> bool:
        return all(
            allowed is ANY or value in allowed
            for value, allowed in ((label, self.labels), (precision, self.precisions), (device, self.devices))
        )

    def options_set(self, cfg) -> bool:
        return all(_config_value(cfg, key) == value for key, value in self.options)

    def options_text(self) -> str:
        return " ".join(
            f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in self.options
        )


def _config_value(cfg, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)


# First match wins, so on a CPU the GPU-only plugins say that first. Each reason says what fails
# and what to use instead.
REFUSALS = (
    Rule(
        ("CAI_DDP_FP16",),
        ANY,
        ("cpu",),
        "strategy",
        "CAI_DDP_FP16 needs a GPU (fp16 mixed precision: CUDA autocast and grad scaling); on a CPU use CAI_DDP "
        "with train.precision=fp32 or bf16",
    ),
    Rule(
        ("CAI_LOW_LEVEL_ZERO",),
        ANY,
        ("cpu",),
        "strategy",
        "CAI_LOW_LEVEL_ZERO needs a GPU (ColossalAI's LowLevelZero plugin: accelerator buffers and kernels); "
        "on a CPU use CAI_DDP with train.precision=fp32 or bf16",
    ),
    Rule(
        ("CAI_GEMINI",),
        ANY,
        ("cpu",),
        "strategy",
        "CAI_GEMINI needs a GPU (ColossalAI's Gemini plugin: chunk manager and HybridAdam kernels); on a CPU use "
        "CAI_DDP with train.precision=fp32 or bf16",
    ),
    Rule(
        ("CAI_FSDP",),
        ANY,
        ("cpu",),
        "strategy",
        "CAI_FSDP needs a GPU (ColossalAI's TorchFSDPPlugin wraps FSDP on torch.cuda.current_device()); on a CPU "
        "use CAI_DDP with train.precision=fp32 or bf16",
    ),
    Rule(
        ("CAI_DDP_FP16",),
        ("fp32", "bf16"),
        ANY,
        "train.precision",
        "CAI_DDP_FP16 is fp16 mixed precision by name; set train.precision=fp16, or use CAI_DDP for fp32 or bf16",
    ),
    Rule(
        ("CAI_GEMINI",),
        ("fp32",),
        ANY,
        "train.precision",
        "CAI_GEMINI runs in fp16 or bf16 only (Gemini has no fp32 mode); set train.precision=fp16 or bf16",
    ),
    Rule(
        ("CAI_FSDP",),
        ("fp16",),
        ANY,
        "train.precision",
        "CAI_FSDP with fp16: ColossalAI's TorchFSDPPlugin applies no loss scaling to fp16 gradients; use bf16, "
        "or FULL_SHARD with train.precision=fp16 (FSDP with a ShardedGradScaler)",
    ),
    Rule(
        ("CAI_GEMINI",),
        ANY,
        ("rocm",),
        "strategy",
        "CAI_GEMINI does not run on ROCm: ColossalAI 0.5.0 builds HybridAdam's kernels with nvcc and has no ROCm "
        "build; use CAI_LOW_LEVEL_ZERO or ZERO3",
    ),
    # HybridAdam's constructor loads CPUAdamLoader and FusedOptimizerLoader, both _CudaExtension
    # (colossalai/kernel/extensions/cuda_extension.py assert_compatible): they need CUDA_HOME, which
    # torch leaves None on a ROCm build, so the optimizer fails when the run builds it
    Rule(
        ("CAI_LOW_LEVEL_ZERO",),
        ANY,
        ("rocm",),
        "colossalai.cpu_offload",
        "CAI_LOW_LEVEL_ZERO with cpu_offload uses HybridAdam, whose kernels ColossalAI 0.5.0 builds with nvcc only "
        "(no ROCm build); on ROCm set colossalai.cpu_offload=false, or offload with ZERO2 and "
        "deepspeed.offload_optimizer=true",
        options=(("colossalai.cpu_offload", True),),
    ),
    Rule(
        ("CAI_DDP",),
        ("fp16",),
        ("cpu",),
        "train.precision",
        "CAI_DDP with fp16 needs a GPU (the Booster's fp16 is CUDA autocast and grad scaling); on a CPU use "
        "train.precision=fp32 or bf16",
    ),
    Rule(
        FSDP_LABELS,
        ("fp16",),
        ("cpu",),
        "train.precision",
        "fp16 with FSDP needs a GPU (sharded grad scaling is CUDA-only); use bf16 or fp32 on a CPU",
    ),
    Rule(
        DEEPSPEED_LABELS,
        ("fp16",),
        ("cpu",),
        "train.precision",
        "fp16 with DeepSpeed needs a GPU (DeepSpeed's CPU accelerator has no fp16: 'Type fp16 is not supported "
        "on your device'); use bf16 or fp32 on a CPU",
    ),
)

# Pairs that run only with some options set; the walk test sets them and checks the refusal without.
CONDITIONS = (
    (
        Rule(("ZEROPP",), ANY, ("cpu",), "strategy", "ZEROPP quantisation (qwZ, qgZ) has no CPU kernel in DeepSpeed"),
        ("deepspeed.quantized_weights=false", "deepspeed.quantized_gradients=false"),
    ),
)

# Where a pair was seen training, beyond this project's CPU tests (which run every allowed cpu pair).
H100 = "H100"
SEEN_ON_GPU = {
    # issue 10: one H100, torch 2.11 + CUDA 13, vit_base batch 32
    **{
        (label, "bf16", "cuda"): H100
        for label in (
            "DDP",
            "NO_SHARD",
            "FULL_SHARD",
            "SHARD_GRAD_OP",
            "HYBRID_<g>GPU",
            "ZERO2",
            "ZERO3",
            "CAI_LOW_LEVEL_ZERO",
            "CAI_FSDP",
        )
    },
    ("CAI_DDP_FP16", "fp16", "cuda"): H100,
}


@dataclass(frozen=True)
class Capability:
    label: str
    precision: str
    device: str
    runs: bool
    key: str = ""  # refused: the config key the one-line error names
    reason: str = ""  # refused: why, and what to use instead; allowed with needs: why those
    needs: tuple = ()  # overrides without which the pair is refused
    seen: str = ""  # "CPU tests", "H100", or "" (allowed, not yet run)
    refused_with: tuple = ()  # allowed: the option rules (Rule) that would refuse it

    @property
    def error(self) -> str:
        return f"{self.key}: {self.reason}"


def table_label(label: str) -> str:
    """The row a concrete label belongs to: HYBRID_2GPU -> HYBRID_<g>GPU; an unknown one is its own
    (validation names it; the table has nothing to say about it)."""
    return next((row for row in TABLE_LABELS if re.fullmatch(label_pattern(row), label)), label)


def capability(label: str, precision: str, device: str, cfg=None) -> Capability:
    """The verdict for a pair; with `cfg` (a vit_scale.config.Config) option rules apply too."""
    row = table_label(label)
    if precision not in PRECISIONS or device not in DEVICE_KINDS:
        raise ValueError(f"precision {precision!r} or device kind {device!r} unknown")
    refused_with = []
    for rule in REFUSALS:
        if not rule.matches(row, precision, device):
            continue
        if rule.options and not (cfg is not None and rule.options_set(cfg)):
            refused_with.append(rule)
            continue
        return Capability(label, precision, device, False, rule.key, rule.reason)
    needs, reason = (), ""
    for rule, overrides in CONDITIONS:
        if rule.matches(row, precision, device):
            needs, reason = overrides, rule.reason
    seen = "CPU tests" if device == "cpu" else SEEN_ON_GPU.get((row, precision, device), "")
    return Capability(
        label, precision, device, True, reason=reason, needs=needs, seen=seen, refused_with=tuple(refused_with)
    )


def refusal(label: str, precision: str, device: str, cfg=None) -> str | None:
    """The one-line error for a pair that cannot run ('key: reason'), or None. Pass the run's
    config to have the option rules checked as well."""
    cap = capability(label, precision, device, cfg)
    return None if cap.runs else cap.error


def table() -> list[Capability]:
    return [
        capability(label, precision, device)
        for label in TABLE_LABELS
        for device in DEVICE_KINDS
        for precision in PRECISIONS
    ]


# ---------------------------------------------------------------- the docs' table


def _cell(cap: Capability) -> str:
    if not cap.runs:
        return "refused"
    text = {"CPU tests": "tested", H100: "H100", "": "allowed"}[cap.seen]
    return text + (" *" if cap.needs else "") + (" †" if cap.refused_with else "")


def markdown() -> str:
    """The table docs/strategies.md carries: one row per label, one column per device x precision,
    then every refusal and condition with its reason."""
    columns = [(d, p) for d in DEVICE_KINDS for p in PRECISIONS]
    lines = ["| label | " + " | ".join(f"{d} {p}" for d, p in columns) + " |", "|---|" + "---|" * len(columns)]
    # (with options, key, reason) -> label -> ["device precision"]
    reasons: dict[tuple, dict[str, list[str]]] = {}
    for label in TABLE_LABELS:
        cells = []
        for device, precision in columns:
            cap = capability(label, precision, device)
            cells.append(_cell(cap))
            whys = [("", cap.key, cap.reason)] if not cap.runs else []
            whys += [("", "", f"{cap.reason}; runs with {' '.join(cap.needs)}")] if cap.needs else []
            whys += [(rule.options_text(), rule.key, rule.reason) for rule in cap.refused_with]
            for why in whys:
                reasons.setdefault(why, {}).setdefault(label, []).append(f"{device} {precision}")
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "tested: trained by the CPU test suite (tests/test_capabilities.py walks every cpu pair); H100: seen "
        "training on an H100; allowed: expected to train, not yet run; refused: stops before it starts. ",
        "",
        "Every refused pair stops with exit code 2 and this one line, before any process group starts "
        "(\\* = runs only with the options named; † = refused with the options named):",
        "",
    ]
    for (options, key, reason), by_label in reasons.items():
        pairs = "; ".join(f"{label} ({', '.join(where)})" for label, where in by_label.items())
        lines.append(
            f"- {pairs}" + (f" with {options}" if options else "") + ": " + (f"`{key}: {reason}`" if key else reason)
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
