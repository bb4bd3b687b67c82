"""DeepSpeed ZeRO, torch-free half: its labels ZERO1, ZERO2, ZERO3 and ZEROPP (ZeRO-3 with hpZ,
qwZ and qgZ), its `deepspeed.*` options, its layout and the qgZ rule the study applies when it
plans. The Strategy (the engine, the generated config) is in `strategy`.
"""

from __future__ import annotations

from dataclasses import dataclass

from vit_scale.distributed.deepspeed.cost import COSTS
from vit_scale.distributed.family import Family
from vit_scale.distributed.layout import Layout
from vit_scale.options import AT_LEAST_1, NON_NEGATIVE, option


# the deepspeed.* keys of the run configuration
@dataclass
class DeepSpeedConfig:
    offload_optimizer: bool = option(False, "to CPU; uses DeepSpeed's own optimizer, which offload requires")
    offload_params: bool = option(False, "ZeRO-3 only (ZERO3, ZEROPP)")
    overlap_comm: bool = option(True)
    contiguous_gradients: bool = option(True)
    reduce_bucket_size: int = option(500_000_000, "", AT_LEAST_1)
    allgather_bucket_size: int = option(500_000_000, "ZeRO-1/2", AT_LEAST_1)
    prefetch_bucket_size: int = option(50_000_000, "ZeRO-3: stage3_prefetch_bucket_size", AT_LEAST_1)
    param_persistence_threshold: int = option(
        100_000, "ZeRO-3: parameters smaller than this stay gathered", NON_NEGATIVE
    )
    gradient_clipping: float = option(
        0.0, "DeepSpeed clips at 1.0 by default; 0 keeps it equal to the others", NON_NEGATIVE
    )
    hpz_partition_size: int = option(0, "ZEROPP: 0 = ranks per node", NON_NEGATIVE)
    quantized_weights: bool = option(True, "ZEROPP qwZ (GPU only)")
    quantized_gradients: bool = option(True, "ZEROPP qgZ (GPU only)")
    skip_shm_comm: bool = option(True, "CPU only: do not build DeepSpeed's shm op (inference all-reduce only)")


STAGES = {"ZERO1": 1, "ZERO2": 2, "ZERO3": 3, "ZEROPP": 3}

QGZ_OPTION = "deepspeed.quantized_gradients"
QGZ_WRONG_RANKS = "DeepSpeed would group the wrong ranks"  # also in the study's refusal when it plans


def qgz_refusal(quantized_gradients: bool, device_count: int, ranks_per_node: int, nodes: int) -> str | None:
    """The one-line error when ZeRO++'s qgZ would run a different algorithm than ZeRO++'s, or None.

    DeepSpeed 0.19.8 takes the ranks of a node to be `device_count()` consecutive ranks: it builds
    qgZ's intra-node groups from it (utils/groups.py, _get_local_all_to_all_group), counts nodes as
    world // device_count (runtime/zero/stage3.py, __avg_scatter_grads: qgZ only when that is above
    1, a plain reduce-scatter otherwise) and quantises per node with it
    (runtime/comm/coalesced_collectives.py, all_to_all_quant_reduce). With one GPU visible per
    rank (srun --gpus-per-task=1) every rank is a "node": one flat quantised all-to-all over the
    world, even on one node where ZeRO++ quantises nothing. More GPUs visible than ranks on a
    node mis-groups the ranks, or switches qgZ off across nodes, or fails an assertion."""
    if not quantized_gradients or device_count == ranks_per_node:
        return None
    if nodes == 1 and device_count > ranks_per_node:
        return None  # DeepSpeed counts no whole node, reduce-scatters unquantised: what ZeRO++ does on one node
    return (
        f"{QGZ_OPTION}: qgZ needs each rank to see all of its node's GPUs (DeepSpeed takes the "
        f"ranks per node from torch.cuda.device_count(), {device_count} here, but {ranks_per_node} ranks run on "
        f"each node, so {QGZ_WRONG_RANKS} in its all-to-all); launch with every GPU of the node visible "
        f"(srun --gpus-per-node, not --gpus-per-task=1) or set {QGZ_OPTION}=false"
    )


def layout(cfg, label, world_size, ranks_per_node):
    W, stage, notes = world_size, STAGES[label.label], []
    hpz = (cfg.deepspeed.hpz_partition_size or ranks_per_node) if label.label == "ZEROPP" else 0
    if stage < 3:
        notes.append(
            f"ZeRO-{stage} partitions optimizer states{' and gradients' if stage == 2 else ''} over "
            f"all {W} ranks; parameters stay whole on every rank, so each rank is a replica for the "
            "replica check"
        )
    if hpz == 1:
        notes.append(
            "hpZ partition size 1 (one rank per node): no secondary partition, so ZEROPP runs "
            "as ZeRO-3 with quantised collectives only"
        )
    elif hpz and hpz == W:
        notes.append(
            f"hpZ partition size {hpz} equals the world size: the secondary partition "
            "spans every rank, like ZeRO-3's own"
        )
    if label.label == "ZEROPP" and cfg.deepspeed.quantized_gradients and W <= ranks_per_node:
        notes.append(
            "one node: DeepSpeed applies qgZ between nodes only, so gradients are reduce-scattered unquantised"
        )
    shard = W if stage == 3 else 1
    return Layout(
        label.label,
        "deepspeed",
        f"deepspeed-zero{stage}" + ("-pp" if label.label == "ZEROPP" else ""),
        f"ZERO{stage}",
        shard,
        W // shard,
        W,
        hpz=hpz,
        notes=tuple(notes),
    )


def _strategy():
    from vit_scale.distributed.deepspeed.strategy import DeepSpeedStrategy

    return DeepSpeedStrategy


def _jit_kernels(label: str, device_kind: str) -> tuple:
    # DeepSpeedCPUAdam for any stage's optimizer offload; ZeRO++'s qwZ/qgZ quantize on the GPU
    return ("deepspeed.cpu_adam",) + (("deepspeed.quantizer",) if label == "ZEROPP" else ())


FAMILY = Family(
    "deepspeed",
    labels=("ZERO1", "ZERO2", "ZERO3", "ZEROPP"),
    strategy=_strategy,
    costs=COSTS,
    options=DeepSpeedConfig,
    layout=layout,
    # the engine owns the loss scale, clipping, accumulation boundaries and checkpoints (strategy)
    supports_finetune=True,
    trains_lora=lambda label: True,  # the ZeRO optimizers get the trainable parameters only (setup)
    jit_kernels=_jit_kernels,
)
