"""A local study's orchestrator killed outright (SIGKILL) in the middle of a run: its trainer
processes end with it (they get SIGTERM from the kernel and write a timeout record) instead of
running on unattended with parent 1, and the resumed study runs that run again, with one ledger
row per run. Also: a run recorded ok that its study never saw end (no ledger row) is not taken as
ok on resume without saying so. Real studies on emulated nodes, vit_micro; the run is made slow in
its second step by a VIT_SCALE_PYTHON that patches the trainer (tests/jobs_support.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from jobs_support import job_env, python_injecting

STUDY = [
    "--system",
    "local",
    "--models",
    "vit_micro",
    "--strategies",
    "FULL_SHARD,DDP",
    "--nodes",
    "2",
    "--ranks-per-node",
    "1",
    "--steps",
    "4",
    "--warmup-steps",
    "1",
    "--batch-size",
    "2",
    "--study",
    "k",
    "--out",
    "runs",
    "--no-analysis",
    "--repeat",
    "1",
    "--set",
    "train.health_probe_s=0.1",  # the node-health probe after each run, shortened (it defaults to 1 s)
]


def start_study(cwd, args, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "vit_scale", "study", *args],
        cwd=cwd,
        env=job_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def trainers_of(out_dir) -> list:
    """The pids of trainer processes writing under out_dir."""
    marker = f"output.dir={out_dir}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def stepped(study_dir, strategy: str) -> bool:
    """Whether a run of `strategy` has recorded a training step."""
    import glob

    for path in glob.glob(os.path.join(study_dir, "vit_micro", strategy, "n2", "*", "metrics.jsonl")):
        with open(path) as f:
            if any(json.loads(line).get("event") == "step" for line in f if line.strip()):
                return True
    return False


def ledger_rows(study_dir) -> list:
    lines = (study_dir / "study_runs.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


@pytest.fixture(scope="module")
def killed_then_resumed(tmp_path_factory):
    """The study of both tests: its orchestrator SIGKILLed in DDP's run, the trainers it leaves, then the
    study resumed. test_an_ok_run_... goes on from its finished study (one study's runs fewer)."""
    tmp_path = tmp_path_factory.mktemp("orphans")
    study_dir, out = tmp_path / "runs" / "k", tmp_path / "runs"
    # DDP sleeps two minutes in its second step: the orchestrator is killed in there
    slow = python_injecting(tmp_path, "slow", 'self.cfg.strategy == "DDP"', "time.sleep(120)")
    proc = start_study(tmp_path, STUDY, VIT_SCALE_PYTHON=slow)
    deadline = time.monotonic() + 300
    while not stepped(study_dir, "DDP") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    running = proc.poll() is None and stepped(study_dir, "DDP")
    if not running:
        proc.kill()
    assert running, proc.communicate()
    trainers = len(trainers_of(out))
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)

    # the trainers end with their orchestrator: nothing of the run is left
    deadline = time.monotonic() + 45
    while trainers_of(out) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = trainers_of(out)
    for pid in left:  # not this test's to leave behind
        os.kill(pid, signal.SIGKILL)

    resumed = study(tmp_path, STUDY)
    return tmp_path, trainers, left, resumed, ledger_rows(study_dir)


def study(cwd, args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vit_scale", "study", *args],
        cwd=cwd,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_killed_orchestrator_takes_its_runs_with_it_and_the_resumed_study_reruns_them(killed_then_resumed):
    _, trainers, left, resumed, rows = killed_then_resumed
    assert trainers == 2
    assert left == [], "trainer processes outlived their killed study"
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "[1/2] vit_micro FULL_SHARD n2 (2 ranks) ... ok earlier, skipped" in resumed.stdout, resumed.stdout
    assert "[2/2] vit_micro DDP n2 (2 ranks) ... ok " in resumed.stdout, resumed.stdout
    assert [(r["strategy"], r["status"]) for r in rows] == [("FULL_SHARD", "ok"), ("DDP", "ok")], rows
    assert len({r["run_dir"] for r in rows}) == len(rows)


def test_an_ok_run_its_study_never_saw_end_is_run_again_saying_why(killed_then_resumed):
    """The record of a run that ended after its study had died: ok, but without the ledger row the
    study writes once it has seen the run end (here: DDP's row taken out of the resumed study's ledger).
    A study directory moved, or reached through a link, keeps its runs: nothing reruns."""
    tmp_path, _, _, resumed, _ = killed_then_resumed
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    ledger = tmp_path / "runs" / "k" / "study_runs.tsv"
    (run_dir,) = [r["run_dir"] for r in ledger_rows(tmp_path / "runs" / "k") if r["strategy"] == "DDP"]
    ledger.write_text("".join(line for line in ledger.read_text().splitlines(True) if run_dir not in line))

    again = study(tmp_path, STUDY)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        f"[2/2] vit_micro DDP n2 (2 ranks): {run_dir} says ok, but it has no ledger row: its study was killed "
        f"before the run ended, which then ran unattended; running it again"
    ) in again.stdout, again.stdout
    assert "[2/2] vit_micro DDP n2 (2 ranks) ... ok " in again.stdout
    assert "[1/2] vit_micro FULL_SHARD n2 (2 ranks) ... ok earlier, skipped" in again.stdout, again.stdout
    rows = ledger_rows(tmp_path / "runs" / "k")
    # the rerun's row, once
    assert [r["strategy"] for r in rows] == ["FULL_SHARD", "DDP"] and rows[1]["run_dir"] != run_dir, rows

    # the finished study moved, then reached through a symbolic link: its runs are still its own, each skipped
    # without a word of unattended runs, and no row is added
    (tmp_path / "runs").rename(tmp_path / "moved")
    (tmp_path / "link").symlink_to(tmp_path / "moved")
    for out in ("moved", "link"):
        moved = [*STUDY[: STUDY.index("--out") + 1], out, *STUDY[STUDY.index("--out") + 2 :]]
        resumed = study(tmp_path, moved)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert resumed.stdout.count("ok earlier, skipped") == 2, resumed.stdout
        assert "unattended" not in resumed.stdout, resumed.stdout
        assert len(ledger_rows(tmp_path / "moved" / "k")) == 2
