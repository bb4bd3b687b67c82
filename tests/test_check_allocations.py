"""vit-scale check and its Slurm allocations, on the real Slurm of tests/slurm_fixture.py.

jobs/check.sh against its allocation's end: the check's default --time-limit comes from the job's
time left (less a margin, printed), so the check ends first and writes check.json; and when the
allocation ends first all the same (a --time-limit longer than the job), Slurm's SIGTERM still
leaves check.json, the unfinished parts as timeout lines, exit code 143. One label is made to hang
in its second step (the worker run through a VIT_SCALE_PYTHON that patches the trainer, as
tests/jobs_support.py does for the study), so that neither check can finish on its own.

jobs/submit_sweep.sh --check: each job checks its own nodes into a check.json of its node count
(and model, the study having one), and the report shows each."""

import glob
import json
import os
import re
import subprocess
import time

import jobs_support
from conftest import PYTHON, ROOT
from slurm_fixture import slurm_four_nodes  # noqa: F401  (the session fixture)

CHECK_SH = os.path.join(ROOT, "jobs", "check.sh")
SUBMIT_SWEEP = os.path.join(ROOT, "jobs", "submit_sweep.sh")
ARGS = ["--system", "local", "--quick", "--strategies", "DDP,FULL_SHARD,NO_SHARD", "--out", "check"]
WORKER = "from vit_scale.check import worker  # noqa: E402\nsys.exit(worker.main(sys.argv[1:]))"
WRAPPER = """#!/bin/bash
if [ "${{1:-}} ${{2:-}}" = "-m vit_scale.check.worker" ]; then
  shift 2
  exec {python} {inject} "$@"
fi
exec {python} "$@"
"""


def hanging_python(work) -> str:
    """FULL_SHARD sleeps in its second step, ignoring nothing: only a stop ends it."""
    inject, wrapper = work / "inject_hang.py", work / "python-hanging"
    inject.write_text(
        jobs_support.INJECT.format(when='self.cfg.strategy == "FULL_SHARD"', action="time.sleep(3600)", entry=WORKER)
    )
    wrapper.write_text(WRAPPER.format(python=PYTHON, inject=inject))
    wrapper.chmod(0o755)
    return str(wrapper)


def lines_of(path) -> dict:
    with open(path) as f:
        return {line["check"]: line for line in json.load(f)["lines"]}


def ended(work, strategy: str) -> bool:
    """Whether the check's run of `strategy` under work has written its end record."""
    for path in glob.glob(str(work / "check" / "records" / "**" / strategy / "**" / "metrics.jsonl"), recursive=True):
        with open(path) as f:
            if any(json.loads(line).get("event") == "end" for line in f if line.strip()):
                return True
    return False


def test_check_jobs_against_their_allocations_and_the_sweeps_checks(slurm_four_nodes, tmp_path):  # noqa: F811
    """One test on four emulated nodes: the two allocation jobs spend most of their time in their hung
    label, waiting for their limit, and the sweep's jobs run meanwhile on the other nodes (as two
    tests, one after the other, they took the allocations' minutes and then the sweep's)."""
    cluster = slurm_four_nodes
    derived, stopped = tmp_path / "derived", tmp_path / "stopped"
    jobs = {}
    for work, sbatch, extra in ((derived, ["--time=2"], []), (stopped, ["--time=1"], ["--time-limit", "30"])):
        work.mkdir()
        jobs[work] = cluster.sbatch(
            ["-N", "1", *sbatch, CHECK_SH, *ARGS, *extra],
            cwd=work,
            VIT_SCALE_PYTHON=hanging_python(work),
            VIT_SCALE_STOP_GRACE_S="3",
        )
    # the sweep once both checks are past DDP, the label each must finish (on a loaded machine the
    # sweep's work beside it could otherwise hold it past its limit)
    deadline = time.monotonic() + 400
    while not (ended(derived, "DDP") and ended(stopped, "DDP")) and time.monotonic() < deadline:
        time.sleep(1)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    n1, n2, analysis = submit_sweep_with_check(cluster, sweep)
    cluster.wait([*jobs.values(), n1, n2, analysis], timeout=900)
    check_job_ends_before_its_allocation_or_writes_check_json_if_stopped(cluster, derived, stopped, jobs)
    sweep_check_keeps_each_node_counts_check_and_the_report_shows_it(cluster, sweep, n1, n2, analysis)


def check_job_ends_before_its_allocation_or_writes_check_json_if_stopped(cluster, derived, stopped, jobs):
    # the default limit: the job's 2 minutes left, less the margin; the check stops itself and says so
    job = jobs[derived]
    output = (derived / f"vit-check-{job}.out").read_text()
    assert re.search(
        # 2 minutes less the 1 minute margin, but at least half of what is left, less the seconds the
        # job took to start (shown to a tenth)
        rf"  time limit: (0\.[5-9]|1) min \(job {job} has [12]\.\d min left, less a 1\.0 min margin to "
        rf"stop the ranks and write check\.json\)",
        output,
    ), output
    info = cluster.job(job)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", (info, output)
    found = lines_of(derived / "check" / "check.json")
    assert found["DDP fp32"]["status"] == "ok", found
    assert found["FULL_SHARD fp32"]["text"].startswith("timeout: stopped at --time-limit "), found
    assert found["NO_SHARD fp32"]["text"].startswith("timeout: not started"), found

    # the allocation ends first: Slurm's SIGTERM, KillWait (5 s here) before its SIGKILL
    job = jobs[stopped]
    output = (stopped / f"vit-check-{job}.out").read_text()
    assert "  time limit: 30 min (--time-limit)" in output, output
    info = cluster.job(job)
    assert info["JobState"] == "TIMEOUT", (info, output)
    assert "check.sh: stopped by a signal; check.json written from what the ranks had reported" in output, output
    found = lines_of(stopped / "check" / "check.json")
    assert found["DDP fp32"]["status"] == "ok", found
    for name in ("FULL_SHARD fp32", "NO_SHARD fp32"):
        assert found[name]["status"] == "fail" and found[name]["text"].startswith("timeout: "), found[name]
    # the label running then: stopped by the signal (its own record, or the orchestrator's line)
    assert found["FULL_SHARD fp32"]["text"].startswith("timeout: stopped by"), found["FULL_SHARD fp32"]


def submit_sweep_with_check(cluster, tmp_path) -> list:
    proc = subprocess.run(
        [
            SUBMIT_SWEEP,
            "--system",
            "local",
            "--models",
            "vit_micro",
            "--strategies",
            "DDP",
            "--nodes",
            "1,2",
            "--steps",
            "3",
            "--warmup-steps",
            "1",
            "--batch-size",
            "2",
            "--study",
            "sw",
            "--out",
            "runs",
            "--logs",
            "logs",
            "--check",
            "--repeat",
            "1",
        ],
        cwd=tmp_path,
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def sweep_check_keeps_each_node_counts_check_and_the_report_shows_it(cluster, tmp_path, n1, n2, analysis):
    jobs = {name: cluster.job(i) for name, i in (("n1", n1), ("n2", n2), ("analysis", analysis))}
    logs = {name: (tmp_path / "logs" / f"{j['JobName']}-{j['JobId']}.out").read_text() for name, j in jobs.items()}
    assert all(j["JobState"] == "COMPLETED" for j in jobs.values()), (jobs, logs)

    study = tmp_path / "runs" / "sw"
    for nodes, job in ((1, n1), (2, n2)):
        with open(study / f"check-n{nodes}-vit_micro.json") as f:  # a study of one model: its name too
            check = json.load(f)
        assert check["ok"] and check["nodes"] == nodes and check["slurm"]["job_id"] == job, check["lines"]
    assert (study / "check.json").is_file()  # the latest, as one allocation's study has it
    # each job's summary names its own check; the analysis job's names both
    assert logs["n1"].count("  check:       ") == 1 and logs["n2"].count("  check:       ") == 1, logs
    assert "  check:       n1: ready (" in logs["analysis"] and "  check:       n2: ready (" in logs["analysis"]
    report = (tmp_path / "report" / "sw" / "report.md").read_text()
    assert "## System check: 1 node\n" in report and "## System check: 2 nodes\n" in report, report
    assert report.index("## System check: 1 node") < report.index("## System check: 2 nodes")
    assert "before its runs on 2 nodes" in report
