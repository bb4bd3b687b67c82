"""How fast an emulated node computes while its ranks also wait on the network.

The isolated emulation (vit_scale/cluster/emulation.py) makes a slow node with a CPU quota: a node's ranks
may use `cpus_per_node` cores' worth of CPU time in every 100 ms period (CFS bandwidth control), but within
a period they run on as many of the machine's cores as are free until that time is spent. A rank that waits
on a collective spends none of it, so its next stretch of compute may run faster than at the 1-node rung,
where the ranks compute back to back and the quota binds all the time. A prediction that takes a node's
compute from its 1-node rung is then an upper bound on that compute beyond 1 node, not a value; this
benchmark measures how far below it the compute can go.

Each "node" is a cgroup with the profile's quota holding `--ranks` worker processes (one torch thread each,
as threads_per_rank gives a half-core node's two ranks). A step: `--pieces` stretches of compute (a
fixed count of matmuls: `--cpu-ms` of CPU time a rank a step in all, split evenly), each followed by a wait
(sleep) of `--wait-ms / pieces`, as FSDP's blocking gloo collectives split a step into units with a wait
after each; every worker of every node meets at a barrier before each step, as a collective would align
them. Printed per node count and wait: the median over steps of a rank's compute wall time in the step
(its stretches added) and its ratio to the same with no wait (the 1-node rung's pace).

    python benchmarks/quota_burst.py                 # 1, 2, 4 nodes x waits 0, 100, 250, 500, 1000 ms
    python benchmarks/quota_burst.py --nodes 2 --wait-ms 0,250

Needs root and a cgroup cpu controller (v1 cpu.cfs_quota_us or v2 cpu.max), as the emulation does; run it
on an idle machine. Torch is used for the compute so that it is the same kind of work as a rank's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from vit_scale.cluster import emulation  # noqa: E402

SIZE = 96  # a matmul's side: a few hundred microseconds of one core, fine-grained enough to split a step


def _matmuls_for(cpu_ms: float) -> int:
    """How many SIZE x SIZE matmuls take cpu_ms of one unthrottled core (measured here, before any quota)."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(SIZE, SIZE)
    for _ in range(50):
        a @ a
    t = time.thread_time()
    n = 400
    for _ in range(n):
        a @ a
    per = (time.thread_time() - t) / n
    return max(1, round(cpu_ms / 1000 / per))


def _worker(procs_file, barrier, out, steps, pieces, matmuls, wait_s):
    import torch

    torch.set_num_threads(1)
    if procs_file:
        with open(procs_file, "w") as f:
            f.write(str(os.getpid()))
    a = torch.randn(SIZE, SIZE)
    per_piece = max(1, matmuls // pieces)
    walls = []
    for step in range(steps + 1):  # the first step warms up
        barrier.wait()
        wall = 0.0
        for _ in range(pieces):
            t = time.perf_counter()
            for _ in range(per_piece):
                a @ a
            wall += time.perf_counter() - t
            if wait_s:
                time.sleep(wait_s / pieces)
        if step:
            walls.append(wall)
    out.put(statistics.median(walls))


def _node_dirs(kind: str, tag: str, nodes: int, cpus: float) -> list:
    for path, text in emulation.cgroup_writes(tag, nodes, cpus, kind):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    top = emulation.cgroup_dir(tag, kind)
    name = "cgroup.procs" if kind == "v2" else "tasks"
    return [os.path.join(top, f"n{i}", name) for i in range(nodes)]


def measure(nodes: int, ranks: int, cpus: float, steps: int, pieces: int, matmuls: int, wait_s: float, kind) -> float:
    """The median over ranks of each rank's median compute wall time a step (seconds)."""
    # the emulation's own tag form, so that its clean-up (and a later run's sweep of a killed one) finds them
    tag = emulation.study_tag(f"quota-burst-{nodes}")
    files = _node_dirs(kind, tag, nodes, cpus) if kind else [None] * nodes
    barrier, out = mp.Barrier(nodes * ranks), mp.Queue()
    procs = [
        mp.Process(target=_worker, args=(files[i], barrier, out, steps, pieces, matmuls, wait_s))
        for i in range(nodes)
        for _ in range(ranks)
    ]
    try:
        for p in procs:
            p.start()
        walls = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if kind:
            emulation.remove(tag)
    return statistics.median(walls)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,2,4", help="node counts, comma-separated (default 1,2,4)")
    ap.add_argument("--wait-ms", default="0,100,250,500,1000", help="a rank's wait a step, ms, comma-separated")
    ap.add_argument("--ranks", type=int, default=2, help="ranks a node (default 2, the local profile's)")
    ap.add_argument("--cpus", type=float, default=0.5, help="cores a node's quota allows (default 0.5, local's)")
    ap.add_argument("--cpu-ms", type=float, default=40.0, help="a rank's CPU time of compute a step (default 40)")
    ap.add_argument("--pieces", type=int, default=12, help="stretches of compute a step (default 12)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps (default 8, after one warm-up)")
    args = ap.parse_args(argv)
    try:
        nodes = [int(x) for x in args.nodes.split(",")]
        waits = [float(x) / 1000 for x in args.wait_ms.split(",")]
    except ValueError:
        print("quota_burst: --nodes and --wait-ms take comma-separated numbers", file=sys.stderr)
        return 2
    kind = emulation.cgroup_kind()
    if kind is None or os.geteuid() != 0:
        print("quota_burst: needs root and a cgroup cpu controller (v1 or v2), as the emulation does", file=sys.stderr)
        return 2
    matmuls = _matmuls_for(args.cpu_ms)
    print(
        f"a rank: {args.cpu_ms:g} ms of CPU a step ({matmuls} matmuls of {SIZE}x{SIZE}) in {args.pieces} stretches; "
        f"a node: {args.ranks} ranks, quota {args.cpus:g} cores ({kind} cgroup, period "
        f"{emulation.PERIOD_US // 1000} ms); {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'nodes':>5} {'wait ms':>8} {'compute ms':>11} {'of no wait':>11}   (a rank's compute wall a step, median)")
    for n in nodes:
        base = None
        for w in waits:
            wall = measure(n, args.ranks, args.cpus, args.steps, args.pieces, matmuls, w, kind)
            base = wall if base is None else base
            print(f"{n:>5} {w * 1000:>8.0f} {wall * 1000:>11.1f} {wall / base:>11.2f}", flush=True)
    unthrottled = measure(1, args.ranks, args.cpus, args.steps, args.pieces, matmuls, 0.0, None)
    print(f"no quota, 1 node, no wait: {unthrottled * 1000:.1f} ms (the cores' own pace)")
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
