"""Memory per device for one training step (formulas: docs/plan.md): each family's components (its
`cost` module, vit_scale.distributed.<family>/cost.py) plus activations, the backward's workspace and
the allocator's allowance, here.

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
  workspace    gradient temporaries of one Block's backward; the optimizer step's temporaries; a GEMM's
               BLAS workspace (Allowance.blas_workspace_mib: 76 MiB on ROCm)
Their largest sum over the phases is the prediction of `torch.cuda.max_memory_allocated`.

What the device must have, per phase, is that sum plus the allocator allowance: a fixed runtime
reserve, a fragmentation share of the sum, and memory the caching allocator holds for a
communication stream in that phase (freed tensors it cannot reuse until the stream catches up).
The verdict takes the phase where this need peaks, and the components shown are that phase's.
"""

from __future__ import annotations

from dataclasses import dataclass

from vit_scale.distributed import FAMILIES
from vit_scale.distributed.costing.memory import B0, B1, PHASES, F, S, StateMemory, per_phase
from vit_scale.planning.scenario import Layout, Scenario, layout
from vit_scale.planning.shapes import Shape

GIB = 1024**3
COMPONENTS = ("params", "grads", "optimizer", "in_flight", "activations", "buckets", "workspace")


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


def state_memory(sc: Scenario, shape: Shape, lay: Layout) -> StateMemory:
    """The family's own components (its `cost` module, through the registry's Family.costs)."""
    costs = FAMILIES[lay.family].costs
    if costs is None:
        raise ValueError(f"no memory model for {lay.label}")
    return costs.memory(sc, shape, lay)


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
    acts = per_phase(data + stem + saved, data + stem + saved, data + stem + last, data)
    return acts, per_phase(0, work, work, 0)


# ---------------------------------------------------------------- putting it together


def predict(sc: Scenario, lay: Layout | None = None) -> MemoryPrediction:
    shape = sc.shape
    lay = lay or layout(sc)
    st = state_memory(sc, shape, lay)
    acts, work = activations(sc, shape, st.autocast, st.compute_bytes)
    work[S] += st.optimizer_temporaries
    for phase in (F, B0, B1):  # a GEMM runs at these instants; the fused optimizer step runs none
        work[phase] += sc.allowance.blas_workspace_mib * 2**20
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
