"""How often `vit-scale check --only nodes` names exactly the slow node(s) injected into the miniature
cluster, and how often it names a node when none is slow: the rule's error rates, measured.

    python benchmarks/slow_node.py                 # 4 cases x 20 checks on 4 emulated nodes, about 15 min
    python benchmarks/slow_node.py --checks 5 --cases b,d

Each check runs on 4 isolated emulated nodes (configs/systems/local.yaml: 25 Mbit/s links, half a core a
node) with one of the faults set through `--set emulation.nodes.<host>...`:
  a  one node's link at a quarter of the others' (local2: 0.00625 Gbit/s)
  b  one node's CPU share at a quarter (local3: 0.125 cores)
  c  both, on two different nodes (local1's link, local3's CPU)
  d  no fault
and the nodes it names (check.json's per_node.slow) are compared with the injected ones. Needs root (network
namespaces, cgroups), as the emulation does; run it on an otherwise idle machine, since the nodes' CPU
shares are what case b measures. Prints each case's count beside the bar (19 of 20) and the time a check
took; docs/check.md, "Finding a slow node", carries the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = 0.025 / 4  # a quarter of local.yaml's inter_node_gbps
CPU = 0.5 / 4  # a quarter of local.yaml's cpus_per_node
CASES = {
    "a": ("one node's link at a quarter", {"local2": {"inter_node_gbps": LINK}}),
    "b": ("one node's CPU share at a quarter", {"local3": {"cpus_per_node": CPU}}),
    "c": ("both, on two nodes", {"local1": {"inter_node_gbps": LINK}, "local3": {"cpus_per_node": CPU}}),
    "d": ("no fault", {}),
}
BAR = 19 / 20


def sets(faults: dict) -> list[str]:
    return [
        arg
        for host, values in faults.items()
        for key, value in values.items()
        for arg in ("--set", f"emulation.nodes.{host}.{key}={value:g}")
    ]


def one_check(faults: dict, out: str) -> tuple[set, float, dict]:
    """(the nodes named, seconds, check.json's per_node) of one check."""
    argv = [sys.executable, "-m", "vit_scale", "check", "--nodes", "4", "--only", "nodes", "--out", out, *sets(faults)]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    try:
        with open(os.path.join(out, "check.json")) as f:
            found = json.load(f).get("per_node") or {}
    except (OSError, ValueError):
        sys.exit(f"slow_node: the check wrote no check.json (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    if found.get("error"):
        sys.exit(f"slow_node: the nodes part failed: {found['error']}")
    return {n["node"] for n in found.get("slow") or []}, seconds, found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=20, help="checks per case (default 20)")
    parser.add_argument("--cases", default="a,b,c,d", help="which of a,b,c,d (default all)")
    parser.add_argument("--keep", metavar="DIR", help="keep each check's check.json there, as DIR/<case><i>.json")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    bad = [c for c in cases if c not in CASES]
    if bad or args.checks < 1:
        parser.error(f"--cases: allowed a,b,c,d, got {args.cases}; --checks: a positive number")
    if os.geteuid() != 0:
        sys.exit("slow_node: needs root (the emulated nodes' namespaces and CPU groups)")
    print(f"{len(cases)} case(s) x {args.checks} checks, 4 emulated nodes, `vit-scale check --only nodes`")
    rows = []
    with tempfile.TemporaryDirectory(prefix="slow_node.") as tmp:
        for case in cases:
            what, faults = CASES[case]
            injected = set(faults)
            right, seconds, wrong = 0, [], []
            for i in range(args.checks):
                named, took, found = one_check(faults, os.path.join(tmp, f"{case}{i}"))
                if args.keep:
                    os.makedirs(args.keep, exist_ok=True)
                    shutil.copy(
                        os.path.join(tmp, f"{case}{i}", "check.json"), os.path.join(args.keep, f"{case}{i}.json")
                    )
                seconds.append(took)
                right += named == injected
                # what a wrong answer rests on: each named node's figure and its share of the median node's
                why = [f"{n['node']} {n['figure']} {n['share']:.0%}" for n in found.get("slow") or []]
                hosts = found.get("hosts") or {}
                retests = [
                    f"{a} again {hosts[a].get('link_confirm_gbps', 0) / found['median']['link_gbps']:.0%} with {b}"
                    for a, b in found.get("retested") or []
                ]
                if named != injected:
                    wrong.append(sorted(named))
                print(
                    f"  {case} {i + 1:2d}/{args.checks}: named {', '.join(why) or 'none'} "
                    + (f"; retested {', '.join(retests)}" if retests else "")
                    + f" ({took:.1f} s, part {found.get('seconds', 0):.1f} s)"
                    + ("" if named == injected else "  WRONG"),
                    flush=True,
                )
            rows.append((case, what, injected, right, args.checks, statistics.median(seconds), wrong))
    print()
    print(f"{'case':5} {'fault':36} {'injected':16} {'named exactly':>14} {'bar':>6} {'check s':>8}")
    for case, what, injected, right, n, median_s, wrong in rows:
        ok = right >= BAR * n
        print(
            f"{case:5} {what:36} {','.join(sorted(injected)) or 'none':16} {f'{right}/{n}':>14} "
            f"{'met' if ok else 'MISSED':>6} {median_s:8.1f}" + (f"   wrong: {wrong}" if wrong else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
