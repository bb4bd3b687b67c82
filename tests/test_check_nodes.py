"""The check's nodes part without its ranks: the pairings every node count gets, the figures and the
rule that names a slow node, the verdict's lines and `--exclude=`, the quick collectives' cut to the
rate found, and --only's bad input. The part on emulated nodes with a slow one injected runs in
tests/test_emulation.py; its error rates are measured by benchmarks/slow_node.py."""

from types import SimpleNamespace

import pytest

from vit_scale.check import nodes as part
from vit_scale.check.collectives import QUICK, Size, within_cap
from vit_scale.check.verdict import node_lines


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6, 7, 8, 9, 128, 129, 9408])
def test_every_node_meets_both_ring_neighbours_and_a_third_in_at_most_four_rounds(count):
    rounds = part.pairings(count)
    assert len(rounds) == (1 if count == 2 else 3 if count % 2 == 0 or count == 3 else 4)
    met = {i: set() for i in range(count)}
    for pairing in rounds:
        busy = [n for pair in pairing for n in pair]
        assert len(busy) == len(set(busy)), "a node in two pairs of one round"
        for a, b in pairing:
            met[a].add(b)
            met[b].add(a)
    for i in range(count):
        assert {(i - 1) % count, (i + 1) % count} <= met[i]
    if count >= 4:  # a node between two slow ones on the ring still has a healthy partner
        assert sum(len(partners) < 3 for partners in met.values()) <= 1


def test_exchange_size_follows_the_rate_found():
    slow = part.exchange_bytes(probe_s=0.25, free_bytes=0)  # 256 KiB in 0.25 s: about 1 MB/s
    fast = part.exchange_bytes(probe_s=20e-6, free_bytes=64 * 2**30)  # 256 KiB in 20 us: 13 GB/s
    assert part.PROBE_BYTES <= slow <= 2**20
    assert fast == part.MAX_BYTES
    assert part.exchange_bytes(probe_s=20e-6, free_bytes=2**26) <= 2**26 / 8  # two buffers within a quarter


def figures(compute: dict, link: dict) -> dict:
    return {
        h: {
            "gemm_tflops": compute[h],
            "gemm_spread_tflops": 0.02 * compute[h],
            "link_gbps": link[h],
            "link_spread_gbps": 0.05 * link[h],
        }
        for h in compute
    }


HOSTS = ["local0", "local1", "local2", "local3"]


def test_a_node_at_a_quarter_is_named_and_a_node_within_the_noise_is_not():
    nodes = figures(
        {"local0": 1.0, "local1": 0.97, "local2": 1.02, "local3": 0.25},
        {"local0": 3.0, "local1": 2.1, "local2": 2.9, "local3": 3.1},  # local1 30% low, but see its spread
    )
    nodes["local1"]["link_spread_gbps"] = 1.0  # its windows ranged over 2 GB/s: not a finding
    found = part.verdict(HOSTS, nodes, [])
    assert [(n["node"], n["figure"]) for n in found["slow"]] == [("local3", "compute")]
    assert found["exclude"] == "local3"
    assert found["median"]["gemm_tflops"] == pytest.approx(0.985)


def test_two_nodes_name_a_slow_cpu_but_never_a_link():
    nodes = figures({"local0": 1.0, "local1": 0.25}, {"local0": 0.5, "local1": 0.5})
    nodes["local0"]["link_gbps"] = 3.0  # cannot happen in one pair, but the rule must not name a link
    found = part.verdict(HOSTS[:2], nodes, [])
    assert {n["figure"] for n in found["slow"]} == {"compute"}
    assert found["undecidable"] == HOSTS[:2]


def test_a_slow_link_is_slow_in_both_its_pairs_and_only_its_node_is_named():
    """local2's link at a quarter: its two pairs are slow, its partners' other pairs are not."""
    rounds = part.pairings(4)
    fast, slow = [0.1, 0.11, 0.1], [0.4, 0.42, 0.41]
    times = {(r, a, b): (slow if 2 in (a, b) else fast) for r, pairing in enumerate(rounds) for a, b in pairing}
    link, pairs = part.link_figures(HOSTS, rounds, times, nbytes=2**20, per_node=2)
    assert len(pairs) == 6  # 4 nodes: every pair, over 3 rounds
    assert link["local2"]["link_gbps"] == pytest.approx(2 * 2**20 / 0.4 / 1e9)  # its best window
    assert link["local1"]["link_gbps"] == link["local0"]["link_gbps"] == pytest.approx(2 * 2**20 / 0.1 / 1e9)
    assert [p["link_gbps"] for p in pairs if "local2" in p["nodes"]] == [pytest.approx(2 * 2**20 / 0.41 / 1e9)] * 3
    compute = {h: {"gemm_tflops": 1.0, "gemm_spread_tflops": 0.0} for h in HOSTS}
    found = part.verdict(HOSTS, {h: {**compute[h], **link[h]} for h in HOSTS}, pairs)
    assert [(n["node"], n["figure"]) for n in found["slow"]] == [("local2", "link")]


def test_a_gpu_node_counts_at_its_slowest_rank():
    rows = [
        {"node": "local0", "rank": 0, "gemm_tflops_windows": [1.0, 1.1, 0.9]},
        {"node": "local0", "rank": 1, "gemm_tflops_windows": [0.5, 0.6, 0.4]},
        {"node": "local1", "rank": 2, "gemm_tflops_windows": [1.0, 1.0, 1.0]},
    ]
    found = part.compute_figures(rows)
    assert found["local0"] == {
        "gemm_tflops": 0.5,
        "gemm_spread_tflops": pytest.approx(0.1),
        "slowest_rank": 1,
        "gemm_of": "its slowest rank",
    }


def test_lines_name_each_slow_node_with_its_figure_and_the_exclude_list():
    nodes = figures(
        {"local0": 1.0, "local1": 1.0, "local2": 1.0, "local3": 0.25},
        {"local0": 3.0, "local1": 3.0, "local2": 0.7, "local3": 3.0},
    )
    found = part.verdict(HOSTS, nodes, [])
    found.update(exchange_bytes=2**20, seconds=9.5)
    lines = node_lines({"parts": ["nodes"], "per_node": found})
    by = {line.check: line for line in lines}
    assert by["nodes"].status == "ok" and "4 nodes" in by["nodes"].text
    assert by["node local3"].status == "fail" and by["node local3"].broken
    assert "compute 0.25 TFLOP/s, 25% of the median node's 1 TFLOP/s" in by["node local3"].text
    assert "link 0.7 GB/s, 23% of the median node's 3 GB/s" in by["node local2"].text
    assert by["exclude"].text == "--exclude=local2,local3"
    assert "--exclude=local2,local3" in by["node local2"].fix


def test_two_nodes_warn_and_name_the_pair():
    nodes = figures({"local0": 1.0, "local1": 1.0}, {"local0": 3.0, "local1": 3.0})
    found = {**part.verdict(HOSTS[:2], nodes, []), "exchange_bytes": 2**20, "seconds": 3.0}
    pair = {line.check: line for line in node_lines({"parts": ["nodes"], "per_node": found})}["nodes pair"]
    assert pair.status == "warn" and not pair.broken
    assert "local0 and local1" in pair.text


def test_a_part_that_never_reported_fails_and_one_not_asked_for_is_silent():
    assert node_lines({"parts": ["nodes"], "per_node": None})[0].status == "fail"
    assert node_lines({"parts": ["meter"], "per_node": None}) == []


def done(nbytes, seconds):
    return {"bytes": nbytes, "time_s": seconds}


def test_quick_mode_cuts_a_bucket_a_slow_link_would_take_seconds_to_move():
    bucket = Size("bucket", 25 * 2**20, "fp32", "DDP bucket")
    # 25 Mbit/s: 8 B in 5 ms, 64 KiB in 26 ms -> about 3 MB/s
    slow = [done(8, 0.005), done(4096, 0.0055), done(65536, 0.026)]
    size, cut = within_cap(bucket, slow, QUICK)
    assert size.nbytes < 2**21 and size.nbytes >= 65536 and "cut to" in size.what
    assert cut["bytes"] == 25 * 2**20 and "measured at" in cut["why"]
    fabric = [done(8, 20e-6), done(4096, 22e-6), done(65536, 30e-6)]  # a fabric keeps the bucket
    assert within_cap(bucket, fabric, QUICK) == (bucket, None)
    latency = Size("latency", 8, "fp32", "8 B")
    assert within_cap(latency, slow, QUICK) == (latency, None)


def test_only_takes_parts_of_the_check(tmp_path, capsys):
    from vit_scale.check.cli import main

    assert main(["--only", "nodes,bogus", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--only: 'bogus' is not a part of the check; allowed: meter" in err[0]
    assert not any(tmp_path.iterdir())


def test_cost_at_2_128_and_9408_nodes_is_the_docs_table():
    """Frontier's figures as docs/check.md gives them: 256 MiB a rank at 12.5 GB/s (21 ms), 10 us a step."""
    t_x = part.MAX_BYTES / 12.5e9
    costs = {n: part.cost_seconds(n, 8, t_x, 10e-6, 12.5) for n in (2, 128, 9408)}
    assert costs[2] == pytest.approx(1.3, abs=0.05)
    assert costs[128] == pytest.approx(1.5, abs=0.05)
    assert costs[9408] == pytest.approx(3.0, abs=0.05)
    assert costs[128] - costs[2] < 0.25  # a third round, then only the gathering grows with the ranks


def slow_check() -> dict:
    nodes = figures({h: 1.0 for h in HOSTS} | {"local3": 0.25}, {h: 3.0 for h in HOSTS})
    found = {**part.verdict(HOSTS, nodes, []), "exchange_bytes": 2**20, "seconds": 9.0}
    lines = [line.to_dict() for line in node_lines({"parts": ["nodes"], "per_node": found})]
    return {"per_node": found, "lines": lines}


def test_a_check_broken_only_by_slow_nodes_lets_the_study_go_on():
    from vit_scale.study.preflight import only_slow_nodes_broken

    check = slow_check()
    assert only_slow_nodes_broken(check)
    check["lines"].append({"check": "transport", "status": "fail", "needed": True, "text": "socket"})
    assert not only_slow_nodes_broken(check)
    assert not only_slow_nodes_broken({"lines": []})


def test_report_names_the_points_a_named_node_ran_or_that_the_study_left_it_out(tmp_path):
    import json

    import pandas as pd

    from analysis.report import _slow_nodes_named

    results = pd.DataFrame(
        [
            {"model": "vit_micro", "strategy": "DDP", "nodes": 4, "hosts": "local0,local1,local2,local3"},
            {"model": "vit_micro", "strategy": "DDP", "nodes": 2, "hosts": "local0,local1"},
        ]
    )
    blocks = _slow_nodes_named(slow_check(), str(tmp_path), results)
    assert "local3 (compute 25% of the median node's)" in blocks[0].text
    assert "ran on them all the same" in blocks[0].text
    assert blocks[1].items == ["vit_micro DDP n4: local3"]
    (tmp_path / "nodes_left_out.json").write_text(json.dumps({"left_out": {"local3": "compute 25%"}}))
    blocks = _slow_nodes_named(slow_check(), str(tmp_path), results)
    assert len(blocks) == 1 and "the study left them out of every run" in blocks[0].text


def test_a_study_leaving_a_node_out_places_its_runs_on_the_others_and_skips_what_no_longer_fits(tmp_path, capsys):
    """StudyRun's placement with --exclude-slow-nodes (the check's verdict, here given): emulated names less
    the named node, in order, so that n2 runs on local0 and local2 (the launchers name each node's ranks from
    this list: tests/test_emulation_units.py) and n4 is skipped in one line with a ledger row. The real
    check that names the node runs in tests/test_emulation.py; the whole study on the miniature cluster is
    in docs/check.md."""
    from types import SimpleNamespace

    from vit_scale.study.cli import StudyRun
    from vit_scale.study.ledger import Ledger

    study = SimpleNamespace(
        left_out={"local1": "compute 24% of the median node's"},
        in_slurm=False,
        emulation=SimpleNamespace(nodes=4),
        plan=SimpleNamespace(nodes=[1, 2, 4]),
        dry_run=False,
    )
    assert StudyRun.nodes_to_use(study, []) == ["local0", "local2", "local3"]
    study.in_slurm = True  # an allocation: its own node names, less the named one
    assert StudyRun.nodes_to_use(study, ["n1", "local1", "n3"]) == ["n1", "n3"]
    study.left_out = {}
    assert StudyRun.nodes_to_use(study, ["n1", "n2"]) == ["n1", "n2"]  # nothing left out: as before
    study.left_out = {"local1": "compute"}
    ledger = Ledger(str(tmp_path / "study_runs.tsv"))
    run = SimpleNamespace(model="vit_micro", strategy="DDP", variant="-", nodes=4, ranks=8, repetition=1)
    StudyRun._skip_too_few_nodes(study, "[3/3] vit_micro DDP n4 (8 ranks)", run, "processes", 3, ledger)
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        "[3/3] vit_micro DDP n4 (8 ranks) ... skipped: needs 4 nodes, 3 left after leaving out local1 "
        "(named slow by the check)"
    ]
    (row,) = ledger.rows()
    assert row["status"] == "skipped" and row["nodes"] == "4"


def test_exclude_slow_nodes_without_the_check_is_one_line(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    argv = [sys.executable, "-m", "vit_scale", "study", "--system", "local", "--exclude-slow-nodes", "--dry-run"]
    proc = subprocess.run(argv + ["--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not any(tmp_path.iterdir())
    assert proc.stderr.strip().splitlines() == [
        "vit-scale study: --exclude-slow-nodes: needs --check, whose nodes part names the slow nodes"
    ]


def test_two_slow_nodes_do_not_hide_a_slow_link_behind_their_partners_spread():
    """Case (c): local1's link slow, local3's CPU slow (its pairs slow and ragged). The healthy nodes' spread
    is their best pair's repeats, not the spread of their partners, so local1 stays a suspect."""
    rounds = part.pairings(4)
    fast, slow_link, starved = [0.1, 0.105, 0.1], [0.4, 0.41, 0.4], [0.15, 0.5, 0.3]

    def windows(a, b):
        return slow_link if 1 in (a, b) else starved if 3 in (a, b) else fast

    times = {(r, a, b): windows(a, b) for r, pairing in enumerate(rounds) for a, b in pairing}
    link, _ = part.link_figures(HOSTS, rounds, times, nbytes=2**20, per_node=2)
    assert link["local0"]["link_partner"] == ["local0", "local2"]
    assert link["local0"]["link_spread_gbps"] < 0.05 * link["local0"]["link_gbps"]  # the healthy pair's repeats
    assert "local1" in part.link_suspects(HOSTS, link)


def test_a_suspect_link_is_retested_with_the_fastest_healthy_node_and_named_only_if_slow_again():
    nodes = figures({h: 1.0 for h in HOSTS}, {"local0": 3.0, "local1": 1.0, "local2": 2.9, "local3": 3.1})
    assert part.link_suspects(HOSTS, nodes) == ["local1"]
    retest = part.confirmation_pairings(nodes, ["local1"])
    assert retest == [[("local1", "local3")]]  # the fastest node that is not suspected
    slow_again = {(0, "local1", "local3"): [2**21 / 1.0e9] * 3}  # 2 ranks a MiB each at 1 GB/s: slow again
    part.confirm_links(nodes, retest, slow_again, nbytes=2**20, per_node=2)
    assert nodes["local1"]["link_confirm_gbps"] == pytest.approx(1.0)
    assert [n["node"] for n in part.verdict(HOSTS, nodes, [])["slow"]] == ["local1"]
    nodes["local1"]["link_confirm_gbps"] = 3.0  # an unlucky round: fast with a healthy partner
    assert part.verdict(HOSTS, nodes, [])["slow"] == []


def test_more_suspects_than_healthy_nodes_take_more_rounds_each_healthy_node_once_a_round():
    nodes = figures({h: 1.0 for h in HOSTS}, {"local0": 3.0, "local1": 1.0, "local2": 1.0, "local3": 1.0})
    assert part.confirmation_pairings(nodes, ["local1", "local2", "local3"]) == [
        [("local1", "local0")],
        [("local2", "local0")],
        [("local3", "local0")],
    ]
    assert part.confirmation_pairings(nodes, HOSTS) == []  # nobody to retest with
    assert part.link_suspects(HOSTS[:2], nodes) == []  # two nodes: a link is never named


def test_the_checks_label_runs_take_no_node_health_probe():
    """The nodes part measures every node once; each of the check's label runs (14 on a CPU) would otherwise
    probe for a second after its few steps."""
    from types import SimpleNamespace

    from vit_scale.check.strategies import overrides
    from vit_scale.config import load_config

    world = SimpleNamespace(launcher="torchrun")
    settings = overrides("DDP", "fp32", world, {"quick": True, "records": "/tmp/x"}, "check.DDP.fp32.0", ())
    assert load_config(None, settings).train.health_probe_s == 0


def test_where_a_nodes_ranks_share_its_cores_it_counts_at_their_mean_window_by_window():
    """On a CPU the scheduler may give one rank of a healthy node three times the other's share (measured on
    the miniature cluster): its slowest rank would read like a node at a quarter. The node's mean rate, window
    by window, does not; a node whose quota is a quarter is a quarter at its mean too."""
    rows = [
        {"node": "local0", "rank": 0, "gemm_tflops_windows": [0.006, 0.006, 0.005, 0.005, 0.023]},
        {"node": "local0", "rank": 1, "gemm_tflops_windows": [0.018, 0.023, 0.021, 0.022, 0.020]},
        {"node": "local3", "rank": 6, "gemm_tflops_windows": [0.0016, 0.0032, 0.0033, 0.0037, 0.0031]},
        {"node": "local3", "rank": 7, "gemm_tflops_windows": [0.0028, 0.0027, 0.0048, 0.0041, 0.0081]},
    ]
    shared = part.compute_figures(rows, shared_cores=True)
    assert shared["local0"]["gemm_tflops"] == pytest.approx(0.0135)  # the median of the windows' means
    assert shared["local0"]["slowest_rank"] == 0 and "mean" in shared["local0"]["gemm_of"]
    assert shared["local3"]["gemm_tflops"] / shared["local0"]["gemm_tflops"] < 0.3
    alone = part.compute_figures(rows)  # a device a rank: the slowest rank
    assert alone["local0"]["gemm_tflops"] == pytest.approx(0.006)


def test_a_rank_whose_probe_failed_still_passes_the_other_ranks_barriers(monkeypatch):
    """The compute windows start after a barrier of every rank; a rank whose probe raised (an out-of-memory,
    say) passes the barriers it had not, or the others would wait at theirs until the collective timeout."""
    import torch.distributed as dist

    from vit_scale.run import health

    calls = []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append(1))

    def fails_after_two(device, model, batch, precision, windows, window_s, before_window):
        before_window()
        before_window()
        raise RuntimeError("out of memory")

    monkeypatch.setattr(health, "rank_figures", fails_after_two)
    world = SimpleNamespace(device_type="cpu", device="cpu")
    got = part.compute_probe(world, {"model": "vit_micro", "batch_size": 8, "precisions": ["fp32"]})
    assert "out of memory" in got["error"] and len(calls) == part.COMPUTE_WINDOWS
