"""vit-scale study --repeat: every point N times, in rounds over the ladder (every point once before
any point again), each repetition a run of its own with its index in the ledger and its record, and
a resume that counts them. The order and the bad input come from the plan and the command line
(nothing launched); one real local study (vit_micro, DDP on 1 and 2 emulated nodes of one CPU rank
each, a repetition made to fail for real in its second step) is run, then resumed."""

import csv
import os
import re
import shutil
import subprocess

import pandas as pd
import pytest

from conftest import ROOT
from jobs_support import job_env, python_injecting, runs_by_strategy_and_nodes
from vit_scale.cluster import systems
from vit_scale.errors import UserError
from vit_scale.study import cli as study_cli
from vit_scale.study.ledger import COLUMNS, Ledger, allocation, allocation_line, repetitions_done, summary
from vit_scale.study.plan import make_plan

WEAK_SCALING = os.path.join(ROOT, "jobs", "weak_scaling.sh")
LOCAL = os.path.join(ROOT, "configs", "studies", "local.yaml")
FAST = [
    "--models",
    "vit_micro",
    "--strategies",
    "DDP",
    "--nodes",
    "1,2",
    "--ranks-per-node",
    "1",
    "--steps",
    "6",
    "--warmup-steps",
    "1",
    "--set",
    # no node-health probe: a short one on a loaded machine once read a node at 61% of the other, and the
    # analysis set that run aside (results.csv's slow_node), which changes the counts asserted here
    "train.health_probe_s=0",
    "--batch-size",
    "2",
    "--study",
    "rep",
    "--out",
    "runs",
]


def plan(cli, study_file=LOCAL):
    return make_plan(study_file, cli, [], systems.read_system("local"), ranks_per_node=2, alloc_nodes=0)


def order(study) -> list:
    return [(run.strategy, run.nodes, run.repetition) for run in study.runs]


def test_repeats_run_in_rounds_over_the_ladder():
    study = plan({"models": "vit_micro", "strategies": "DDP,FULL_SHARD", "nodes": "1,2", "repeat": "3"})
    points = [("DDP", 1), ("DDP", 2), ("FULL_SHARD", 1), ("FULL_SHARD", 2)]
    # round r holds every point once, in the plan's order, before round r + 1 starts
    assert study.repeat == 3
    assert order(study) == [(s, n, r) for r in (1, 2, 3) for s, n in points]
    # the repetitions of a point are the same measurement: same settings, same place
    first = {(run.strategy, run.nodes): run for run in study.runs if run.repetition == 1}
    for run in study.runs:
        twin = first[(run.strategy, run.nodes)]
        assert (run.settings, run.system_settings, run.variant) == (twin.settings, twin.system_settings, twin.variant)

    # the local study file's 3 repetitions unless told otherwise on the command line
    default = order(plan({"models": "vit_micro", "strategies": "DDP", "nodes": "1,2"}))
    assert default == [("DDP", n, r) for r in (1, 2, 3) for n in (1, 2)]


def test_the_study_files_repeat_and_the_command_line_over_it(tmp_path):
    study_file = tmp_path / "twice.yaml"
    study_file.write_text("models: [vit_micro]\nstrategies: [DDP]\nnodes: [1]\nrepeat: 2\n")
    assert order(plan({}, str(study_file))) == [("DDP", 1, 1), ("DDP", 1, 2)]
    assert order(plan({"repeat": "1"}, str(study_file))) == [("DDP", 1, 1)]


def test_dry_run_prints_the_rounds_and_starts_nothing(tmp_path):
    proc = subprocess.run(
        ["bash", WEAK_SCALING, *FAST, "--repeat", "2", "--dry-run"],
        cwd=tmp_path,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "4 runs (1 model(s) x 1 strategy x nodes 1,2 x 2 repetitions, in rounds)" in out, out
    labels = [line for line in out.splitlines() if line.startswith("[")]
    assert labels == [
        "[1/4] vit_micro DDP n1 (1 rank) repetition 1/2",
        "[2/4] vit_micro DDP n2 (2 ranks) repetition 1/2",
        "[3/4] vit_micro DDP n1 (1 rank) repetition 2/2",
        "[4/4] vit_micro DDP n2 (2 ranks) repetition 2/2",
    ]
    assert out.count("output.repetition=1") == 1 + 2 and out.count("output.repetition=2") == 1 + 2  # a line a rank
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two"])
def test_bad_repeat_on_the_command_line_is_one_line(tmp_path, value):
    proc = subprocess.run(
        ["bash", WEAK_SCALING, *FAST, "--repeat", value],
        cwd=tmp_path,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"weak_scaling.sh: --repeat: '{value}' is not allowed; allowed: a whole number of at least 1, auto or "
        "auto:N (N from 3 to 8)"
    ], proc.stderr
    assert proc.stdout == "" and os.listdir(tmp_path) == []


@pytest.mark.parametrize("value", ["0", "2.5", "yes", "[2, 3]"])
def test_bad_repeat_in_the_study_file_is_one_line(tmp_path, monkeypatch, capsys, value):
    study_file = tmp_path / "bad.yaml"
    study_file.write_text(f"models: [vit_micro]\nstrategies: [DDP]\nnodes: [1]\nrepeat: {value}\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert study_cli.main(["--system", "local", "--config", str(study_file), "--out", "runs"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"vit-scale study: 'repeat' in {study_file}: ") and line.endswith(
        "is not allowed; allowed: a whole number of at least 1, auto or auto:N (N from 3 to 8)"
    ), line
    assert os.listdir(work) == []
    with pytest.raises(UserError):  # the plan refuses it too, for every caller (the sweep plans first)
        plan({}, str(study_file))


def test_a_resume_gives_each_repetition_one_earlier_ok_run():
    # its own repetition first; runs without one (from before --repeat) or a second of the same fill the gaps
    assert repetitions_done([("c", 2), ("b", 0), ("a", 1)], 3) == {1: "a", 2: "c", 3: "b"}
    assert repetitions_done([("new", 1), ("old", 1)], 2) == {1: "new", 2: "old"}
    assert repetitions_done([("x", 3), ("y", 0)], 1) == {1: "x"}
    # 2 ok of 3: one left to run, whichever failed
    assert sorted(repetitions_done([("a", 1), ("c", 3)], 3)) == [1, 3]
    assert repetitions_done([], 2) == {}


def _row(nodes, repetition, status, ips="-"):
    return {
        "model": "vit_micro",
        "strategy": "DDP",
        "variant": "-",
        "nodes": str(nodes),
        "ranks": str(nodes),
        "status": status,
        "images_per_s": ips,
        "repetition": str(repetition),
    }


def test_the_summary_shows_the_median_of_a_points_ok_repetitions():
    rows = [
        _row(1, 1, "ok", "100.0"),
        _row(1, 2, "failed"),
        _row(1, 3, "ok", "120.0"),
        _row(2, 1, "oom"),
        _row(2, 2, "oom"),
        _row(2, 3, "oom"),
        _row(1, 2, "ok", "90.0"),
    ]  # a resume ran repetition 2 again: its last line wins
    table = summary(rows)
    assert table[1].split() == ["vit_micro", "DDP", "100.0", "[3/3]", "oom", "[0/3]"], table
    assert table[-1] == (
        "  3 ok, 3 oom; 3 repetitions of each point: img/s is the median of its ok ones, "
        "[k/n] k of its n repetitions ok"
    ), table
    # one repetition (and a ledger from before repeats, without the column): the table as it was
    single = [{k: v for k, v in _row(1, 1, "ok", "100.0").items() if k != "repetition"}, _row(2, 1, "oom")]
    assert [line.split() for line in summary(single)] == [
        ["model", "strategy", "n1", "img/s", "n2", "img/s"],
        ["vit_micro", "DDP", "100.0", "oom"],
        ["1", "ok,", "1", "oom"],
    ]


def test_the_last_line_says_where_the_allocation_went(tmp_path):
    """Node-seconds of the runs this study launched (the ledger's seconds x nodes; a run found ok earlier
    cost nothing), and of them the shares in start-up, warm-up and timed windows from each record's time
    split; a run whose record has none counts as untimed and is named."""
    from analysis.synthetic import write_run

    split = {"launched_at": 1.7e9, "startup_s": 6.0, "warmup_s": 1.0, "timed_s": 2.0, "rest_s": 0.5, "wall_s": 9.5}
    dirs = [
        os.path.dirname(write_run(str(tmp_path), nodes=n, run_id=f"r{n}", time_split=split if n < 4 else None))
        for n in (1, 2, 4)
    ]
    rows = [
        dict(_row(1, 1, "ok", "100.0"), seconds="10.0", run_dir=dirs[0]),
        dict(_row(2, 1, "ok", "180.0"), seconds="10.0", run_dir=dirs[1]),
        dict(_row(4, 1, "ok", "300.0"), seconds="10.0", run_dir=dirs[2]),
        dict(_row(1, 2, "ok", "100.0"), seconds="0", run_dir=dirs[0]),  # ok earlier: skipped, booked
    ]
    assert allocation(rows) == {"runs": 3, "node_s": 70.0, "startup_node_s": 18.0, "warmup_node_s": 3.0,
                                "timed_node_s": 6.0, "split_runs": 2}  # fmt: skip
    assert allocation_line(rows) == (
        "  allocation:  70 node-seconds (0.0194 node-hours) over 3 runs: 8.6% in timed windows, 25.7% start-up, "
        "4.3% warm-up (1 run(s) without a time split in their record count as untimed)"
    )


def test_a_ledger_from_before_repeats_reads_with_the_lines_added_to_it(tmp_path):
    old_columns = COLUMNS[: COLUMNS.index("repetition")]
    path = tmp_path / "study_runs.tsv"
    old = {**_row(1, 1, "ok", "100.0"), "run_dir": "a"}
    path.write_text("\t".join(old_columns) + "\n" + "\t".join(old.get(c, "-") for c in old_columns) + "\n")
    Ledger(str(path)).add(**{**_row(1, 2, "ok", "120.0"), "run_dir": "b"})
    rows = Ledger(str(path)).rows()
    assert [(r["run_dir"], r["images_per_s"], r.get("repetition")) for r in rows] == [
        ("a", "100.0", None),
        ("b", "120.0", "2"),
    ]
    assert summary(rows)[1].split() == ["vit_micro", "DDP", "110.0", "[2/2]"]


def ledger(study_dir) -> list:
    with open(study_dir / "study_runs.tsv") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def run_dirs(study_dir) -> set:
    return {os.path.dirname(p) for p in map(str, study_dir.glob("vit_micro/DDP/n*/*/metrics.jsonl"))}


def points(report) -> dict:
    results = pd.read_csv(report / "results.csv")
    return {int(r.nodes): int(r.ips_runs) for r in results.itertuples() if r.status == "ok"}


def test_a_repeated_study_keeps_every_repetition_and_its_resume_counts_them(tmp_path):
    study_dir, report = tmp_path / "runs" / "rep", tmp_path / "report" / "rep"

    def study(*extra, **env):
        proc = subprocess.run(
            ["bash", WEAK_SCALING, *FAST, "--repeat", "2", *extra],
            cwd=tmp_path,
            env=job_env(**env),
            capture_output=True,
            text=True,
            timeout=900,
        )
        return proc.returncode, proc.stdout, proc.stderr

    # repetition 2 on one node fails for real in its second step; the other three runs are ok
    failing = python_injecting(
        tmp_path,
        "failing",
        "True",
        'raise RuntimeError("injected by the test")',
        '[[ " $* " == *" output.repetition=2 "* ]] && [ "${GROUP_WORLD_SIZE:-1}" = 1 ]',
    )
    code, out, err = study(VIT_SCALE_PYTHON=failing)
    assert code == 1, out + err
    for line in [
        "[1/4] vit_micro DDP n1 (1 rank) repetition 1/2 ... ok ",
        "[2/4] vit_micro DDP n2 (2 ranks) repetition 1/2 ... ok ",
        "[3/4] vit_micro DDP n1 (1 rank) repetition 2/2 ... FAILED (exit 1",
        "[4/4] vit_micro DDP n2 (2 ranks) repetition 2/2 ... ok ",
    ]:
        assert line in out, out
    # the ledger: one line a run, with its repetition, each in a run directory of its own
    rows = ledger(study_dir)
    assert [(r["nodes"], r["repetition"], r["status"]) for r in rows] == [
        ("1", "1", "ok"),
        ("2", "1", "ok"),
        ("1", "2", "failed"),
        ("2", "2", "ok"),
    ], rows
    assert len({r["run_dir"] for r in rows}) == 4 and {r["run_dir"] for r in rows} == run_dirs(study_dir)
    # the records: the same point (settings) for both repetitions, each naming its repetition
    records = runs_by_strategy_and_nodes(study_dir)
    for nodes in (1, 2):
        found = sorted(records[("DDP", nodes)], key=lambda rec: rec[0]["config"]["output"]["repetition"])
        assert [s["config"]["output"]["repetition"] for s, _ in found] == [1, 2]
        assert found[0][0]["config"]["train"] == found[1][0]["config"]["train"]
    assert sorted(e["status"] for _, e in records[("DDP", 1)]) == ["failed", "ok"]
    # each record splits its wall time from the study's launch: start-up, warm-up, the timed window, the rest
    for _, e in records[("DDP", 2)]:
        split = e["time_split"]
        assert split["startup_s"] > 0 and split["timed_s"] > 0 and split["launched_at"] > 1.7e9
        parts = split["startup_s"] + split["warmup_s"] + split["timed_s"] + split["rest_s"]
        assert split["wall_s"] == pytest.approx(parts)
    # the study's last line: the node-seconds it spent and the share in timed windows
    last = out.rstrip().splitlines()[-1]
    assert re.fullmatch(r"  allocation:  [\d,]+ node-seconds \([\d.e-]+ node-hours\) over 4 runs: [\d.]+% in timed "
                        r"windows, [\d.]+% start-up, [\d.]+% warm-up", last), last  # fmt: skip
    # the table at the end counts the ok repetitions; the analysis pools them per point
    assert "[1/2]" in out and "[2/2]" in out and "1 failed, 3 ok; 2 repetitions of each point" in out, out
    assert points(report) == {1: 1, 2: 2}
    assert "Ok runs per point: 1 to 2" in (report / "report.md").read_text()

    # resumed, one ok repetition's run directory gone: the failed repetition and the gone one run again, only
    # those (one resume for both: each study's start costs seconds)
    gone = next(
        r["run_dir"] for r in ledger(study_dir) if (r["nodes"], r["repetition"], r["status"]) == ("1", "1", "ok")
    )
    shutil.rmtree(gone)
    before = run_dirs(study_dir)
    code, out, err = study("--no-analysis")
    assert code == 0, out + err
    assert out.count("ok earlier, skipped") == 2, out
    assert "[1/4] vit_micro DDP n1 (1 rank) repetition 1/2 ... ok " in out, out
    assert "[3/4] vit_micro DDP n1 (1 rank) repetition 2/2 ... ok " in out, out
    # one ledger row per run: the skipped repetitions are in it already, each rerun adds its own
    new = ledger(study_dir)[4:]
    assert [(r["nodes"], r["repetition"], r["status"]) for r in new] == [("1", "1", "ok"), ("1", "2", "ok")], new
    again = run_dirs(study_dir) - before
    assert len(again) == 2 and len(run_dirs(study_dir)) == 5
    assert all(d.startswith(str(study_dir / "vit_micro" / "DDP" / "n1")) for d in again), again
    rerun = [
        rec
        for rec in runs_by_strategy_and_nodes(study_dir)[("DDP", 1)]
        if rec[0]["run_id"] in map(os.path.basename, again)
    ]
    assert sorted((start["config"]["output"]["repetition"], end["status"]) for start, end in rerun) == [
        (1, "ok"),
        (2, "ok"),
    ], rerun

    # resumed with every repetition ok: nothing runs; the analysis has both repetitions of each point
    before = run_dirs(study_dir)
    code, out, err = study()
    assert code == 0, out + err
    assert out.count("ok earlier, skipped") == 4 and not re.search(r"\.\.\. ok \d", out), out
    assert run_dirs(study_dir) == before
    assert points(report) == {1: 2, 2: 2}
    assert "Ok runs per point: 2" in (report / "report.md").read_text()

    # --repeat auto:3 over the same records: rounds 1 and 2 are done; the look after round 2 (the report's test,
    # analysis/sequential.py) finds one point at each node count, nothing to compare: no round 3 runs
    before = run_dirs(study_dir)
    code, out, err = study("--repeat", "auto:3", "--no-analysis")
    assert code == 0, out + err
    assert "4 to 6 runs (1 model(s) x 1 strategy x nodes 1,2 x 2 to 3 rounds" in out, out
    assert out.count("ok earlier, skipped") == 4 and "[1/4] vit_micro DDP n1 (1 rank) round 1 (at most 3)" in out
    assert "look after round 2 of at most 3 (level 1.50%):" in out, out
    assert "vit_micro n2: DDP: one point: nothing to compare: decided" in out, out
    assert "round 3" not in out and run_dirs(study_dir) == before


def test_three_repetitions_are_the_local_default_and_one_says_what_it_gives_up(tmp_path):
    """The local study runs each point 3 times; --repeat 1 runs it once, and the report of single runs then
    says that no point is compared and how to repeat. Records written without a trainer
    (analysis/synthetic.py): the words are the analysis's."""
    from analysis.synthetic import write_run
    from analysis.weak_scaling import main as analyse

    assert plan({}).repeat == 3
    study = plan({"repeat": "1"})
    assert study.repeat == 1 and {run.repetition for run in study.runs} == {1}
    for strategy, ips in (("DDP", 100.0), ("FULL_SHARD", 80.0)):
        for nodes in (1, 2):
            write_run(
                str(tmp_path / "runs"),
                study="local",
                model="vit_micro",
                strategy=strategy,
                nodes=nodes,
                ranks_per_node=2,
                ips=ips * nodes,
                device="cpu",
                steps=20,
                warmup=5,
            )
    assert analyse([str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--quiet", "--no-plots"]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Every point here ran once: no ratio is tested, and each interval is within-run" in md, md
    assert "vit-scale study --repeat 3, the default, runs each point 3 times" in md


def test_two_repetitions_far_apart_still_make_every_figure(tmp_path):
    """Two runs of a point that disagree tenfold (a busy laptop) give intervals spanning orders of
    magnitude, and efficiency one as wide: the heat map still draws. Records
    written without a trainer (analysis/synthetic.py)."""
    from analysis.synthetic import write_run
    from analysis.weak_scaling import main as analyse

    for nodes, first, second in ((1, 100.0, 10.0), (2, 180.0, 20.0)):
        for i, ips in enumerate((first, second)):
            write_run(
                str(tmp_path / "runs"),
                study="rep",
                model="vit_micro",
                strategy="DDP",
                nodes=nodes,
                ranks_per_node=1,
                ips=ips,
                device="cpu",
                steps=6,
                warmup=1,
                time=1.7e9 + 10 * i + nodes,
                run_id=f"r{nodes}.{i}",
            )
    assert analyse([str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--quiet"]) == 0
    assert (tmp_path / "report" / "efficiency.png").is_file()
    assert points(tmp_path / "report") == {1: 2, 2: 2}
