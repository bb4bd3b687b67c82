"""--repeat auto's stopping rule (analysis/sequential.py) and the study's rounds around it, on fabricated
records (analysis/synthetic.py) and plans: nothing is launched. Which node counts stop after a look, at
which level, that a look reads only the rounds up to it (so a resumed study decides as before), that the
study adds a round only for the open node counts, and the bad input. The simulated error rate and savings
of the rule are benchmarks/statistics_power.py's (docs/analysis.md)."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

from conftest import ROOT

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from analysis import sequential, stats
from analysis.synthetic import steady_steps, write_run
from vit_scale.cluster import systems
from vit_scale.errors import UserError
from vit_scale.study import cli as study_cli
from vit_scale.study import plan as study_plan

LOCAL = os.path.join(ROOT, "configs", "studies", "local.yaml")
# n1: FULL_SHARD 30% faster than DDP; n2: the two equal; each round moves both points alike
LEVELS = {("DDP", 1): 100.0, ("FULL_SHARD", 1): 130.0, ("DDP", 2): 180.0, ("FULL_SHARD", 2): 180.0}
ROUND = [1.00, 0.97, 1.02, 0.99, 1.01]
NOISE = {"DDP": [1.000, 1.004, 0.997, 1.002, 0.999], "FULL_SHARD": [1.003, 0.996, 1.001, 0.998, 1.004]}


def _study(root, rounds: int) -> str:
    for r in range(1, rounds + 1):
        for (strategy, nodes), level in LEVELS.items():
            ips = level * ROUND[r - 1] * NOISE[strategy][r - 1]
            write_run(
                str(root),
                study="auto",
                model="vit_micro",
                strategy=strategy,
                nodes=nodes,
                ranks_per_node=1,
                device="cpu",
                steps=12,
                warmup=2,
                step_ips=steady_steps(ips, 10, 0.001, seed=10 * r + nodes),
                run_id=f"{strategy}-n{nodes}-r{r}",
                time=1.7e9 + 100 * r + nodes,
                repetition=r,
            )
    return str(root / "auto")


def _by_nodes(looks) -> dict:
    return {x.nodes: x for x in looks}


def test_a_settled_node_count_stops_and_an_open_one_goes_on(tmp_path):
    """After round 3 of at most 7, a 30% difference is separated at the look's level (2%): decided; equal
    points are not: open. The test is the report's paired t, on the rounds both points have."""
    study_dir = _study(tmp_path, 3)
    looks = _by_nodes(sequential.decide(study_dir, 3, 7))
    assert looks[1].decided and looks[1].best == "FULL_SHARD" and looks[1].runner_up == "DDP"
    assert looks[1].test == stats.PAIRED and looks[1].ratio == pytest.approx(1.30, rel=0.01)
    assert "separated at the look's level 2.00%" in looks[1].why
    assert not looks[2].decided and looks[2].low < 1 < looks[2].high
    # the look's interval is the report's test at the look's level, wider than the report's 95%
    wide = stats.compare(*[[stats.Run(130.0 * ROUND[i] * NOISE["FULL_SHARD"][i], (), i + 1) for i in range(3)],
                           [stats.Run(100.0 * ROUND[i] * NOISE["DDP"][i], (), i + 1) for i in range(3)]])  # fmt: skip
    assert looks[1].high - looks[1].low > wide.high - wide.low


def test_a_look_reads_only_the_rounds_up_to_it(tmp_path):
    """Records of rounds 1..5 on disk (a resumed study finds its later rounds there): the look after round 2
    reads two runs a point, as it did the first time, so the resumed study takes the same decisions."""
    study_dir = _study(tmp_path, 5)
    early = _by_nodes(sequential.decide(study_dir, 2, 7))
    assert early == _by_nodes(sequential.decide(_study(tmp_path / "fresh", 2), 2, 7))
    assert early[1].ratio == pytest.approx(1.30, rel=0.01)
    # the same records read after round 3 give three pairs and another interval
    assert _by_nodes(sequential.decide(study_dir, 3, 7))[1].low != early[1].low


def test_one_point_at_a_node_count_has_nothing_to_compare(tmp_path):
    for r in (1, 2):
        write_run(str(tmp_path), study="one", model="vit_micro", strategy="DDP", nodes=1, ranks_per_node=1,
                  device="cpu", run_id=f"r{r}", repetition=r, time=1.7e9 + r)  # fmt: skip
    (look,) = sequential.decide(str(tmp_path / "one"), 2, 7)
    assert look.decided and look.runner_up is None and look.why == "one point: nothing to compare"


def test_the_levels_spend_at_most_alpha_on_the_interim_looks():
    """Interim looks at 1.5%, 2%, then 0.5%; the last look's level below 5% and shrinking with more looks."""
    assert [sequential.look_level(r, 7) for r in range(2, 8)] == [0.015, 0.02, 0.005, 0.005, 0.005, 0.0131]
    finals = [sequential.FINAL[n] for n in sequential.MAXIMA]
    assert finals == sorted(finals, reverse=True) and max(finals) < sequential.ALPHA
    # the study's own copy of the allowed maxima and the default is the rule's
    assert study_plan.AUTO_MAXIMA == sequential.MAXIMA and study_plan.AUTO_MAX == sequential.DEFAULT_MAX


def _plan(repeat: str):
    return study_plan.make_plan(
        LOCAL,
        {"models": "vit_micro", "strategies": "DDP,FULL_SHARD", "nodes": "1,2", "repeat": repeat},
        [],
        systems.read_system("local"),
        ranks_per_node=1,
        alloc_nodes=0,
    )


def test_auto_plans_two_rounds_and_the_study_adds_one_where_open(tmp_path, capsys):
    """auto:5 plans rounds 1 and 2 of every point; after the look the study appends round 3 for the open
    node count (n2: equal points) only, and after round 5 none."""
    p = _plan("auto:5")
    assert p.adaptive and p.repeat == 5 and {r.repetition for r in p.runs} == {1, 2} and len(p.runs) == 8
    assert _plan("auto").repeat == 7
    run = object.__new__(study_cli.StudyRun)  # the study's state without its Slurm and emulation set-up
    run.plan, run.dry_run, run.one_machine = p, False, False
    run.study_dir = _study(tmp_path, 3)
    p.runs = [dataclasses.replace(pt, repetition=r) for r in (1, 2, 3) for pt in p.points]  # 3 rounds ran
    assert run.next_round() is True
    added = p.runs[12:]
    assert [(x.strategy, x.nodes, x.repetition) for x in added] == [("DDP", 2, 4), ("FULL_SHARD", 2, 4)]
    out = capsys.readouterr().out
    assert "look after round 3 of at most 5 (level 2.00%):" in out
    assert "vit_micro n1: FULL_SHARD / DDP 1.30" in out and ": decided" in out and ": open" in out
    p.runs = p.runs[:8] + [dataclasses.replace(pt, repetition=5) for pt in p.points]  # the last round ran
    assert run.next_round() is False


@pytest.mark.parametrize("value", ["auto:1", "auto:0", "auto:x", "auto:9", "auto:", "sometimes"])
def test_bad_auto_is_one_line(value):
    with pytest.raises(UserError) as caught:
        _plan(value)
    (line,) = str(caught.value).splitlines()
    assert line.startswith(f"--repeat: '{value}' is not allowed; allowed: ") and "auto:N" in line


@pytest.mark.parametrize("value", ["auto:1", "auto:0", "auto:many"])
def test_bad_auto_on_the_command_line_writes_nothing(tmp_path, monkeypatch, capsys, value):
    monkeypatch.chdir(tmp_path)
    argv = ["--system", "local", "--models", "vit_micro", "--strategies", "DDP", "--nodes", "1", "--repeat", value]
    assert study_cli.main([*argv, "--out", "runs"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"vit-scale study: --repeat: '{value}' is not allowed; allowed: auto (at most 7")
    assert os.listdir(tmp_path) == []


def test_a_dry_run_of_auto_prints_two_rounds_and_says_looks_follow(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["--system", "local", "--models", "vit_micro", "--strategies", "DDP,FULL_SHARD", "--nodes", "1,2"]
    assert study_cli.main([*argv, "--ranks-per-node", "1", "--repeat", "auto", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "8 to 28 runs (1 model(s) x 2 strategies x nodes 1,2 x 2 to 7 rounds, more where the comparison is open" in out
    )
    labels = [line for line in out.splitlines() if line.startswith("[")]
    assert len(labels) == 8 and labels[0] == "[1/8] vit_micro DDP n1 (1 rank) round 1 (at most 7)"
    assert labels[-1] == "[8/8] vit_micro FULL_SHARD n2 (2 ranks) round 2 (at most 7)"
    assert out.rstrip().endswith("whose best-against-next comparison is still open run another round, up to round 7 "
                                 "(docs/jobs.md)")  # fmt: skip
    assert os.listdir(tmp_path) == []


def test_a_look_that_cannot_be_made_leaves_every_node_count_open(tmp_path, capsys):
    p = _plan("auto:4")
    run = object.__new__(study_cli.StudyRun)
    run.plan, run.dry_run, run.one_machine, run.study_dir = p, False, False, str(tmp_path / "gone")
    assert run.next_round() is True and [x.repetition for x in p.runs[8:]] == [3, 3, 3, 3]
    out = capsys.readouterr().out
    assert "look after round 2 failed (analysis/sequential.py: " in out and "every node count runs another round" in out
