"""The check's per-step fits, torch-free: vit_scale.planning.step_fit.fit_steps gives back the per-step
latencies, launch and bus bandwidth of timings made by alpha_beta.Network's own ring form at several group
sizes; vit_scale.check.collectives plans every group size it can form and partitions the ranks into them;
a schema-2 check.json calibrates the planner (a group beyond the largest fitted is extrapolated) and a
schema-1 one is still read; a usable fit with non-finite or non-positive values is one line, exit 2. The
timings are synthetic: the arithmetic must come out exactly (the real ranks' check: tests/test_check.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from vit_scale.check.collectives import group_sizes, partition, step_fits_of
from vit_scale.errors import UserError
from vit_scale.planning import predict as pr
from vit_scale.planning.alpha_beta import COLLECTIVES, Link, Network
from vit_scale.planning.scenario import Scenario
from vit_scale.planning.step_fit import Point, fit_steps

SIZES = [8 * 8**k for k in range(9)]  # 8 B to 128 MiB
# what the fit must give back: per-step latency 5 us inside a node, 20 us across, launch 8 us, 50 GB/s
TRUE = Network(Link(5.0, 50.0), Link(20.0, 12.5), launch_us=8.0, algo="ring")


def measurements(per_node=8, nodes=4, network=TRUE) -> list:
    """What check.json's interconnect measurements hold for every group size group_sizes plans."""
    out = []
    for scope, ranks, span in group_sizes(per_node, nodes, quick=False):
        for collective in COLLECTIVES:
            for size in SIZES:
                t = network.cost(collective, size, ranks, span, ranks // span).seconds
                out.append(
                    {
                        "scope": scope,
                        "nodes": span,
                        "collective": collective,
                        "ranks": ranks,
                        "bytes": size,
                        "time_s": t,
                        "spread_s": 0.0,
                        "correct": True,
                    }
                )
    return out


def test_group_sizes_and_their_groups():
    assert group_sizes(8, 4, quick=False) == [("node", 2, 1), ("node", 4, 1), ("node", 8, 1)] + [
        ("world", 16, 2),
        ("world", 32, 4),
    ]
    assert group_sizes(8, 4, quick=True) == [("node", 8, 1), ("world", 32, 4)]  # the widest of each scope
    assert group_sizes(6, 3, quick=False) == [("node", 2, 1), ("node", 6, 1), ("world", 18, 3)]  # dividing only
    assert group_sizes(1, 2, quick=False) == [("world", 2, 2)]
    names = ["a", "b", "a", "b", "a", "b", "a", "b"]  # cyclic placement: each node's own ranks group
    assert partition(names, "node", 2) == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert partition(["a"] * 4 + ["b"] * 4 + ["c"] * 4 + ["d"] * 4, "world", 8) == [
        list(range(8)),
        list(range(8, 16)),
    ]


# a ring spanning nodes pays the network's overhead on its in-node steps too (NCCL tuning.cc)
OVERHEAD = dataclasses.replace(TRUE, net_overhead_us=30.0)


def test_fit_gives_back_the_per_step_form_from_every_group_size():
    spanning = {(f["collective"], f["scope"]): f for f in step_fits_of(measurements(network=OVERHEAD))}
    for collective in COLLECTIVES:
        f = spanning[(collective, "inter")]
        assert f["usable"] and f["intra_latency_us"] == pytest.approx(30.0, rel=1e-3)
        assert f["step_latency_us"] == pytest.approx(20.0, rel=1e-3)
    fits = {(f["collective"], f["scope"]): f for f in step_fits_of(measurements())}
    assert set(fits) == {(c, s) for c in COLLECTIVES for s in ("intra", "inter")}
    for (_, scope), f in fits.items():
        assert f["usable"] and not f["notes"], f
        assert f["launch_us"] == pytest.approx(8.0, abs=1e-3)
        assert f["bus_gbps"] == pytest.approx(50.0, rel=1e-3)  # across nodes: 8 ranks a node x 12.5, up to 50
        assert f["step_latency_us"] == pytest.approx(5.0 if scope == "intra" else 20.0, rel=1e-3), f
        assert f["groups"] == ([2, 4, 8] if scope == "intra" else [16, 32])
    # one group size: launch and per-step latency cannot come apart; the latency goes on the steps, said so
    one = [Point(s, TRUE.cost("all_gather", s, 2).seconds, 0.0, 2) for s in SIZES]
    f = fit_steps("all_gather", "intra", one)
    assert f.usable and f.launch_us == 0 and f.step_latency_us == pytest.approx(13.0) and f.notes


def test_a_step_fit_carries_standard_errors_and_the_calibration_its_band(tmp_path):
    """Exact timings give standard errors of about 0; timings with scatter (a repeat 3% off either way) give
    each fitted figure an error, written beside it in check.json, read back, and a schema-2 calibration over
    the profile's defaults then bands a prediction by +-1.645 of them: wider than from exact timings."""
    exact = step_fits_of(measurements())
    assert all(f["step_latency_us_se"] < 1e-3 and f["bus_gbps_se"] < 1e-3 for f in exact)
    scattered = []
    for i, m in enumerate(measurements()):
        for sign in (1, -1):
            scattered.append({**m, "time_s": m["time_s"] * (1 + sign * 0.03 * (i % 2))})
    noisy = step_fits_of(scattered)
    assert all(f["usable"] and f["step_latency_us_se"] > 0 and f["bus_gbps_se"] > 0 for f in noisy), noisy
    widths = {}
    for name, fits in (("exact", exact), ("noisy", noisy)):
        check = write_check(tmp_path / f"{name}.json", fits)
        cal = pr.choose_calibration(check, pr.profile_path("frontier"), system="frontier", models=["vit_base"],
                                    precisions=["bf16"])  # fmt: skip
        comp = pr.compute_from_flops(191.5, 0.4)
        sc = Scenario("vit_base", "FULL_SHARD", nodes=4, gpus_per_node=8, batch_size=32, precision="bf16")
        [p] = pr.predict([sc], cal, comp)
        low, high = p.band["step_s"]
        assert low <= p.breakdown.step_s <= high
        widths[name] = high / low
    assert widths["noisy"] > widths["exact"], widths


def write_check(path, step_fits, schema=2) -> str:
    data = {"schema": schema, "system": "frontier", "model": "vit_3b", "precisions": ["bf16"], "nodes": 4}
    data["step_fits"] = step_fits
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("true", [TRUE, OVERHEAD], ids=["no-overhead", "overhead"])
def test_a_schema_2_check_calibrates_and_says_what_is_extrapolated(tmp_path, true):
    check = write_check(tmp_path / "check.json", step_fits_of(measurements(network=true)))
    profile = pr.profile_path("frontier")
    cal = pr.choose_calibration(check, profile, system="frontier", models=["vit_base"], precisions=["bf16"])
    assert cal.kind == "check" and not cal.over_defaults and cal.network.measured_ranks == 32
    net = dataclasses.replace(cal.network, algo="ring")  # the timings were rings (NCCL_ALGO=ring)
    # the calibration prices a collective as the network the timings came from
    for collective in COLLECTIVES:
        for n, nodes in ((8, 1), (32, 4), (128, 16)):
            got = net.seconds(collective, 2**20, n, nodes > 1, n // nodes)
            assert got == pytest.approx(true.cost(collective, 2**20, n, nodes, n // nodes).seconds, rel=1e-3)
    comp = pr.compute_from_flops(191.5, 0.4)
    sc = Scenario("vit_base", "FULL_SHARD", nodes=4, gpus_per_node=8, batch_size=32, precision="bf16")
    far = Scenario("vit_base", "FULL_SHARD", nodes=16, gpus_per_node=8, batch_size=32, precision="bf16")
    inside, beyond = pr.predict([sc, far], cal, comp)
    assert not inside.extrapolated and beyond.extrapolated and beyond.largest_group == 128


def test_bad_fits_are_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    from vit_scale import plan

    good = step_fits_of(measurements())
    cases = [
        ({"bus_gbps": float("inf")}, "a usable fit needs a finite bus_gbps above 0"),
        ({"bus_gbps": 0.0}, "a usable fit needs a finite bus_gbps above 0"),
        ({"step_latency_us": -3.0}, "step_latency_us and launch_us of 0 or more"),
        ({"step_latency_us": float("nan")}, "step_latency_us and launch_us of 0 or more"),
        ({"groups": [1]}, "groups a list of whole numbers of ranks, each at least 2"),
        ({"groups": [-4]}, "each at least 2"),
        ({"ranks_per_node": 0}, "ranks_per_node must be a positive whole number"),
    ]
    figure = tmp_path / "figure"
    for i, (change, words) in enumerate(cases):
        fits = [dict(f) for f in good]
        fits[1].update(change)
        check = write_check(tmp_path / f"bad{i}.json", fits)
        argv = ["--system", "frontier", "--model", "vit_base", "--nodes", "1,2", "--strategy", "FULL_SHARD"]
        assert plan.main(argv + ["--calibration", check, "--figure", str(figure)]) == 2, change
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"bad{i}.json: step_fits[1]" in err[0] and words in err[0], (change, err)
        assert not figure.exists()
    # a fit the check itself marked is not used, whatever numbers it left
    fits = [dict(f) for f in good]
    fits[1].update(bus_gbps=0.0, usable=False, flags=["no bandwidth: time does not grow with size"])
    cal = pr.choose_calibration(
        write_check(tmp_path / "marked.json", fits),
        pr.profile_path("frontier"),
        system="frontier",
        models=["vit_base"],
        precisions=["bf16"],
    )
    assert cal.over_defaults and f"{good[1]['collective']}/intra not used: no bandwidth" in cal.describe()
    with pytest.raises(UserError, match="has no step_fits"):
        pr.check_calibration(write_check(tmp_path / "none.json", []), system="frontier", models=[], precisions=[])
