"""Communication per step per device: bytes by collective, split into what crosses nodes and what
stays inside one (formulas: docs/plan.md).

Accounting is the bandwidth term of ring algorithms, in bytes each device sends:
  all-reduce of S bytes over n ranks       2 (n-1)/n S
  all-gather producing S bytes (the whole) (n-1)/n S
  reduce-scatter of S bytes (the whole)    (n-1)/n S
A ring over a group's ranks in rank order crosses a node boundary at every consecutive pair (and
the wrap-around) on different nodes; the share of a device's bytes counted as inter-node is the
share of the ring's hops that cross, averaged over all groups of that kind. Ranks are placed
node by node (rank // gpus_per_node), as srun's block distribution and torchrun place them.
"""

from __future__ import annotations

from functools import cache

from vit_scale.planning.scenario import Layout, Scenario
from vit_scale.planning.shapes import Shape

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
FACTORS = {
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_reduce": lambda n: 2 * (n - 1) / n,
}


@cache
def _crossing_share(world: int, gpus_per_node: int, kind: str, size: int) -> float:
    """Share of ring hops that cross nodes, averaged over the groups of `kind`:
    'block' groups are `size` consecutive ranks, 'strided' groups take every `size`-th rank."""
    if kind == "block":
        groups = [range(s, s + size) for s in range(0, world, size)]
    else:
        groups = [range(s, world, size) for s in range(size)]
    shares = []
    for group in groups:
        ranks = list(group)
        n = len(ranks)
        if n < 2:
            shares.append(0.0)
            continue
        nodes = [r // gpus_per_node for r in ranks]
        crossings = sum(nodes[i] != nodes[(i + 1) % n] for i in range(n))
        shares.append(crossings / n)
    return sum(shares) / len(shares)


class Ledger:
    def __init__(self, sc: Scenario):
        self.sc = sc
        self.bytes = {k: {"intra": 0.0, "inter": 0.0} for k in COLLECTIVES}

    def add(self, collective: str, size_bytes: float, n: int, kind: str = "block", group_param: int = 0):
        """`size_bytes` is the whole tensor (all-reduce input, all-gather output, reduce-scatter input)."""
        if n < 2 or size_bytes <= 0:
            return
        sent = FACTORS[collective](n) * size_bytes
        share = _crossing_share(self.sc.world, self.sc.gpus_per_node, kind, group_param or n)
        self.bytes[collective]["inter"] += sent * share
        self.bytes[collective]["intra"] += sent * (1 - share)

    def result(self) -> dict:
        out: dict = {
            k: {"intra": int(round(v["intra"])), "inter": int(round(v["inter"]))} for k, v in self.bytes.items()
        }
        intra = sum(out[k]["intra"] for k in COLLECTIVES)
        inter = sum(out[k]["inter"] for k in COLLECTIVES)
        out.update(intra_node=intra, inter_node=inter, total=intra + inter)
        return out


def predict(sc: Scenario, lay: Layout, shape: Shape | None = None) -> dict:
    shape = shape or sc.shape
    W, P, L = sc.world, shape.params, shape.L
    c = 4 if sc.precision == "fp32" else 2
    ledger = Ledger(sc)
    label, g = lay.label, lay.shard

    if lay.family == "ddp" or label in ("CAI_DDP", "CAI_DDP_FP16"):
        ledger.add("all_reduce", 4 * P, W)  # fp32 gradients, whatever autocast did
    elif lay.family == "fsdp" or label == "CAI_FSDP":
        sharding = lay.sharding if lay.family == "fsdp" else "FULL_SHARD"
        block, root = _fsdp_unit_sizes(shape, lay, g)
        blocks = L * block
        if sharding == "NO_SHARD" or g == 1:
            ledger.add("all_reduce", c * P, W)
        else:
            kind = "block"
            gathers = blocks + root
            if sharding != "SHARD_GRAD_OP":
                gathers += blocks + (root if _fsdp_root_regathers(lay) else 0)
            ledger.add("all_gather", c * gathers, g, kind)
            ledger.add("reduce_scatter", c * (blocks + root), g, kind)
            if lay.replicate > 1:
                ledger.add("all_reduce", c * (blocks + root) / g, lay.replicate, "strided", g)
    elif lay.family == "deepspeed":
        ds = sc.deepspeed
        stage = int(lay.sharding[-1])
        if stage < 3:
            # the trainer's reduce_scatter=True and DeepSpeed's default use_multi_rank_bucket_allreduce
            # take each gradient bucket through deepspeed/runtime/zero/stage_1_and_2.py average_tensor ->
            # allreduce_and_scatter -> allreduce_and_copy_with_multiple_ranks -> allreduce_bucket: a full
            # all-reduce over the data-parallel group, each rank then keeping its partition's slice
            ledger.add("all_reduce", c * P, W)
            ledger.add("all_gather", c * P, W)  # updated parameters after the step
        else:
            gathered = P - shape.small_tensor_params(ds.param_persistence_threshold)
            regathered = sum(zero3_backward_gathers(shape, ds.param_persistence_threshold))
            if lay.hpz:
                weight_bytes = 1 if ds.quantized_weights else c  # qwZ: int8 weights
                # qgZ: int4 gradients, but only across nodes: on one node DeepSpeed reduce-scatters them
                # unquantised (stage3.py __avg_scatter_grads: qgZ when world // device_count > 1)
                quantised = ds.quantized_gradients and W > sc.gpus_per_node
                grad_bytes = 0.5 if quantised else c
                ledger.add("all_gather", weight_bytes * gathered, W)  # forward, over all ranks
                ledger.add("all_gather", c * regathered, lay.hpz, "block")  # backward, inside the hpZ group
                ledger.add("reduce_scatter", grad_bytes * P, W)
            else:
                ledger.add("all_gather", c * (gathered + regathered), W)  # forward, and backward where released
                ledger.add("reduce_scatter", c * P, W)
            # the persistent parameters (whole on every rank) gathered again after each optimizer step
            # (deepspeed/runtime/zero/stage3.py: _post_step, persistent_parameters[0].all_gather)
            ledger.add("all_gather", c * shape.small_tensor_params(ds.param_persistence_threshold), W)
    elif label == "CAI_LOW_LEVEL_ZERO":
        if sc.colossalai.zero_stage == 1:
            ledger.add("all_reduce", c * P, W)
        else:
            ledger.add("reduce_scatter", c * P, W)
        ledger.add("all_gather", c * P, W)
    elif label == "CAI_GEMINI":
        ledger.add("all_gather", 2 * c * P, W)
        ledger.add("reduce_scatter", c * P, W)
    return ledger.result()


def _fsdp_unit_sizes(shape: Shape, lay: Layout, g: int) -> tuple[int, int]:
    """Elements one Block's and the root's all-gather produces (their reduce-scatter takes): FSDP1
    pads the unit's flat parameter to a multiple of g (torch/distributed/fsdp/_flat_param.py:
    FlatParamHandle._get_shard); FSDP2 pads each parameter's dim 0 to a multiple of g
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: FSDPParam._init_sharded_param,
    _chunk_with_empty), which for the class token (1, 1, D) and position embedding (1, T, D) is g times
    their size."""
    if lay.implementation == "fsdp2":
        return _fsdp2_padded(shape.block_tensors(), g), _fsdp2_padded(shape.root_tensors(), g)
    return -(-shape.block_params // g) * g, -(-shape.root_params // g) * g


def _fsdp2_padded(tensors, g: int) -> int:
    return sum(-(-s[0] // g) * g * (n // s[0]) for s, n in zip(tensors, _numels(tensors), strict=True))


def _fsdp_root_regathers(lay: Layout) -> bool:
    """Whether the root unit is all-gathered again for the backward (under resharding after forward).
    FSDP1 keeps the root's parameters after its forward (torch/distributed/fsdp/_runtime_utils.py:
    _post_forward_reshard skips the root). FSDP2 does so only when reshard_after_forward was left
    to its default (torch/distributed/fsdp/_fully_shard/_fsdp_state.py: FSDPState._lazy_init, under
    _auto_reshard_after_forward); the trainer passes it explicitly, so its root is resharded."""
    return lay.implementation == "fsdp2"


# ---------------------------------------------------------------- per unit, for the step time model


def spans_nodes(sc: Scenario, n: int, kind: str = "block", group_param: int = 0) -> bool:
    """Whether a group of this kind has ranks on more than one node (some of its ring's hops cross)."""
    return n > 1 and _crossing_share(sc.world, sc.gpus_per_node, kind, group_param or n) > 0


def ranks_per_node(sc: Scenario, n: int, kind: str = "block", group_param: int = 0) -> int:
    """How many of one node's ranks a group of this kind holds (the most on any node, over the first
    group): the NICs a ring over it can drive (alpha_beta.Network.link). A block group over whole
    nodes holds all of a node's ranks; a strided group with a stride of a node or more, one."""
    if n < 2:
        return 1
    size = group_param or n
    ranks = range(0, n) if kind == "block" else range(0, sc.world, size)
    nodes = [r // sc.gpus_per_node for r in ranks]
    return max(nodes.count(x) for x in set(nodes))


def per_unit(sc: Scenario, lay: Layout, shape: Shape | None = None) -> dict:
    """The sharded strategies' collectives unit by unit, at the sizes `predict` sums: the root unit
    (index 0: patch embedding, tokens, final norm, head) then one per Block. Each entry is a whole
    tensor in bytes (all-gather output, reduce-scatter input, all-reduce input) or 0.

    {"gather": group, "units": [{"gather_forward", "gather_backward", "reduce_scatter", "all_reduce"}],
     "reduce": group, "replicate": group} with group = (ranks, kind, group_param).
    Only FSDP (FULL_SHARD, SHARD_GRAD_OP, HYBRID_*), CAI_FSDP, ZeRO-3/ZeRO++ and Gemini have units;
    the bucketed strategies (DDP, NO_SHARD, ZeRO-1/2, LowLevelZero) return None.
    """
    shape = shape or sc.shape
    W, L = sc.world, shape.L
    c = 4 if sc.precision == "fp32" else 2
    label, g = lay.label, lay.shard

    units = []
    if lay.family == "fsdp" or label == "CAI_FSDP":
        sharding = lay.sharding if lay.family == "fsdp" else "FULL_SHARD"
        if sharding == "NO_SHARD" or g == 1:
            return None
        block, root = (c * n for n in _fsdp_unit_sizes(shape, lay, g))
        regather = sharding != "SHARD_GRAD_OP"
        rep = lay.replicate
        for i in range(L + 1):
            whole = root if i == 0 else block
            again = regather and (i > 0 or _fsdp_root_regathers(lay))
            units.append(
                {
                    "gather_forward": whole,
                    "gather_backward": whole if again else 0,
                    "reduce_scatter": whole,
                    "all_reduce": whole / g if rep > 1 else 0,
                }
            )
        return {"gather": (g, "block", g), "reduce": (g, "block", g), "replicate": (rep, "strided", g), "units": units}
    if lay.family == "deepspeed" and lay.sharding == "ZERO3":
        ds = sc.deepspeed
        small = ds.param_persistence_threshold
        root_g = shape.root_params - sum(n for n in _numels(shape.root_tensors()) if n <= small)
        block_g = shape.block_params - sum(n for n in _numels(shape.block_tensors()) if n <= small)
        weight_bytes = (1 if ds.quantized_weights else c) if lay.hpz else c
        quantised = lay.hpz and ds.quantized_gradients and W > sc.gpus_per_node
        grad_bytes = 0.5 if quantised else c
        regathered = zero3_backward_gathers(shape, small)
        for i in range(L + 1):
            gathered, params = (root_g, shape.root_params) if i == 0 else (block_g, shape.block_params)
            units.append(
                {
                    "gather_forward": weight_bytes * gathered,
                    "gather_backward": c * regathered[i],
                    "reduce_scatter": grad_bytes * params,
                    "all_reduce": 0,
                }
            )
        backward_group = (lay.hpz, "block", lay.hpz) if lay.hpz else (W, "block", W)
        # stage3.py _post_step: the persistent parameters, gathered after the optimizer step
        return {
            "gather": (W, "block", W),
            "gather_backward": backward_group,
            "reduce": (W, "block", W),
            "replicate": (1, "block", 1),
            "units": units,
            "after_step": c * shape.small_tensor_params(small),
        }
    if label == "CAI_GEMINI":
        for i in range(L + 1):
            params = shape.root_params if i == 0 else shape.block_params
            units.append(
                {
                    "gather_forward": c * params,
                    "gather_backward": c * params,
                    "reduce_scatter": c * params,
                    "all_reduce": 0,
                }
            )
        return {"gather": (W, "block", W), "reduce": (W, "block", W), "replicate": (1, "block", 1), "units": units}
    return None


# DeepSpeed's default stage3_max_reuse_distance (deepspeed/runtime/zero/config.py,
# DeepSpeedZeroConfig.max_reuse_distance), which the trainer does not override
DS_MAX_REUSE_DISTANCE = 1_000_000_000


def zero3_backward_gathers(shape: Shape, threshold: int) -> list[int]:
    """Elements ZeRO-3 all-gathers again before each unit's backward (unit 0 the root, then one per
    Block): those of the parameters it released after their forward.

    deepspeed/runtime/zero/partitioned_param_coordinator.py, release_sub_module and __params_to_release:
    once the module trace is complete, a module's parameters are kept after its forward when the trace
    reaches their next use (the module's backward) before it has passed stage3_max_reuse_distance
    elements of parameters (every module's own, persistent ones included). Between a module's forward
    and its backward lie every module after it, once in forward and once in backward, and the root
    module (cls_token, pos_embed), whose backward hook fires first. The root module itself is released
    at the end of the forward and used next, so kept. Parameters under param_persistence_threshold are
    never released. Not modelled: the prefetcher also keeps a parameter whose later use it scanned
    while the parameter was still gathered (the same function's first rule); that reaches only
    stage3_prefetch_bucket_size elements ahead, so with the defaults (5e7 < 1e9) it keeps nothing more.
    """
    root, block = shape.root_tensors(), shape.block_tensors()
    # modules holding parameters, in forward order: (unit, [numels]); timm's ViT: the model itself
    # (cls_token, pos_embed), patch_embed.proj, each Block's norm1, qkv, proj, norm2, fc1, fc2, norm, head
    modules = [(0, _numels(root[0:2])), (0, _numels(root[2:4]))]
    for i in range(shape.L):
        modules += [(i + 1, _numels(block[j : j + 2])) for j in range(0, len(block), 2)]
    modules += [(0, _numels(root[4:6])), (0, _numels(root[6:8]))]
    out = [0] * (shape.L + 1)
    top = sum(modules[0][1])
    after = sum(sum(n) for _, n in modules)
    for k, (unit, numels) in enumerate(modules):
        after -= sum(numels)
        distance = 0 if k == 0 else 2 * after + top
        if distance >= DS_MAX_REUSE_DISTANCE:
            out[unit] += sum(n for n in numels if n > threshold)
    return out


def _numels(tensors) -> list[int]:
    out = []
    for s in tensors:
        n = 1
        for d in s:
            n *= d
        out.append(n)
    return out
