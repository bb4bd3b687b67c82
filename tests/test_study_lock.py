"""A study directory in use is locked (vit_scale/study/lock.py): of two studies started at once on
the same --out one runs and the other is refused in one line naming it, changing nothing; a lock
whose holder is gone (its process ended, its Slurm job ended, this same job before a requeue) is
taken over with one line naming it; SIGTERM releases the lock; the jobs of a sweep (other node
counts) share the directory. Real studies and processes; Slurm is the local cluster of
tests/slurm_fixture.py. A lock of "another machine" is written by the test: it cannot exist here."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from jobs_support import job_env
from slurm_fixture import slurm_cluster  # noqa: F401  (the session fixture)
from vit_scale.errors import UserError
from vit_scale.study import lock

WEAK_SCALING = os.path.join(ROOT, "jobs", "weak_scaling.sh")
STUDY = [
    "--system",
    "local",
    "--models",
    "vit_micro",
    "--strategies",
    "DDP",
    "--nodes",
    "1",
    "--ranks-per-node",
    "1",
    "--steps",
    "2",
    "--warmup-steps",
    "1",
    "--batch-size",
    "2",
    "--study",
    "s",
    "--out",
    "runs",
    "--no-analysis",
    "--repeat",
    "1",
    "--set",
    "train.health_probe_s=0.1",  # the node-health probe after each run, shortened (it defaults to 1 s)
]
COMMAND = "weak_scaling.sh " + " ".join(STUDY)

# VIT_SCALE_PYTHON under which a trainer run waits for the file GO before it starts: the study
# holding the directory is then still at its first run when the other one looks
WAITING_PYTHON = """#!/bin/bash
if [ "${{1:-}} ${{2:-}} ${{3:-}}" = "-m vit_scale train" ]; then
  while [ ! -e {go} ]; do sleep 0.05; done
fi
exec {python} "$@"
"""


def waiting_python(tmp_path) -> str:
    path = tmp_path / "python-waiting"
    path.write_text(WAITING_PYTHON.format(go=tmp_path / "GO", python=sys.executable))
    path.chmod(0o755)
    return str(path)


def start_study(cwd, **env) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", WEAK_SCALING, *STUDY],
        cwd=cwd,
        env=job_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def study(cwd, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", WEAK_SCALING, *STUDY], cwd=cwd, env=job_env(**env), capture_output=True, text=True, timeout=300
    )


def ledger(study_dir) -> list:
    return (study_dir / "study_runs.tsv").read_text().splitlines()[1:]


def locks(study_dir) -> list:
    return sorted(os.listdir(study_dir / lock.LOCK_DIR))


def plant_lock(study_dir, **facts) -> None:
    """A lock file as the holder `facts` describe would have left it."""
    record = {**lock.this_process("weak_scaling.sh --out runs (the holder)"), **facts}
    with open(lock.lock_path(str(study_dir), "vit_micro", 1), "w") as f:
        json.dump(record, f)


@pytest.fixture(scope="module")
def raced(tmp_path_factory):
    """Two identical studies started at once on one --out; the one that gets the directory waits
    at its first run until the other has ended."""
    work = tmp_path_factory.mktemp("raced")
    python = waiting_python(work)
    procs = [start_study(work, VIT_SCALE_PYTHON=python) for _ in range(2)]
    deadline = time.monotonic() + 60
    while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    (work / "GO").touch()
    results = {}
    for p in procs:
        out, err = p.communicate(timeout=300)
        results[p.pid] = (p.returncode, out, err)
    return work, work / "runs" / "s", results


def test_two_studies_at_once_one_runs_the_other_is_refused_naming_it(raced):
    work, study_dir, results = raced
    codes = sorted(code for code, _, _ in results.values())
    assert codes == [0, 2], results
    ((winner, (_, out, _)),) = [(pid, r) for pid, r in results.items() if r[0] == 0]
    ((_, refused_out, refused_err),) = [r for r in results.values() if r[0] == 2]
    assert refused_out == ""
    (line,) = refused_err.splitlines()
    host = socket.gethostname()
    assert line.startswith(f"weak_scaling.sh: {study_dir} is in use by process {winner} on {host} ("), line
    assert line.endswith(f": {COMMAND}), which is running; wait for it to end (or stop it), or use another --out"), line
    assert "[1/1] vit_micro DDP n1 (1 rank) ... ok " in out, out
    # each run once: one record, one log, one ledger line, all of the winner's
    (row,) = ledger(study_dir)
    assert row.split("\t")[9] == "ok" and f"-p{winner}.1" in row, row
    assert len(os.listdir(study_dir / "vit_micro" / "DDP" / "n1")) == 1
    assert len(os.listdir(study_dir / "logs")) == 1
    assert locks(study_dir) == []


def test_lock_of_a_killed_study_is_taken_over(raced):
    """Its holder SIGKILLed (nothing could release the lock), the next study takes it with one line
    and resumes: the run recorded ok is skipped."""
    work, study_dir, _ = raced
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom vit_scale.study.lock import StudyLock\n"
            f"StudyLock({str(study_dir)!r}, [('vit_micro', 1)], 'weak_scaling.sh (killed)', 'x').__enter__()\n"
            "print('held', flush=True)\ntime.sleep(300)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    assert locks(study_dir) == ["vit_micro.n1.lock"]
    before = len(ledger(study_dir))

    proc = study(work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    host = socket.gethostname()
    assert line.startswith(f"weak_scaling.sh: took over {study_dir} from process {holder.pid} on {host} (")
    assert line.endswith(": weak_scaling.sh (killed)), which has ended"), line
    assert "[1/1] vit_micro DDP n1 (1 rank) ... ok earlier, skipped" in proc.stdout
    # one ledger row per run: the run skipped as ok earlier is in it already
    assert len(ledger(study_dir)) == before and locks(study_dir) == []


def test_lock_of_a_slurm_job_elsewhere_holds_while_the_job_runs(slurm_cluster, raced):  # noqa: F811
    """A holder on another machine (written by the test) is judged by its Slurm job in the real
    local cluster: running, the study is refused; ended, the lock is taken over."""
    work, study_dir, _ = raced
    env = slurm_cluster.env()
    running = slurm_cluster.sbatch(["--wrap", "sleep 300"], cwd=work)
    finished = slurm_cluster.sbatch(["--wrap", "true"], cwd=work)
    try:
        slurm_cluster.wait([finished], timeout=60)
        deadline = time.monotonic() + 30
        while slurm_cluster.job(running).get("JobState") != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        elsewhere = dict(host="n2", pid=4242, boot_id="another machine")
        slurm = dict(step_id="batch", restart_count=0, cluster="vitscale", node="n2")
        before = ledger(study_dir)

        plant_lock(study_dir, **elsewhere, slurm=dict(slurm, job_id=running))
        proc = study(work, SLURM_CONF=env["SLURM_CONF"])
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        (line,) = proc.stderr.splitlines()
        assert f"is in use by Slurm job {running} (n2 pid 4242, " in line, line
        assert line.endswith("which is running (job RUNNING); wait for it to end (or stop it), or use another --out")
        assert ledger(study_dir) == before and locks(study_dir) == ["vit_micro.n1.lock"]

        plant_lock(study_dir, **elsewhere, slurm=dict(slurm, job_id=finished))
        proc = study(work, SLURM_CONF=env["SLURM_CONF"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"weak_scaling.sh: took over {study_dir} from Slurm job {finished} (n2 pid 4242, ")
        assert line.endswith("which has ended (job COMPLETED)"), line
        assert "ok earlier, skipped" in proc.stdout and locks(study_dir) == []
    finally:
        subprocess.run(["scancel", running], env=env, timeout=30)


def test_sigterm_ends_the_study_and_releases_its_lock(tmp_path):
    proc = start_study(tmp_path, VIT_SCALE_PYTHON=waiting_python(tmp_path))
    lock_file = lock.lock_path(str(tmp_path / "runs" / "s"), "vit_micro", 1)
    deadline = time.monotonic() + 60
    while not os.path.exists(lock_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # at its run by now
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    assert "interrupted after 1 of 1 runs" in out
    assert locks(tmp_path / "runs" / "s") == []


def test_other_node_counts_share_the_directory_overlapping_ones_do_not(tmp_path):
    """The jobs of jobs/submit_sweep.sh: one node count each, side by side on one study directory."""
    study_dir = str(tmp_path / "s")
    with (
        lock.StudyLock(study_dir, [("vit_micro", 1)], "sweep job n1", "x"),
        lock.StudyLock(study_dir, [("vit_micro", 2)], "sweep job n2", "x"),
    ):
        with pytest.raises(UserError, match=f"in use by process {os.getpid()} .*: sweep job n1\\), which is running"):
            with lock.StudyLock(study_dir, [("vit_micro", 2), ("vit_micro", 1)], "the whole study", "x"):
                pass
        assert locks(tmp_path / "s") == ["vit_micro.n1.lock", "vit_micro.n2.lock"]
    assert locks(tmp_path / "s") == []


def test_who_holds_a_lock(tmp_path, monkeypatch):
    """The decisions that need what this machine cannot be: another machine, a requeued job."""
    me = lock.this_process("me")
    elsewhere = dict(me, host="n2", pid=4242, boot_id="another machine")
    # a pid recycled for another process is not the holder
    assert lock.holder_state(dict(me, process_start="1"), me)[0] == "gone"
    assert lock.holder_state(me, me) == ("held", "is running")
    # another machine and no Slurm job: nobody can tell; the refusal says which file to remove
    os.makedirs(tmp_path / lock.LOCK_DIR)
    plant_lock(tmp_path, **dict(elsewhere, slurm=None))
    with pytest.raises(UserError) as refused:
        lock.StudyLock(str(tmp_path), [("vit_micro", 1)], "me", "x").__enter__()
    assert str(refused.value).endswith(
        "which runs on another machine, where it cannot be checked from here; if it has ended: "
        f"rm {lock.lock_path(str(tmp_path), 'vit_micro', 1)}; or use another --out"
    ), refused.value
    # a requeued job keeps its id: its own earlier start is gone, a step of this start is not
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    me = lock.this_process("me")
    job = dict(job_id="77", step_id="batch", cluster="c", node="n2")
    assert lock.holder_state(dict(elsewhere, slurm=dict(job, restart_count=0)), me) == (
        "gone",
        "was this job before it was requeued",
    )
    assert lock.holder_state(dict(elsewhere, slurm=dict(job, restart_count=1)), me)[0] == "held"
    assert lock.holder_state(dict(elsewhere, slurm=dict(job, job_id="78", cluster="frontier")), me)[0] == "unknown"


def ended_process() -> dict:
    """The lock record of a study process on this machine that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    return dict(lock.this_process("weak_scaling.sh (ended)"), pid=proc.pid)


def plant_guard(path: str, holder: dict, skew_s: float) -> str:
    """A takeover guard of `holder` whose mtime is off from this host's clock by skew_s, as a file
    server (or, on Lustre, the writing client) whose clock is that far from ours stamps it."""
    guard = path + ".takeover"
    with open(guard, "w") as f:
        json.dump(holder, f)
    now = time.time()
    os.utime(guard, (now + skew_s, now + skew_s))
    return guard


def test_a_live_takeover_guard_holds_whatever_its_mtime_says(tmp_path):
    """Another machine's study is taking over a stale lock, its guard's mtime 2 minutes behind our
    clock: this study waits for it instead of breaking the guard, and is refused once it holds the
    lock (before, the guard looked 120 s old and both studies took the lock over)."""
    os.makedirs(tmp_path / lock.LOCK_DIR)
    path = lock.lock_path(str(tmp_path), "vit_micro", 1)
    plant_lock(tmp_path, **ended_process())
    other = dict(
        lock.this_process("weak_scaling.sh (elsewhere)"), host="n2", pid=4242, boot_id="another machine", slurm=None
    )
    guard = plant_guard(path, other, -120)

    def other_finishes():  # its takeover ends a second later, as a slow file server can make it
        time.sleep(1.0)
        with open(path + ".new", "w") as f:
            json.dump(other, f)
        os.replace(path + ".new", path)
        os.unlink(guard)

    import threading

    finishing = threading.Thread(target=other_finishes)
    finishing.start()
    try:
        with pytest.raises(lock.Refused) as refused:
            lock.take(path, lock.this_process("me"))
    finally:
        finishing.join()
    assert refused.value.holder["token"] == other["token"]
    with open(path) as f:
        assert json.load(f)["token"] == other["token"]


def test_a_guard_left_by_a_dead_takeover_is_broken_by_our_own_clock(tmp_path, monkeypatch):
    """A guard whose writer died on another machine, its mtime 2 minutes ahead of our clock: after
    TAKEOVER_STALE_S of this study's own clock it is broken and the stale lock taken over (before,
    it never aged and every later study was refused)."""
    monkeypatch.setattr(lock, "TAKEOVER_STALE_S", 1.5)
    os.makedirs(tmp_path / lock.LOCK_DIR)
    path = lock.lock_path(str(tmp_path), "vit_micro", 1)
    ended = ended_process()
    plant_lock(tmp_path, **ended)
    dead = dict(
        lock.this_process("weak_scaling.sh (died in its takeover)"),
        host="n2",
        pid=4242,
        boot_id="another machine",
        slurm=None,
    )
    guard = plant_guard(path, dead, 120)
    me = lock.this_process("me")
    started = time.monotonic()
    old = lock.take(path, me)
    assert time.monotonic() - started >= 1.5
    assert old["token"] == ended["token"] and old["why"] == "has ended"
    with open(path) as f:
        assert json.load(f)["token"] == me["token"]
    assert not os.path.exists(guard)
