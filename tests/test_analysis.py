"""analysis/: reading run directories, the results table, the figures, the report and the CLI.

Run directories here are written by analysis/synthetic.py with numbers chosen so every
expected value can be worked out by hand; tests/test_analysis_contract.py reads ones the real
trainer wrote.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys

import pandas as pd
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from analysis import figures, report, table  # noqa: E402
from analysis.synthetic import default_options, write_run  # noqa: E402
from analysis.weak_scaling import main  # noqa: E402
from vit_scale.record import reader as records  # noqa: E402

CAPACITY = 64.0


def _study(root) -> str:
    """A small study with hand-checkable numbers.

    vit_base: DDP at 1, 2, 4 nodes = 100, 180, 300 images/s (efficiency 1, 0.9, 0.75);
              FULL_SHARD OOM at 1 node, then 200, 360 at 2, 4 nodes (efficiency 1, 0.9 against 2 nodes);
              HYBRID_2GPU 90, 170 at 1, 2 nodes, timeout at 4.
    vit_3b:   DDP 10 at 1 node but diverged (replicas disagree); FULL_SHARD 8, 15 at 1, 2 nodes.
    """
    root = str(root)
    t = 1.7e9
    w = lambda **kw: write_run(root, study="s", steps=8, warmup=2, device_memory_gib=CAPACITY, **kw)  # noqa: E731
    for nodes, ips in ((1, 100.0), (2, 180.0), (4, 300.0)):
        w(model="vit_base", strategy="DDP", nodes=nodes, ips=ips, memory_gib=20.0, time=t + nodes)
    w(model="vit_base", strategy="FULL_SHARD", nodes=1, ips=None, status="oom", error="CUDA out of memory", time=t)
    for nodes, ips, mem in ((2, 200.0, 12.0), (4, 360.0, 9.0)):
        w(model="vit_base", strategy="FULL_SHARD", nodes=nodes, ips=ips, memory_gib=mem, time=t + nodes)
    for nodes, ips in ((1, 90.0), (2, 170.0)):
        w(model="vit_base", strategy="HYBRID_2GPU", nodes=nodes, ips=ips, memory_gib=15.0, time=t + nodes)
    w(
        model="vit_base",
        strategy="HYBRID_2GPU",
        nodes=4,
        ips=None,
        status="timeout",
        error="SIGTERM after 600 s",
        time=t,
    )
    w(
        model="vit_3b",
        strategy="DDP",
        nodes=1,
        ips=10.0,
        memory_gib=60.0,
        replicas_agree=False,
        status="diverged",
        error="replicas differ at the end",
        time=t,
    )
    for nodes, ips in ((1, 8.0), (2, 15.0)):
        w(model="vit_3b", strategy="FULL_SHARD", nodes=nodes, ips=ips, memory_gib=30.0 / nodes, time=t + nodes)
    return root


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return _study(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def results(study):
    return table.build(records.collect([study])).results


def _row(df, model, strategy, nodes):
    sub = df[(df["model"] == model) & (df["strategy"] == strategy) & (df["nodes"] == nodes)]
    assert len(sub) == 1, sub
    return sub.iloc[0]


# --------------------------------------------------------------------------------- the table


def test_efficiency_is_ips_over_base_times_node_ratio(results):
    expected = {
        ("DDP", 1): 1.0,
        ("DDP", 2): 0.9,
        ("DDP", 4): 0.75,
        ("FULL_SHARD", 2): 1.0,
        ("FULL_SHARD", 4): 0.9,
        ("HYBRID_2GPU", 1): 1.0,
        ("HYBRID_2GPU", 2): 170 / 180,
    }
    for (strategy, nodes), eff in expected.items():
        row = _row(results, "vit_base", strategy, nodes)
        assert row["efficiency"] == pytest.approx(eff), (strategy, nodes)
    assert _row(results, "vit_base", "FULL_SHARD", 4)["efficiency_base_nodes"] == 2
    assert math.isnan(_row(results, "vit_base", "FULL_SHARD", 1)["efficiency"])  # the OOM has none


# One fast step in nine: the run's median step rate stays at its level, its throughput over wall time does not.
SKEWED_1 = [98.0, 100.0, 102.0, 101.0, 99.0, 103.0, 160.0, 97.0, 100.0]  # median 100
SKEWED_2 = [178.0, 180.0, 183.0, 181.0, 179.0, 182.0, 250.0, 177.0, 180.0]  # median 180


def test_efficiency_and_scaling_table_use_the_point_throughput(tmp_path):
    """Efficiency is of the throughputs over wall time the figures plot (images over summed step times),
    not of the median step rates (180 / (2 x 100) = 0.90); the median step rate stands beside it."""
    root = str(tmp_path)
    for nodes, steps in ((1, SKEWED_1), (2, SKEWED_2)):
        write_run(root, study="m", strategy="DDP", nodes=nodes, step_ips=steps, warmup=2, time=1.7e9 + nodes)
    df = table.build(records.collect([root])).results
    one, two = _row(df, "vit_base", "DDP", 1), _row(df, "vit_base", "DDP", 2)
    wall_1, wall_2 = 9 / sum(1 / x for x in SKEWED_1), 9 / sum(1 / x for x in SKEWED_2)
    assert two["ips_mean"] == pytest.approx(wall_2) and two["ips_point"] == pytest.approx(wall_2)
    assert two["ips_step_median"] == 180.0 and one["ips_step_median"] == 100.0
    assert two["efficiency"] == pytest.approx(wall_2 / (2 * wall_1)) != pytest.approx(0.9)
    assert two["efficiency_ci_low"] < two["efficiency"] < two["efficiency_ci_high"]
    assert list(table.scaling_table(df, "vit_base").loc["DDP"]) == [
        f"{wall_1:.4g} (100%)",
        f"{wall_2:.4g} ({wall_2 / (2 * wall_1) * 100:.0f}%)",
    ]


def test_status_column_and_derived_columns(results):
    assert len(results) == 12
    assert _row(results, "vit_base", "FULL_SHARD", 1)["status"] == "oom"
    assert _row(results, "vit_base", "HYBRID_2GPU", 4)["status"] == "timeout"
    assert _row(results, "vit_base", "HYBRID_2GPU", 4)["error"] == "SIGTERM after 600 s"
    ddp4 = _row(results, "vit_base", "DDP", 4)
    assert ddp4["world_size"] == 32 and ddp4["batch_global"] == 32 * 32
    assert ddp4["ips_per_device"] == pytest.approx(300 / 32)
    assert ddp4["memory_gib"] == pytest.approx(20.0) and ddp4["memory_measure"] == "allocated"
    assert ddp4["mem_reserved_max_gib"] == pytest.approx(22.0)
    assert ddp4["device_memory_gib"] == CAPACITY
    assert ddp4["opt_precision"] == "bf16" and ddp4["job_id"] == "1234" and ddp4["v_torch"].startswith("2.4")
    assert ddp4["mfu"] == pytest.approx(ddp4["tflops_per_device"] / 191.5)


def test_best_run_per_model_and_nodes(results):
    best = table.best_runs(results).set_index(["model", "nodes"])
    assert best.loc[("vit_base", 1), "strategy"] == "DDP"  # 100 vs 90; FULL_SHARD OOM
    assert best.loc[("vit_base", 2), "strategy"] == "FULL_SHARD"  # 200 vs 180 vs 170
    assert best.loc[("vit_base", 2), "ratio"] == pytest.approx(200 / 180)
    assert best.loc[("vit_base", 4), "strategy"] == "FULL_SHARD"  # 360 vs 300; HYBRID timed out
    # DDP is faster on vit_3b but diverged (its replicas disagree): not a result
    assert best.loc[("vit_3b", 1), "strategy"] == "FULL_SHARD"


def test_reruns_keep_newest_ok_and_count_the_rest(tmp_path):
    root = str(tmp_path)
    common = dict(study="r", model="vit_base", strategy="DDP", nodes=2, steps=4, warmup=1)
    write_run(root, ips=100.0, time=1000.0, run_id="old-ok", **common)
    write_run(root, ips=120.0, time=2000.0, run_id="new-ok", **common)
    write_run(root, ips=None, status="failed", error="NCCL timeout", time=3000.0, run_id="newest-failed", **common)
    write_run(root, ips=50.0, time=1000.0, run_id="other", **dict(common, nodes=4))
    write_run(root, ips=90.0, time=2000.0, run_id="new-ok", **dict(common, strategy="FULL_SHARD"))  # same id
    tables = table.build(records.collect([root]))
    kept = _row(tables.results, "vit_base", "DDP", 2)
    assert kept["run_id"] == "new-ok" and kept["ips_mean"] == 120.0 and kept["reruns_set_aside"] == 2
    assert (kept["ips_runs"], kept["ips_runs_planned"]) == (2, 3)  # the failed rerun counts: 2 of 3 ok
    assert sorted(tables.set_aside["run_id"]) == ["newest-failed", "old-ok"]
    assert set(tables.set_aside["set_aside_for"]) == {"new-ok"}
    assert set(tables.set_aside["series"]) == {"DDP"}
    assert set(tables.set_aside["set_aside_for_path"]) == {kept["path"]}
    assert _row(tables.results, "vit_base", "DDP", 4)["reruns_set_aside"] == 0


def test_where_the_allocation_went_counts_every_run_and_repetitions_as_repetitions(tmp_path):
    """Two points of two rounds each on 1 and 2 nodes, and a failed rerun on 2: every run 10 s from launch to
    record (start-up 6, warm-up 1, timed 2, the rest 1). 80 node-seconds in all (1 x 2 x 10 + 2 x 3 x 10), 20%
    in timed windows; the report's first line counts the repetitions as repetitions, and only the failed run
    is listed as set aside."""
    import pandas as pd

    from analysis.weak_scaling import main as analyse

    split = {"launched_at": 1.7e9, "startup_s": 6.0, "warmup_s": 1.0, "timed_s": 2.0, "rest_s": 1.0, "wall_s": 10.0}
    common = dict(study="a", model="vit_base", strategy="DDP", steps=6, warmup=1, time_split=split)
    for nodes in (1, 2):
        for r in (1, 2):
            write_run(str(tmp_path / "runs"), nodes=nodes, run_id=f"n{nodes}r{r}", repetition=r, time=1e4 * r, **common)
    write_run(str(tmp_path / "runs"), nodes=2, run_id="lost", repetition=2, status="failed", ips=None, time=1.5e4,
              error="NCCL timeout", **common)  # fmt: skip
    out = tmp_path / "report"
    assert analyse([str(tmp_path / "runs"), "--out", str(out), "--quiet", "--no-plots"]) == 0
    csv = pd.read_csv(out / "results.csv").set_index("nodes")
    assert csv.loc[1, "point_node_s"] == pytest.approx(20) and csv.loc[2, "point_node_s"] == pytest.approx(60)
    assert csv.loc[2, "point_timed_share"] == pytest.approx(0.2) and csv.loc[2, "point_runs_split"] == 3
    assert csv.loc[1, "startup_s"] == 6 and csv.loc[1, "run_node_s"] == 10 and csv.loc[2, "run_node_s"] == 20
    md = (out / "report.md").read_text()
    first = md.split("\n\n")[1]
    assert first.startswith("2 point(s) from 5 run(s) in ") and "2 ok (each point's kept run)" in first, first
    assert "2 further repetition(s) pooled into their points, 1 rerun(s) set aside" in first, first
    section = md.split("## Where the allocation went")[1].split("\n## ")[0]
    assert (
        "Over 5 run(s), repetitions and failures included: 0.0222 node-hours (80 node-seconds), 20.0% in timed "
        "windows, 60.0% start-up, 10.0% warm-up, 10.0% the rest." in section
    ), section
    assert "| 2 | 1 | 3 | 0.0167 | 20.0% | 60.0% | 10.0% | 10.0% |" in section, section
    assert "| vit_base | DDP | 1 | 2 | 0.00556 | 20.0% |" in section, section
    aside = md.split("## Reruns set aside")[1].split("\n## ")[0]
    assert "1 failed or unusable rerun(s)" in aside and "| lost |" in aside and "n2r1" not in aside, aside


def test_overlapping_inputs_are_read_once(study):
    coll = records.collect([study, os.path.join(study, "s", "vit_base"), study])
    assert len(coll.runs) == 12 and table.build(coll).set_aside.empty


def test_series_name_the_options_that_vary(tmp_path):
    root = str(tmp_path)
    for prefetch in ("pre", "post"):
        opts = dict(default_options("FULL_SHARD"), backward_prefetch=prefetch)
        for nodes, ips in ((1, 100.0), (2, 150.0 if prefetch == "pre" else 190.0)):
            write_run(
                root,
                study="g",
                strategy="FULL_SHARD",
                nodes=nodes,
                ips=ips,
                options=opts,
                steps=4,
                warmup=1,
                run_id=f"{prefetch}{nodes}",
            )
    write_run(root, study="g", strategy="DDP", nodes=1, ips=80.0, steps=4, warmup=1)
    df = table.build(records.collect([root])).results
    assert set(df["series"]) == {"FULL_SHARD [prefetch=pre]", "FULL_SHARD [prefetch=post]", "DDP"}
    # each configuration is its own efficiency baseline
    post2 = df[(df["series"] == "FULL_SHARD [prefetch=post]") & (df["nodes"] == 2)].iloc[0]
    assert post2["efficiency"] == pytest.approx(0.95)


def test_single_node_rank_ladder_uses_ranks(tmp_path):
    """CPU runs with 1 and 2 ranks on one node: efficiency by ranks, x axis in ranks."""
    root = str(tmp_path)
    write_run(
        root,
        study="c",
        model="vit_micro",
        strategy="DDP",
        nodes=1,
        ranks_per_node=1,
        ips=40.0,
        device="cpu",
        steps=4,
        warmup=1,
    )
    write_run(
        root,
        study="c",
        model="vit_micro",
        strategy="DDP",
        nodes=1,
        ranks_per_node=2,
        ips=60.0,
        device="cpu",
        steps=4,
        warmup=1,
        run_id="two",
    )
    df = table.build(records.collect([root])).results
    assert sorted(df["efficiency"]) == pytest.approx([0.75, 1.0])
    assert table.x_axis(df) == ("world_size", "ranks")
    assert set(df["memory_measure"]) == {"rss"}
    plot = figures.memory(df)
    assert plot.figure.axes[0].get_ylabel() == "peak RSS per rank (GiB), CPU"


# ------------------------------------------------------------------------------------ plots


def _lines(ax, style):
    return [ln for ln in ax.get_lines() if ln.get_linestyle() == style]


def test_weak_scaling_plot_has_one_line_and_one_ideal_per_strategy(results):
    plot = figures.weak_scaling(results)
    assert plot.drawn["vit_base"] == {"measured": 3, "ideal": 3, "failed": 2}
    # vit_3b DDP ran at one node count only: a single run is no scaling line, so it is left out
    assert plot.drawn["vit_3b"] == {"measured": 1, "ideal": 1, "failed": 0}
    ax = next(a for a in plot.figure.axes if a.get_title().startswith("vit_base"))
    assert len(_lines(ax, "-")) == 3 and len(_lines(ax, "--")) == 3
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "nodes"
    # the ideal FULL_SHARD line starts at its 2-node run: 200 → 400 at 4 nodes, and spans the OOM at 1
    color = figures.series_colors(results)["FULL_SHARD"]
    ideal = next(ln for ln in _lines(ax, "--") if ln.get_color() == color)
    assert list(ideal.get_xdata()) == [1, 2, 4] and list(ideal.get_ydata()) == pytest.approx([100, 200, 400])
    assert len(ax.collections) == 2  # an × for the OOM and one for the timeout


def test_predicted_against_measured_memory_has_a_point_per_ok_gpu_run(results):
    plot = figures.predicted_memory(results)
    assert plot is not None
    # ok runs with a measured peak: vit_base DDP x3, FULL_SHARD x2 (+ vit_3b x2), HYBRID_2GPU x2
    assert plot.drawn == {"DDP": 3, "FULL_SHARD": 4, "HYBRID_2GPU": 2}
    ax = plot.figure.axes[0]
    assert len(ax.collections) == 3 + 1  # one scatter per strategy and the ±15% band


def test_memory_plot_keeps_full_shard_apart_with_capacity(results):
    plot = figures.memory(results)
    assert plot.drawn[("vit_base", "FULL_SHARD")] == {"measured": 1, "capacity": 1, "failed": 1}
    assert plot.drawn[("vit_base", "other strategies")] == {"measured": 2, "capacity": 1, "failed": 1}
    ax = next(a for a in plot.figure.axes if a.get_title().endswith("FULL_SHARD") and "vit_base" in a.get_title())
    assert list(_lines(ax, "-")[0].get_ydata()) == [12.0, 9.0]
    assert [ln.get_ydata()[0] for ln in _lines(ax, ":")] == [CAPACITY]
    assert ax.get_ylabel() == "peak allocated per GPU (GiB)"


def test_efficiency_heat_map_values(results):
    plot = figures.efficiency(results)
    base = plot.drawn["vit_base"]
    assert list(base.columns) == [1, 2, 4]
    assert base.loc["DDP"].tolist() == pytest.approx([1.0, 0.9, 0.75])
    assert math.isnan(base.loc["FULL_SHARD", 1]) and base.loc["FULL_SHARD", 4] == pytest.approx(0.9)
    texts = [t.get_text() for t in plot.figure.axes[0].texts]
    assert "75%" in texts and "×\nOOM" in texts and "×\nTIMEOUT" in texts


def _grid_study(root, oom=("FULL_SHARD", "none", False)):
    for label, base in (("HYBRID_2GPU", 130.0), ("FULL_SHARD", 100.0), ("SHARD_GRAD_OP", 110.0)):
        for pi, prefetch in enumerate(("none", "pre", "post")):
            for lag in (False, True):
                opts = dict(default_options(label), backward_prefetch=prefetch, limit_all_gathers=lag)
                bad = (label, prefetch, lag) == oom
                write_run(
                    str(root),
                    study="grid",
                    model="vit_5b",
                    strategy=label,
                    nodes=8,
                    options=opts,
                    ips=None if bad else base + 10 * pi + 5 * lag,
                    status="oom" if bad else "ok",
                    steps=4,
                    warmup=1,
                    run_id=f"{prefetch}-{lag}",
                )
    # a second, smaller grid the picker must not choose
    for lag in (False, True):
        opts = dict(default_options("FULL_SHARD"), limit_all_gathers=lag)
        write_run(
            str(root),
            study="grid",
            model="vit_base",
            strategy="FULL_SHARD",
            nodes=2,
            options=opts,
            ips=50.0,
            steps=4,
            warmup=1,
            run_id=f"b-{lag}",
        )


def test_config_grid_bars(tmp_path):
    _grid_study(tmp_path)
    df = table.build(records.collect([str(tmp_path)])).results
    plot = figures.config_grid(df)
    d = plot.drawn
    assert (d["model"], d["nodes"], d["batch"]) == ("vit_5b", 8, 32)
    assert d["bars"] == 17 and d["failed"] == [("FULL_SHARD", "none", False, "oom")]
    assert d["values"][("HYBRID_2GPU", "pre", True)] == pytest.approx(145.0)
    ax = plot.figure.axes[0]
    assert len(ax.patches) == 17 and [t.get_text() for t in ax.get_xticklabels()] == [
        "HYBRID_2GPU",
        "FULL_SHARD",
        "SHARD_GRAD_OP",
    ]
    small = figures.config_grid(df, model="vit_base")
    assert small.drawn["bars"] == 2
    with pytest.raises(ValueError, match="--grid-model.*vit_5b"):
        figures.config_grid(df, model="vit_15b")
    with pytest.raises(ValueError, match="--grid-nodes.*8"):
        figures.config_grid(df, model="vit_5b", nodes=4)


def test_plugin_comparison_found_by_data(tmp_path):
    for label, ips in (("CAI_DDP", 20.0), ("CAI_GEMINI", 30.0), ("ZERO2", 25.0)):
        for batch in (8, 32):
            bad = label == "CAI_DDP" and batch == 32
            write_run(
                str(tmp_path),
                study="anything",
                strategy=label,
                nodes=1,
                ranks_per_node=1,
                batch=batch,
                ips=None if bad else ips * batch / 8,
                status="oom" if bad else "ok",
                steps=4,
                warmup=1,
                memory_gib=None if bad else batch / 8,
                run_id=f"b{batch}",
            )
    df = table.build(records.collect([str(tmp_path)])).results
    plot = figures.plugin_comparison(df)
    assert plot.drawn == {("anything", "vit_base"): {"ips_lines": 3, "memory_lines": 3, "failed": 1, "capacity": 1}}
    assert len(_lines(plot.figure.axes[0], "-")) == 3
    assert figures.weak_scaling(df) is None  # one world size: no scaling plot, and all_plots says why
    _, missing = figures.all_plots(df)
    assert any(m.startswith("weak scaling") for m in missing)


def test_figure_modules_share_only_the_private_modules():
    """Each figure family stands alone: a figure module imports the private helpers (_style,
    _layout, ...) and the analysis' tables, never another figure module, and every one of them is
    in the registry."""
    import ast

    package = os.path.join(ROOT, "analysis", "figures")
    modules = sorted(f[:-3] for f in os.listdir(package) if f.endswith(".py") and not f.startswith("_"))
    assert len(modules) >= 7
    for name in modules:
        tree = ast.parse(open(os.path.join(package, f"{name}.py")).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                targets = [node.module] if node.module else [a.name for a in node.names]
                assert all(t.startswith("_") for t in targets), (name, targets)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith("analysis.figures"), (name, node.module)
    assert sorted(f.draw.__module__.rsplit(".", 1)[-1] for f in figures.FIGURES) == modules


# ----------------------------------------------------------------------------- bad input


def _one(path):
    coll = records.collect([str(path)])
    return coll


def test_truncated_last_line_is_an_incomplete_run(tmp_path):
    path = write_run(str(tmp_path), strategy="DDP", steps=10, warmup=2, ips=50.0)
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:  # the job died while writing the end record
        f.write(data[: data.rfind(b'"event": "end"') + 20])
    coll = _one(tmp_path)
    (run,) = coll.runs
    # partial_ips is the mean of the logged step rates; the steps' throughput over wall time is 50
    assert run.status == "incomplete" and run.last_step == 10 and run.partial_ips == pytest.approx(50.0, rel=2e-3)
    assert any("truncated" in n for n in run.notes)
    row = table.build(coll).results.iloc[0]
    assert row["status"] == "incomplete" and row["steps_done"] == 10
    assert row["error"].startswith("no end record; stopped after step 10 of 10")


def test_killed_run_with_rank_error_file(tmp_path):
    path = write_run(str(tmp_path), strategy="FULL_SHARD", nodes=2, steps=10, warmup=2, end=False, steps_logged=3)
    with open(os.path.join(os.path.dirname(path), "rank5.error.json"), "w") as f:
        json.dump({"rank": 5, "status": "oom", "error": "HIP out of memory"}, f)
    row = table.build(_one(tmp_path)).results.iloc[0]
    assert row["status"] == "incomplete" and row["steps_done"] == 3
    assert "rank 5: oom: HIP out of memory" in row["error"]


def test_garbage_after_end_record_still_reads_the_end(tmp_path):
    path = write_run(str(tmp_path), ips=70.0)
    with open(path, "a") as f:
        f.write("\x00\x00garbage{\n")
    (run,) = _one(tmp_path).runs
    assert run.status == "ok" and run.end["images_per_s"]["mean"] == 70.0
    assert any("unreadable" in n for n in run.notes)


def test_huge_end_record_is_read_from_the_tail(tmp_path):
    """Per-rank lists of a 4,096-rank run make the end line longer than the first tail window."""
    path = write_run(str(tmp_path), nodes=512, ranks_per_node=8, ips=5000.0, steps=3, warmup=1)
    with open(path, "rb") as f:
        assert len(f.read().splitlines()[-1]) > 2 * records._TAIL_BLOCK
    (run,) = _one(tmp_path).runs
    assert run.status == "ok" and len(run.end["memory"]["peak_allocated_gib"]["per_rank"]) == 4096


def test_each_bad_file_is_skipped_with_its_reason(tmp_path):
    good = write_run(str(tmp_path), study="b", ips=10.0)
    bad_dir = os.path.join(str(tmp_path), "b", "bad")
    cases = {
        "empty": b"",
        "garbage": b"\x89PNG not json\n",
        "halfstart": b'{"event": "start", "sche',
        "notstart": b'{"event": "step", "step": 1}\n',
        "noschema": b'{"event": "start"}\n',
        "nomodel": json.dumps({"event": "start", "schema": 1}).encode() + b"\n",
    }
    for name, content in cases.items():
        os.makedirs(os.path.join(bad_dir, name))
        with open(os.path.join(bad_dir, name, "metrics.jsonl"), "wb") as f:
            f.write(content)
    os.makedirs(os.path.join(bad_dir, "dangling"))
    os.symlink("/nonexistent/metrics.jsonl", os.path.join(bad_dir, "dangling", "metrics.jsonl"))
    os.makedirs(os.path.join(bad_dir, "nometrics"))
    open(os.path.join(bad_dir, "nometrics", "config.yaml"), "w").close()
    coll = _one(tmp_path)
    assert [r.path for r in coll.runs] == [good]
    reasons = {
        os.path.basename(os.path.dirname(s.path)) if s.path.endswith(".jsonl") else os.path.basename(s.path): s.reason
        for s in coll.skipped
    }
    assert reasons["empty"] == "empty file"
    assert reasons["garbage"].startswith("first line is not JSON")
    assert reasons["halfstart"].startswith("first line is not JSON")
    assert reasons["notstart"].startswith("first line is not a start record")
    assert "schema" in reasons["noschema"]
    assert reasons["nomodel"] == "start record lacks model.name (str), got None"
    assert reasons["dangling"].startswith("cannot read: No such file")
    assert reasons["nometrics"].startswith("config.yaml but no metrics.jsonl")


def test_permission_denied_is_skipped(tmp_path, monkeypatch):
    """As root chmod cannot make a file unreadable, so the denial is simulated where records opens."""
    path = write_run(str(tmp_path), ips=10.0)
    real_open = open

    def deny(p, *a, **kw):
        if p == path:
            raise PermissionError(13, "Permission denied", p)
        return real_open(p, *a, **kw)

    monkeypatch.setattr(records, "open", deny, raising=False)
    coll = _one(tmp_path)
    assert not coll.runs and coll.skipped[0].reason == "cannot read: Permission denied"


def test_unreadable_file_is_skipped(tmp_path):
    """A real chmod 000 where it denies anything; as root (CI) it does not, and the test above
    simulates the denial instead."""
    path = write_run(str(tmp_path), ips=10.0)
    os.chmod(path, 0)
    try:
        coll = _one(tmp_path)
    finally:
        os.chmod(path, 0o644)
    if os.geteuid() == 0:
        assert len(coll.runs) == 1  # root reads it: nothing to skip
    else:
        assert not coll.runs and coll.skipped[0].reason.startswith("cannot read: Permission denied")


# ------------------------------------------------------------------------------------- CLI


def _digest(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                out[p] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_cli_end_to_end_without_torch(study, tmp_path):
    """The whole CLI in a fresh interpreter, as on a login node: files, numbers, no torch imported
    (the record reader and the label registry it uses from vit_scale are torch-free)."""
    out = str(tmp_path / "report")
    before = _digest(study)
    probe = (
        f"import sys, runpy; sys.argv = ['analysis/weak_scaling.py', {study!r}, '--out', {out!r}, '--dpi', '60']; "
        "code = 0\ntry:\n    runpy.run_path('analysis/weak_scaling.py', run_name='__main__')\n"
        "except SystemExit as e:\n    code = e.code\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm', 'deepspeed', 'colossalai'))\n"
        "print('FORBIDDEN', bad); sys.exit(code)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "FORBIDDEN []" in proc.stdout
    assert "collected 12 runs" in proc.stdout
    assert "vit_base     1: DDP · 2-4: FULL_SHARD" in proc.stdout
    assert "Traceback" not in proc.stderr
    names = set(os.listdir(out))
    for stem in ("weak_scaling_ips", "memory", "efficiency"):
        assert {f"{stem}.png", f"{stem}.pdf"} <= names
    assert {"results.csv", "report.md", "report.html"} <= names
    import pandas as pd

    csv = pd.read_csv(os.path.join(out, "results.csv"))
    assert len(csv) == 12 and sorted(csv["status"].unique()) == ["diverged", "ok", "oom", "timeout"]
    md = open(os.path.join(out, "report.md")).read()
    assert "## Best run per model and node count" in md and "![Weak scaling: images/s](weak_scaling_ips.png)" in md
    assert "| vit_base | HYBRID_2GPU | 4 | 32 | timeout |" in md and "SIGTERM after 600 s" in md
    assert "| DDP | 100 (100%) | 180 (90%) | 300 (75%) |" in md
    assert "replicas disagree: vit_3b DDP" in md
    html = open(os.path.join(out, "report.html")).read()
    assert html.count("src='data:image/png;base64,") == 3
    with open(os.path.join(out, "weak_scaling_ips.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert _digest(study) == before  # inputs untouched


def test_cli_goes_on_past_bad_files_and_names_them(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_run(str(runs), ips=10.0, nodes=1)
    write_run(str(runs), ips=18.0, nodes=2)
    os.makedirs(runs / "junk")
    (runs / "junk" / "metrics.jsonl").write_text("not json at all\n")
    code = main([str(runs), "--out", str(tmp_path / "o"), "--no-plots"])
    cap = capsys.readouterr()
    assert code == 0
    assert "collected 2 runs" in cap.out and "(1 skipped, 0 reruns set aside)" in cap.out
    assert f"skipped {runs / 'junk' / 'metrics.jsonl'}: first line is not JSON" in cap.err
    assert "junk" in (tmp_path / "o" / "report.md").read_text()


def test_cli_unknown_schema_is_an_error_but_the_rest_is_written(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_run(str(runs), ips=10.0, nodes=1)
    write_run(str(runs), ips=10.0, nodes=2, schema=2)
    code = main([str(runs), "--out", str(tmp_path / "o"), "--no-plots", "--quiet"])
    err = capsys.readouterr().err
    assert code == 3
    assert "schema newer than this analysis reads (up to 1)" in err and "update" in err
    assert len((tmp_path / "o" / "results.csv").read_text().splitlines()) == 2
    only_new = tmp_path / "new"
    write_run(str(only_new), ips=10.0, schema=7)
    assert main([str(only_new), "--out", str(tmp_path / "o2")]) == 3


@pytest.mark.parametrize(
    "case, expect",
    [
        ("empty_dir", "no usable runs"),
        ("only_garbage", "no usable runs"),
    ],
)
def test_cli_nothing_usable_exits_1(tmp_path, capsys, case, expect):
    runs = tmp_path / "runs"
    os.makedirs(runs)
    if case == "only_garbage":
        os.makedirs(runs / "x")
        (runs / "x" / "metrics.jsonl").write_text("")
    assert main([str(runs), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_cli_bad_arguments_are_one_line_errors(study, tmp_path, capsys):
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    run_dir = os.path.dirname(write_run(str(tmp_path / "r"), ips=1.0))
    cases = [
        ([str(tmp_path / "missing"), "--out", str(tmp_path / "o")], "RUNS_DIR: no such file or directory"),
        ([study, "--out", str(a_file)], "is a file"),
        ([study, "--out", os.path.join(run_dir, "rep")], "inside the run directory"),
        ([study, "--out", str(tmp_path / "o"), "--grid-model", "vit_15b"], "--grid-model"),
        ([study, "--out", str(tmp_path / "o"), "--formats", "png,gif"], "allowed: png, pdf, svg"),
        ([study, "--out", str(tmp_path / "o"), "--dpi", "0"], "--dpi"),
        (["--out", str(tmp_path / "o")], "RUNS_DIR"),
        ([study, "--out", str(tmp_path / "o"), "--study", "nope"], "--study: no runs of nope"),
    ]
    for argv, expect in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and expect in err, (argv, err)
    assert not (tmp_path / "o").exists()


def test_cli_refuses_to_overwrite_an_input(tmp_path, capsys):
    out = tmp_path / "o"
    os.makedirs(out)
    (out / "results.csv").write_text("precious\n")  # passed as an input file: must survive
    runs = tmp_path / "runs"
    write_run(str(runs), ips=10.0)
    assert main([str(runs), str(out / "results.csv"), "--out", str(out), "--no-plots"]) == 2
    assert "is one of the input files" in capsys.readouterr().err
    assert (out / "results.csv").read_text() == "precious\n"


def test_report_markdown_table_escapes_pipes():
    md = report.to_markdown([report.Block("table", header=["a"], rows=[["x|y"]])])
    assert md == "| a |\n|---|\n| x\\|y |\n"


# ------------------------------------------------------------- figures and report for a paper


def _patch_start(path, **changes):
    """Rewrite a synthetic run's start record (hosts, versions, ...) as another machine would write it."""
    with open(path) as f:
        lines = f.read().splitlines()
    start = json.loads(lines[0])
    for key, value in changes.items():
        if isinstance(value, dict):
            start.setdefault(key, {}).update(value)
        else:
            start[key] = value
    lines[0] = json.dumps(start)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _emulated_cpu_study(root):
    """vit_micro on 1 and 2 emulated nodes of 2 CPU ranks, as jobs/weak_scaling.sh runs it without Slurm.

    DDP 100 then 150 images/s and SHARD_GRAD_OP 95 then 140 over 6 timed steps each, whose single
    steps scatter by 10 images/s: the 95% intervals of the medians (batch medians: about ±17) overlap,
    so the margins (5%, 7%) are within noise. FULL_SHARD 80 then 120 with a spread of 1.
    """
    cpu = {"cpu_model": "AMD EPYC 7763 64-Core Processor", "cpu_count": 128, "launched_by": "env"}
    for strategy, ips1, ips2, spread in (
        ("DDP", 100.0, 150.0, 10.0),
        ("SHARD_GRAD_OP", 95.0, 140.0, 10.0),
        ("FULL_SHARD", 80.0, 120.0, 1.0),
    ):
        for nodes, ips in ((1, ips1), (2, ips2)):
            path = write_run(
                str(root),
                study="local",
                model="vit_micro",
                strategy=strategy,
                nodes=nodes,
                ranks_per_node=2,
                batch=4,
                ips=ips,
                device="cpu",
                memory_gib=0.37,
                steps=8,
                warmup=2,
                job_id=None,
                run_id=f"{strategy}-{nodes}",
                spread=spread / ips,
            )
            _patch_start(
                path,
                hosts=[f"local{i}" for i in range(nodes)],
                versions=cpu,
                git_revision=None,
                world=dict(device_name="x86_64"),
            )
    return str(root)


def _black(color) -> bool:
    from matplotlib.colors import to_rgb

    return to_rgb(color) == (0.0, 0.0, 0.0)


def test_colours_never_fall_back_to_black(tmp_path, results):
    colors = figures.series_colors(results)
    known = {colors[s] for s in ("DDP", "FULL_SHARD", "HYBRID_2GPU")}
    # a strategy or series the map was not built from gets the next colour, also through .get
    for name in ("ZERO3", "CAI_GEMINI", "FULL_SHARD [prefetch=post]"):
        assert not _black(colors.get(name, "black")) and colors[name] not in known, name
        known.add(colors[name])
    assert colors.get("ZERO3", "black") == colors["ZERO3"]  # stable once given
    # predicted memory groups by strategy; here the FULL_SHARD series carry their options
    root = str(tmp_path)
    for prefetch, mem in (("pre", 10.0), ("post", 11.0)):
        opts = dict(default_options("FULL_SHARD"), backward_prefetch=prefetch)
        write_run(
            root,
            strategy="FULL_SHARD",
            options=opts,
            ips=10.0,
            memory_gib=mem,
            predicted_gib=mem * 1.01,
            run_id=prefetch,
            device="cuda",
        )
    write_run(root, strategy="ZERO3", ips=10.0, memory_gib=8.0, predicted_gib=7.9, run_id="z", device="cuda")
    df = table.build(records.collect([root])).results
    plot = figures.predicted_memory(df)
    faces = [tuple(c.get_facecolors()[0][:3]) for c in plot.figure.axes[0].collections[:2]]
    assert all(face != (0.0, 0.0, 0.0) for face in faces) and faces[0] != faces[1]
    for maker in (figures.weak_scaling, figures.memory):
        plot = maker(results)
        for ax in plot.figure.axes:
            assert not any(_black(ln.get_color()) for ln in ax.get_lines())


def test_weak_scaling_has_error_bars_labels_and_facts(results):
    plot = figures.weak_scaling(results)
    # one bar per ok run on a line: vit_base DDP x3, FULL_SHARD x2, HYBRID_2GPU x2; vit_3b FULL_SHARD x2
    assert plot.extra["errorbars"] == {"vit_base": 7, "vit_3b": 2}
    ax = next(a for a in plot.figure.axes if a.get_title().startswith("vit_base"))
    colors = figures.series_colors(results)
    from matplotlib.colors import to_hex

    assert {to_hex(p.get_edgecolor()) for p in ax.patches} == {colors[s] for s in ("DDP", "FULL_SHARD", "HYBRID_2GPU")}
    assert ax.get_yscale() == "log" and "log" in ax.get_ylabel() and "all ranks" in ax.get_ylabel()
    ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    assert len(ticks) >= 3  # 100 to 400 images/s: more than the two decade labels
    facts = " ".join(plot.figure.get_suptitle().split())
    assert "8 × AMD Instinct MI250X per node" in facts and "batch 32 per device" in facts and "bf16" in facts
    assert "6 timed steps after 2 warm-up" in facts
    assert plot.figure.get_size_inches()[0] == pytest.approx(figures.COLUMN_WIDTH)
    assert figures.weak_scaling(results, width=figures.PAGE_WIDTH).figure.get_size_inches()[0] == pytest.approx(
        figures.PAGE_WIDTH
    )
    legend = (
        plot.figure.legends[0]
        if plot.figure.legends
        else next(a.get_legend() for a in plot.figure.axes if a.get_legend())
    )
    assert [t.get_text() for t in legend.get_texts()][:3] == ["DDP", "HYBRID_2GPU", "FULL_SHARD"]


def test_memory_plot_has_headroom_and_shows_equal_series(results, tmp_path):
    plot = figures.memory(results)
    for ax in plot.figure.axes:
        if not ax.get_visible() or not ax.get_lines():
            continue
        top = max(max(ln.get_ydata()) for ln in ax.get_lines())
        assert ax.get_ylim()[1] >= 1.1 * top  # neither the data nor the capacity line on the frame
        assert all(not ln.get_clip_on() for ln in _lines(ax, "-"))  # markers on the edge drawn whole
    # the legend lists the other panels' series only: FULL_SHARD has its own panels, named in their titles
    legend = plot.figure.legends[0]
    assert "FULL_SHARD" not in [t.get_text() for t in legend.get_texts()]
    assert "Dotted: the device's memory." in plot.caption
    # DDP and NO_SHARD with equal memory are drawn side by side, and the caption says so
    root = str(tmp_path)
    for strategy in ("DDP", "NO_SHARD", "FULL_SHARD"):
        for nodes in (1, 2):
            write_run(
                root,
                strategy=strategy,
                nodes=nodes,
                ips=10.0 * nodes,
                memory_gib=12.0 / (nodes if strategy == "FULL_SHARD" else 1),
                run_id=f"{strategy}{nodes}",
                device_memory_gib=None,
            )
    df = table.build(records.collect([root])).results
    plot = figures.memory(df)
    other = next(a for a in plot.figure.axes if a.get_title().endswith("other strategies"))
    xs = [tuple(ln.get_xdata()) for ln in _lines(other, "-")]
    assert len(xs) == 2 and xs[0] != xs[1]
    assert plot.extra["shifted"] == [("vit_base", ["DDP", "NO_SHARD"])] and "DDP = NO_SHARD" in plot.caption
    assert "Dotted" not in plot.caption  # no capacity recorded, none promised


def test_cpu_memory_plot_says_it_is_process_rss(tmp_path):
    df = table.build(records.collect([_emulated_cpu_study(tmp_path)])).results
    plot = figures.memory(df)
    assert "not the sharded model state" in " ".join(plot.figure.get_suptitle().split())
    assert "says nothing about what sharding saves" in plot.caption


def test_efficiency_heat_map_states_its_definition(results):
    plot = figures.efficiency(results)
    definition = " ".join(plot.figure.get_suptitle().split())
    # FULL_SHARD's baseline is its 2-node run (it ran out of memory on one), so the general form
    assert definition.startswith("efficiency = ips(N) / (N/N₀ × ips(N₀))") and "N₀" in plot.caption
    sizes = {t.get_fontsize() for t in plot.figure.axes[0].texts if "%" in t.get_text()}
    assert min(sizes) >= 6.5


def test_one_point_per_series_is_not_drawn_and_the_report_says_why(tmp_path):
    """Every strategy ran at two node counts but only one of them finished: no line to draw."""
    root = str(tmp_path / "runs")
    for strategy in ("DDP", "FULL_SHARD"):
        write_run(root, strategy=strategy, nodes=1, ips=100.0, run_id=f"{strategy}1")
        write_run(
            root,
            strategy=strategy,
            nodes=2,
            ips=None,
            status="oom",
            error="out of memory",
            memory_gib=None,
            run_id=f"{strategy}2",
        )
    df = table.build(records.collect([root])).results
    assert figures.weak_scaling(df) is None and figures.memory(df) is None and figures.efficiency(df) is None
    _, missing = figures.all_plots(df)
    assert any(m.startswith("weak scaling: every strategy has at most one run") for m in missing)
    out = tmp_path / "o"
    assert main([root, "--out", str(out), "--quiet", "--dpi", "50", "--formats", "png"]) == 0
    md = (out / "report.md").read_text()
    assert "The weak scaling figure is not drawn: every strategy has at most one run with a throughput" in md
    assert not (out / "weak_scaling_ips.png").exists()


def test_report_on_emulated_nodes_says_so_and_marks_noise(tmp_path):
    out = tmp_path / "o"
    assert main([_emulated_cpu_study(tmp_path / "runs"), "--out", str(out), "--quiet", "--no-plots"]) == 0
    md = (out / "report.md").read_text()
    assert "these runs come from emulated nodes" in md and "local0, local1" in md
    assert "show the toolkit at work, not how a strategy scales" in md
    # DDP beats SHARD_GRAD_OP by 5.3% and 7.1% in one run each: a ratio, no verdict
    assert (
        "| vit_micro | 1 | 2 | DDP | 4 | 100.0 | 82.7–126.5 (within-run) | 100.0 | 0.0% | 1 of 1 ok | 50.0 | 100% "
        "| 0.4 |  | SHARD_GRAD_OP | 1.053: one run each: not compared |"
    ) in md
    assert "1.071: one run each: not compared" in md
    assert "2 ratio(s) are not compared: a point ran once" in md
    assert "| CPU | AMD EPYC 7763 64-Core Processor, 128 logical CPUs |" in md
    assert "| launcher | processes started by jobs/weak_scaling.sh without Slurm (env://) |" in md
    assert "| steps per run | 8 (2 warm-up + 6 timed) |" in md
    assert "| vit-scale revision | unknown |" in md


def test_report_of_real_nodes_has_no_emulation_note_and_a_clear_margin(study, tmp_path):
    out = tmp_path / "o"
    assert main([study, "--out", str(out), "--quiet", "--no-plots"]) == 0
    md = (out / "report.md").read_text()
    assert "emulated" not in md and "toolkit at work" not in md
    # 200 against 180, single steps scattering by 2%: one run of each point, so not compared
    assert (
        "| FULL_SHARD | 32 | 200.0 | 194.3–206.0 (within-run) | 200.0 | 0.0% | 1 of 1 ok | 12.5 | 100% | 12.0 | 0% "
        "| DDP | 1.111: one run each: not compared |"
    ) in md
    assert "): separated" not in md and "): not separated" not in md
    assert "3 ratio(s) are not compared" in md
    assert "Every point here ran once: no ratio is tested, and each interval is within-run" in md
    assert "| device | AMD Instinct MI250X (rocm) |" in md and "| vit-scale revision | 0123abc |" in md
    assert "| launcher | srun |" in md
    assert "## Predicted against measured memory" in md and "within 0.0% over 9 runs" in md


def test_a_point_with_three_timed_steps_has_no_interval(tmp_path):
    """Three timed steps give no batches, so no within-run interval: the cell stays empty, never a made-up one."""
    root = str(tmp_path / "runs")
    write_run(root, strategy="DDP", ips=110.0, steps=5, warmup=2, run_id="a")
    write_run(root, strategy="FULL_SHARD", ips=100.0, steps=5, warmup=2, run_id="b")
    best = table.best_runs(table.build(records.collect([root])).results).iloc[0]
    assert best["ips_ci_method"] is None and math.isnan(best["ips_ci_low"])
    assert best["verdict"] is None and best["ratio_test"] == "one run each: not compared"
    out = tmp_path / "o"
    assert main([root, "--out", str(out), "--quiet", "--no-plots"]) == 0
    md = (out / "report.md").read_text()
    assert "| 110.0 |  | 110.0 | 0.0% | 1 of 1 ok |" in md and "1.100: one run each: not compared" in md


def _git(cwd, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def _revision_of_copy(toolkit_root) -> str:
    """vit_scale/record/versions.py copied under toolkit_root, asked for the toolkit's revision."""
    os.makedirs(os.path.join(toolkit_root, "vit_scale", "record"), exist_ok=True)
    copy = os.path.join(toolkit_root, "vit_scale", "record", "versions.py")
    with open(os.path.join(ROOT, "vit_scale", "record", "versions.py")) as src, open(copy, "w") as dst:
        dst.write(src.read())
    probe = f"import runpy; print(runpy.run_path({copy!r})['git_revision']())"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()


def test_git_revision_is_the_toolkits_own_or_none(tmp_path):
    # unpacked inside another repository: that repository's commit is not the toolkit's
    outer = tmp_path / "outer"
    os.makedirs(outer)
    _git(outer, "init", "-q")
    (outer / "README").write_text("someone else's project\n")
    _git(outer, "add", "README")
    _git(outer, "commit", "-q", "-m", "x")
    assert _revision_of_copy(str(outer / "third_party" / "vit-scale")) == "None"
    # its own checkout: the commit
    own = tmp_path / "own"
    os.makedirs(own)
    _git(own, "init", "-q")
    _revision_of_copy(str(own))
    _git(own, "add", "vit_scale/record/versions.py")
    _git(own, "commit", "-q", "-m", "x")
    rev = _revision_of_copy(str(own))
    assert len(rev) == 12 and all(c in "0123456789abcdef" for c in rev)
    # no git repository at all
    assert _revision_of_copy(str(tmp_path / "loose")) == "None"


def test_launched_by_tells_a_script_from_torchrun(monkeypatch):
    from vit_scale.launch import world as launch
    from vit_scale.record import versions as host

    versions = {"launched_by": launch.launched_by, "cpu_model": host.cpu_model}
    for key in (
        "TORCHELASTIC_RUN_ID",
        "SLURM_STEP_ID",
        "SLURM_PROCID",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PMIX_RANK",
        "RANK",
        "WORLD_SIZE",
    ):
        monkeypatch.delenv(key, raising=False)
    assert versions["launched_by"]() == "single"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert versions["launched_by"]() == "env"  # what the trainer records as launcher "torchrun"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert versions["launched_by"]() == "torchrun"
    cpu = versions["cpu_model"]()
    assert cpu is None or (isinstance(cpu, str) and cpu)


def test_cli_width_option(study, tmp_path, capsys):
    assert main([study, "--out", str(tmp_path / "o"), "--width", "wide"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--width" in err and "allowed: column, page or inches" in err
    assert main([study, "--out", str(tmp_path / "o"), "--width", "40"]) == 2
    assert "--width" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_one_machine_ladder_puts_gpus_on_the_x_axis():
    """A GPU machine without Slurm: one node, 1, 2, 4 ranks; the axis says GPUs (ranks on a CPU)."""
    import pandas as pd

    from analysis import table

    df = pd.DataFrame({"nodes": [1, 1, 1], "world_size": [1, 2, 4], "device_type": ["cuda"] * 3})
    assert table.x_axis(df) == ("world_size", "GPUs")
    assert table.x_axis(df.assign(device_type="cpu")) == ("world_size", "ranks")
    assert table.x_axis(df.assign(nodes=[1, 2, 4])) == ("nodes", "nodes")


# ------------------------------------------------------------------- error bars are intervals

# Nine timed steps in three batches of three: batch medians 100, 110, 90, the run's median 100 (its
# mean 101.1); half-width t(0.975, 2) · s / √3 with s = 10, t = 4.3027: 24.84.
NINE_STEPS = [100.0, 104.0, 98.0, 110.0, 120.0, 108.0, 90.0, 92.0, 88.0]
NINE_WALL = 9 / sum(1 / x for x in NINE_STEPS)  # the run's throughput over wall time, 101.0


def _nine_interval() -> tuple:
    """The within-run interval of NINE_STEPS by hand: three batches of three step times, their mean's t
    interval (t(0.975, 2) = 4.302653), turned into throughput around NINE_WALL."""
    times = [1 / x for x in NINE_STEPS]
    means = [sum(times[i : i + 3]) / 3 for i in (0, 3, 6)]
    mid = sum(means) / 3
    half = 4.302653 * math.sqrt(sum((m - mid) ** 2 for m in means) / 2) / math.sqrt(3)
    return NINE_WALL * mid / (mid + half), NINE_WALL * mid / (mid - half)


def _bars(ax, color) -> dict:
    """x -> (low, high) of the error-bar patch drawn in this colour (the vertical strokes of its path)."""
    from matplotlib.colors import to_hex

    patch = next(p for p in ax.patches if to_hex(p.get_edgecolor()) == to_hex(color))
    verts = patch.get_path().vertices
    return {float(verts[i][0]): (float(verts[i][1]), float(verts[i + 1][1])) for i in range(0, len(verts), 6)}


def _ci_study(root, repeats: int = 1) -> str:
    """DDP and FULL_SHARD at 1 and 2 nodes; DDP at 2 nodes runs NINE_STEPS, each point `repeats` times."""
    root = str(root)
    for strategy, base in (("DDP", 50.0), ("FULL_SHARD", 40.0)):
        for nodes in (1, 2):
            for k in range(repeats):
                steps = NINE_STEPS if (strategy, nodes) == ("DDP", 2) and repeats == 1 else None
                write_run(
                    root,
                    strategy=strategy,
                    nodes=nodes,
                    ips=base * nodes * (1 + 0.02 * k),
                    step_ips=steps,
                    steps=11,
                    warmup=2,
                    run_id=f"{strategy}{nodes}-{k}",
                    time=1.7e9 + k,
                    spread=0.05,
                )
    return root


def test_error_bar_is_the_confidence_interval_in_results_csv(tmp_path):
    """The bar drawn at a point is its 95% interval as results.csv gives it, the marker its throughput."""
    import pandas as pd

    out = tmp_path / "o"
    assert main([_ci_study(tmp_path / "runs"), "--out", str(out), "--quiet", "--dpi", "50", "--formats", "png"]) == 0
    csv = pd.read_csv(out / "results.csv")
    row = _row(csv, "vit_base", "DDP", 2)
    assert row["ips_ci_method"] == "within-run batch means" and row["ips_point"] == pytest.approx(NINE_WALL)
    assert row["ips_ci_level"] == 0.95 and row["ips_step_median"] == 100.0
    assert (row["ips_ci_low"], row["ips_ci_high"]) == pytest.approx(_nine_interval(), rel=1e-6)
    plot = figures.weak_scaling(csv)
    ax = plot.figure.axes[0]
    color = figures.series_colors(csv)["DDP"]
    bars = _bars(ax, color)
    for nodes in (1, 2):
        r = _row(csv, "vit_base", "DDP", nodes)
        assert bars[nodes] == pytest.approx((r["ips_ci_low"], r["ips_ci_high"]))
    measured = next(ln for ln in _lines(ax, "-") if ln.get_color() == color)
    assert list(measured.get_ydata()) == pytest.approx([50.0, NINE_WALL])  # the throughput, not the median 100
    ideal = next(ln for ln in _lines(ax, "--") if ln.get_color() == color)
    assert list(ideal.get_ydata()) == pytest.approx([50.0, 100.0])  # from the base's throughput
    # the figure and the report say which interval the bars are, by method and level
    assert "bars: 95% interval (within-run, 1 run)" in " ".join(plot.figure.get_suptitle().split())
    md = (out / "report.md").read_text()
    assert (
        "error bars: the 95% interval: within one run (batch means of its step times; silent on run-to-run variation)"
    ) in " ".join(md.split())
    assert "at least" not in md and "≥95%" not in md
    assert "standard deviation" not in md and "s.d." not in md


def test_repeated_points_get_the_interval_over_their_runs(tmp_path):
    """Six runs a point: the bar is the t interval of the mean log throughput, and the captions say so."""
    df = table.build(records.collect([_ci_study(tmp_path, repeats=6)])).results
    r = _row(df, "vit_base", "FULL_SHARD", 2)
    assert r["ips_ci_method"] == "t on log run throughputs" and r["ips_runs"] == 6
    # run throughputs 80 x (1, 1.02 ... 1.10): their geometric mean ± t(0.975, 5) = 2.570582 s / sqrt(6) in logs
    logs = [math.log(80.0 * (1 + 0.02 * k)) for k in range(6)]
    mean = sum(logs) / 6
    half = 2.570582 * math.sqrt(sum((x - mean) ** 2 for x in logs) / 5) / math.sqrt(6)
    expected = (math.exp(mean - half), math.exp(mean + half))
    assert r["ips_point"] == pytest.approx(math.exp(mean))
    assert (r["ips_ci_low"], r["ips_ci_high"]) == pytest.approx(expected, rel=1e-6)
    plot = figures.weak_scaling(df)
    assert _bars(plot.figure.axes[0], figures.series_colors(df)["FULL_SHARD"])[2] == pytest.approx(expected)
    assert "95% interval: t over 6 runs (log throughputs)" in plot.caption
    assert "(t, 6 runs)" in " ".join(plot.figure.get_suptitle().split())


def test_efficiency_cells_carry_their_interval(tmp_path):
    """Each cell off the base shows ± the wider side of efficiency_ci_low/high in points, rounded up."""
    df = table.build(records.collect([_ci_study(tmp_path)])).results
    plot = figures.efficiency(df)
    r = _row(df, "vit_base", "DDP", 2)
    wider = max(r["efficiency"] - r["efficiency_ci_low"], r["efficiency_ci_high"] - r["efficiency"]) * 100
    assert wider > 20  # NINE_STEPS' interval is -22% +37%
    assert plot.extra["intervals"]["vit_base"].loc["DDP", 2] == f"±{math.ceil(wider)}"
    assert plot.extra["intervals"]["vit_base"].loc["DDP", 1] == ""  # the base: 100% by definition
    texts = [t.get_text() for t in plot.figure.axes[0].texts]
    # the base's 100%, without its % sign where the cells are too narrow for it (the line above says so)
    base = "100" if "cells in %" in " ".join(plot.figure.get_suptitle().split()) else "100%"
    assert f"±{math.ceil(wider)}" in texts and base in texts
    assert "wider side of the efficiency's 95% interval" in plot.caption
    assert (
        f"widest interval: DDP at 2 nodes (vit_base), {r['efficiency_ci_low'] * 100:.0f}–"
        f"{r['efficiency_ci_high'] * 100:.0f}%"
    ) in plot.caption
    assert "95% interval's wider side" in " ".join(plot.figure.get_suptitle().split())


def test_grid_and_single_device_bars_are_intervals(tmp_path):
    from analysis.synthetic import config_grid_study, plugin_study

    config_grid_study(str(tmp_path))
    plugin_study(str(tmp_path))
    df = table.build(records.collect([str(tmp_path)])).results
    grid = figures.config_grid(df)
    assert len(grid.extra["errorbars"]) == 18
    for (label, prefetch, lag), (low, high) in grid.extra["errorbars"].items():
        r = df[
            (df["strategy"] == label)
            & (df["opt_backward_prefetch"] == prefetch)
            & (df["opt_limit_all_gathers"] == lag)
            & (df["model"] == "vit_5b")
        ].iloc[0]
        assert (low, high) == pytest.approx((r["ips_ci_low"], r["ips_ci_high"]))
        assert grid.drawn["values"][(label, prefetch, lag)] == pytest.approx(r["ips_point"])
    within = "95% interval: within one run (batch means of its step times; silent on run-to-run variation)"
    assert within in grid.caption
    single = figures.plugin_comparison(df)
    assert single.extra["errorbars"] == {("plugin_comparison", "vit_base"): 15}  # CAI_DDP at 64 ran out of memory
    assert within in single.caption


def test_report_names_each_interval_and_the_test(tmp_path):
    """The best-run table heads its interval column with the level and gives each cell its method; six runs
    of two nearly equal points: the ratio's Welch interval includes 1, so the two are not separated."""
    root = str(tmp_path / "runs")
    for label, levels in (("DDP", [100.0, 101.0, 99.0, 102.0, 98.0, 100.5]), ("NO_SHARD", [99.5, 100.2] * 3)):
        for i, level in enumerate(levels):
            write_run(
                root,
                study="rep",
                strategy=label,
                ips=level,
                steps=20,
                warmup=5,
                spread=0.01,
                time=1.7e9 + 10 * i,
                run_id=f"{label.lower()}-{i}",
            )
    out = tmp_path / "o"
    assert main([root, "--out", str(out), "--quiet", "--no-plots"]) == 0
    md = (out / "report.md").read_text()
    assert "| images/s (wall) | 95% interval (method) | median step images/s | slow steps (>2× median) | runs |" in md
    assert (
        "| DDP | 32 | 100.1 | 98.6–101.6 (t over runs) | 100.2 | 0.0% | 6 of 6 ok | 12.5 | 100% | 10.0 | 0% "
        "| NO_SHARD | 1.002 (0.987–1.017, Welch t, 95%): not separated |"
    ) in md
    assert "1 ratio(s) are not separated: their 95% interval includes 1" in md
    assert "at least" not in md and "≥95%" not in md


def test_an_unbounded_efficiency_interval_is_worded_in_the_caption(tmp_path):
    """DDP's 2-node run has 4 timed steps, two of them 100 times slower: the interval of its mean step time
    reaches 0, so its throughput's and the efficiency's have no upper end. The cell reads ±∞ and the
    caption says why, never "0–inf%"."""
    root = str(tmp_path / "runs")
    write_run(root, strategy="DDP", nodes=1, ips=100.0, steps=11, warmup=2, run_id="ddp-1")
    write_run(root, strategy="DDP", nodes=2, step_ips=[200.0, 200.0, 2.0, 2.0], warmup=2, run_id="ddp-2")
    df = table.build(records.collect([root])).results
    assert math.isinf(_row(df, "vit_base", "DDP", 2)["efficiency_ci_high"])
    plot = figures.efficiency(df)
    assert plot.extra["intervals"]["vit_base"].loc["DDP", 2] == "±∞"
    caption = " ".join(plot.caption.split())
    low = _row(df, "vit_base", "DDP", 2)["efficiency_ci_low"]
    assert f"DDP at 2 nodes (vit_base), {low * 100:.0f}% upward, unbounded: a point's interval has no upper end" in (
        caption
    )
    assert "inf" not in caption


# --------------------------------------------------------------------------------- a slow node (issue 36)


def _health(**gemm) -> dict:
    """An end record's nodes_health: one rank a node, these compute figures (vit_scale.record.health.by_node)."""
    from vit_scale.record.health import by_node

    return by_node([{"node": h, "rank": i, "gemm_tflops": v} for i, (h, v) in enumerate(gemm.items())])


def test_a_run_on_a_slow_node_is_flagged_and_left_out_of_comparisons_and_errors(tmp_path):
    """DDP on 4 nodes is the fastest point but ran with local3 at 48% of the median node's compute: the
    csv says so, the report names it, and it is neither the best run nor in the prediction's errors.
    DDP on 2 nodes has an older clean run and a newer one on a slow node: the clean one is the point."""
    root, t = str(tmp_path / "runs"), 1.7e9
    w = lambda **kw: write_run(root, study="s", steps=8, warmup=2, **kw)  # noqa: E731
    slow4 = _health(local0=1.0, local1=1.02, local2=0.98, local3=0.48)
    even = _health(local0=1.0, local1=1.01, local2=0.99, local3=1.0)
    w(strategy="DDP", nodes=1, ips=100.0, time=t, nodes_health=_health(local0=1.0))
    w(strategy="DDP", nodes=4, ips=400.0, time=t, nodes_health=slow4)
    w(strategy="DDP", nodes=2, ips=180.0, time=t, run_id="clean")
    w(strategy="DDP", nodes=2, ips=150.0, time=t + 10, run_id="spoiled", nodes_health=_health(local0=1.0, local1=0.5))
    w(strategy="FULL_SHARD", nodes=1, ips=95.0, time=t)
    w(strategy="FULL_SHARD", nodes=2, ips=170.0, time=t)
    w(strategy="FULL_SHARD", nodes=4, ips=360.0, time=t, nodes_health=even)
    out = str(tmp_path / "out")
    assert main([root, "--out", out, "--no-plots", "--quiet"]) == 0
    results = pd.read_csv(os.path.join(out, "results.csv"), keep_default_na=False)
    flags = {(r["strategy"], r["nodes"]): r["slow_node"] for _, r in results.iterrows()}
    assert flags == {
        ("DDP", 1): "",  # one node: nothing to be slow against
        ("DDP", 2): "",
        ("DDP", 4): "a slow node: local3, compute 48% of the median",
        ("FULL_SHARD", 1): "",
        ("FULL_SHARD", 2): "",
        ("FULL_SHARD", 4): "",
    }
    two = _row(results, "vit_base", "DDP", 2)
    assert two["run_id"] == "clean" and two["ips_point"] == 180.0 and two["ips_runs"] == 1
    aside = pd.read_csv(os.path.join(out, "set_aside.csv"), keep_default_na=False)
    (spoiled,) = aside.itertuples()
    assert spoiled.run_id == "spoiled" and spoiled.slow_node == "a slow node: local1, compute 67% of the median"
    assert spoiled.pooled in (False, "False")

    best = table.best_runs(table.build(records.collect([root])).results).set_index(["model", "nodes"])
    assert best.loc[("vit_base", 4), "strategy"] == "FULL_SHARD" and best.loc[("vit_base", 4), "candidates"] == 1
    assert best.loc[("vit_base", 2), "strategy"] == "DDP"

    predicted = pd.read_csv(os.path.join(out, "prediction.csv"), keep_default_na=False)
    ddp4 = predicted[(predicted["strategy"] == "DDP") & (predicted["nodes"] == 4)].iloc[0]
    assert ddp4["error"] == "" and ddp4["slow_node"] == "a slow node: local3, compute 48% of the median"
    assert ddp4["measured_ips"] != "" and ddp4["predicted_ips"] != ""
    errors = predicted[predicted["error"] != ""]
    predicted_points = sorted(zip(errors["strategy"], errors["nodes"], strict=True))
    assert predicted_points == [("DDP", 2), ("FULL_SHARD", 2), ("FULL_SHARD", 4)]

    with open(os.path.join(out, "report.md")) as f:
        text = f.read()
    ddp4_dir = os.path.dirname(ddp4["path"])
    assert (
        f"- a slow node: local3, compute 48% of the median: vit_base DDP on 4 node(s) ({ddp4_dir}); "
        "left out of the best-run comparison and the prediction's errors" in text
    )
    assert "- a slow node: local1, compute 67% of the median: vit_base DDP on 2 node(s) (" in text
    assert "set aside for run clean, not pooled into its point's figure" in text
    best_section = text.split("## Best run per model and node count")[1].split("\n## ")[0]
    assert (
        "Left out of the comparison, a node of their run more than 20% below the run's median node (its figures "
        "are that node's, not the strategy's; docs/analysis.md, A slow node): vit_base DDP on 4 node(s) "
        "(a slow node: local3, compute 48% of the median)." in best_section
    )
    measured = text.split("## Measured against predicted")[1].split("\n## ")[0]
    assert "Median |error| over 3 predicted point(s)" in measured
    assert (
        "Left out of the errors, a node of their run more than 20% below its median node: vit_base DDP on 4 "
        "node(s) (a slow node: local3, compute 48% of the median)." in measured
    )


def test_records_without_node_health_are_not_flagged(results):
    assert (results["slow_node"] == "").all() and table.slow_node_runs(results).empty
