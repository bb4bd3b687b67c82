"""`vit-scale plan --system`: the predicted columns and --json with the profile's defaults, with a
check.json whose fits come from alpha_beta.fit over synthetic timings, with compute from a synthetic
run directory (analysis/synthetic.py); every bad input as one line, exit 2 and nothing written; the
predicted figure (analysis/plan_figure.py, a subprocess of the CLI); and a study's `predict: true` in a
dry run. Torch-free: the run records and the collective timings are synthetic, so that the arithmetic
is known (Frontier cannot be reached from here; its profile is what is read)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jsonschema
import pytest

from conftest import PYTHON, ROOT
from vit_scale import plan
from vit_scale.errors import UserError
from vit_scale.planning import predict as pr
from vit_scale.planning.alpha_beta import BUS_FACTORS, fit
from vit_scale.planning.scenario import Scenario
from vit_scale.planning.step_time import Compute, predict_step

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from analysis import plan_figure
from analysis.synthetic import write_run

BASE = ["--system", "frontier", "--model", "vit_base,vit_3b", "--nodes", "1,2", "--strategy", "DDP,FULL_SHARD"]
SIZES = [8 * 4**k for k in range(14)]  # 8 B to 512 MiB


def run_json(capsys, argv) -> dict:
    assert plan.main(argv + ["--json", "--no-figure"]) == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(out, plan.PLAN_SCHEMA)
    return out


def row(out, model, strategy, nodes) -> dict:
    [r] = [r for r in out["rows"] if (r["model"], r["strategy"], r["nodes"]) == (model, strategy, nodes)]
    return r


def synthetic_fits(alpha_us: float, bus_gbps: float, ranks=16, scopes=("intra", "inter"), sizes=SIZES) -> list:
    """alpha_beta.fit over timings that follow t = alpha + S f(n) / B exactly: the fit gives them back."""
    fits = []
    for scope in scopes:
        n = ranks if scope == "inter" else 8
        for collective, factor in BUS_FACTORS.items():
            points = [(s, alpha_us * 1e-6 + s * factor(n) / (bus_gbps * 1e9)) for s in sizes]
            fits.append(fit(collective, scope, n, points).as_dict())
    return fits


def write_check(path, fits, system="frontier", model="vit_3b", precisions=("bf16",)) -> str:
    with open(path, "w") as fh:
        json.dump(
            {
                "schema": 1,
                "system": system,
                "model": model,
                "precisions": list(precisions),
                "nodes": 2,
                "ranks_per_node": 8,
                "fits": fits,
            },
            fh,
        )
    return str(path)


# ---------------------------------------------------------------- the profile's defaults


def test_without_system_the_output_is_unchanged(capsys):
    assert plan.main(["--model", "vit_base", "--strategy", "DDP", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"schema", "assumptions", "rows"} and "prediction" not in out["rows"][0]
    assert plan.main(["--model", "vit_base", "--strategy", "DDP"]) == 0
    text = capsys.readouterr().out
    assert "step ms" not in text and not text.startswith("predicted") and "not worth" not in text


def cells(line: str) -> list:
    """A table row's cells: columns are two spaces apart, a cell holds at most one (`value (low-high)`)."""
    return re.split(r"\s{2,}", line.strip())


def flat(text: str) -> str:
    """The output with its wrapped lines joined: the table wraps its prose at 119 columns."""
    return " ".join(text.split())


def test_table_with_the_profiles_defaults(capsys, tmp_path):
    assert plan.main(BASE + ["--no-figure"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    # the first lines say which calibration and which compute
    assert lines[0] == "predicted for frontier: calibration: the system profile's defaults (frontier.yaml)"
    assert lines[1].startswith("predicted compute: FLOPs x peak x efficiency: counted FLOPs over 191.5 TFLOP/s x 40%")
    assert "(assumed;" in flat(out)
    # by default the columns a user chooses by, in a terminal's width
    assert max(len(line) for line in lines) < 120
    header = next(line for line in lines if line.startswith("strategy"))
    assert header.split() == "strategy nodes GPUs mem GiB fits step ms img/s/GPU img/s eff extrap".split()
    fitting = [cells(line) for line in lines if line.startswith(("DDP ", "FULL_SHARD ")) and "yes" in line.split()]
    # the profile's defaults cover any group size: no point is extrapolated, so its last cell is eff
    assert len(fitting) == 6 and all(c[-1].endswith(("%", "%)")) for c in fitting)
    # the profile's figures carry ranges: beyond 1 node each speed, step and efficiency reads `value (low-high)`
    two = [c for c in fitting if c[1] == "2"][:2]  # vit_base's (vit_3b's speed moves less than its rounding)
    assert len(two) == 2 and all(re.fullmatch(r"[\d.]+%? \([\d.]+-[\d.]+%?\)", c[i]) for c in two for i in (-4, -3, -1))
    assert "interval: 90% band: every input at its cheap end and at its costly end" in flat(out)
    ddp_3b = [line for line in lines if line.startswith("DDP") and "does not fit" in line]
    assert len(ddp_3b) == 2  # vit_3b DDP on 1 and 2 nodes: a verdict, not a speed
    assert "predicted not worth running" in flat(out) and "vit_3b DDP (does not fit on 2 node(s))" in flat(out)
    # --wide: the step's split as well, the same step
    assert plan.main(BASE + ["--no-figure", "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    header = next(line for line in wide if line.startswith("strategy"))
    for column in ("params", "peak at", "intra", "inter", "step ms", "comp", "x-intra", "x-inter", "optim"):
        assert column in header
    # the step's optim (the fifth cell from the end, before img/s/GPU, img/s, eff and extrap): not modelled, "-"
    assert header.split()[-5:] == ["optim", "img/s/GPU", "img/s", "eff", "extrap"]
    wide_fitting = [cells(line) for line in wide if line.startswith(("DDP ", "FULL_SHARD ")) and "yes" in line]
    assert all(c[-4] == "-" for c in wide_fitting)
    assert [c[-4:] for c in fitting] == [[c[-8], *c[-3:]] for c in wide_fitting]  # the same step and speed
    assert not os.listdir(tmp_path)


def test_json_carries_the_prediction_per_row(capsys):
    out = run_json(capsys, BASE + ["--efficiency", "0.3"])
    p = out["prediction"]
    assert p["system"] == "frontier" and p["calibration"]["kind"] == "profile" and p["compute"]["kind"] == "flops"
    assert "30%" in p["compute"]["text"] and "--efficiency" in p["compute"]["text"]
    assert p["not_worth_running"] == [{"model": "vit_3b", "strategy": "DDP", "why": "does not fit on 2 node(s)"}]
    no = row(out, "vit_3b", "DDP", 2)["prediction"]
    assert no["fits"] is False and no["step"] is None and no["images_per_s"] is None
    # the same numbers as the model itself, fed the profile's network and FLOPs x peak x 30%
    net = pr.profile_calibration(pr.profile_path("frontier")).network
    for model, nodes in (("vit_base", 1), ("vit_base", 2), ("vit_3b", 2)):
        got = row(out, model, "FULL_SHARD", nodes)["prediction"]
        sc = Scenario(
            model, "FULL_SHARD", nodes=nodes, gpus_per_node=8, batch_size=32, precision="bf16", device_memory_gib=64.0
        )
        want = predict_step(sc, net, Compute.from_flops(sc, 191.5, 0.3))
        assert got["images_per_s"] == pytest.approx(want.images_per_s, rel=1e-9)
        step = got["step"]
        parts = ("forward_s", "backward_s", "exposed_intra_s", "exposed_inter_s")
        assert step["step_s"] == pytest.approx(sum(step[k] for k in parts), rel=1e-6)
        # the optimizer is not timed apart: null and said so, not a predicted 0
        assert step["optimizer_s"] is None and step["optimizer"] == "not modelled: inside compute"
        assert got["images_per_s_per_gpu"] == pytest.approx(32 / step["step_s"], rel=1e-6)
    one, two = (row(out, "vit_base", "DDP", n)["prediction"] for n in (1, 2))
    assert one["scaling_efficiency"] == 1.0
    assert two["scaling_efficiency"] == pytest.approx(two["images_per_s_per_gpu"] / one["images_per_s_per_gpu"])
    assert two["step"]["exposed_inter_s"] > 0 and one["step"]["exposed_inter_s"] == 0


def test_efficiency_from_run_records(capsys, tmp_path):
    """--efficiency-from: each model's FLOPs' efficiency is the median MFU of that model's ok runs there,
    and the output says so; a model with no such run is a one-line error (an MFU does not carry over)."""
    runs = str(tmp_path / "runs")
    mfus = []
    for nodes, ips in ((1, 800.0), (2, 1500.0), (4, 2800.0)):
        metrics = write_run(runs, study="s", nodes=nodes, ips=ips)
        with open(metrics) as fh:
            mfus.append(json.loads(fh.read().splitlines()[-1])["mfu"])
    write_run(runs, study="s", nodes=8, ips=None, status="oom")  # no MFU: not counted
    assert plan.main(BASE + ["--efficiency-from", runs, "--json", "--no-figure"]) == 2
    err = capsys.readouterr().err
    assert "--efficiency-from: no ok run of vit_3b recorded an MFU" in err and "(it has vit_base)" in err
    one_model = ["--system", "frontier", "--model", "vit_base", "--nodes", "1,2", "--strategy", "DDP,FULL_SHARD"]
    out = run_json(capsys, one_model + ["--efficiency-from", runs])
    median = sorted(mfus)[1]
    text = out["prediction"]["compute"]["text"]
    assert f"each model's MFU (vit_base {median:.0%})" in text and f"the median MFU of 3 run(s) in {runs}" in text
    got = row(out, "vit_base", "DDP", 1)["prediction"]
    sc = Scenario("vit_base", "DDP", nodes=1, gpus_per_node=8, batch_size=32, precision="bf16", device_memory_gib=64.0)
    net = pr.profile_calibration(pr.profile_path("frontier")).network
    want = predict_step(sc, net, Compute.from_flops(sc, 191.5, median))
    assert got["images_per_s"] == pytest.approx(want.images_per_s, rel=1e-9)


def test_not_worth_running_rule():
    def r(strategy, nodes, ips, fits=True):
        return {
            "model": "m",
            "strategy": strategy,
            "nodes": nodes,
            "prediction": {"fits": fits, "images_per_s": None if not fits else ips},
        }

    rows = [r("A", 1, 100), r("B", 1, 100), r("C", 1, 100), r("A", 4, 400), r("B", 4, 199), r("C", 4, 0, fits=False)]
    assert plan.not_worth_running(rows) == [
        {"model": "m", "strategy": "B", "why": "50% of A's images/s on 4 node(s)"},
        {"model": "m", "strategy": "C", "why": "does not fit on 4 node(s)"},
    ]
    rows[4]["prediction"]["images_per_s"] = 200  # exactly half: still worth running
    assert [w["strategy"] for w in plan.not_worth_running(rows)] == ["C"]


# ---------------------------------------------------------------- a check.json


def test_with_a_generated_check(capsys, tmp_path):
    fits = synthetic_fits(alpha_us=40.0, bus_gbps=2.0)
    assert all(f["usable"] for f in fits)
    assert fits[0]["bus_gbps"] == pytest.approx(2.0, rel=1e-3) and fits[0]["alpha_us"] == pytest.approx(40, rel=1e-3)
    check = write_check(tmp_path / "check.json", fits)
    slow = run_json(capsys, BASE + ["--calibration", check])
    assert slow["prediction"]["calibration"]["kind"] == "check" and slow["prediction"]["calibration"]["source"] == check
    assert plan.main(BASE + ["--calibration", check, "--no-figure"]) == 0
    first = flat(capsys.readouterr().out.split("predicted compute:")[0])
    # every collective and scope fitted: the fits are named, no profile default is needed
    every = ", ".join(f"{c}/{s}" for s in ("intra", "inter") for c in ("all_reduce", "all_gather", "reduce_scatter"))
    assert first == f"predicted for frontier: calibration: check.json's fits ({every}) ({check})"
    defaults = run_json(capsys, BASE)
    # 2 GB/s fitted against the profile's 12.5 (inter) and 50 (intra): every multi-rank point slower
    for model, strategy, nodes in (("vit_base", "DDP", 2), ("vit_base", "FULL_SHARD", 2), ("vit_3b", "FULL_SHARD", 1)):
        a = row(slow, model, strategy, nodes)["prediction"]
        b = row(defaults, model, strategy, nodes)["prediction"]
        assert a["images_per_s"] < b["images_per_s"], (model, strategy, nodes)
        assert "fitted" in a["network_source"]


# ---------------------------------------------------------------- compute from a run directory


def test_compute_from_a_synthetic_run(capsys, tmp_path):
    metrics = write_run(
        str(tmp_path / "runs"), model="vit_base", strategy="DDP", nodes=1, ranks_per_node=8, batch=32, ips=800.0
    )
    run_dir = os.path.dirname(metrics)
    out = run_json(
        capsys,
        [
            "--system",
            "frontier",
            "--model",
            "vit_base",
            "--nodes",
            "1,2,4",
            "--strategy",
            "DDP,FULL_SHARD",
            "--compute-from",
            run_dir,
        ],
    )
    assert out["prediction"]["compute"]["kind"] == "measured" and run_dir in out["prediction"]["compute"]["text"]
    # the 1-node rung of the strategy that ran reproduces its own measurement
    assert row(out, "vit_base", "DDP", 1)["prediction"]["images_per_s"] == pytest.approx(800.0, rel=1e-6)
    assert "measured step of DDP on 1 node(s)" in row(out, "vit_base", "FULL_SHARD", 2)["prediction"]["compute_source"]
    ddp = [row(out, "vit_base", "DDP", n)["prediction"]["images_per_s_per_gpu"] for n in (1, 2, 4)]
    assert ddp[0] >= ddp[1] >= ddp[2]  # weak scaling: per GPU no faster with more nodes


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing written


def bad_inputs(tmp_path) -> list:
    good = synthetic_fits(40.0, 2.0)
    few = synthetic_fits(40.0, 2.0, scopes=("inter",), sizes=SIZES[:3])
    not_json = tmp_path / "broken.json"
    not_json.write_text("{not json")
    runs = str(tmp_path / "runs")
    huge = os.path.dirname(write_run(runs, study="a", model="vit_huge", batch=32, ips=100.0))
    batch16 = os.path.dirname(write_run(runs, study="b", model="vit_base", batch=16, ips=100.0))
    fp32 = os.path.dirname(
        write_run(
            runs,
            study="c",
            model="vit_base",
            batch=32,
            ips=100.0,
            options={"precision": "fp32", "activation_checkpointing": False},
        )
    )
    two_nodes = os.path.dirname(write_run(runs, study="d", model="vit_base", nodes=2, batch=32, ips=100.0))
    fast = str(tmp_path / "fast")  # a run claiming far more FLOP/s than its device's peak
    write_run(fast, study="e", model="vit_base", batch=32, ips=1e7)
    one_rank, infinite = synthetic_fits(40.0, 2.0), synthetic_fits(40.0, 2.0)
    one_rank[0]["ranks"] = 1
    infinite[2]["bus_gbps"] = float("inf")
    # a standard error that is not a number, or a negative one
    words_se, negative_se = synthetic_fits(40.0, 2.0), synthetic_fits(40.0, 2.0)
    words_se[1]["alpha_us_se"] = "small"
    negative_se[3]["bus_gbps_se"] = -0.5
    cal, comp = "--calibration", "--compute-from"
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    return [
        (
            [cal, write_check(tmp_path / "cuda.json", good, system="cuda")],
            ["system 'cuda'", "expected a check of 'frontier'"],
        ),
        ([cal, write_check(tmp_path / "fp32.json", good, precisions=("fp32",))], ["precision fp32", "expected bf16"]),
        ([cal, write_check(tmp_path / "micro.json", good, model="vit_micro")], ["a check of vit_micro", "vit_3b"]),
        ([cal, str(tmp_path / "missing.json")], ["cannot read", "missing.json", "expected a check.json"]),
        ([cal, str(not_json)], ["broken.json is not JSON"]),
        ([cal, write_check(tmp_path / "few.json", few)], ["has 3 size(s)", "at least 4"]),
        ([comp, huge], [huge, "no run of vit_base at batch 32 in bf16", "vit_huge at batch 32 in bf16"]),
        ([comp, batch16], [batch16, "no run of vit_base at batch 32", "vit_base at batch 16 in bf16"]),
        ([comp, fp32], [fp32, "vit_base at batch 32 in fp32"]),
        ([comp, str(tmp_path / "absent")], ["--compute-from", "absent is not a directory"]),
        (["--efficiency", "1.5"], ["--efficiency", "(0, 1]"]),
        ([cal, malformed(tmp_path / "p5.json", precisions=5)], ["p5.json: precisions must be a list"]),
        ([cal, malformed(tmp_path / "pstr.json", precisions="bf16")], ["pstr.json: precisions must be a list"]),
        ([cal, malformed(tmp_path / "m5.json", model=5)], ["m5.json: model must be a model's name"]),
        (["--efficiency-from", str(tmp_path / "absent")], ["--efficiency-from", "absent is not a directory"]),
        (["--efficiency-from", empty], ["--efficiency-from", "no ok run that recorded an MFU"]),
        (["--efficiency-from", runs, "--efficiency", "0.3"], ["--efficiency-from", "--efficiency cannot"]),
        ([comp, two_nodes], [two_nodes, "on 2 node(s) only", "expected its rung on 1 node(s)"]),
        ([comp, fast], ["--compute-from", "mfu is", "above 1", "expected runs whose MFU is at most 1"]),
        (["--efficiency-from", fast], ["--efficiency-from", "above 1"]),
        (
            [cal, write_check(tmp_path / "one.json", one_rank)],
            ["fits[0]", "ranks must be a whole number of at least 2"],
        ),
        ([cal, write_check(tmp_path / "inf.json", infinite)], ["fits[2]", "finite bus_gbps above 0", "inf"]),
        (
            [cal, write_check(tmp_path / "se.json", words_se)],
            ["fits[1]", "alpha_us_se must be a finite number", "small"],
        ),
        ([cal, write_check(tmp_path / "nse.json", negative_se)], ["fits[3]", "bus_gbps_se must be a finite", "-0.5"]),
    ]


def malformed(path, **values) -> str:
    """A check.json with a key of the wrong type (a hand-edited or foreign file)."""
    write_check(path, synthetic_fits(40.0, 2.0))
    data = json.loads(open(path).read())
    data.update(values)
    with open(path, "w") as fh:
        json.dump(data, fh)
    return str(path)


def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path):
    cases = bad_inputs(tmp_path)
    figure = tmp_path / "figure"
    for extra, words in cases:
        argv = [
            "--system",
            "frontier",
            "--model",
            "vit_base,vit_3b",
            "--nodes",
            "1,2",
            "--strategy",
            "DDP",
            "--figure",
            str(figure),
        ] + extra
        assert plan.main(argv) == 2, extra
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert captured.out == "" and len(lines) == 1 and lines[0].startswith("vit-scale plan: error: "), captured
        for word in words:
            assert word in lines[0], (word, lines[0])
        assert not figure.exists(), extra
    # the prediction's options need the profile
    assert plan.main(["--model", "vit_base", "--calibration", "x.json"]) == 2
    assert "--calibration: needs --system" in capsys.readouterr().err
    assert plan.main(["--system", "nowhere", "--model", "vit_base"]) == 2
    assert "configs/systems/nowhere.yaml" in capsys.readouterr().err


# ---------------------------------------------------------------- the figure


def test_json_writes_no_figure_unless_asked(tmp_path, monkeypatch, capsys):
    """`plan --json` prints the document and writes nothing into the working directory; `--figure DIR`
    asks for the figure (drawn in test_the_predicted_figure_is_written)."""
    monkeypatch.chdir(tmp_path)
    assert plan.main(BASE + ["--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["prediction"] and "predicted figure" not in captured.err
    assert not os.listdir(tmp_path)
    assert plan.figure_dir(plan.parse_args(BASE + ["--json", "--figure", "fig"])) == "fig"
    assert plan.figure_dir(plan.parse_args(BASE)) == "."  # the table: the current directory, as always
    assert plan.figure_dir(plan.parse_args(BASE + ["--no-figure"])) is None


def test_the_predicted_figure_is_written(tmp_path):
    """The real CLI in a process: the table on stdout, the figure drawn by analysis/plan_figure.py."""
    figure = tmp_path / "fig"
    proc = subprocess.run(
        [PYTHON, "-m", "vit_scale", "plan", *BASE, "--figure", str(figure)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"predicted figure: {figure}/weak_scaling_plan.png, {figure}/weak_scaling_plan.pdf" in proc.stdout
    for name in ("weak_scaling_plan.png", "weak_scaling_plan.pdf", "weak_scaling_plan.json"):
        assert (figure / name).stat().st_size > 1000, name
    data = json.loads((figure / "weak_scaling_plan.json").read_text())
    assert len(data["rows"]) == 8 and data["calibration"]["kind"] == "profile"
    # what the figure draws: a dashed curve per strategy that fits, an x where it does not
    drawn = plan_figure.draw(data)
    assert set(drawn.extra["predicted"]) == {("vit_base", "DDP"), ("vit_base", "FULL_SHARD"), ("vit_3b", "FULL_SHARD")}
    # the profile's ranges give each point that fits its band, drawn under its curve
    assert drawn.drawn["vit_3b"] == {"predicted": 1, "not_fit": 2, "extrapolated": 0, "banded": 2}
    assert all(r["images_per_s_low"] <= r["images_per_s"] <= r["images_per_s_high"] for r in data["rows"] if r["fits"])
    assert drawn.drawn["vit_base"]["not_fit"] == 0
    # a point beyond the largest measured group: an open marker over its curve, and its legend entry
    data["rows"][-1].update(fits=True, images_per_s=500.0, extrapolated=True)
    far = plan_figure.draw(data)
    model = data["rows"][-1]["model"]
    assert far.drawn[model]["extrapolated"] == 1
    assert "extrapolated (open marker)" in [t.get_text() for t in far.figure.legends[0].get_texts()]
    curve = dict(drawn.extra["predicted"][("vit_base", "DDP")])
    want = {r["nodes"]: r["images_per_s"] for r in data["rows"] if r["model"] == "vit_base" and r["strategy"] == "DDP"}
    assert curve == pytest.approx(want)


def test_plan_figure_bad_input(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text("[]")
    assert plan_figure.main([str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected rows" in err[0] and not (tmp_path / "o").exists()


# ---------------------------------------------------------------- a study that asks for it


def study(tmp_path, *extra, predict="true"):
    conf = tmp_path / "s.yaml"
    conf.write_text(
        "models: [vit_base, vit_3b]\nstrategies: [DDP, FULL_SHARD]\nprecision: bf16\n"
        + (f"predict: {predict}\n" if predict is not None else "")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run(
        [
            PYTHON,
            "-m",
            "vit_scale",
            "study",
            "--system",
            "frontier",
            "--config",
            str(conf),
            "--nodes",
            "1,2",
            "--out",
            str(tmp_path / "runs"),
            "--dry-run",
            *extra,
        ],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_study_predict_key_in_a_dry_run(tmp_path):
    proc = study(tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    head, _, runs = out.partition("[1/8]")
    assert (
        "predicted (predict: true), as `vit-scale plan --system frontier --model vit_base,vit_3b --strategy "
        "DDP,FULL_SHARD --nodes 1,2 --gpus-per-node 8 --batch-size 32 --precision bf16" in head
    )
    assert "predicted for frontier: calibration: the system profile's defaults" in head
    assert "predicted not worth running (" in head and "vit_3b DDP (does not fit on 2 node(s))" in head
    assert "predicted figure: not written in a dry run" in head and "srun" in runs  # before the first run
    assert not (tmp_path / "report").exists() and not (tmp_path / "runs").exists()
    # without the key: nothing predicted; a bad value: one line, exit 2
    assert "predicted" not in study(tmp_path, predict=None).stdout
    bad = study(tmp_path, predict="maybe")
    assert bad.returncode == 2 and "'predict' in" in bad.stderr and "allowed: true, false" in bad.stderr
    # the study option overrides the file
    assert "predicted" not in study(tmp_path, "--predict", "false").stdout


def test_study_falls_back_from_a_check_without_fits(tmp_path):
    (tmp_path / "runs" / "s").mkdir(parents=True)
    write_check(tmp_path / "runs" / "s" / "check.json", [])  # a quick check: no size sweep
    out = study(tmp_path).stdout
    assert "check.json not used: --calibration:" in out and "has no fits" in out
    assert "predicted for frontier: calibration: the system profile's defaults" in out


def test_a_resumed_study_predicts_from_its_own_runs_and_writes_the_figure(tmp_path, monkeypatch, capsys):
    """The study's forecast on this CPU (system local: no peak, so only its own earlier runs can give the
    compute): the 1-node rung an earlier submission left (synthetic records) is the compute, and the
    figure goes into the report directory. In-process, with the run loop left out: the forecast is what
    the study calls before its first run."""
    from vit_scale.study import cli as study_cli
    from vit_scale.study.forecast import forecast

    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    conf = tmp_path / "s.yaml"
    conf.write_text(
        "models: [vit_micro]\nstrategies: [DDP, FULL_SHARD]\nprecision: bf16\nbatch_size: 4\npredict: true\n"
    )
    for strategy, ips in (("DDP", 40.0), ("FULL_SHARD", 30.0)):
        write_run(
            str(tmp_path / "runs"),
            study="s",
            model="vit_micro",
            strategy=strategy,
            nodes=1,
            ranks_per_node=2,
            batch=4,
            ips=ips,
            device="cpu",
            job_id=None,
        )
    opts = study_cli.parse(["--system", "local", "--config", str(conf), "--nodes", "1,2", "--out", "runs", "--dry-run"])
    run = study_cli.StudyRun(opts)
    run.dry_run = False  # the forecast of a real submission; no run is started here
    forecast(run)
    out = capsys.readouterr().out
    assert "predicted for local: calibration: the system profile's defaults (local.yaml)" in out
    assert f"predicted compute: measured run: measured steps from {run.study_dir} (2 run(s))" in flat(out)
    assert "--compute-from" in out and "--figure report/s" in out
    lines = [line for line in out.splitlines() if line.startswith(("DDP ", "FULL_SHARD "))]
    # a speed and its efficiency (with its band from the local profile's ranges beyond 1 node)
    assert len(lines) == 4 and all(line.endswith(("%", "%)")) for line in lines), lines
    data = json.loads((tmp_path / "report" / "s" / "weak_scaling_plan.json").read_text())
    one = {r["strategy"]: r["images_per_s"] for r in data["rows"] if r["nodes"] == 1}
    assert one == pytest.approx({"DDP": 40.0, "FULL_SHARD": 30.0}, rel=1e-6)  # each rung reproduces itself
    assert (tmp_path / "report" / "s" / "weak_scaling_plan.png").stat().st_size > 1000
    assert "predicted figure: report/s/weak_scaling_plan.png, report/s/weak_scaling_plan.pdf" in out


def _study_run(tmp_path, monkeypatch, system, text):
    from vit_scale.study import cli as study_cli

    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    conf = tmp_path / "s.yaml"
    conf.write_text(text)
    opts = study_cli.parse(["--system", system, "--config", str(conf), "--nodes", "1,2", "--out", "runs", "--dry-run"])
    return study_cli.StudyRun(opts)


def test_predict_key_is_checked_with_the_plan(tmp_path, monkeypatch):
    """`predict` is validated where the study's other keys are, and kept on the plan."""
    run = _study_run(tmp_path, monkeypatch, "frontier", "models: [vit_base]\nstrategies: [DDP]\npredict: true\n")
    assert run.plan.predict is True
    with pytest.raises(UserError) as exc:
        _study_run(tmp_path, monkeypatch, "frontier", "models: [vit_base]\nstrategies: [DDP]\npredict: maybe\n")
    assert "'predict' in" in str(exc.value) and "allowed: true, false" in str(exc.value)


def test_forecast_takes_the_efficiency_from_the_studys_runs(tmp_path, monkeypatch, capsys):
    """Earlier runs of another batch cannot give the compute, but their MFU gives the FLOPs' efficiency."""
    from vit_scale.study.forecast import forecast

    text = "models: [vit_base]\nstrategies: [DDP]\nprecision: bf16\nbatch_size: 32\npredict: true\n"
    for nodes in (1, 2):
        write_run(str(tmp_path / "runs"), study="s", nodes=nodes, batch=16, ips=400.0 * nodes, job_id=None)
    run = _study_run(tmp_path, monkeypatch, "frontier", text)
    forecast(run)
    out = capsys.readouterr().out
    assert "--compute-from" in out and "not used: --compute-from:" in out
    assert f"the median MFU of 2 run(s) in {run.study_dir}" in flat(out) and "--efficiency-from" in out


def test_forecast_failure_is_one_line_and_the_study_goes_on(tmp_path, monkeypatch, capsys):
    """A planner bug cannot be produced on purpose: plan() is replaced by one that raises, as a bug would."""
    from vit_scale import plan as plan_cli
    from vit_scale.study.forecast import forecast

    run = _study_run(tmp_path, monkeypatch, "frontier", "models: [vit_base]\nstrategies: [DDP]\npredict: true\n")

    def broken(args):
        raise KeyError("bucket")

    monkeypatch.setattr(plan_cli, "plan", broken)
    forecast(run)  # returns: the study goes on
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    assert lines == ["predicted: not available: 'bucket'"]


def test_a_group_wider_than_a_node_takes_its_smallest_node_count_as_baseline(capsys):
    """The seed-003 authors' vit_15b HYBRID_16GPU on 8-GCD nodes cannot run on 1 node: the plan used to
    exit 2 on that 1-node baseline. Its baseline is 2 nodes (the efficiency there is 1), the rules say so,
    and each point says whether its largest group (16 ranks: the shard group) lies beyond what the
    Frontier profile's sources measured (32 ranks): no. FULL_SHARD over 8 nodes (64 ranks) does."""
    argv = ["--system", "frontier", "--model", "vit_15b", "--strategy", "HYBRID_16GPU,FULL_SHARD"]
    out = run_json(capsys, argv + ["--nodes", "2,8", "--activation-checkpointing"])
    h16 = row(out, "vit_15b", "HYBRID_16GPU", 2)["prediction"]
    assert h16["baseline_nodes"] == 2 and h16["scaling_efficiency"] == pytest.approx(1.0)
    assert any("baseline: 2 nodes, the fewest HYBRID_16GPU fits on" in r for r in h16["rules"])
    at8 = row(out, "vit_15b", "HYBRID_16GPU", 8)["prediction"]
    assert (at8["largest_group"], at8["extrapolated"]) == (16, False)
    full = row(out, "vit_15b", "FULL_SHARD", 8)["prediction"]
    assert full["baseline_nodes"] == 1 and (full["largest_group"], full["extrapolated"]) == (64, True)


# ---------------------------------------------------------------- the profile's ranges


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        # a range that does not contain its value
        (("net_overhead_us_range: [3.0, 76.2]", "net_overhead_us_range: [3.0, 40]"), "network.net_overhead_us_range"),
        # a negative bound
        (("launch_us_range: [12, 17]", "launch_us_range: [-1, 17]"), "network.launch_us_range"),
        # a bound that is not finite
        (
            ("step_latency_us_range: [3.0, 76.2]", "step_latency_us_range: [3.0, .inf]"),
            "network.inter_node.step_latency_us_range",
        ),
        # not a pair of numbers
        (
            ("step_latency_us_range: [1.11, 1.52]", "step_latency_us_range: wide"),
            "network.intra_node.step_latency_us_range",
        ),
        # a bandwidth's share whose low end is 0 (a tree that never ends)
        (("tree_bus_ratio_range: [0.135, 0.92]", "tree_bus_ratio_range: [0, 0.92]"), "network.tree_bus_ratio_range"),
        # a slowdown below 0, and a slowdown's range that does not contain it
        (("compute_slowdown: 0\n", "compute_slowdown: -0.1\n"), "network.compute_slowdown"),
        (("collective_slowdown: 0\n", "collective_slowdown: 1.5\n"), "network.collective_slowdown_range"),
        # a device spread that is not a share
        (("device_spread: 0.08", "device_spread: 1.5"), "device_spread"),
    ],
)
def test_a_bad_range_is_one_line_naming_its_key(capsys, tmp_path, monkeypatch, edit, named):
    """A range that does not contain its value, a negative or non-finite bound, or one that is no pair of
    numbers: one line naming the key, exit 2, nothing written (not the figure's directory either)."""
    text = open(pr.profile_path("frontier"), encoding="utf-8").read()
    assert edit[0] in text
    bad = tmp_path / "frontier.yaml"
    bad.write_text(text.replace(edit[0], edit[1], 1))
    monkeypatch.setattr(pr, "profile_path", lambda system: str(bad))
    figure = tmp_path / "figure"
    assert plan.main(BASE + ["--figure", str(figure)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert f"frontier.yaml: {named}" in captured.err and "Traceback" not in captured.err
    assert not figure.exists()


def test_a_profile_without_ranges_reads_as_before(capsys, tmp_path, monkeypatch):
    """Without `*_range` keys and `device_spread` the rows have no band (null *_low/*_high, the cells a bare
    value) and the output says so in one line; the values are the same as with them."""
    with_ranges = run_json(capsys, BASE)
    text = open(pr.profile_path("frontier"), encoding="utf-8").read()
    plain = tmp_path / "frontier.yaml"
    kept = [line for line in text.splitlines() if "_range:" not in line and not line.startswith("device_spread:")]
    plain.write_text("\n".join(kept) + "\n")
    monkeypatch.setattr(pr, "profile_path", lambda system: str(plain))
    out = run_json(capsys, BASE)
    for a, b in zip(with_ranges["rows"], out["rows"], strict=True):
        if b["prediction"]["step"] is None:
            continue
        assert b["prediction"]["images_per_s"] == a["prediction"]["images_per_s"]
        assert b["prediction"]["images_per_s_low"] is None and b["prediction"]["step_s_high"] is None
        low, high = a["prediction"]["images_per_s_low"], a["prediction"]["images_per_s_high"]
        assert low <= a["prediction"]["images_per_s"] <= high
    assert out["prediction"]["interval"]["text"] == "no interval: the calibration's figures carry no range"
    assert out["prediction"]["crossings"] == []
    assert plan.main(BASE + ["--no-figure"]) == 0
    table = capsys.readouterr().out
    assert "interval: no interval: the calibration's figures carry no range" in table and "(4" not in table


def test_the_issues_ladder_shows_each_band_and_the_crossing_as_a_range(capsys):
    """vit_base, FULL_SHARD against HYBRID_2GPU over 1-128 Frontier nodes: every point beyond 1 node with
    its band in the table, each band holding its value, and the crossing said as a range of node counts
    (the ranges of the per-step latency across nodes, 3.0 to 76.2 us, move it by 16x)."""
    args = ["--system", "frontier", "--model", "vit_base", "--strategy", "FULL_SHARD,HYBRID_2GPU"]
    args += ["--nodes", "1,2,4,8,16,32,64,128"]
    out = run_json(capsys, args)
    for r in out["rows"]:
        p = r["prediction"]
        for name in ("images_per_s_per_gpu", "images_per_s", "step_s", "scaling_efficiency"):
            value = p["step"]["step_s"] if name == "step_s" else p[name]
            # the bounds are written to 9 decimals, the value in full
            assert p[f"{name}_low"] - 1e-9 <= value <= p[f"{name}_high"] + 1e-9, (r, name)
    full = [r["prediction"] for r in out["rows"] if r["strategy"] == "FULL_SHARD" and r["nodes"] == 128][0]
    assert full["images_per_s_per_gpu_high"] / full["images_per_s_per_gpu_low"] > 10
    # beyond 1 node a hybrid's band is the devices' 8% either way (device_spread; the cheap end's network adds a
    # little) and, on its low side, its replicas' tree all-reduce at the tree's costly bandwidth (PCCL's all-reduce
    # at 32-256 nodes) and up to twice as long beside the backward (collective_slowdown), exposed more as the
    # tree grows; its 1-node rung (compute from FLOPs) only moves by its compute beside its own within-node
    # collectives (compute_slowdown up to 0.4)
    hybrid = {r["nodes"]: r["prediction"] for r in out["rows"] if r["strategy"] == "HYBRID_2GPU"}
    at = hybrid[32]
    assert 1 / 0.92 <= at["images_per_s_per_gpu_high"] / at["images_per_s_per_gpu"] < 1.12
    assert 1.5 < at["images_per_s_per_gpu"] / at["images_per_s_per_gpu_low"] < 1.8
    assert hybrid[128]["images_per_s_per_gpu_low"] < hybrid[32]["images_per_s_per_gpu_low"]
    assert hybrid[1]["images_per_s_per_gpu_high"] / hybrid[1]["images_per_s_per_gpu"] < 1.01
    assert 1.05 < hybrid[1]["images_per_s_per_gpu_high"] / hybrid[1]["images_per_s_per_gpu_low"] < 1.15
    [c] = out["prediction"]["crossings"]
    assert (c["strategy"], c["below"], c["earliest"], c["latest"]) == ("FULL_SHARD", "HYBRID_2GPU", 2, 32)
    assert out["prediction"]["interval"]["method"] == "bounds" and out["prediction"]["interval"]["level"] == 0.9
    jsonschema.validate(out, plan.PLAN_SCHEMA)
    assert plan.main(args + ["--no-figure"]) == 0
    text = capsys.readouterr().out
    assert "vit_base: FULL_SHARD falls below HYBRID_2GPU between 2 and 32 nodes" in flat(text)
    assert max(len(line) for line in text.splitlines()) < 120


def test_a_checks_fits_carry_their_standard_errors_into_the_band(capsys, tmp_path):
    """A check's fit records the standard errors of its alpha and B from the size sweep's scatter; over the
    profile's defaults its collectives' band is +-1.645 of them (the profile's ranges still time what no fit
    covers). A fit from exact timings has errors of about 0: the band narrows to the value."""
    noisy = []
    for scope in ("intra", "inter"):
        n = 16 if scope == "inter" else 8
        for collective, factor in BUS_FACTORS.items():
            points = [
                (s, (40e-6 + s * factor(n) / 2e9) * (1 + 0.04 * (-1) ** i))
                for i, s in enumerate(SIZES)
                for _ in range(2)
            ]
            noisy.append(fit(collective, scope, n, points).as_dict())
    assert all(f["alpha_us_se"] > 0 and f["bus_gbps_se"] > 0 for f in noisy)
    exact = synthetic_fits(40.0, 2.0)
    assert all(f["bus_gbps_se"] < 1e-6 * f["bus_gbps"] for f in exact)
    args = ["--system", "frontier", "--model", "vit_3b", "--nodes", "1,2", "--strategy", "FULL_SHARD"]
    got = {}
    for name, fits in (("noisy", noisy), ("exact", exact)):
        out = run_json(capsys, args + ["--calibration", write_check(tmp_path / f"{name}.json", fits)])
        got[name] = row(out, "vit_3b", "FULL_SHARD", 2)["prediction"]
        text = out["prediction"]["interval"]["text"]
        # exact timings' errors round to 0 in check.json: no interval of their own
        assert ("standard errors of all_gather/inter fit: alpha" in text) == (name == "noisy")
    for p in got.values():
        assert p["images_per_s_low"] <= p["images_per_s"] <= p["images_per_s_high"]
    width = {k: p["step_s_high"] / p["step_s_low"] for k, p in got.items()}
    assert width["noisy"] > width["exact"] * 1.01, width


def test_a_crossing_is_a_range_of_node_counts_or_may_not_happen():
    """spread.crossings over (value, cheap end, costly end) images/s per GPU: the node counts A falls more
    than 5% below B at, as a range over the readings; 'or not within the ladder' where at some reading it
    does not happen; nothing where A is already below B at the first node count (a lasting gap)."""
    from vit_scale.planning import spread

    nodes = [1, 2, 4, 8, 16]
    hybrid = {n: (100.0, 100.0, 100.0) for n in nodes}
    full = {1: (100.0, 100.0, 100.0), 2: (97, 99, 90), 4: (90, 98, 70), 8: (80, 97, 50), 16: (60, 94, 30)}
    [c] = spread.crossings({("m", "FULL_SHARD"): full, ("m", "HYBRID_2GPU"): hybrid})
    assert (c["strategy"], c["below"], c["value"], c["earliest"], c["latest"]) == (
        "FULL_SHARD",
        "HYBRID_2GPU",
        4,
        2,
        16,
    )
    assert c["text"] == "FULL_SHARD falls below HYBRID_2GPU between 2 and 16 nodes (at the inputs' values: from 4)"
    full[16] = (60, 96, 30)  # at the cheap end it stays within 5%
    [c] = spread.crossings({("m", "FULL_SHARD"): full, ("m", "HYBRID_2GPU"): hybrid})
    assert c["latest"] is None and "from 2 nodes, or not within the ladder (up to 16 nodes)" in c["text"]
    slow = {n: (80.0, 80.0, 80.0) for n in nodes}
    assert spread.crossings({("m", "SLOW"): slow, ("m", "HYBRID_2GPU"): hybrid}) == []


def test_an_emulated_node_computes_faster_beyond_its_rung_never_slower(tmp_path):
    """local.yaml's device_spread [0.75, 0]: an emulated node's CPU quota is a budget a period, not a pace,
    so where its ranks wait on the link their compute may take as little as a quarter of the rung's
    (benchmarks/quota_burst.py measures it), and never more; Frontier's 0.08 is 8% either way. A pair that
    is not two shares below 1 is one line naming the key."""
    local = pr.device_spread(pr.profile_path("local"))
    assert (local.faster, local.slower) == (0.75, 0.0) and local.text().startswith(
        "compute up to 75% less and 0% more time"
    )
    comp = Compute(0.1, 0.2, 0.05, "the rung")
    cheap = pr.on_other_devices(comp, local, costly=False)
    assert (cheap.forward_s, cheap.backward_s, cheap.optimizer_s) == pytest.approx((0.025, 0.05, 0.0125))
    assert pr.on_other_devices(comp, local, costly=True) is comp
    frontier = pr.device_spread(pr.profile_path("frontier"))
    assert pr.on_other_devices(comp, frontier, costly=True).backward_s == pytest.approx(0.216)
    assert pr.on_other_devices(comp, 0.08, costly=False).backward_s == pytest.approx(0.184)
    for bad in ("[0.75, 1.5]", "[0.75]", "[a, 0]"):
        path = tmp_path / "local.yaml"
        text = open(pr.profile_path("local"), encoding="utf-8").read()
        path.write_text(text.replace("device_spread: [0.75, 0]", f"device_spread: {bad}"), encoding="utf-8")
        with pytest.raises(UserError) as err:
            pr.device_spread(str(path))
        assert str(err.value).startswith("local.yaml: device_spread: ") and "[faster, slower]" in str(err.value)
        assert "\n" not in str(err.value)


def test_on_a_quota_the_costly_end_computes_at_most_the_measured_burst_share(tmp_path):
    """The band's costly end on the local profile's quota: benchmarks/quota_burst.py measured a node's compute,
    once its ranks wait at least as long as they compute a step, at up to 0.57 of the rung's time (the profile's
    quota_burst_share), so there the costly end computes in 0.57 C (C its rung's compute, E its waits, both at
    the costly end's inputs), with shorter waits on the line from C: C (1 - 0.43 min(1, E / C)); never faster
    than the value. The rung keeps its compute. A share below the cores' own pace (0.25) or above 1, or one on a
    profile without a quota, is one line naming the key."""
    cal = pr.profile_calibration(pr.profile_path("local"))
    comp = pr.compute_from_flops(1e-2, 0.4, "a made peak")  # a CPU has no peak: one to count FLOPs against
    comp.device_spread = pr.device_spread(pr.profile_path("local"))
    assert (
        comp.device_spread.burst_share == 0.57
        and "with waits as long as the compute, 57% of the rung's time" in comp.device_spread.text()
    )
    dear = cal.ends[True]
    points = [
        Scenario(model="vit_micro", strategy=s, nodes=n, batch_size=8, precision="fp32", gpus_per_node=2)
        for s in ("FULL_SHARD", "HYBRID_2GPU")
        for n in (1, 2, 4)
    ]
    shares = []
    for sc, p in zip(points, pr.predict(points, cal, comp, blocking=True), strict=True):
        rung = comp.compute_for(sc, dear)
        plain = predict_step(sc, dear, rung, blocking=True)
        whole = rung.forward_s + rung.backward_s + rung.optimizer_s
        waits = plain.breakdown.exposed_intra_s + plain.breakdown.exposed_inter_s
        share = 1.0 if sc.nodes == 1 else 1 - 0.43 * min(1.0, waits / whole)
        end = predict_step(sc, dear, rung.scaled(share, "test"), blocking=True)
        assert p.end_ips[1] == pytest.approx(end.images_per_s_per_gpu), sc
        assert p.band["images_per_s_per_gpu"][0] <= p.images_per_s_per_gpu
        shares.append(share)
    # at 4 nodes the waits outlast the compute: the measured ceiling itself
    assert shares[0] == 1.0 and shares[2] == pytest.approx(0.57) and all(0.57 <= x < 1 for x in shares[1:3])
    local = open(pr.profile_path("local"), encoding="utf-8").read()
    frontier = open(pr.profile_path("frontier"), encoding="utf-8").read()
    for text, words in (
        (local.replace("quota_burst_share: 0.57", "quota_burst_share: 0.1"), "from the cores' own pace (0.25"),
        (local.replace("quota_burst_share: 0.57", "quota_burst_share: most"), "up to 1"),
        (frontier + "quota_burst_share: 0.5\n", "is given without a CPU quota (emulation.cpus_per_node)"),
    ):
        path = tmp_path / "bad.yaml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(UserError) as err:
            pr.device_spread(str(path))
        assert str(err.value).startswith("bad.yaml: quota_burst_share") and words in str(err.value)
        assert "\n" not in str(err.value)


def test_on_a_quota_the_values_compute_takes_back_what_the_waits_left_unspent():
    """On the local profile's emulated nodes (a CPU quota, gloo's blocking collectives) a point beyond its rung
    computes in max(C - E, 0.25 C): C the rung's compute, E the step's waits, 0.25 the cores' own pace over the
    quota's; over the step the node still uses no more than its quota. The rung itself, collectives that
    overlap compute, and Frontier's devices keep the rung's compute."""
    cal = pr.profile_calibration(pr.profile_path("local"))
    comp = pr.compute_from_flops(1e-2, 0.4, "a made peak")  # a CPU has no peak: one to count FLOPs against
    comp.device_spread = pr.device_spread(pr.profile_path("local"))
    assert comp.device_spread.budget
    points = [
        Scenario(model="vit_micro", strategy=s, nodes=n, batch_size=8, precision="fp32", gpus_per_node=2)
        for s in ("FULL_SHARD", "HYBRID_2GPU")
        for n in (1, 2, 4)
    ]
    for sc, p in zip(points, pr.predict(points, cal, comp, blocking=True), strict=True):
        plain = predict_step(sc, cal.network, comp.compute_for(sc, cal.network), blocking=True).breakdown
        whole = plain.forward_s + plain.backward_s + plain.optimizer_s
        waits = plain.exposed_intra_s + plain.exposed_inter_s
        got = p.breakdown.forward_s + p.breakdown.backward_s + p.breakdown.optimizer_s
        expected = whole if sc.nodes == 1 else max(whole - waits, 0.25 * whole)
        assert got == pytest.approx(expected), sc
        assert p.breakdown.step_s == pytest.approx(expected + waits)
        lo, hi = p.band["images_per_s_per_gpu"]
        assert lo <= p.images_per_s_per_gpu <= hi
    # at 4 nodes the waits exceed the rung's compute: the value computes at the cores' own pace
    plain = predict_step(points[2], cal.network, comp.compute_for(points[2], cal.network), blocking=True).breakdown
    assert plain.exposed_inter_s > plain.forward_s + plain.backward_s + plain.optimizer_s
    # not blocking (the collectives overlap compute: a wait is not idle time) or no quota: the rung's compute
    nonblocking = pr.predict([points[2]], cal, comp, blocking=False)[0].breakdown
    assert nonblocking.forward_s == pytest.approx(comp.compute_for(points[2], cal.network).forward_s)
    comp.device_spread = pr.device_spread(pr.profile_path("frontier"))
    assert not comp.device_spread.budget
    again = pr.predict([points[2]], cal, comp, blocking=True)[0].breakdown
    assert again.forward_s == pytest.approx(comp.compute_for(points[2], cal.network).forward_s)
