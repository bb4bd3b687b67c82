"""Each node's health in one run, and the rule that calls a node slow.

After its timed window every rank of a run times a short probe (vit_scale.run.health): its Block's
GEMM rate and, on a GPU, its device's memory copy rate. `by_node` folds the ranks' figures into one
entry per host, each figure its slowest rank's (a node is as slow as its slowest rank), and the
median node; the run writes that as the end record's `nodes_health` (docs/run_record.md).
`slow_nodes` is the one rule that reads it: a node more than SLOW_SHARE below the median node in a
figure is slow. The analysis flags the run by it (results.csv's `slow_node`), the run prints it,
and the check may judge its own per-node figures with it. Torch-free.
"""

from __future__ import annotations

import math
import statistics

SLOW_SHARE = 0.20  # a node's figure this far below the median node's makes it slow
# the figures a node is judged by, and the word a line names each with
FIGURES = (("gemm_tflops", "compute"), ("copy_gbps", "memory copy"))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def by_node(rows: list[dict], shared_cores: bool = False) -> dict:
    """{"hosts": {host: entry}, "median": {figure: value}} from one row per rank (`node`, `rank`, the
    FIGURES' keys where measured, `error` where its probe failed). An entry: each figure its slowest
    rank's, or where the node's ranks share its cores (`shared_cores`: a CPU) their mean (the scheduler's
    split between them is not the node's speed; vit_scale.check.nodes.compute_figures), None where no rank
    measured it; `ranks` (how many ranks the host had), `slowest_rank` (the rank with its lowest compute
    figure), `error` (its ranks' failures, or None). The median node: per figure, the median over the
    hosts that have it."""
    grouped: dict = {}
    for row in rows:
        grouped.setdefault(str(row["node"]), []).append(row)
    hosts = {}
    for host, group in grouped.items():
        entry: dict = {}
        for key, _ in FIGURES:
            measured = [r[key] for r in group if _number(r.get(key))]
            entry[key] = (statistics.fmean(measured) if shared_cores else min(measured)) if measured else None
        timed = [r for r in group if _number(r.get(FIGURES[0][0]))]
        slowest = min(timed, key=lambda r: r[FIGURES[0][0]]) if timed else None
        errors = [f"rank {r.get('rank')}: {r['error']}" for r in group if r.get("error")]
        entry.update(
            ranks=len(group),
            slowest_rank=slowest.get("rank") if slowest else None,
            error="; ".join(errors) or None,
        )
        hosts[host] = entry
    return {"hosts": hosts, "median": median_node(hosts)}


def median_node(hosts: dict) -> dict:
    """Per figure, the median over the hosts that measured it (None where none did)."""
    median = {}
    for key, _ in FIGURES:
        values = [e[key] for e in hosts.values() if isinstance(e, dict) and _number(e.get(key))]
        median[key] = statistics.median(values) if values else None
    return median


def slow_nodes(health) -> list[tuple[str, str, float]]:
    """(host, figure's word, share of the median) for each node whose figure is more than SLOW_SHARE
    below the median node's, its lowest such figure, slowest first. One node, or none measured:
    nothing can be slow. `health`: an end record's `nodes_health` (anything else reads as none); the
    median is worked out again from the hosts, so that a record and the rule can never disagree."""
    hosts = health.get("hosts") if isinstance(health, dict) else None
    if not isinstance(hosts, dict) or len(hosts) < 2:
        return []
    median = median_node(hosts)
    found = []
    for host, entry in hosts.items():
        shares = [
            (entry[key] / median[key], word)
            for key, word in FIGURES
            if isinstance(entry, dict) and _number(entry.get(key)) and _number(median[key])
        ]
        share, word = min(shares, default=(1.0, ""))
        if share < 1 - SLOW_SHARE:
            found.append((host, word, share))
    return sorted(found, key=lambda f: f[2])


def slow_node_text(health) -> str:
    """'a slow node: local3, compute 48% of the median' (several: 'slow nodes: ...; ...'), or ''."""
    found = slow_nodes(health)
    if not found:
        return ""
    parts = "; ".join(f"{host}, {word} {share:.0%} of the median" for host, word, share in found)
    return f"{'a slow node' if len(found) == 1 else 'slow nodes'}: {parts}"
