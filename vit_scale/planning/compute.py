"""Compute per step from the matrix multiplies a ViT Block runs, timed by `vit-scale check` on the
user's own device at the model's shapes, batch and precision (check.json's `compute`).

    ops = block_gemms(Shape.from_spec(get_spec("vit_base")), batch=32)   # what the check times
    entries = read_compute(check, "check.json")                            # what it timed, checked
    comp = compute_of_gemms(entries[("vit_base", "bf16", 32)], scenario)  # the step's compute

One Block's GEMMs are the four Linears (qkv, attention projection, fc1, fc2), each forward
(tokens x in x out) and its two backward GEMMs (the input's gradient and the weight's), and the
attention's two batched matmuls (q.k^T, attn.v) with their four backward ones. Their FLOPs are
exactly step_time.forward_flops_per_image's Block, three times (forward + backward). The step's
compute is then, as step_time counts FLOPs:

    forward  = L x (the Block's forward GEMMs, as timed)  + (stem + head forward FLOPs) / rate
    backward = L x (the Block's backward GEMMs, as timed) + 2 x (stem + head forward FLOPs) / rate
               + L x (the Block's forward GEMMs) under activation checkpointing (the recompute)

rate: the measured GEMMs' FLOPs over their seconds. The patch embedding and the head, which the
check does not time, are charged at that rate; what FLOPs do not count (LayerNorm, softmax, GELU,
the optimizer) is not charged, as with an efficiency. Torch-free. docs/plan.md says more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vit_scale.errors import UserError
from vit_scale.planning.scenario import Scenario
from vit_scale.planning.shapes import Shape
from vit_scale.planning.step_time import Compute, forward_flops_per_image

OP_KEYS = ("op", "pass", "batch", "m", "k", "n", "flops", "seconds")
ENTRY_KEYS = ("model", "precision", "batch_size", "ops")
LABEL = "check's GEMMs at this model's shapes"


def block_gemms(shape: Shape, batch: int) -> list[dict]:
    """One Block's matrix multiplies at `batch` images: op, pass (forward/backward), the batched
    matmul's size (batch x m x k times batch x k x n) and which operand is read transposed, as the
    library runs them (a Linear's forward is X W^T, its weight's gradient dY^T X), and the FLOPs
    (2 per multiply-add)."""
    D, M, T, H = shape.D, shape.M, shape.T, shape.H
    N, hd, bh = batch * T, D // H, batch * H
    ops = []

    def add(op, pas, b, m, k, n, a_t=False, b_t=False):
        sizes = {"batch": b, "m": m, "k": k, "n": n, "a_t": a_t, "b_t": b_t}
        ops.append({"op": op, "pass": pas, **sizes, "flops": 2 * b * m * k * n})

    for name, fan_in, fan_out in (("qkv", D, 3 * D), ("proj", D, D), ("fc1", D, M), ("fc2", M, D)):
        add(f"{name}.forward", "forward", 1, N, fan_in, fan_out, b_t=True)  # X W^T
        add(f"{name}.grad_input", "backward", 1, N, fan_out, fan_in)  # dY W
        add(f"{name}.grad_weight", "backward", 1, fan_out, N, fan_in, a_t=True)  # dY^T X
    add("attn.scores.forward", "forward", bh, T, hd, T, b_t=True)  # q k^T
    add("attn.context.forward", "forward", bh, T, T, hd)  # attn v
    add("attn.context.grad_attn", "backward", bh, T, hd, T, b_t=True)  # dO v^T
    add("attn.context.grad_v", "backward", bh, T, T, hd, a_t=True)  # attn^T dO
    add("attn.scores.grad_q", "backward", bh, T, T, hd)  # dS k
    add("attn.scores.grad_k", "backward", bh, T, T, hd, a_t=True)  # dS^T q
    return ops


@dataclass(frozen=True)
class GemmTimings:
    """One entry of check.json's compute: a model's Block GEMMs timed at a precision and batch."""

    model: str
    precision: str
    batch_size: int
    forward_s: float  # one Block's forward GEMMs, summed
    backward_s: float  # its backward GEMMs
    flops: float  # all of them
    device: str = ""
    where: str = ""

    @property
    def rate(self) -> float:
        """FLOP/s the timed GEMMs achieved together."""
        return self.flops / (self.forward_s + self.backward_s)

    @property
    def key(self) -> tuple:
        return (self.model, self.precision, self.batch_size)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def read_compute(check: dict, where: str) -> dict:
    """check.json's `compute` entries by (model, precision, batch), each op's FLOPs and seconds finite
    and above 0 (else a UserError naming the entry). A check without the entry (written before it, or a
    check whose compute part failed) gives none: {}."""
    found = check.get("compute")
    if found is None:
        return {}
    if not isinstance(found, dict) or not isinstance(found.get("entries", []), list):
        raise UserError(f"--calibration: {where}: compute must be a mapping with a list of entries")
    out = {}
    device = str(found.get("device") or "")
    for i, entry in enumerate(found.get("entries") or []):
        name = f"compute.entries[{i}]"
        if not isinstance(entry, dict) or any(k not in entry for k in ENTRY_KEYS) or not isinstance(entry["ops"], list):
            raise UserError(f"--calibration: {where}: {name} needs the keys {', '.join(ENTRY_KEYS)} (ops a list)")
        name += f" ({entry['model']} {entry['precision']} batch {entry['batch_size']})"
        if not entry["ops"]:
            raise UserError(f"--calibration: {where}: {name} has no ops; expected the Block's timed GEMMs")
        if isinstance(entry["batch_size"], bool) or not isinstance(entry["batch_size"], int) or entry["batch_size"] < 1:
            raise UserError(f"--calibration: {where}: {name}: batch_size must be a positive whole number")
        sums = {"forward": 0.0, "backward": 0.0}
        flops = 0.0
        for j, op in enumerate(entry["ops"]):
            if not isinstance(op, dict) or any(k not in op for k in OP_KEYS) or op["pass"] not in sums:
                raise UserError(
                    f"--calibration: {where}: {name}: ops[{j}] needs the keys {', '.join(OP_KEYS)}, pass forward or "
                    "backward"
                )
            for key in ("flops", "seconds"):
                value = op[key]
                if not _number(value) or not math.isfinite(value) or not value > 0:
                    raise UserError(
                        f"--calibration: {where}: {name}: ops[{j}] ({op['op']}): {key} must be a finite number above "
                        f"0, got {value!r}"
                    )
            sums[op["pass"]] += op["seconds"]
            flops += op["flops"]
        out[(entry["model"], entry["precision"], entry["batch_size"])] = GemmTimings(
            entry["model"],
            entry["precision"],
            entry["batch_size"],
            sums["forward"],
            sums["backward"],
            flops,
            device,
            where,
        )
    return out


def compute_of_gemms(t: GemmTimings, sc: Scenario) -> Compute:
    """The step's compute from one Block's timed GEMMs (the module docstring's sum); the scenario must
    be of the timings' model, precision and batch (covers)."""
    if t.key != (sc.model, sc.precision, sc.batch_size):
        raise ValueError(f"compute: GEMMs of {t.key} applied to {(sc.model, sc.precision, sc.batch_size)}")
    shape = sc.shape
    f = forward_flops_per_image(shape)
    rest = sc.batch_size * (f["stem"] + f["head"]) / t.rate  # the patch embedding and head, forward
    recompute = shape.L * t.forward_s if sc.activation_checkpointing else 0.0
    forward = shape.L * t.forward_s + rest
    backward = shape.L * t.backward_s + 2 * rest + recompute
    source = (
        f"{LABEL}: {shape.L} Blocks x the GEMMs timed by {t.where} ({t.model} {t.precision} batch {t.batch_size}"
        f"{', ' + t.device if t.device else ''}: {t.rate / 1e12:.3g} TFLOP/s achieved); stem and head at that rate"
        + ("; the Blocks' forward again for checkpointing's recompute" if recompute else "")
    )
    return Compute(forward, backward, 0.0, source)


def why_not(timings: dict, sc: Scenario) -> str | None:
    """None when the check's GEMMs cover the scenario, else one line saying what they are of."""
    if (sc.model, sc.precision, sc.batch_size) in timings:
        return None
    have = ", ".join(f"{m} {p} batch {b}" for m, p, b in sorted(timings)) or "none"
    return (
        f"check's GEMMs not used for {sc.model} {sc.precision} batch {sc.batch_size}: measured for {have} "
        "(a check of another model, precision or batch does not carry over)"
    )


__all__ = ["LABEL", "GemmTimings", "block_gemms", "compute_of_gemms", "read_compute", "why_not"]
