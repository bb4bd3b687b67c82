"""Predictions held against measurements: vit_scale.planning.predict (calibration, compute from measured
runs, bad input as one line) and the analysis's side (prediction.csv, the predicted figure, the report's
"Measured against predicted" and its explanations). Torch-free; the run records are synthetic
(analysis/synthetic.py), the traces hand-written Chrome JSON, so that the arithmetic is known."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import sys

import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from analysis import figures, prediction, table  # noqa: E402
from analysis.synthetic import wall_throughput, write_run  # noqa: E402
from analysis.weak_scaling import main  # noqa: E402
from vit_scale.errors import UserError  # noqa: E402
from vit_scale.planning import predict as pr  # noqa: E402
from vit_scale.planning.alpha_beta import Fit, Link, Network  # noqa: E402
from vit_scale.planning.scenario import Scenario  # noqa: E402
from vit_scale.planning.step_time import predict_step, train_flops_per_image  # noqa: E402
from vit_scale.record import reader  # noqa: E402

FRONTIER = pr.profile_path("frontier")


def fit(collective="all_reduce", scope="inter", sizes=8, flags=(), alpha=5.0, bus=20.0) -> dict:
    return Fit(collective, scope, 16, alpha, bus, 0.05, sizes, tuple(flags)).as_dict()


def write_check(path, fits, system="frontier", model="vit_base", precisions=("bf16",), job="1234") -> str:
    data = {
        "schema": 1,
        "system": system,
        "model": model,
        "precisions": list(precisions),
        "nodes": 2,
        "ranks_per_node": 8,
        "slurm": {"job_id": job} if job else None,
        "fits": fits,
    }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def one_line_error(call, *words):
    with pytest.raises(UserError) as exc:
        call()
    text = str(exc.value)
    assert "\n" not in text and exc.value.exit_code == 2
    for w in words:
        assert w in text, text
    return text


# ---------------------------------------------------------------- bad input


def test_missing_and_unreadable_calibration(tmp_path):
    missing = str(tmp_path / "nope.json")
    one_line_error(lambda: pr.read_check(missing), "--calibration", missing, "cannot read", "expected a check.json")
    bad = tmp_path / "check.json"
    bad.write_text("{not json")
    one_line_error(lambda: pr.read_check(str(bad)), str(bad), "is not JSON")


def test_check_of_another_system_model_or_precision(tmp_path):
    args = dict(system="frontier", models=["vit_base"], precisions=["bf16"])
    other = write_check(str(tmp_path / "a" / "check.json"), [fit()], system="cuda")
    one_line_error(
        lambda: pr.check_calibration(other, **args), other, "system 'cuda'", "expected a check of 'frontier'"
    )
    fp32 = write_check(str(tmp_path / "b" / "check.json"), [fit()], precisions=("fp32",))
    one_line_error(lambda: pr.check_calibration(fp32, **args), "measured precision fp32", "expected bf16")
    small = write_check(str(tmp_path / "c" / "check.json"), [fit()], model="vit_micro")
    one_line_error(lambda: pr.check_calibration(small, **args), "a check of vit_micro", "expected a check of vit_base")
    # a check of a larger model covers a smaller one's messages
    big = write_check(str(tmp_path / "d" / "check.json"), [fit()], model="vit_3b")
    assert pr.check_calibration(big, **args).kind == "check"


def test_check_without_fits_or_with_too_few_points(tmp_path):
    args = dict(system="frontier", models=["vit_base"], precisions=["bf16"])
    none = write_check(str(tmp_path / "a" / "check.json"), [])
    one_line_error(lambda: pr.check_calibration(none, **args), "has no fits (from the size sweep)", "full mode")
    few = write_check(str(tmp_path / "b" / "check.json"), [fit(), fit("all_gather", "intra", sizes=3)])
    one_line_error(lambda: pr.check_calibration(few, **args), "fits[1] (all_gather, intra) has 3 size(s)", "at least 4")


def test_compute_from_a_run_of_another_model_batch_or_precision(tmp_path):
    metrics = write_run(str(tmp_path), model="vit_base", batch=32, nodes=1, ips=800.0)
    run_dir = os.path.dirname(metrics)
    source = pr.compute_from(run_dir)
    net = pr.profile_calibration(FRONTIER).network
    for sc in (
        Scenario("vit_huge", "DDP", batch_size=32),
        Scenario("vit_base", "DDP", batch_size=16),
        Scenario("vit_base", "DDP", batch_size=32, precision="fp32"),
    ):
        one_line_error(
            lambda sc=sc: source.compute_for(sc, net),
            "--compute-from",
            run_dir,
            f"no run of {sc.model} at batch {sc.batch_size} in {sc.precision}",
            "expected a run of the same model, batch and precision",
            "vit_base at batch 32 in bf16",
        )
    one_line_error(lambda: pr.compute_from(str(tmp_path / "absent")), "--compute-from", "not a directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(lambda: pr.compute_from(str(empty)), "--compute-from", "no run that finished ok")


def test_flops_compute_needs_a_peak_and_a_stated_efficiency(tmp_path):
    assert pr.peak_tflops(FRONTIER, "bf16") == 191.5 and pr.peak_tflops(pr.profile_path("local"), "bf16") is None
    one_line_error(
        lambda: pr.compute_from_flops(None, 0.4, "local.yaml"),
        "--compute-from",
        "local.yaml",
        "no peak TFLOP/s",
        "RUNDIR",
    )
    one_line_error(lambda: pr.compute_from_flops(191.5, 1.5), "--efficiency", "(0, 1]")
    one_line_error(lambda: pr.profile_path("nowhere"), "--system", "configs/systems/nowhere.yaml")
    source = pr.compute_from_flops(191.5, 0.4)
    sc = Scenario("vit_base", "DDP", nodes=1, gpus_per_node=1, batch_size=32)
    [p] = pr.predict([sc], pr.profile_calibration(FRONTIER), source)
    # one rank: nothing to communicate, so the step is the counted FLOPs at 40% of the peak
    assert p.breakdown.step_s == pytest.approx(32 * train_flops_per_image(sc.shape) / (191.5e12 * 0.4), rel=1e-9)


# ---------------------------------------------------------------- calibration precedence


def test_calibration_precedence_check_over_profile_over_none(tmp_path):
    marked = fit("all_gather", "inter", flags=["large residual: 40% > 25%"])
    check = write_check(str(tmp_path / "check.json"), [fit(alpha=72.0, bus=20.0), marked])
    cal = pr.choose_calibration(check, FRONTIER, system="frontier", models=["vit_base"], precisions=["bf16"])
    assert cal.kind == "check" and check in cal.describe()
    # the usable fit replaces the default for its collective and scope; the marked one is not used, and said so.
    # Its 72 us over 16 ranks, less the profile's 12 us launch (added to every collective anyway), over
    # 2 x 15 ring steps (no ranks per node recorded: one a node, every step across) is 2 us a step
    assert cal.network.link("all_reduce", True) == Link(2.0, 20.0, cal.network.link("all_reduce", True).source)
    defaults = pr.profile_calibration(FRONTIER).network
    assert cal.network.link("all_gather", True).bus_gbps == defaults.link("all_gather", True).bus_gbps
    assert any("all_gather/inter not used: large residual" in n for n in cal.notes)

    prof = pr.choose_calibration(None, FRONTIER, system="frontier")
    assert prof.kind == "profile" and "frontier.yaml" in prof.describe()
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\n")
    none = pr.choose_calibration(None, str(bare), system="bare")
    assert none.kind == "none" and "compute-bound ceiling" in none.describe()
    assert none.network.seconds("all_reduce", 1e9, 16, True) == 0.0


# ---------------------------------------------------------------- compute from the 1-node rung


def test_compute_from_the_rung_is_the_step_less_its_predicted_exposed_communication(tmp_path):
    """FULL_SHARD, vit_base, 1 node x 8 at 800 images/s: step 8 x 32 / 800 = 0.32 s. The compute c is
    what makes the model's own prediction of that run equal 0.32 s; so c + exposed(c) = 0.32 s, the
    1-node prediction reproduces the measurement, and c is below it by the exposed part."""
    # a slow within-node network, so that some communication is exposed
    net = Network(Link(50.0, 5.0), Link(50.0, 5.0), source="test")
    write_run(str(tmp_path), strategy="FULL_SHARD", nodes=1, ips=800.0)
    source = pr.compute_from(str(tmp_path))
    sc = Scenario("vit_base", "FULL_SHARD", nodes=1, gpus_per_node=8, batch_size=32, device_memory_gib=None)
    comp = source.compute_for(sc, net)
    c = comp.forward_s + comp.backward_s
    step = predict_step(sc, net, comp)
    exposed = step.breakdown.exposed_intra_s + step.breakdown.exposed_inter_s
    assert step.breakdown.step_s == pytest.approx(0.32, rel=1e-6)
    assert exposed > 0.001 and c == pytest.approx(0.32 - exposed, rel=1e-6)
    assert step.images_per_s == pytest.approx(800.0, rel=1e-6)
    assert "less" in comp.source and "exposed communication predicted" in comp.source
    # a network so slow that its communication alone outlasts the measured step: compute 0, and said so
    slow = Network(Link(50.0, 0.05), Link(50.0, 0.05), source="test")
    comp = pr.compute_from(str(tmp_path)).compute_for(sc, slow)
    assert comp.forward_s + comp.backward_s == 0.0 and "alone exceeds the measured step" in comp.source


def test_each_strategy_takes_its_own_one_node_run(tmp_path):
    """DDP ran at 800, FULL_SHARD at 400 images/s on 1 node; HYBRID_2GPU has no 1-node run and takes the
    fastest one (DDP's). One rank, so no communication: compute = the measured step."""
    write_run(str(tmp_path), strategy="DDP", nodes=1, ranks_per_node=1, ips=100.0)
    write_run(str(tmp_path), strategy="FULL_SHARD", nodes=1, ranks_per_node=1, ips=50.0)
    write_run(str(tmp_path), strategy="FULL_SHARD", nodes=2, ranks_per_node=1, ips=90.0)
    source = pr.compute_from(str(tmp_path))
    net = pr.profile_calibration(FRONTIER).network
    for label, step_s in (("DDP", 0.32), ("FULL_SHARD", 0.64), ("HYBRID_1GPU", 0.32)):
        sc = Scenario("vit_base", label, nodes=2, gpus_per_node=1, batch_size=32)
        comp = source.compute_for(sc, net)
        assert comp.forward_s + comp.backward_s == pytest.approx(step_s, rel=1e-9), label


def test_predict_gives_scaling_efficiency_and_names_the_calibration(tmp_path):
    write_run(str(tmp_path), strategy="DDP", nodes=1, ips=800.0)
    cal = pr.profile_calibration(FRONTIER)
    points = [Scenario("vit_base", "DDP", nodes=n, gpus_per_node=8, batch_size=32) for n in (1, 2, 4)]
    rows = pr.predict(points, cal, pr.compute_from(str(tmp_path)))
    assert rows[0].images_per_s == pytest.approx(800.0, rel=1e-6) and rows[0].scaling_efficiency == 1.0
    assert all(0 < r.scaling_efficiency <= 1.0 for r in rows)
    assert all(any("frontier.yaml" in rule for rule in r.rules) for r in rows)


# ---------------------------------------------------------------- the analysis


def _predicted_ips(root, strategy, nodes, ranks=8):
    """What the analysis will predict for this point: the profile's defaults, compute from the 1-node run."""
    cal = pr.profile_calibration(FRONTIER)
    sc = Scenario("vit_base", strategy, nodes=nodes, gpus_per_node=ranks, batch_size=32, device_memory_gib=None)
    return pr.predict([sc], cal, pr.compute_from(root))[0]


def _study(tmp_path, strategy="DDP"):
    root = str(tmp_path / "runs")
    write_run(root, study="s", strategy=strategy, nodes=1, ips=800.0)
    p = _predicted_ips(os.path.join(root, "s"), strategy, 2)
    # 40% below its prediction
    metrics = write_run(root, study="s", strategy=strategy, nodes=2, ips=0.6 * p.images_per_s)
    return root, p, os.path.dirname(metrics)


def _trace(run_dir, step_ms, exposed_ms):
    """One step: compute kernels over the first part, then an NCCL kernel nothing hides (exposed_ms)."""
    step = step_ms * 1000
    events = [
        {"ph": "X", "name": "vit_scale.step#1", "ts": 0, "dur": step, "cat": "user_annotation"},
        {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 0, "dur": step - exposed_ms * 1000},
        {
            "ph": "X",
            "name": "ncclKernel_AllReduce",
            "cat": "kernel",
            "ts": step - exposed_ms * 1000,
            "dur": exposed_ms * 1000,
        },
    ]
    with gzip.open(os.path.join(run_dir, "trace_rank0.json.gz"), "wt") as f:
        json.dump({"traceEvents": events}, f)


def _analyse(root, out):
    assert main([root, "--out", out, "--no-plots", "--quiet"]) == 0
    rows = pd.read_csv(os.path.join(out, "prediction.csv"))
    with open(os.path.join(out, "report.md")) as f:
        return rows, f.read()


def test_point_forty_percent_below_untraced(tmp_path):
    root, p, _ = _study(tmp_path)
    rows, text = _analyse(root, str(tmp_path / "out"))
    two = rows[rows["nodes"] == 2].iloc[0]
    assert two["predicted_ips"] == pytest.approx(p.images_per_s, rel=1e-6)
    assert two["error"] == pytest.approx(-0.4, abs=1e-3) and two["calibration"] == "profile"
    one = rows[rows["nodes"] == 1].iloc[0]
    # the rung gave the compute: it reproduces itself, and is kept apart from the errors
    assert one["role"] == "compute" and two["role"] == "predicted" and math.isnan(one["error"])
    assert one["predicted_ips"] == pytest.approx(one["measured_ips"], rel=1e-6)
    assert "Median |error| over 1 predicted point(s): 40.0%." in text
    assert "Left out of the errors, as the prediction's input: 1 point(s) whose step gave the compute" in text
    # 40% below is outside the band the Frontier profile's ranges give it, and the report says so
    assert two["predicted_ips_low"] <= two["predicted_ips"] <= two["predicted_ips_high"]
    assert not two["inside_band"] and "Inside their band: 0 of 1." in text
    assert "| no (" in text
    # the step is 1/0.6 of the predicted one: the gap is 2/3 of it
    gap = two["predicted_step_ms"] * (1 / 0.6 - 1)
    compute = two["predicted_compute_ms"]
    assert "## Measured against predicted" in text
    assert "Calibration used: the system profile's defaults (frontier.yaml)" in text
    line = next(x for x in text.splitlines() if x.startswith("- vit_base DDP on 2 node(s): 40% below its prediction"))
    assert "not traced" in line
    assert f"compute would have to grow {(compute + gap) / compute:.2f}x" in line
    assert "exposed inter-node communication would have to grow" in line
    assert not any(x.startswith("- vit_base DDP on 1 node(s)") for x in text.splitlines())


def test_a_study_of_1_node_points_reports_no_error(tmp_path):
    """Only the points that gave the compute: nothing was predicted, so no "median |error| 0.0%"."""
    root = str(tmp_path / "runs")
    for strategy in ("DDP", "FULL_SHARD"):
        write_run(root, study="s", strategy=strategy, nodes=1, ips=800.0)
    rows, text = _analyse(root, str(tmp_path / "out"))
    assert set(rows["role"]) == {"compute"} and rows["error"].isna().all()
    section = text.split("## Measured against predicted")[1]
    assert "Median |error|" not in section and "0.0%" not in section
    assert "No point was predicted beyond the ones that gave the compute: no error to report." in section
    assert "2 point(s) whose step gave the compute (vit_base DDP on 1 node(s), vit_base FULL_SHARD on 1" in section


def test_point_forty_percent_below_traced(tmp_path):
    root, p, run_dir = _study(tmp_path)
    measured_step = p.breakdown.step_s * 1e3 / 0.6
    _trace(run_dir, measured_step, 30.0)
    rows, text = _analyse(root, str(tmp_path / "out"))
    two = rows[rows["nodes"] == 2].iloc[0]
    assert two["traced_exposed_ms"] == pytest.approx(30.0, abs=0.01)
    predicted = two["predicted_exposed_intra_ms"] + two["predicted_exposed_inter_ms"]
    line = next(x for x in text.splitlines() if x.startswith("- vit_base DDP on 2 node(s): 40% below"))
    assert f"traced: exposed communication 30 ms measured against {predicted:.4g} ms predicted" in line


def test_check_json_of_the_same_allocation_calibrates(tmp_path):
    root, _, _ = _study(tmp_path)
    write_check(os.path.join(root, "s", "check.json"), [fit(alpha=5.0, bus=200.0)], job="1234")
    rows, text = _analyse(root, str(tmp_path / "out"))
    assert set(rows["calibration"]) == {"check (all_reduce/inter) + profile defaults"}
    assert "Calibration used: check.json's fits" in text
    # another allocation's check is not used, and the report says so
    write_check(os.path.join(root, "s", "check.json"), [fit(alpha=5.0, bus=200.0)], job="999")
    rows, text = _analyse(root, str(tmp_path / "out2"))
    assert set(rows["calibration"]) == {"profile"}
    assert "not used for runs outside its allocation (Slurm job 999)" in text
    # a quick check writes no fits: the defaults, and the report says why
    write_check(os.path.join(root, "s", "check.json"), [], job="1234")
    rows, text = _analyse(root, str(tmp_path / "out3"))
    assert set(rows["calibration"]) == {"profile"} and "has no fits (from the size sweep)" in text


def test_predicted_figure_is_registered_and_drawn(tmp_path):
    root, _, _ = _study(tmp_path)
    write_run(root, study="s", strategy="FULL_SHARD", nodes=1, ips=700.0)
    write_run(root, study="s", strategy="FULL_SHARD", nodes=2, ips=1300.0)
    coll = reader.collect([root])
    results = table.build(coll).results
    predicted = prediction.build(coll.runs, results)
    assert any(f.name == "weak scaling against prediction" for f in figures.FIGURES)
    plots, _ = figures.all_plots(results, predictions=predicted.rows)
    plot = next(p for p in plots if p.name == "weak_scaling_predicted")
    # the Frontier profile's ranges give every predicted point its band, shaded under the dashed line
    assert plot.drawn["vit_base"] == {"measured": 2, "predicted": 2, "extrapolated": 0, "failed": 0, "banded": 4}
    rows = predicted.rows
    assert (rows["predicted_ips_low"] <= rows["predicted_ips"] + 1e-9).all()
    assert (rows["predicted_ips"] <= rows["predicted_ips_high"] + 1e-9).all()
    # the report says of each predicted point whether it lies in its band
    two = rows[(rows["role"] == prediction.PREDICTED) & (rows["nodes"] == 2)]
    assert len(two) == 2 and all(
        x == (lo <= m <= hi)
        for x, lo, m, hi in zip(
            two["inside_band"], two["predicted_ips_low"], two["measured_ips"], two["predicted_ips_high"], strict=True
        )
    )
    assert all(x is None for x in rows[rows["role"] == prediction.COMPUTE]["inside_band"])
    curves = plot.extra["predicted"]
    for label in ("DDP", "FULL_SHARD"):
        key = next(k for k in curves if k[2] == label)
        want = predicted.rows[predicted.rows["strategy"] == label].sort_values("nodes")
        assert [x for x, _ in curves[key]] == [1, 2]
        assert [y for _, y in curves[key]] == pytest.approx(list(want["predicted_ips"]))
    # each dashed prediction shares its measured line's colour
    ax = plot.figure.axes[0]
    solid = {ln.get_color() for ln in ax.get_lines() if ln.get_linestyle() == "-"}
    dashed = {ln.get_color() for ln in ax.get_lines() if ln.get_linestyle() == "--"}
    assert dashed == solid and len(dashed) == 2
    # without predictions the registry keeps quiet
    plots, missing = figures.all_plots(results)
    assert all(p.name != "weak_scaling_predicted" for p in plots) and not any("prediction" in m for m in missing)


# One fast step in nine: each run's median step rate stays at its level, its throughput over wall time does not.
def _skewed(level):
    return [level * f for f in (0.98, 1.0, 1.02, 1.01, 0.99, 1.03, 1.6, 0.97, 1.0)]


def test_measured_is_the_point_throughput_and_its_rung_reproduces_itself(tmp_path):
    """prediction.csv's measured column is the point's throughput (over three repeated 1-node runs, the
    geometric mean of their throughputs over wall time), the compute comes from it, so the 1-node rung's
    error is 0."""
    root = str(tmp_path / "runs")
    for k, level in enumerate((790.0, 800.0, 830.0)):
        write_run(
            root,
            study="s",
            strategy="DDP",
            nodes=1,
            step_ips=_skewed(level),
            warmup=2,
            time=1.7e9 + k,
            run_id=f"one-{k}",
        )
    write_run(root, study="s", strategy="DDP", nodes=2, step_ips=_skewed(1200.0), warmup=2, time=1.7e9 + 5)
    coll = reader.collect([root])
    results = table.build(coll).results
    rows = prediction.build(coll.runs, results).rows.set_index("nodes")
    points = results.set_index("nodes")
    walls = [wall_throughput(_skewed(level)) for level in (790.0, 800.0, 830.0)]
    assert points.loc[1, "ips_point"] == pytest.approx(math.prod(walls) ** (1 / 3)) and points.loc[1, "ips_runs"] == 3
    assert points.loc[2, "ips_step_median"] == pytest.approx(1200.0) != pytest.approx(points.loc[2, "ips_point"])
    for nodes in (1, 2):
        assert rows.loc[nodes, "measured_ips"] == pytest.approx(points.loc[nodes, "ips_point"])
    assert rows.loc[1, "role"] == "compute" and math.isnan(rows.loc[1, "error"])
    # the rung reproduces itself: it is the compute the prediction was given
    assert rows.loc[1, "predicted_ips"] == pytest.approx(points.loc[1, "ips_point"], rel=1e-6)
    assert rows.loc[2, "error"] == pytest.approx(points.loc[2, "ips_point"] / rows.loc[2, "predicted_ips"] - 1)


def test_predicted_figure_draws_the_throughput_with_its_interval(tmp_path):
    """The measured line of the predicted figure stands at each point's throughput, its error bars are the
    95% intervals of results.csv, and the caption and facts line say which interval."""
    from matplotlib.colors import to_hex

    root = str(tmp_path / "runs")
    for nodes, level in ((1, 800.0), (2, 1200.0)):
        write_run(root, study="s", strategy="DDP", nodes=nodes, step_ips=_skewed(level), warmup=2)
    coll = reader.collect([root])
    results = table.build(coll).results
    plots, _ = figures.all_plots(results, predictions=prediction.build(coll.runs, results).rows)
    plot = next(p for p in plots if p.name == "weak_scaling_predicted")
    ax, ok = plot.figure.axes[0], results.sort_values("nodes")
    solid = next(ln for ln in ax.get_lines() if ln.get_linestyle() == "-")
    assert list(solid.get_ydata()) == pytest.approx(list(ok["ips_point"]))
    verts = next(p for p in ax.patches if to_hex(p.get_edgecolor()) == to_hex(solid.get_color())).get_path().vertices
    drawn = [y for i in range(0, len(verts), 6) for y in (float(verts[i][1]), float(verts[i + 1][1]))]
    assert drawn == pytest.approx([y for pair in zip(ok["ips_ci_low"], ok["ips_ci_high"], strict=True) for y in pair])
    assert plot.extra["errorbars"] == {"vit_base": 2}
    assert (
        "each point's throughput (solid; error bars: the 95% interval: within one run (batch means of its step times"
        in " ".join(plot.caption.split())
    )
    assert "bars: 95% interval (within-run, 1 run)" in " ".join(plot.figure.get_suptitle().split())


def test_scenario_of_a_run_carries_its_options(tmp_path):
    opts = {
        "version": 1,
        "backward_prefetch": "post",
        "limit_all_gathers": False,
        "forward_prefetch": True,
        "use_orig_params": False,
        "cpu_offload": False,
        "precision": "fp32",
        "activation_checkpointing": True,
    }
    metrics = write_run(str(tmp_path), strategy="FULL_SHARD", nodes=2, ranks_per_node=4, batch=16, options=opts)
    sc = pr.scenario_of_run(reader.read_run(metrics).start)
    assert (sc.nodes, sc.gpus_per_node, sc.batch_size, sc.precision) == (2, 4, 16, "fp32")
    assert sc.activation_checkpointing and sc.fsdp.backward_prefetch == "post" and sc.fsdp.forward_prefetch
    assert dataclasses.replace(sc, nodes=1).world == 4
    # the run's device names the BLAS workspace the memory prediction counts: 76 MiB on ROCm, none on a CPU
    assert sc.allowance.blas_workspace_mib == 76.0
    cpu = write_run(str(tmp_path / "cpu"), strategy="FULL_SHARD", device="cpu", device_memory_gib=None)
    assert pr.scenario_of_run(reader.read_run(cpu).start).allowance.blas_workspace_mib == 0.0


# ---------------------------------------------------------------- review fixes


def test_malformed_check_json_is_one_line(tmp_path):
    """A check.json whose precisions or model have the wrong type: one line naming the key, not a traceback."""
    for key, value in (("precisions", 5), ("precisions", "bf16"), ("model", 5)):
        path = write_check(str(tmp_path / f"{key}-{value}.json"), [fit()])
        with open(path) as f:
            data = json.load(f)
        data[key] = value
        with open(path, "w") as f:
            json.dump(data, f)
        one_line_error(
            lambda path=path: pr.check_calibration(path, system="frontier", models=["vit_base"], precisions=["bf16"]),
            path,
            key,
        )


def test_calibration_names_the_fits_it_used(tmp_path):
    defaults = pr.profile_calibration(FRONTIER)
    flagged = write_check(str(tmp_path / "flagged.json"), [fit(flags=("residual 40%",))])
    cal = pr.check_calibration(flagged, system="frontier", models=["vit_base"], precisions=["bf16"], defaults=defaults)
    assert cal.kind == "profile" and cal.label == "profile"
    assert any("check.json's fits were all flagged: all_reduce/inter not used: residual 40%" in n for n in cal.notes)
    some = write_check(str(tmp_path / "some.json"), [fit(), fit("all_gather", flags=("not monotone",))])
    cal = pr.check_calibration(some, system="frontier", models=["vit_base"], precisions=["bf16"], defaults=defaults)
    assert cal.kind == "check" and cal.label == "check (all_reduce/inter) + profile defaults"
    assert cal.describe().startswith("check.json's fits (all_reduce/inter) + profile defaults")


def test_compute_from_takes_the_median_step(tmp_path):
    """The analysis plots a run's median images/s: --compute-from takes the same, not the mean."""
    steps = [100.0] * 20 + [1000.0] * 5  # mean 280, median 100
    metrics = write_run(str(tmp_path), nodes=1, ranks_per_node=8, step_ips=steps)
    run = reader.collect([os.path.dirname(metrics)]).runs[0]
    step = pr.measured_step(run)
    assert step.step_s == pytest.approx(32 * 8 / 100.0)


def test_runs_that_did_not_fit_get_no_prediction(tmp_path):
    root = str(tmp_path / "runs")
    write_run(root, study="s", nodes=1, ips=800.0)
    write_run(root, study="s", nodes=2, ips=None, status="oom")
    write_run(root, study="s", nodes=4, ips=None, status="skipped")
    # it ran, yet the planner says it cannot fit in 1 GiB: predicted as not fitting, not as a speed
    write_run(root, study="s", nodes=8, ips=5000.0, device_memory_gib=1.0)
    rows, _ = _analyse(root, str(tmp_path / "out"))
    by = rows.set_index("nodes")
    assert by.at[1, "predicted_ips"] > 0
    assert math.isnan(by.at[1, "predicted_optimizer_ms"])  # not modelled (inside compute), not a predicted 0
    for nodes, status in ((2, "oom"), (4, "skipped")):
        assert math.isnan(by.at[nodes, "predicted_ips"]) and math.isnan(by.at[nodes, "predicted_step_ms"])
        assert (
            by.at[nodes, "explanation"].startswith("not predicted:")
            and f"status {status}" in by.at[nodes, "explanation"]
        )
    assert math.isnan(by.at[8, "predicted_ips"]) and "does not fit in the device's 1 GiB" in by.at[8, "explanation"]


def test_a_sweep_jobs_own_check_calibrates_its_node_count(tmp_path):
    """A sweep job writes STUDY/check-n<N>.json: it calibrates that job's runs on N nodes."""
    root, _, _ = _study(tmp_path)
    write_check(os.path.join(root, "s", "check.json"), [fit(alpha=5.0, bus=200.0)], job="999")
    write_check(os.path.join(root, "s", "check-n2.json"), [fit(alpha=5.0, bus=200.0)], job="1234")
    rows, text = _analyse(root, str(tmp_path / "out"))
    by = rows.set_index("nodes")
    assert by.at[2, "calibration"] == "check (all_reduce/inter) + profile defaults"
    assert "check-n2.json" in by.at[2, "calibration_source"]
    assert by.at[1, "calibration"] == "profile"  # check.json is another allocation's; no check-n1.json
    # a node count's check of another job is not that job's: check.json's rule applies
    write_check(os.path.join(root, "s", "check-n2.json"), [fit(alpha=5.0, bus=200.0)], job="555")
    rows, _ = _analyse(root, str(tmp_path / "out2"))
    assert set(rows["calibration"]) == {"profile"}


def test_no_dashed_point_over_a_failure_mark(tmp_path):
    root = str(tmp_path / "runs")
    write_run(root, study="s", nodes=1, ips=800.0)
    write_run(root, study="s", nodes=2, ips=1500.0)
    write_run(root, study="s", nodes=4, ips=None, status="oom")
    coll = reader.collect([root])
    results = table.build(coll).results
    predicted = prediction.build(coll.runs, results)
    plots, _ = figures.all_plots(results, predictions=predicted.rows)
    plot = next(p for p in plots if p.name == "weak_scaling_predicted")
    assert plot.drawn["vit_base"] == {"measured": 1, "predicted": 1, "extrapolated": 0, "failed": 1, "banded": 2}
    assert [x for x, _ in next(iter(plot.extra["predicted"].values()))] == [1, 2]


def test_a_malformed_check_json_is_a_note_in_the_analysis(tmp_path):
    """The analysis goes on past a hand-edited check.json: the report names it, the defaults are used."""
    root, _, _ = _study(tmp_path)
    path = write_check(os.path.join(root, "s", "check.json"), [fit()])
    with open(path) as f:
        data = json.load(f)
    data.update(precisions=5, slurm="1234", system=["frontier"])
    with open(path, "w") as f:
        json.dump(data, f)
    rows, text = _analyse(root, str(tmp_path / "out"))
    assert set(rows["calibration"]) == {"profile"} and "check.json not used" in text
