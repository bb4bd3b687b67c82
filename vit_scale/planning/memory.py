"""Memory per device for one training step, strategy by strategy (formulas: docs/plan.md).

The step is looked at in four phases, and the prediction is the largest of them:
  forward_end     every activation the backward will need is saved; FSDP holds the units it
                  has gathered; autocast holds its low-precision weight copies
  backward_start  the first Block's backward: activations (plus its recompute under activation
                  checkpointing) and one Block's gradients
  backward_end    the last Block's backward: every gradient, one Block's activations
  optimizer_step  gradients, optimizer states and the optimizer's own temporaries
Gradients grow and activations shrink linearly through the backward, so its largest point is one
of its two ends. Each phase is the sum of components, all in bytes held by one device:
  params       the parameter storage the rank keeps (sharded or whole; fp32 masters for FSDP/DDP)
  grads        gradients as the optimizer will see them (and DeepSpeed's gradient partitions)
  optimizer    AdamW's exp_avg and exp_avg_sq, plus a separate fp32 master copy where the
               strategy keeps one (DeepSpeed, ColossalAI ZeRO/Gemini)
  in_flight    unsharded FSDP units and their unsharded gradients, ZeRO-3 gathered parameters,
               autocast's low-precision weight copies
  activations  what autograd saves, the input batches on the device, logits and loss
  buckets      communication buffers: DDP's gradient buckets, DeepSpeed's reduction buffers
  workspace    gradient temporaries of one Block's backward; the optimizer step's temporaries
Their largest sum over the phases is the prediction of `torch.cuda.max_memory_allocated`.

What the device must have, per phase, is that sum plus the allocator allowance: a fixed runtime
reserve, a fragmentation share of the sum, and memory the caching allocator holds for a
communication stream in that phase (freed tensors it cannot reuse until the stream catches up).
The verdict takes the phase where this need peaks, and the components shown are that phase's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from math import ceil

from vit_scale.distributed.fsdp import FSDPConfig
from vit_scale.planning.scenario import (
    CAI_REDUCE_BUCKET,
    DS_MAX_LIVE_PARAMETERS,
    DS_SUB_GROUP_SIZE,
    Layout,
    Scenario,
    layout,
)
from vit_scale.planning.shapes import Shape, numel

GIB = 1024**3
PHASES = ("forward_end", "backward_start", "backward_end", "optimizer_step")
COMPONENTS = ("params", "grads", "optimizer", "in_flight", "activations", "buckets", "workspace")
F, B0, B1, S = PHASES


def _per_phase(forward_end=0.0, backward_start=0.0, backward_end=0.0, optimizer_step=0.0) -> dict:
    return {F: forward_end, B0: backward_start, B1: backward_end, S: optimizer_step}


def _const(value: float) -> dict:
    return _per_phase(value, value, value, value)


@dataclass
class StateMemory:
    """The strategy-dependent components (bytes), before activations and the backward workspace."""

    params: float
    optimizer: float
    grads: dict
    in_flight: dict
    buckets: dict
    optimizer_temporaries: float
    stream_held: dict = field(default_factory=lambda: _const(0.0))
    # freed on the host, not yet reusable (the device is behind): counted in the allocator's active bytes,
    # which the seed-003 authors measured, but not in what must fit, since the caching allocator
    # synchronises and reclaims such blocks before it raises out-of-memory (synchronize_and_free_events)
    pending_frees: dict = field(default_factory=lambda: _const(0.0))
    autocast: bool = False  # activations under torch.autocast (fp32 residual stream) or not
    compute_bytes: int = 4  # bytes of a low-precision activation / parameter copy
    optimizer_impl: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass
class MemoryPrediction:
    phases: dict  # phase -> component -> bytes
    peak_phase: str  # where the need (allocated + allowance) peaks: the verdict's phase
    peak_allocated: float  # bytes, the largest allocated sum over the phases
    peak_allocated_phase: str
    allocator: dict  # runtime, fragmentation, stream_held at peak_phase (bytes)
    total: float  # bytes the device must have
    optimizer_impl: str
    notes: list[str]
    # bytes allocated or freed but not yet reusable (held for another stream), the largest over the
    # phases: the prediction of torch's memory_stats()["active_bytes.all.peak"]
    peak_active: float = 0.0

    @property
    def components(self) -> dict:
        return self.phases[self.peak_phase]


# ---------------------------------------------------------------- helpers


def _bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _optimizer_temporaries(impl: str, foreach_numel: int, largest_numel: int) -> float:
    """AdamW's step: foreach computes sqrt(exp_avg_sq) for the whole tensor list at once (one fp32
    buffer the size of the list); the single-tensor loop does it per tensor (two buffers of the
    largest tensor, the sqrt and its division); fused kernels need none."""
    if impl == "foreach":
        return 4.0 * foreach_numel
    if impl == "single":
        return 8.0 * largest_numel
    return 0.0


def _auto_optimizer(sc: Scenario, plain_tensor_params: bool) -> str:
    """The AdamW kernel the run uses. `auto` is the trainer's choice on a GPU
    (distributed.parts.optimizer_kernel): the fused kernel, which needs no step temporaries.
    `plain_tensor_params` says whether torch could run foreach/fused over the parameters at all
    (FSDP1's FlatParameter counts as a Parameter; checked in tests/plan_tensors.py)."""
    if sc.optimizer != "auto":
        return sc.optimizer
    return "fused" if plain_tensor_params else "single"


def _shard_pad(n: int, g: int) -> int:
    return ceil(n / g)


def _fsdp2_local(tensors: list[tuple[int, ...]], g: int) -> tuple[int, int]:
    """FSDP2 shards every parameter on dim 0, padded to a multiple of g: (local, unsharded padded)."""
    local = padded = 0
    for shape in tensors:
        rest = numel(shape) // shape[0]
        rows = ceil(shape[0] / g)
        local += rows * rest
        padded += rows * g * rest
    return local, padded


# ---------------------------------------------------------------- strategy families


def _ddp(sc: Scenario, shape: Shape, precision: str) -> StateMemory:
    """torch DDP under autocast: fp32 parameters and gradients; the Reducer's buckets hold a
    second copy of every gradient (gradient_as_bucket_view=False, the default)."""
    P, c = shape.params, _bytes(precision)
    impl = _auto_optimizer(sc, plain_tensor_params=True)
    cast = c < 4
    weights_all = c * shape.matmul_weights if cast else 0
    weights_block = c * shape.block_matmul_weights if cast else 0
    # autocast caches each weight's low-precision cast for the whole forward; without
    # checkpointing the matmuls also save them for backward, so they live until each block's backward
    in_flight = _per_phase(weights_all, weights_block if sc.activation_checkpointing else weights_all, weights_block, 0)
    return StateMemory(
        params=4.0 * P,
        optimizer=8.0 * P,
        grads=_per_phase(0, 4.0 * shape.block_params, 4.0 * P, 4.0 * P),
        in_flight=in_flight,
        buckets=_const(4.0 * P),
        optimizer_temporaries=_optimizer_temporaries(impl, P, shape.largest_tensor),
        autocast=True,
        compute_bytes=c,
        optimizer_impl=impl,
    )


def _fsdp1(sc: Scenario, shape: Shape, lay: Layout, precision: str) -> StateMemory:
    """FSDP1 (and ColossalAI TorchFSDP) memory: the family rules, in vit_scale.planning.families.fsdp."""
    from vit_scale.planning.families import fsdp

    return fsdp.fsdp1_memory(sc, shape, lay, precision)


def _fsdp2(sc: Scenario, shape: Shape, lay: Layout, precision: str) -> StateMemory:
    g, L = lay.shard, shape.L
    c = _bytes(precision)
    blk_local, blk_full = _fsdp2_local(shape.block_tensors(), g)
    root_local, root_full = _fsdp2_local(shape.root_tensors(), g)
    local = L * blk_local + root_local
    impl = _auto_optimizer(sc, plain_tensor_params=True)  # DTensor is foreach-capable
    unit, rootc = c * blk_full, c * root_full
    # autograd's unsharded gradient, FSDP2's reduce-scatter input copy and its output
    grad_tmp = 2 * c * blk_full + c * blk_local
    n_fwd = 2  # FSDP2 overlaps the next unit's all-gather in forward, with or without prefetch
    if lay.sharding == "SHARD_GRAD_OP":
        in_flight = _per_phase(L * unit + rootc, L * unit + rootc + grad_tmp, 2 * unit + rootc + grad_tmp, 0)
    else:
        in_flight = _per_phase(n_fwd * unit + rootc, 2 * unit + rootc + grad_tmp, 2 * unit + rootc + grad_tmp, 0)
    params, optimizer = 4.0 * local, 8.0 * local
    grads = _per_phase(0, 4.0 * blk_local, 4.0 * local, 4.0 * local)
    temporaries = _optimizer_temporaries(impl, local, min(local, shape.largest_tensor))
    notes = []
    if sc.fsdp.cpu_offload:
        params = optimizer = temporaries = 0.0
        grads = _const(0.0)
        notes.append("fsdp.cpu_offload: parameters, gradients and optimizer states live on the host")
    return StateMemory(
        params=params,
        optimizer=optimizer,
        grads=grads,
        in_flight=in_flight,
        buckets=_const(0.0),
        optimizer_temporaries=temporaries,
        compute_bytes=c,
        optimizer_impl=impl,
        notes=notes,
    )


def _zero12(
    sc: Scenario,
    shape: Shape,
    N: int,
    stage: int,
    precision: str,
    bucket_elems: int,
    n_buckets: int,
    contiguous: bool,
    offload: bool,
) -> StateMemory:
    """ZeRO-1/2 (DeepSpeed's stage_1_and_2 optimizer; ColossalAI's LowLevelZero is the same
    scheme): low-precision parameters whole on every rank, fp32 master and AdamW states
    partitioned, gradients reduced through buckets into this rank's partition."""
    P, c = shape.params, _bytes(precision)
    part = ceil(P / N)
    impl = _auto_optimizer(sc, plain_tensor_params=True)  # one flat fp32 partition per group
    if stage == 1 and not contiguous:
        grads = _per_phase(0, c * shape.block_params, c * P, c * P)
    else:
        # each reduced gradient is copied into this rank's partition buffer (every parameter that
        # overlaps the partition, whole), allocated at the first copy and released after the step
        buffer = shape.whole_tensors_in_partitions(N, align=2 if c == 2 else 1)
        grads = _per_phase(0, c * buffer, c * buffer, c * buffer)
    grads[S] += 4.0 * part if not offload else 0.0  # the fp32 gradient partition the step reads
    notes = []
    optimizer = 12.0 * part
    temporaries = _optimizer_temporaries(impl, part, part)
    if offload:
        optimizer, temporaries = 0.0, 0.0
        notes.append("optimizer offload: fp32 master, AdamW states and fp32 gradients live on the host")
    fresh_grad = c * shape.largest_tensor  # autograd's gradient before the bucket copy
    return StateMemory(
        params=float(c * P),
        optimizer=optimizer,
        grads=grads,
        in_flight=_per_phase(0, fresh_grad, fresh_grad, 0),
        # reduction buffers: allocated when the backward starts, released at its end
        buckets=_per_phase(0, n_buckets * bucket_elems * c, n_buckets * bucket_elems * c, 0),
        optimizer_temporaries=temporaries,
        compute_bytes=c,
        optimizer_impl=impl,
        notes=notes,
    )


def _zero3(sc: Scenario, shape: Shape, lay: Layout, precision: str) -> StateMemory:
    ds = sc.deepspeed
    P, c, N = shape.params, _bytes(precision), lay.state_shard
    partitioned = sum(ceil(numel(s) / N) for s in shape.tensors())
    small = shape.small_tensor_params(ds.param_persistence_threshold)
    part = ceil(P / N)
    impl = _auto_optimizer(sc, plain_tensor_params=True)
    # gathered parameters: DeepSpeed keeps those it will reuse soon (stage3_max_reuse_distance) up
    # to stage3_max_live_parameters, so across the forward/backward turn up to that many stay
    live = min(P - small, DS_MAX_LIVE_PARAMETERS)
    later = shape.block_params + ds.prefetch_bucket_size
    gathered = _per_phase(c * live, c * live, c * min(P - small, later), 0)
    notes = ["ZeRO-3 gathered parameters: an upper bound (stage3_max_live_parameters)"]
    if lay.hpz:
        secondary = c * ceil(P / lay.hpz)
        for phase in (F, B0, B1):
            gathered[phase] += secondary
        notes.append(f"hpZ keeps a secondary partition over {lay.hpz} ranks between forward and backward")
    params = float(c * (partitioned + small))
    optimizer = 12.0 * part
    grads = _const(float(c * part))
    grads[S] += 4.0 * min(part, DS_SUB_GROUP_SIZE)
    temporaries = _optimizer_temporaries(impl, min(part, DS_SUB_GROUP_SIZE), min(part, DS_SUB_GROUP_SIZE))
    if ds.offload_params:
        params = float(c * small)
        notes.append("parameter offload: partitions live on the host")
    if ds.offload_optimizer or ds.offload_params:
        optimizer, temporaries = 0.0, 0.0
        grads[S] -= 4.0 * min(part, DS_SUB_GROUP_SIZE)
        notes.append("optimizer offload: fp32 master and AdamW states live on the host")
    return StateMemory(
        params=params,
        optimizer=optimizer,
        grads=grads,
        in_flight=gathered,
        buckets=_const(float(c * ds.reduce_bucket_size)),
        optimizer_temporaries=temporaries,
        compute_bytes=c,
        optimizer_impl=impl,
        notes=notes,
    )


def _gemini(sc: Scenario, shape: Shape, N: int, precision: str) -> StateMemory:
    """ColossalAI Gemini: chunked ZeRO-3; gradients reuse the fp16 parameter chunks; static
    placement offloads the given fractions of parameters and optimizer states to the host."""
    cai = sc.colossalai
    optim_frac, param_frac = cai.offload_optim_frac, cai.offload_param_frac
    if cai.preset == "seed000":
        optim_frac = 1.0
    P, c = shape.params, _bytes(precision)
    part = ceil(P / N)
    chunks = 2 * c * shape.block_params  # about two chunks gathered at a time
    return StateMemory(
        params=c * part * (1 - param_frac),
        optimizer=12.0 * part * (1 - optim_frac),
        grads=_const(0.0),
        in_flight=_per_phase(chunks, chunks, chunks, 0),
        buckets=_const(0.0),
        optimizer_temporaries=0.0,
        compute_bytes=c,
        optimizer_impl="fused",
        notes=["Gemini: gradients reuse the parameter chunks; HybridAdam has no temporaries"],
    )


def state_memory(sc: Scenario, shape: Shape, lay: Layout) -> StateMemory:
    label = lay.label
    if lay.family == "ddp" or label == "CAI_DDP":
        return _ddp(sc, shape, sc.precision)
    if label == "CAI_DDP_FP16":
        return _ddp(sc, shape, "fp16")
    if lay.family == "fsdp":
        return (
            _fsdp1(sc, shape, lay, sc.precision)
            if lay.implementation == "fsdp1"
            else _fsdp2(sc, shape, lay, sc.precision)
        )
    if label == "CAI_FSDP":
        # TorchFSDPPlugin: FSDP1 FULL_SHARD with torch's own defaults (prefetch pre, rate limiter on),
        # not the trainer's fsdp.* keys
        cai_lay = Layout(label, "fsdp", "fsdp1", "FULL_SHARD" if lay.shard > 1 else "NO_SHARD", lay.shard, 1, lay.shard)
        return _fsdp1(dataclasses.replace(sc, fsdp=FSDPConfig()), shape, cai_lay, sc.precision)
    if lay.family == "deepspeed":
        ds = sc.deepspeed
        stage = int(lay.sharding[-1])
        if stage == 3:
            return _zero3(sc, shape, lay, sc.precision)
        n_buckets = (2 if ds.overlap_comm else 1) if ds.contiguous_gradients else 0
        return _zero12(
            sc,
            shape,
            lay.state_shard,
            stage,
            sc.precision,
            ds.reduce_bucket_size,
            n_buckets,
            ds.contiguous_gradients,
            ds.offload_optimizer,
        )
    if label == "CAI_LOW_LEVEL_ZERO":
        return _zero12(
            sc,
            shape,
            lay.state_shard,
            sc.colossalai.zero_stage,
            sc.precision,
            CAI_REDUCE_BUCKET,
            1,
            True,
            sc.colossalai.cpu_offload,
        )
    if label == "CAI_GEMINI":
        return _gemini(sc, shape, lay.state_shard, sc.precision)
    raise ValueError(f"no memory model for {label}")


# ---------------------------------------------------------------- activations


def activations(sc: Scenario, shape: Shape, autocast: bool, c: int) -> tuple[dict, dict]:
    """(activations, backward workspace) per phase, bytes."""
    a = c
    r = 4 if autocast else a
    softmax = (4 + a if a < 4 else 4) if autocast else a
    B, L = sc.batch_size, shape.L
    full = B * shape.block_activation_bytes(a, r, sc.attention == "fused", softmax)
    stem = B * shape.stem_head_bytes(a, r, autocast)
    data = sc.synthetic_batches * B * (shape.image_bytes() + 8)
    if sc.activation_checkpointing:
        ckpt = B * shape.block_checkpoint_bytes(r)
        # the block being run (forward, or its recompute in backward) holds a full block's worth
        saved, last = L * ckpt + full, ckpt + full
    else:
        saved, last = L * full, full
    work = B * shape.backward_transient_bytes(a, r)
    acts = _per_phase(data + stem + saved, data + stem + saved, data + stem + last, data)
    return acts, _per_phase(0, work, work, 0)


# ---------------------------------------------------------------- putting it together


def predict(sc: Scenario, lay: Layout | None = None) -> MemoryPrediction:
    shape = sc.shape
    lay = lay or layout(sc)
    st = state_memory(sc, shape, lay)
    acts, work = activations(sc, shape, st.autocast, st.compute_bytes)
    work[S] += st.optimizer_temporaries
    phases = {}
    for phase in PHASES:
        phases[phase] = {
            "params": st.params,
            "grads": st.grads[phase],
            "optimizer": st.optimizer,
            "in_flight": st.in_flight[phase],
            "activations": acts[phase],
            "buckets": st.buckets[phase],
            "workspace": work[phase],
        }
    al = sc.allowance
    allocated = {p: sum(parts.values()) for p, parts in phases.items()}
    allowance = {
        p: {
            "runtime": al.runtime_gib * GIB,
            "fragmentation": al.fragmentation * allocated[p],
            "stream_held": st.stream_held[p] if al.stream_held else 0.0,
        }
        for p in PHASES
    }
    need = {p: allocated[p] + sum(allowance[p].values()) for p in PHASES}
    peak_phase = max(PHASES, key=lambda p: need[p])
    peak_allocated_phase = max(PHASES, key=lambda p: allocated[p])
    active = {p: allocated[p] + max(st.stream_held[p], st.pending_frees[p]) for p in PHASES}
    return MemoryPrediction(
        phases=phases,
        peak_phase=peak_phase,
        peak_allocated=allocated[peak_allocated_phase],
        peak_allocated_phase=peak_allocated_phase,
        allocator=allowance[peak_phase],
        total=need[peak_phase],
        optimizer_impl=st.optimizer_impl,
        notes=list(lay.notes) + st.notes,
        peak_active=max(active.values()),
    )
