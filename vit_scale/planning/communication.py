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

from functools import lru_cache

from vit_scale.planning.scenario import Layout, Scenario
from vit_scale.planning.shapes import Shape

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
FACTORS = {"all_gather": lambda n: (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
           "all_reduce": lambda n: 2 * (n - 1) / n}


@lru_cache(maxsize=None)
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
        out: dict = {k: {"intra": int(round(v["intra"])), "inter": int(round(v["inter"]))}
                     for k, v in self.bytes.items()}
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

    def padded(n: int, k: int) -> int:
        return -(-n // k) * k

    if lay.family == "ddp" or label in ("CAI_DDP", "CAI_DDP_FP16"):
        ledger.add("all_reduce", 4 * P, W)                        # fp32 gradients, whatever autocast did
    elif lay.family == "fsdp" or label == "CAI_FSDP":
        sharding = lay.sharding if lay.family == "fsdp" else "FULL_SHARD"
        blocks, root = L * padded(shape.block_params, g), padded(shape.root_params, g)
        if sharding == "NO_SHARD" or g == 1:
            ledger.add("all_reduce", c * P, W)
        else:
            kind = "block"
            gathers = 2 * blocks + root if sharding != "SHARD_GRAD_OP" else blocks + root  # root kept after forward
            ledger.add("all_gather", c * gathers, g, kind)
            ledger.add("reduce_scatter", c * (blocks + root), g, kind)
            if lay.replicate > 1:
                ledger.add("all_reduce", c * (blocks + root) / g, lay.replicate, "strided", g)
    elif lay.family == "deepspeed":
        ds = sc.deepspeed
        stage = int(lay.sharding[-1])
        if stage < 3:
            ledger.add("reduce_scatter", c * P, W)
            ledger.add("all_gather", c * P, W)                    # updated parameters after the step
        else:
            gathered = P - shape.small_tensor_params(ds.param_persistence_threshold)
            if lay.hpz:
                weight_bytes = 1 if ds.quantized_weights else c   # qwZ: int8 weights
                # qgZ: int4 gradients, but only across nodes: on one node DeepSpeed reduce-scatters them
                # unquantised (stage3.py __avg_scatter_grads: qgZ when world // device_count > 1)
                quantised = ds.quantized_gradients and W > sc.gpus_per_node
                grad_bytes = 0.5 if quantised else c
                ledger.add("all_gather", weight_bytes * gathered, W)          # forward, over all ranks
                ledger.add("all_gather", c * gathered, lay.hpz, "block")      # backward, inside the hpZ group
                ledger.add("reduce_scatter", grad_bytes * P, W)
            else:
                ledger.add("all_gather", 2 * c * gathered, W)                 # forward and backward
                ledger.add("reduce_scatter", c * P, W)
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


# ---------------------------------------------------------------- per unit, for the step time model

def spans_nodes(sc: Scenario, n: int, kind: str = "block", group_param: int = 0) -> bool:
    """Whether a group of this kind has ranks on more than one node (some of its ring's hops cross)."""
    return n > 1 and _crossing_share(sc.world, sc.gpus_per_node, kind, group_param or n) > 0


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

    def padded(n: int, k: int) -> int:
        return -(-n // k) * k

    units = []
    if lay.family == "fsdp" or label == "CAI_FSDP":
        sharding = lay.sharding if lay.family == "fsdp" else "FULL_SHARD"
        if sharding == "NO_SHARD" or g == 1:
            return None
        root, block = c * padded(shape.root_params, g), c * padded(shape.block_params, g)
        regather = sharding != "SHARD_GRAD_OP"
        rep = lay.replicate
        for i in range(L + 1):
            whole = root if i == 0 else block
            units.append({"gather_forward": whole, "gather_backward": whole if (regather and i) else 0,
                          "reduce_scatter": whole, "all_reduce": whole / g if rep > 1 else 0})
        return {"gather": (g, "block", g), "reduce": (g, "block", g), "replicate": (rep, "strided", g),
                "units": units}
    if lay.family == "deepspeed" and lay.sharding == "ZERO3":
        ds = sc.deepspeed
        small = ds.param_persistence_threshold
        root_g = shape.root_params - sum(n for n in _numels(shape.root_tensors()) if n <= small)
        block_g = shape.block_params - sum(n for n in _numels(shape.block_tensors()) if n <= small)
        weight_bytes = (1 if ds.quantized_weights else c) if lay.hpz else c
        quantised = lay.hpz and ds.quantized_gradients and W > sc.gpus_per_node
        grad_bytes = 0.5 if quantised else c
        for i in range(L + 1):
            gathered, params = (root_g, shape.root_params) if i == 0 else (block_g, shape.block_params)
            units.append({"gather_forward": weight_bytes * gathered,
                          "gather_backward": c * gathered, "reduce_scatter": grad_bytes * params, "all_reduce": 0})
        backward_group = (lay.hpz, "block", lay.hpz) if lay.hpz else (W, "block", W)
        return {"gather": (W, "block", W), "gather_backward": backward_group, "reduce": (W, "block", W),
                "replicate": (1, "block", 1), "units": units}
    if label == "CAI_GEMINI":
        for i in range(L + 1):
            params = shape.root_params if i == 0 else shape.block_params
            units.append({"gather_forward": c * params, "gather_backward": c * params,
                          "reduce_scatter": c * params, "all_reduce": 0})
        return {"gather": (W, "block", W), "reduce": (W, "block", W), "replicate": (1, "block", 1), "units": units}
    return None


def _numels(tensors) -> list[int]:
    out = []
    for s in tensors:
        n = 1
        for d in s:
            n *= d
        out.append(n)
    return out
