"""How the check's orchestrator reads NCCL's log files at full machine size.

    python benchmarks/check_log_reading.py [--ranks 75264] [--ranks-per-node 8] [--net first|last|none] [--dir DIR]

Generates one NCCL_DEBUG_FILE per rank as NCCL writes them with NCCL_DEBUG=INFO
NCCL_DEBUG_SUBSYS=INIT,NET (default: Frontier's 9,408 nodes x 8 ranks, RCCL over AWS Libfabric),
then reads them the old way (every file concatenated into one string, then parsed) and the new
way (check.environment.collective_logs: a stream of lines, file by file, stopping at the end of
the first file that shows a connection between nodes), and prints the time and the peak Python
memory (tracemalloc) of each side by side. --net says where connection lines are: in every file
(first, the case when every rank logged), only in the last file, or nowhere (one node).
Files are read from the page cache (they were just written); a parallel filesystem is slower to
open each, which makes the old way's cost per file larger still.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from vit_scale.check.environment import collective_logs, nccl_log_name, nccl_transport  # noqa: E402

STAMP = "20261125-120000-1"
HEADER = """{host}:{pid}:{pid} [{local}] NCCL INFO Bootstrap : Using hsn0:10.{node_hi}.{node_lo}.{local}<0>
{host}:{pid}:{pid} [{local}] NCCL INFO NET/OFI Initializing aws-ofi-rccl 1.4.0
{host}:{pid}:{pid} [{local}] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
{host}:{pid}:{pid} [{local}] NCCL INFO Using network AWS Libfabric
{host}:{pid}:{pid} [{local}] NCCL INFO comm 0x5b1e2c0 rank {rank} nranks {ranks} cudaDev {local} busId c1000 \
- Init START
{host}:{pid}:{pid} [{local}] NCCL INFO Setting affinity for GPU {local} to ff000000,00000000
{host}:{pid}:{pid} [{local}] NCCL INFO Trees [0] {up}/-1/-1->{rank}->{down} [1] {up}/-1/-1->{rank}->{down}
"""
WITHIN = (
    "{host}:{pid}:{tid} [{local}] NCCL INFO Channel {ch:02d}/0 : {rank}[{local}] -> {peer}[{peer_local}] via P2P/IPC\n"
)
BETWEEN = (
    "{host}:{pid}:{tid} [{local}] NCCL INFO Channel {ch:02d}/0 : {rank}[{local}] -> {peer}[0] [send] "
    "via NET/AWS Libfabric/{nic}/GDRDMA\n"
)
FOOTER = "{host}:{pid}:{pid} [{local}] NCCL INFO comm 0x5b1e2c0 rank {rank} nranks {ranks} - Init COMPLETE\n"


def write_rank_logs(folder: str, ranks: int, per_node: int, net: str, stamp: str = STAMP) -> int:
    """One file per rank, named as NCCL names NCCL_DEBUG_FILE=nccl.<stamp>.1.%h.%p.log; the last
    rank of each node sends to the next node. Bytes written."""
    os.makedirs(folder, exist_ok=True)
    pattern = nccl_log_name(stamp, 1)
    written = 0
    for rank in range(ranks):
        node, local = divmod(rank, per_node)
        host, pid = f"frontier{node:05d}", 10000 + rank
        facts = dict(
            host=host,
            pid=pid,
            tid=pid + 6,
            local=local,
            rank=rank,
            ranks=ranks,
            node_hi=node // 256,
            node_lo=node % 256,
            up=(rank - 1) % ranks,
            down=(rank + 1) % ranks,
        )
        text = HEADER.format(**facts)
        crosses = local == per_node - 1 and (net == "first" or (net == "last" and rank == ranks - 1))
        for ch in range(4):
            if crosses:
                text += BETWEEN.format(**facts, ch=ch, peer=(rank + 1) % ranks, nic=ch)
            else:
                text += WITHIN.format(**facts, ch=ch, peer=(rank + 1) % ranks, peer_local=(local + 1) % per_node)
        text += FOOTER.format(**facts)
        with open(os.path.join(folder, pattern.replace("%h", host).replace("%p", str(pid))), "w") as f:
            f.write(text)
        written += len(text)
    return written


def old_way(out: str, stamp: str) -> dict:
    """Every file of the check concatenated into one string, then parsed (how it was read before)."""
    import glob

    paths = sorted(glob.glob(os.path.join(out, "logs", f"nccl.{glob.escape(stamp)}.*.log")))
    text = ""
    for path in paths:
        with open(path, errors="replace") as f:
            text += f.read()
    return nccl_transport(text)


def new_way(out: str, stamp: str) -> dict:
    return nccl_transport(collective_logs(out, stamp, []))


def measured(read, out: str, stamp: str) -> tuple[dict, float, int]:
    tracemalloc.start()
    started = time.perf_counter()
    found = read(out, stamp)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return found, seconds, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=9408 * 8)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--net", choices=("first", "last", "none"), default="first")
    parser.add_argument("--dir", help="where the files go (default: a temporary folder, removed afterwards)")
    args = parser.parse_args()
    out = args.dir or tempfile.mkdtemp(prefix="check-logs-")
    try:
        started = time.perf_counter()
        written = write_rank_logs(os.path.join(out, "logs"), args.ranks, args.ranks_per_node, args.net)
        print(
            f"{args.ranks} rank files, {written / 2**20:.1f} MiB, written in {time.perf_counter() - started:.1f} s "
            f"(connections between nodes: {args.net})"
        )
        print(f"{'':<6} {'seconds':>9} {'peak MiB':>9}  between nodes")
        for name, read in (("old", old_way), ("new", new_way)):
            found, seconds, peak = measured(read, out, STAMP)
            print(f"{name:<6} {seconds:>9.3f} {peak / 2**20:>9.1f}  {', '.join(found['between_nodes']) or '-'}")
    finally:
        if not args.dir:
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
