"""The nodes part of `vit-scale check`: every node's compute and its link to the other nodes, measured
at once on all of them, so that one slow node or one bad link is named before a study spends the
allocation on it (a weak-scaling point runs at its slowest rank's pace: one slow node makes the
strategy look slow).

Compute: every rank times the Block's GEMMs of the check's model, batch and precision
(vit_scale.run.health.rank_figures, the probe every run also makes after its timed steps); a node
counts at its slowest rank, or where its ranks share its cores (a CPU) at their mean rate.

Link: nodes exchange in pairs, every pair at once, each rank with the rank of the same local index on
the partner node (so the node's whole link carries traffic, as a strategy's rings do), in both directions
at once, at a size where bandwidth dominates. The pairs follow the ring of nodes: one round pairs each
even node with the next, the other each odd node with the next (the last with the first when the count is
even); an odd count needs a third round for the node left out. So every node meets both its neighbours:
a slow node is slow in both its pairs, while each of its partners is fast in its other pair, and a node's
figure is the best of its pairs. Two or three rounds whatever the node count: the part's time does not
grow with the allocation (docs/check.md, "Finding a slow node", gives its cost at 2, 128 and 9,408 nodes).
A node whose link these rounds put below the rule's line is retested in one more round, paired with a node
that is not suspected: named only if slow again (a stall that comes and goes does not repeat on cue).

The size follows the rate found: a probe exchange of PROBE_BYTES a rank, then the size at which the
slowest pair's exchange takes about TARGET_S, between PROBE_BYTES and MAX_BYTES (and a quarter of a rank's
free memory), so that a 25 Mbit/s emulated link and a 200 Gbit/s fabric both get a bandwidth figure in
about a second a round.

The verdict's rule (`slow_nodes`): a node whose figure is below the median of the nodes by more than
SLOW_SHARE, and by more than the spread the check measured across its windows, is named. With fewer than
three nodes the pair test cannot say which of two is slow (both are in the one pair): `undecidable`.

The arithmetic and the rule here are torch-free; torch is imported inside the functions that measure.
"""

from __future__ import annotations

import statistics
import time

SLOW_SHARE = 0.20  # below the median node by more than this share (and more than the spread): named
PROBE_BYTES = 256 * 1024  # a rank's first exchange, to find the rate
MAX_BYTES = 256 * 2**20  # a rank's largest exchange: on a 25 GB/s NIC share, 10 ms, bandwidth-bound
TARGET_S = 0.8  # the slowest pair's exchange, about: long enough for CPU quotas' periods (100 ms) to show
REPEATS = 3  # timed windows a round; their range is the pair's spread
COMPUTE_WINDOWS = 5  # a rank's compute windows: the median of five keeps one unlucky window out
COMPUTE_WINDOW_S = 0.25  # a compute window: several CFS periods, so a CPU quota shows in the rate
FIGURES = {"compute": "gemm_tflops", "link": "link_gbps"}
UNITS = {"compute": "TFLOP/s", "link": "GB/s"}


# ---------------------------------------------------------------- pairings and figures (torch-free)


def pairings(nodes: int) -> list[list[tuple[int, int]]]:
    """Rounds of (node, node) pairs: over the ring of `nodes`, even nodes with the next and odd nodes with
    the next (an odd count: the last node with the first in a round of its own), then each node of the
    ring's first half with the node across from it. Every node meets both its ring neighbours and, from 4
    nodes on, all but at most one node meet a third partner: a healthy node is misjudged only when all its
    partners are slow, which two slow nodes can do to a node between them on the ring but not across it."""
    if nodes < 2:
        return []
    half = nodes // 2
    candidates = [
        [(i, i + 1) for i in range(0, nodes - 1, 2)],
        [(i, (i + 1) % nodes) for i in range(1, nodes, 2)],  # odd count: the last odd node is nodes - 2
        [(nodes - 1, 0)] if nodes % 2 else [],
        [(i, i + half) for i in range(half)],
    ]
    met, rounds = set(), []
    for pairing in candidates:
        fresh = [pair for pair in pairing if frozenset(pair) not in met]
        met |= {frozenset(pair) for pair in fresh}
        if fresh:
            rounds.append(fresh)
    return rounds


def exchange_bytes(probe_s: float, free_bytes: float) -> int:
    """A rank's exchange size from the slowest probe's seconds: about TARGET_S at the rate found, a power
    of two between PROBE_BYTES and MAX_BYTES, and within a quarter of the rank's free memory (two buffers)."""
    rate = PROBE_BYTES / max(probe_s, 1e-9)
    want = min(MAX_BYTES, rate * TARGET_S)
    if free_bytes > 0:
        want = min(want, free_bytes / 8)
    size = PROBE_BYTES
    while size * 2 <= want:
        size *= 2
    return size


def window_stats(values: list[float]) -> tuple[float, float]:
    """(median, half the range): a figure and its spread across the windows. The whole range, odd windows
    included: trimming the lowest and highest of 5 (tried) named a healthy node in 5 of 20 checks with no
    fault, at 69-79% of the median node."""
    ordered = sorted(values)
    if not ordered:
        return 0.0, 0.0
    return statistics.median(ordered), (ordered[-1] - ordered[0]) / 2


def gbps(windows: list[float], nbytes: int, per_node: int) -> list[float]:
    """Each window's rate: what one node sent one way a second (every rank's bytes), GB/s."""
    return [nbytes * per_node / t / 1e9 for t in windows if t > 0]


def link_figures(hosts: list[str], rounds: list, times: dict, nbytes: int, per_node: int) -> tuple[dict, list]:
    """Per host its link figure and the pairs measured. `times[(round, a, b)]`: the pair's seconds per
    window (its slowest rank's). A pair's figure is what one node sent in one direction per second
    (every rank's bytes, GB/s), its median window; a node's is the best window of any of its pairs: what
    its link can do. A slow link is slow in every window of every pair; a healthy node whose pairs were
    all unlucky in their medians (TCP under a CPU quota stalls now and then) still had a good window. The
    node's spread is that of the windows of the pair its figure came from: how well the figure repeats.
    (The spread over all its pairs' windows, tried, also measures how different its partners are: two slow
    nodes widened every healthy node's spread, so the median node's, and hid a slow link in 1 of 10 checks.)"""
    pairs, best = [], {}
    for r, pairing in enumerate(rounds):
        for a, b in pairing:
            windows = times.get((r, a, b)) or []
            if not windows:
                continue
            rates = gbps(windows, nbytes, per_node)
            value, spread = window_stats(rates)
            pair = {
                "round": r + 1,
                "nodes": [hosts[a], hosts[b]],
                "link_gbps": value,
                "spread_gbps": spread,
                "windows_gbps": rates,
            }
            pairs.append(pair)
            top = max(rates, default=0.0)
            for node in (a, b):
                if hosts[node] not in best or top > best[hosts[node]]["link_gbps"]:
                    best[hosts[node]] = {"link_gbps": top, "link_spread_gbps": spread, "link_partner": pair["nodes"]}
    return best, pairs


def confirmation_pairings(nodes: dict, suspects: list[str]) -> list[list[tuple[str, str]]]:
    """Rounds pairing each node suspected of a slow link with a node that is not, the fastest first: a slow
    link is slow again with a healthy partner, while a healthy node that was merely unlucky in its rounds
    (a stall that comes and goes) is not. Each healthy node meets one suspect a round."""
    healthy = sorted((h for h in nodes if h not in suspects), key=lambda h: -(nodes[h].get("link_gbps") or 0.0))
    if not healthy:
        return []
    rounds: list = []
    for k, host in enumerate(suspects):
        if k % len(healthy) == 0:
            rounds.append([])
        rounds[-1].append((host, healthy[k % len(healthy)]))
    return rounds


def confirm_links(nodes: dict, rounds: list, times: dict, nbytes: int, per_node: int) -> None:
    """Each suspect's figure again, from its confirmation pair's windows (`times[(round, suspect, partner)]`):
    `link_confirm_gbps` (best window), its spread and partner, set on `nodes`."""
    for r, pairing in enumerate(rounds):
        for suspect, partner in pairing:
            rates = gbps(times.get((r, suspect, partner)) or [], nbytes, per_node)
            if rates:
                nodes[suspect].update(
                    link_confirm_gbps=max(rates),
                    link_confirm_spread_gbps=window_stats(rates)[1],
                    link_confirm_partner=partner,
                )


def compute_figures(rows: list[dict], shared_cores: bool = False) -> dict:
    """Per host its compute figure and spread (rows: each rank's `node`, `rank` and the probe's
    `gemm_tflops_windows`). A node with a device a rank (a GPU node) counts at its slowest rank: the step
    waits for it. Where a node's ranks share its cores (`shared_cores`: a CPU, an emulated node's quota),
    the scheduler's split between them is not the node's speed (one rank may get three times the other's
    share in a healthy node, tried), so the node counts at its ranks' mean rate, window by window (the
    windows run at once on every rank), its spread that of those means."""
    out: dict = {}
    by_host: dict = {}
    for row in rows:
        if row.get("gemm_tflops_windows"):
            by_host.setdefault(row["node"], []).append(row)
    for host, group in by_host.items():
        slowest = min(group, key=lambda r: window_stats(r["gemm_tflops_windows"])[0])
        if shared_cores:
            count = min(len(r["gemm_tflops_windows"]) for r in group)
            windows = [statistics.fmean(r["gemm_tflops_windows"][i] for r in group) for i in range(count)]
        else:
            windows = slowest["gemm_tflops_windows"]
        value, spread = window_stats(windows)
        out[host] = {
            "gemm_tflops": value,
            "gemm_spread_tflops": spread,
            "slowest_rank": slowest.get("rank"),
            "gemm_of": "its ranks' mean (they share the node's cores)" if shared_cores else "its slowest rank",
        }
    return out


def medians(nodes: dict) -> dict:
    """The median node's figure and spread for each figure the nodes have."""
    out = {}
    for part, key in FIGURES.items():
        values = [n[key] for n in nodes.values() if n.get(key) is not None]
        if values:
            spreads = [n.get(spread_key(part)) or 0.0 for n in nodes.values() if n.get(key) is not None]
            out[key] = statistics.median(values)
            out[spread_key(part)] = statistics.median(spreads)
    return out


def spread_key(part: str) -> str:
    return "gemm_spread_tflops" if part == "compute" else "link_spread_gbps"


def slow_nodes(nodes: dict, median: dict, share: float = SLOW_SHARE) -> list[dict]:
    """The nodes named by the rule: a figure below the median node's by more than `share` of it and by
    more than the spread measured (the node's and the median node's, windows' half-ranges added). A link
    retested against a healthy partner (`link_confirm_gbps`) is named only if the retest is slow too."""
    named = []
    for host, figures in nodes.items():
        for part, key in FIGURES.items():
            value, middle = figures.get(key), median.get(key)
            if value is None or not middle:
                continue
            if below(value, figures.get(spread_key(part)), middle, median.get(spread_key(part)), share):
                again = figures.get("link_confirm_gbps") if part == "link" else None
                if again is not None and not below(
                    again, figures.get("link_confirm_spread_gbps"), middle, median.get(spread_key(part)), share
                ):
                    continue
                named.append({"node": host, "figure": part, "value": value, "median": middle, "share": value / middle})
    return named


def below(value: float, spread, middle: float, middle_spread, share: float) -> bool:
    gap = middle - value
    return gap > share * middle and gap > (spread or 0.0) + (middle_spread or 0.0)


def link_suspects(hosts: list[str], nodes: dict) -> list[str]:
    """The nodes whose link the first rounds put below the rule's line: retested before being named. With
    fewer than three nodes there is no healthy partner to retest with (and a link is never named)."""
    if len(hosts) < 3:
        return []
    return [n["node"] for n in slow_nodes(nodes, medians(nodes)) if n["figure"] == "link"]


def verdict(hosts: list[str], nodes: dict, pairs: list) -> dict:
    """check.json's `nodes`: each host's figures, the median node, the nodes named and why, the
    `--exclude=` list, and with two nodes the pair the test cannot split."""
    middle = medians(nodes)
    named = slow_nodes(nodes, middle) if len(hosts) > 1 else []
    if len(hosts) < 3:  # both nodes share the one pair: a slow link cannot be put on either
        named = [n for n in named if n["figure"] != "link"]
    undecidable = hosts if len(hosts) == 2 else []
    slow = list(dict.fromkeys(n["node"] for n in named))
    return {
        "hosts": {h: nodes.get(h, {}) for h in hosts},
        "median": middle,
        "pairs": pairs,
        "slow": named,
        "exclude": ",".join(slow),
        "undecidable": undecidable,
        "rule": f"below the median node by more than {SLOW_SHARE:.0%} and by more than the windows' spread",
    }


FIGURE_BYTES = 400  # one rank's figures as all_gather_object pickles them, about


def cost_seconds(nodes: int, ranks_per_node: int, exchange_s: float, latency_s: float, gbps: float) -> float:
    """The part's time on `nodes` nodes (docs/check.md, "Finding a slow node"): the compute windows, the
    probe, each round's warm-up and REPEATS windows at the slowest pair's exchange time, a barrier before
    each exchange (log2 of the ranks steps of `latency_s`), and the figures gathered to every rank (two
    all-gathers as rings: ranks - 1 steps each, and every rank's FIGURE_BYTES at `gbps`)."""
    import math

    ranks = nodes * ranks_per_node
    barrier = math.ceil(math.log2(max(2, ranks))) * latency_s
    exchanges = 1 + len(pairings(nodes)) * (1 + REPEATS)  # the probe, then each round's
    probe = PROBE_BYTES / (gbps * 1e9) + barrier
    gather = 2 * (ranks - 1) * latency_s + ranks * FIGURE_BYTES / (gbps * 1e9)
    return COMPUTE_WINDOW_S * COMPUTE_WINDOWS + probe + (exchanges - 1) * exchange_s + exchanges * barrier + gather


# ---------------------------------------------------------------- measuring (torch from here on)


def measure(world, spec: dict) -> dict:
    """Every node's compute and link, at once on all of them; rank 0 returns the verdict's input (the
    others None)."""
    import torch.distributed as dist

    names = [None] * world.world_size
    dist.all_gather_object(names, world.node_name)
    hosts = list(dict.fromkeys(names))
    ranks_of = {h: [r for r, n in enumerate(names) if n == h] for h in hosts}
    started = time.perf_counter()
    mine = compute_probe(world, spec)
    mine.update(node=world.node_name, rank=world.rank)
    compute_s = time.perf_counter() - started
    rounds = pairings(len(hosts))
    times, nbytes, probe_s = {}, 0, 0.0
    if rounds:
        counts = {len(v) for v in ranks_of.values()}
        if len(counts) > 1:
            from vit_scale.errors import UserError

            placed = ", ".join(f"{h} {len(v)}" for h, v in ranks_of.items())
            raise UserError(f"ranks per node: uneven placement ({placed}); allowed: the same number on every node")
        probe_s, nbytes, times = link_rounds(world, hosts, ranks_of, rounds)
    # every rank's figures to every rank, as the environment part gathers the ranks' facts: a collective over
    # the ring (a gather to rank 0 would open a connection from every rank to it at scale)
    rows = [None] * world.world_size
    dist.all_gather_object(rows, {"probe": mine, "times": times})
    per_rank = [row["probe"] for row in rows]
    per_node = len(ranks_of[hosts[0]])
    nodes = {h: {} for h in hosts}
    for host, figures in compute_figures(per_rank, shared_cores=world.device_type == "cpu").items():
        nodes[host].update(figures)
    link, pairs = link_figures(hosts, rounds, slowest_windows([row["times"] for row in rows]), nbytes, per_node)
    for host, figures in link.items():
        nodes[host].update(figures)
    # every rank computed the same figures from the same rows, so all agree on the links to retest
    retest = confirmation_pairings(nodes, link_suspects(hosts, nodes))
    if retest:
        index = {h: i for i, h in enumerate(hosts)}
        mine_again = pair_windows(
            world, hosts, ranks_of, [[(index[a], index[b]) for a, b in p] for p in retest], nbytes
        )
        again = [None] * world.world_size
        dist.all_gather_object(again, mine_again)
        by_name = {(r, hosts[a], hosts[b]): w for (r, a, b), w in slowest_windows(again).items()}
        confirm_links(nodes, retest, by_name, nbytes, per_node)
    if world.rank != 0:
        return {}
    found = verdict(hosts, nodes, pairs)
    found.update(
        exchange_bytes=nbytes,
        probe_s=probe_s,
        compute_s=compute_s,
        retested=[list(pair) for pairing in retest for pair in pairing],
        seconds=time.perf_counter() - started,
        ranks=per_rank,
        errors=[p["error"] for p in per_rank if p.get("error")],
    )
    return found


def slowest_windows(ranks_times: list[dict]) -> dict:
    """A pair's windows as its slowest rank timed them, from every rank's {(round, a, b): seconds}."""
    out: dict = {}
    for times in ranks_times:
        for key, windows in times.items():
            held = out.setdefault(key, [0.0] * len(windows))
            out[key] = [max(x, y) for x, y in zip(held, windows, strict=True)]
    return out


def compute_probe(world, spec: dict) -> dict:
    """This rank's GEMM rate in windows of about COMPUTE_WINDOW_S (the run's health probe), on a CPU every
    rank's window i at once (a barrier before each); an error is kept, not raised: the link part still runs,
    and a rank whose probe failed still passes the barriers the others wait at."""
    barriers = Barriers() if world.device_type == "cpu" else None
    try:
        from vit_scale.run.health import rank_figures

        model, batch, precision = spec["model"], spec["batch_size"], spec["precisions"][0]
        return rank_figures(
            world.device, model, batch, precision, COMPUTE_WINDOWS, window_s=COMPUTE_WINDOW_S, before_window=barriers
        )
    except Exception as exc:  # the probe's failure is a finding, not the check's end
        if barriers is not None:
            barriers.finish(COMPUTE_WINDOWS)
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300], "gemm_tflops_windows": []}


class Barriers:
    """A barrier of the world before each compute window, counted, so that a rank whose probe failed
    part-way can pass the ones it has not (`finish`)."""

    def __init__(self):
        self.passed = 0

    def __call__(self) -> None:
        import torch.distributed as dist

        dist.barrier()
        self.passed += 1

    def finish(self, total: int) -> None:
        while self.passed < total:
            self()


def link_rounds(world, hosts: list, ranks_of: dict, rounds: list) -> tuple[float, int, dict]:
    """(the slowest probe's seconds, the bytes a rank exchanged, {(round, a, b): this rank's seconds per
    window}) for the rounds this rank's node is in."""
    from vit_scale.check.collectives import agreed_max, free_bytes_per_rank

    me = hosts.index(world.node_name)
    index = ranks_of[world.node_name].index(world.rank)

    peer = partner_in(me, index, hosts, ranks_of, rounds[0])[1]
    probe = exchange(world, peer, PROBE_BYTES, 1)[0] if peer is not None else 0.0
    probe_s = agreed_max(probe, None, world.device)
    free = agreed_max(-free_bytes_per_rank(world), None, world.device)  # the least free memory of any rank
    nbytes = exchange_bytes(probe_s, -free)
    return probe_s, nbytes, pair_windows(world, hosts, ranks_of, rounds, nbytes)


def partner_in(me: int, index: int, hosts: list, ranks_of: dict, pairing: list) -> tuple:
    """(the pair this node is in, the partner rank of this rank's local index), or (None, None)."""
    for a, b in pairing:
        if me in (a, b):
            other = b if me == a else a
            return (a, b), ranks_of[hosts[other]][index]
    return None, None


def pair_windows(world, hosts: list, ranks_of: dict, rounds: list, nbytes: int) -> dict:
    """{(round, a, b): this rank's seconds per window} for the rounds this rank's node is in; every rank
    goes through every round (the barriers), sitting out those its node is not in."""
    me = hosts.index(world.node_name)
    index = ranks_of[world.node_name].index(world.rank)
    times = {}
    for r, pairing in enumerate(rounds):
        pair, peer = partner_in(me, index, hosts, ranks_of, pairing)
        windows = exchange(world, peer, nbytes, 1 + REPEATS)[1:]  # the first: warm-up
        if pair is not None:
            times[(r, *pair)] = windows
    return times


def exchange(world, peer: int | None, nbytes: int, times: int) -> list[float]:
    """`times` windows of one exchange of nbytes each way with `peer` (None: this rank sits the round out
    but keeps the barriers): seconds each. Every rank of the world starts each window after one barrier,
    so all pairs run at once; device events on a GPU, the host clock on a CPU."""
    import torch
    import torch.distributed as dist

    gpu = world.device_type != "cpu"
    if peer is not None:
        send = torch.ones(nbytes // 4, dtype=torch.float32, device=world.device)
        recv = torch.empty_like(send)
    out = []
    for _ in range(times):
        dist.barrier()
        if peer is None:
            continue
        if gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if gpu:
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        else:
            out.append(time.perf_counter() - began)
    return out
