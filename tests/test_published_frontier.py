"""The model against the seed-003 authors' published Frontier curves (tests/data/frontier_published.json,
each series naming its file in jqyin/AmSC-At-Scale-Services-OLCF): images/s per GCD predicted from the
Frontier profile's network and each series' own baseline rung, and peak active memory per GCD. The bars
are issue 28's; where the model's microbenchmark constants cannot meet the published data the test pins
the documented gap instead (docs/plan.md, "Accuracy against the published Frontier curves"). No constant
of the model is fitted to these curves. Torch-free, in-process (about 3 s on two shared cores)."""

import pytest

from conftest import ROOT
from vit_scale.planning import published as pub
from vit_scale.planning.alpha_beta import read_network
from vit_scale.planning.input_profile import device_spread


@pytest.fixture(scope="module")
def figures():
    net = read_network(f"{ROOT}/configs/systems/frontier.yaml")
    data = pub.load()
    rows = pub.speed_rows(data, net, device_spread(f"{ROOT}/configs/systems/frontier.yaml"))
    mem = pub.memory_rows(data)
    return data, rows, mem, pub.summary(rows, mem)


def test_the_data_is_the_authors_minus_ddp_and_their_5b(figures):
    """21 series of images/s (NO_SHARD, HYBRID_1GPU, HYBRID_2GPU, FULL_SHARD of four models; five of
    vit_15b), 146 points beyond the baseline rungs, each naming the plot script it was read from; no DDP
    (fp32 there) and no 5B (not Table 1's)."""
    data, rows, mem, s = figures
    assert len(data["speed"]) == 21 and s["points"] == 146
    assert {x["model"] for x in data["speed"]} == {"vit_base", "vit_huge", "vit_1b", "vit_3b", "vit_15b"}
    assert all(x["source"].startswith("ViT-FSDP/src/performance_plots/") for x in data["speed"] + data["memory_points"])
    assert not any(x["strategy"] == "DDP" for x in data["speed"])
    # HYBRID_16GPU of vit_15b starts at 2 nodes, its baseline (a group wider than a node)
    h16 = [r for r in rows if r.strategy == "HYBRID_16GPU"]
    assert {r.baseline_nodes for r in h16} == {2} and min(r.nodes for r in h16) == 4


def test_speed_bars(figures):
    """Median |error| over all 146 points <= 15%; every crossing that both the measured and the predicted
    curves make (the node count from which FULL_SHARD stays below a hybrid) within a factor of 2, and the one
    measured where none is predicted (vit_15b HYBRID_8GPU at 128 nodes) counted as a miss; over the points
    whose measured efficiency is below 0.8,
    the median |error| <= 25% up to 64 nodes. All 13 such points, 128 nodes included, come to 32%: the
    authors' vit_base and vit_1b FULL_SHARD steps grow 4.8x and 3.8x from 64 to 128 nodes, where a ring's
    cost grows 2x (docs/plan.md says why); pinned at <= 33% so that it cannot silently get worse. The
    no-communication baseline (ideal scaling) scores 96% on those points."""
    _, rows, _, s = figures
    assert s["median_abs_error"] <= 0.15
    assert s["max_crossing_factor"] <= 2.0, s["crossings"]
    missed = [(c["model"], c["hybrid"]) for c in s["crossings"] if pub.crossing_missed(c)]
    assert missed == [("vit_15b", "HYBRID_8GPU")] and s["crossings_missed"] == 1
    low = sorted(abs(r.error) for r in rows if r.measured_efficiency < pub.LOW_EFFICIENCY and r.nodes <= 64)
    assert len(low) == 7 and low[len(low) // 2] <= 0.25, low
    assert s["low_efficiency_points"] == 13 and s["median_abs_error_low_efficiency"] <= 0.33
    assert s["no_comm_median_abs_error_low_efficiency"] > 0.9
    # FULL_SHARD collapses at scale in the model as measured: vit_base's efficiency at 128 nodes below 0.2
    assert (
        next(r for r in rows if (r.model, r.strategy, r.nodes) == ("vit_base", "FULL_SHARD", 128)).predicted_efficiency
        < 0.2
    )


def test_memory_within_ten_percent_but_vit_base(figures):
    """Peak active memory within 10% at every node count for every series but vit_base FULL_SHARD, with a
    GEMM's hipBLASLt workspace counted (76 MiB, torch's ROCm default; docs/plan.md). vit_base falls short
    by a near constant 0.20 GiB at every node count (the others by 0.14-0.23 GiB, within their 10%): a fixed
    allocation of the authors' script outside the model that the planner does not know of; pinned as that."""
    _, _, mem, _ = figures
    for m in mem:
        if m.model == "vit_base":
            assert 0.18 <= m.measured_gib - m.predicted_gib <= 0.22, m
        else:
            assert abs(m.error) <= 0.10, m
    # without the workspace the two next-smallest models fall outside the bar: the term is what holds them
    for m in mem:
        if m.model in ("vit_huge", "vit_1b") and m.nodes == 8:
            assert m.measured_gib / (m.predicted_gib - 76 / 1024) - 1 > 0.10, m


def test_bands_from_the_profiles_ranges(figures):
    """Every point's 90% band (the Frontier profile's ranges: 3.0-76.2 us a step across nodes, from the
    issue-1490 table's rows, RCCL's tuning and PCCL's readings at 32-256 nodes; the tree's bandwidth and the
    within-node rate from PCCL; compute up to 40% and collectives up to 2x as slow beside each other; and
    beyond the baseline rung devices 8% slower or faster, Sinha et al.'s variation between GPUs of one SKU)
    holds its prediction; the bands are what the sources give, not widened to the curves (docs/plan.md, "How
    sure a prediction is"): 142 of the 146 points lie inside (bar 80%) at a median width of 1.29 (bar 1.3); of
    the 13 below 0.8 efficiency 11 do (bar 70%). Pinned as measured so that a change of the ranges or the model
    shows here."""
    data, rows, mem, s = figures
    assert all(r.low <= r.predicted <= r.high for r in rows)
    assert s["coverage"] == pytest.approx(142 / 146) and s["coverage_low_efficiency"] == pytest.approx(11 / 13)
    assert 1.25 < s["median_width"] < 1.3 and 3.8 < s["median_width_low_efficiency"] < 4.3
    # FULL_SHARD's collapse is what the ranges disagree on: vit_base's 128-node band spans 15x
    full = next(r for r in rows if (r.model, r.strategy, r.nodes) == ("vit_base", "FULL_SHARD", 128))
    assert 12 < full.width < 16
    # every FULL_SHARD point lies inside: the collapse once PCCL's 70-80 us a step at 32+ nodes is the costly
    # end, the largest models' 64-128-node points once the collectives beside compute may take twice as long
    assert all(r.low <= r.measured <= r.high for r in rows if r.strategy == "FULL_SHARD")
    # without the device spread the well-scaling points' bands are narrow and many miss
    bare = pub.summary(pub.speed_rows(data, read_network(f"{ROOT}/configs/systems/frontier.yaml")), mem)
    assert bare["coverage"] == pytest.approx(86 / 146) and bare["median_width"] < 1.12


def test_a_crossing_on_one_side_only_is_a_miss():
    """A crossing predicted where none was measured, or measured where none was predicted, is a miss (it
    was scored as one at twice the largest node count, within 2x of a crossing at 128); none on either side
    agrees; one inside the predicted range of node counts is inside it."""
    assert pub.crossing_missed({"measured": 128, "predicted": None})
    assert pub.crossing_missed({"measured": None, "predicted": 64})
    assert not pub.crossing_missed({"measured": None, "predicted": None})
    assert pub.crossing_missed({"measured": 16, "predicted": 64}) and not pub.crossing_missed(
        {"measured": 32, "predicted": 64}
    )
    assert pub.crossing_in_range({"measured": 32, "predicted": 16, "earliest": 16, "latest": None})
    assert not pub.crossing_in_range({"measured": 8, "predicted": 16, "earliest": 16, "latest": 64})
    assert pub.crossing_in_range({"measured": None, "predicted": 16, "earliest": 16, "latest": None})
