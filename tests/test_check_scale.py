"""The check at full machine size, without launching its ranks: the collectives' result check at
Frontier's 75,264 ranks (9,408 nodes x 8), simulated in numpy in the orders a collective library
adds in; NCCL's log files of that many ranks, generated as NCCL writes them (no NCCL here), read
by the orchestrator. What needs ranks runs over gloo in tests/test_check.py and
tests/test_check_groups.py."""

import os

import numpy
import pytest

FRONTIER_RANKS = 9408 * 8


def ring(values: numpy.ndarray, start: int, step: int) -> numpy.float32:
    """A ring reduction: starting at rank `start`, each hop adds the next rank's value (step 1 or
    -1: the ring's direction) to the partial sum and rounds it to fp32, as NCCL's kernels do."""
    order = numpy.roll(values, -start)[::step] if step == 1 else numpy.roll(values[::-1], start + 1)
    return numpy.add.accumulate(order.astype(numpy.float32), dtype=numpy.float32)[-1]


def tree(values: numpy.ndarray) -> numpy.float32:
    """Pairwise (a tree, or recursive halving): neighbours added level by level in fp32."""
    level = values.astype(numpy.float32)
    while len(level) > 1:
        if len(level) % 2:
            level = numpy.append(level, numpy.float32(0))
        level = (level[0::2] + level[1::2]).astype(numpy.float32)
    return level[0]


def by_node(values: numpy.ndarray, per_node: int, start: int) -> numpy.float32:
    """Each node's ranks summed first, then a ring over the nodes' sums (a hierarchical all-reduce)."""
    nodes = numpy.add.accumulate(values.astype(numpy.float32).reshape(-1, per_node), axis=1, dtype=numpy.float32)
    return ring(nodes[:, -1], start, 1)


def orders(values: numpy.ndarray):
    n = len(values)
    for start in (0, 1, n // 3, n // 2, n - 8, n - 1):
        for step in (1, -1):
            yield f"ring from rank {start}, step {step}", ring(values, start, step)
    yield "tree", tree(values)
    yield "by node, then a ring over nodes", by_node(values, 8, 0)
    yield "by node, then a ring over nodes from node 4,000", by_node(values, 8, 4000)


def test_rank_plus_one_is_not_exact_at_frontier_size():
    """Why the values changed: rank + 1 from every rank sums past 2**24, and fp32 rounds."""
    n = FRONTIER_RANKS
    values = numpy.arange(1, n + 1, dtype=numpy.float64)
    wrong = [name for name, total in orders(values) if int(total) != n * (n + 1) // 2]
    assert len(wrong) >= 10, wrong


@pytest.mark.parametrize("ranks", [2, 8, 384, 5792, 8192, 8 * 1024, FRONTIER_RANKS, 2**20])
def test_collective_check_is_exact_in_every_order_at_any_size(ranks):
    """What the ranks send for a sum adds up exactly however the library orders the additions,
    and result_is_right accepts that result and refuses one rank's value lost or counted twice."""
    import torch

    from vit_scale.check.collectives import check_value, expected_sum, result_is_right

    values = numpy.array([check_value("all_reduce", r, ranks) for r in range(ranks)], dtype=numpy.float64)
    assert values.min() >= 1 and int(values.sum()) == expected_sum(ranks)
    for name, total in orders(values) if ranks >= 16 else [("ring", ring(values, 0, 1)), ("tree", tree(values))]:
        assert int(total) == expected_sum(ranks), name
        assert result_is_right("all_reduce", torch.tensor([total] * 3), ranks, 3), name
        assert result_is_right("reduce_scatter", torch.tensor([total] * 2), ranks, 2), name
    lost = ring(values[1:], 0, 1)
    twice = ring(numpy.append(values, values[-1]), 0, 1)
    for bad in (lost, twice):
        assert not result_is_right("all_reduce", torch.tensor([bad] * 3), ranks, 3)
    gathered = torch.tensor([float(check_value("all_gather", r, ranks)) for r in range(ranks)]).repeat_interleave(2)
    assert result_is_right("all_gather", gathered, ranks, 2)
    assert not result_is_right("all_gather", gathered.roll(2), ranks, 2)


# ---------------------------------------------------------------- NCCL's log files at full size


def log_benchmark():
    import importlib.util
    import os

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location(
        "check_log_reading", os.path.join(ROOT, "benchmarks", "check_log_reading.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def frontier_logs(tmp_path_factory):
    """A check's logs/ with one NCCL_DEBUG_FILE per rank of a 9,408-node launch (as every rank wrote
    them when all logged; each node's last rank connects to the next node): what the orchestrator
    must read without holding it all."""
    bench = log_benchmark()
    out = tmp_path_factory.mktemp("frontier")
    written = bench.write_rank_logs(str(out / "logs"), FRONTIER_RANKS, 8, "first")
    return bench, str(out), written


def test_the_transport_is_read_from_75264_rank_files_as_a_stream_stopping_at_the_first_connection(frontier_logs):
    import tracemalloc

    from vit_scale.check.environment import collective_logs, transport_facts

    bench, out, written = frontier_logs
    launch_log = os.path.join(out, "logs", "check.launch.log")
    with open(launch_log, "w") as f:
        f.write("the launch's own output\n")
    files = collective_logs(out, bench.STAMP, [launch_log])
    tracemalloc.start()
    facts = transport_facts("nccl", files, ("ofi",))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert facts["observed"] == ["ofi"] and facts["between_nodes"] == ["AWS Libfabric"], facts
    assert any("via NET/AWS Libfabric" in line for line in facts["evidence"])
    left = sum(1 for _ in files)  # files not opened: reading stopped at the first connection between nodes
    assert left > FRONTIER_RANKS + 1 - 1000, left
    assert peak < 2**20, peak

    # every file as a stream: memory stays that of a file, not of the 75,264 together
    tracemalloc.start()
    lines = sum(1 for lines in collective_logs(out, bench.STAMP, [launch_log]) for _ in lines)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert lines == FRONTIER_RANKS * 12 + 1
    assert written > 50 * 2**20 and peak < 2**20, (written, peak)


def test_only_the_ranks_of_two_nodes_log_nccl_lines():
    from vit_scale.check.environment import logs_transport

    frontier = [rank for rank in range(FRONTIER_RANKS) if logs_transport(rank, 8)]
    assert frontier == list(range(16))
    assert [rank for rank in range(8) if logs_transport(rank, 4)] == list(range(8))
    assert [rank for rank in range(3) if logs_transport(rank, 1)] == [0, 1]
