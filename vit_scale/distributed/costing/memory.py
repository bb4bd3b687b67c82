"""A family's memory terms: its components per phase of the step, and the optimizer's rules every
family shares (vit_scale.planning.memory adds activations and the allocator; docs/plan.md).

Phases: forward_end, backward_start, backward_end, optimizer_step. A per-phase value is a dict
{phase: bytes}; `per_phase` and `const` build one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil

PHASES = ("forward_end", "backward_start", "backward_end", "optimizer_step")
F, B0, B1, S = PHASES


def per_phase(forward_end=0.0, backward_start=0.0, backward_end=0.0, optimizer_step=0.0) -> dict:
    return {F: forward_end, B0: backward_start, B1: backward_end, S: optimizer_step}


def const(value: float) -> dict:
    return per_phase(value, value, value, value)


@dataclass
class StateMemory:
    """The strategy-dependent components (bytes), before activations and the backward workspace."""

    params: float
    optimizer: float
    grads: dict
    in_flight: dict
    buckets: dict
    optimizer_temporaries: float
    stream_held: dict = field(default_factory=lambda: const(0.0))
    # freed on the host, not yet reusable (the device is behind): counted in the allocator's active bytes,
    # which the seed-003 authors measured, but not in what must fit, since the caching allocator
    # synchronises and reclaims such blocks before it raises out-of-memory (synchronize_and_free_events)
    pending_frees: dict = field(default_factory=lambda: const(0.0))
    autocast: bool = False  # activations under torch.autocast (fp32 residual stream) or not
    compute_bytes: int = 4  # bytes of a low-precision activation / parameter copy
    optimizer_impl: str = ""
    notes: list[str] = field(default_factory=list)


def bytes_of(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def numels(tensors) -> list[int]:
    return [numel(s) for s in tensors]


def optimizer_temporaries(impl: str, foreach_numel: int, largest_numel: int) -> float:
    """AdamW's step: foreach computes sqrt(exp_avg_sq) for the whole tensor list at once (one fp32
    buffer the size of the list); the single-tensor loop does it per tensor (two buffers of the
    largest tensor, the sqrt and its division); fused kernels need none."""
    if impl == "foreach":
        return 4.0 * foreach_numel
    if impl == "single":
        return 8.0 * largest_numel
    return 0.0


def auto_optimizer(sc, plain_tensor_params: bool) -> str:
    """The AdamW kernel the run uses. `auto` is the trainer's choice on a GPU
    (distributed.parts.optimizer_kernel): the fused kernel, which needs no step temporaries.
    `plain_tensor_params` says whether torch could run foreach/fused over the parameters at all
    (FSDP1's FlatParameter counts as a Parameter; checked in tests/plan_tensors.py)."""
    if sc.optimizer != "auto":
        return sc.optimizer
    return "fused" if plain_tensor_params else "single"


def shard_pad(n: int, g: int) -> int:
    return ceil(n / g)
