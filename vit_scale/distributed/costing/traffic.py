"""Bytes a step's collectives send per device, inside a node and across nodes, and the geometry of
the groups they run over (formulas: docs/plan.md).

Accounting is the bandwidth term of ring algorithms, in bytes each device sends:
  all-reduce of S bytes over n ranks       2 (n-1)/n S
  all-gather producing S bytes (the whole) (n-1)/n S
  reduce-scatter of S bytes (the whole)    (n-1)/n S
A ring over a group's ranks in rank order crosses a node boundary at every consecutive pair (and
the wrap-around) on different nodes; the share of a device's bytes counted as inter-node is the
share of the ring's hops that cross, averaged over all groups of that kind. Ranks are placed
node by node (rank // gpus_per_node), as srun's block distribution and torchrun place them.
A group is (ranks, kind, group_param): 'block' groups are consecutive ranks, 'strided' ones take
every group_param-th rank.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
FACTORS = {
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_reduce": lambda n: 2 * (n - 1) / n,
}


@cache
def crossing_share(world: int, gpus_per_node: int, kind: str, size: int) -> float:
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
    """The bytes of one step's collectives, by collective and scope; a family's `traffic` adds to it."""

    def __init__(self, sc):
        self.sc = sc
        self.bytes = {k: {"intra": 0.0, "inter": 0.0} for k in COLLECTIVES}

    def add(self, collective: str, size_bytes: float, n: int, kind: str = "block", group_param: int = 0):
        """`size_bytes` is the whole tensor (all-reduce input, all-gather output, reduce-scatter input)."""
        if n < 2 or size_bytes <= 0:
            return
        sent = FACTORS[collective](n) * size_bytes
        share = crossing_share(self.sc.world, self.sc.gpus_per_node, kind, group_param or n)
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


def spans_nodes(sc, n: int, kind: str = "block", group_param: int = 0) -> bool:
    """Whether a group of this kind has ranks on more than one node (some of its ring's hops cross)."""
    return n > 1 and crossing_share(sc.world, sc.gpus_per_node, kind, group_param or n) > 0


def ranks_per_node(sc, n: int, kind: str = "block", group_param: int = 0) -> int:
    """How many of one node's ranks a group of this kind holds (the most on any node, over the first
    group): the NICs a ring over it can drive (alpha_beta.Network.link). A block group over whole
    nodes holds all of a node's ranks; a strided group with a stride of a node or more, one."""
    if n < 2:
        return 1
    size = group_param or n
    ranks = range(0, n) if kind == "block" else range(0, sc.world, size)
    # one pass (Counter), not a count per node: at 1024 ranks the plan asks this thousands of times
    return max(Counter(r // sc.gpus_per_node for r in ranks).values())
