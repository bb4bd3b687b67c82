"""vit-scale check and its Slurm allocations, on the real Slurm of tests/slurm_fixture.py.

jobs/check.sh against its allocation's end: the check's default --time-limit comes from the job's
time left (less a margin, printed), so the check ends first and writes check.json; and when the
allocation ends first all the same (a --time-limit longer than the job), Slurm's SIGTERM still
leaves check.json, the unfinished parts as timeout lines, exit code 143. One label is made to hang
in its second step (the worker run through a VIT_SCALE_PYTHON that patches the trainer, as
tests/jobs_support.py does for the study), so that neither check can finish on its own.

jobs/submit_sweep.sh --check: each job checks its own nodes into a check.json of its node count
(and model, the study having one), and the report shows each.

sbatch -N 2 jobs/check.sh in full mode: the size sweep and its fits, which the prediction takes as
its calibration.

All three on the session's six-node cluster: the allocation jobs spend most of their time in their hung
label, waiting for their limit, so they are submitted as the session starts (slurm_fixture.start_early)
and wait beside the tests before these (this module took 128 s of the suite's 1057 s in a profile of
2026-11-28, 79 s with the early jobs and the sweep then the full check). The sweep's jobs and the full
check then run side by side (the sweep's ranks leave a core idle); the full check's fits may then be
flagged as noisy, which its test allows, as it must on any busy machine."""

import glob
import json
import os
import re
import subprocess
import time

import pytest

import jobs_support
import slurm_fixture
from conftest import PYTHON, ROOT
from slurm_fixture import slurm_six_nodes  # noqa: F401  (the session fixture)
from test_check import assert_calibrates, assert_fits, valid_check
from test_check import lines_of as lines_by_name

CHECK_SH = os.path.join(ROOT, "jobs", "check.sh")
SUBMIT_SWEEP = os.path.join(ROOT, "jobs", "submit_sweep.sh")
# the parts whose lines are asserted: the strategy labels (and the environment, which names the ranks' nodes);
# the meter and the GEMM timing run on rank 0 before any label, while the other ranks wait. One rank: what is
# asserted is how the check ends against its allocation's, not what its ranks do together
ARGS = ["--system", "local", "--quick", "--only", "environment,strategies", "--ranks-per-node", "1"]
ARGS += ["--strategies", "DDP,FULL_SHARD,NO_SHARD", "--out", "check"]
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


def submit_allocation_jobs(cluster, tmp) -> dict:
    """The two allocation jobs, submitted in `tmp` (as the session starts: slurm_fixture.start_early)."""
    derived, stopped = tmp / "derived", tmp / "stopped"
    jobs = {}
    for work, sbatch, extra in ((derived, ["--time=2"], []), (stopped, ["--time=1"], ["--time-limit", "30"])):
        work.mkdir()
        jobs[work] = cluster.sbatch(
            ["-N", "1", *sbatch, CHECK_SH, *ARGS, *extra],
            cwd=work,
            VIT_SCALE_PYTHON=hanging_python(work),
            VIT_SCALE_STOP_GRACE_S="3",
        )
    return {"derived": derived, "stopped": stopped, "jobs": jobs}


slurm_fixture.EARLY_JOBS["allocation_jobs"] = submit_allocation_jobs


@pytest.fixture(scope="module")
def allocation_jobs(slurm_six_nodes, tmp_path_factory):  # noqa: F811
    """The two allocation jobs: submitted as the session started when it could, else now."""
    return slurm_fixture.early("allocation_jobs") or submit_allocation_jobs(
        slurm_six_nodes, tmp_path_factory.mktemp("allocations")
    )


@pytest.fixture(scope="module")
def submitted(slurm_six_nodes, allocation_jobs, tmp_path_factory):  # noqa: F811
    """The two allocation jobs; once both are past DDP (the label each must finish: on a loaded
    machine the work beside it could otherwise hold it past its limit) the sweep, waited for; then
    the full check. Returns the cluster, the folders and the job ids."""
    cluster = slurm_six_nodes
    tmp = tmp_path_factory.mktemp("allocations")
    derived, stopped, jobs = allocation_jobs["derived"], allocation_jobs["stopped"], allocation_jobs["jobs"]
    sweep, full = tmp / "sweep", tmp / "full"
    deadline = time.monotonic() + 400
    while not (ended(derived, "DDP") and ended(stopped, "DDP")) and time.monotonic() < deadline:
        time.sleep(1)
    sweep.mkdir()
    n1, n2, analysis = submit_sweep_with_check(cluster, sweep)
    full.mkdir()
    # full mode's size sweep and fits, a label across the two nodes; not the meter, the GEMMs or the nodes part
    # (tests/test_check.py and tests/test_emulation.py run those); queued until two nodes are free
    parts = "environment,interconnect,strategies"
    full_job = cluster.sbatch(
        ["-N", "2", CHECK_SH, "--system", "local", "--only", parts, "--strategies", "HYBRID_2GPU", "--out", "check"],
        cwd=full,
    )
    cluster.wait([n1, n2, analysis], timeout=900)
    return {
        "cluster": cluster,
        "derived": derived,
        "stopped": stopped,
        "jobs": jobs,
        "sweep": (sweep, n1, n2, analysis),
        "full": (full, full_job),
    }


def test_check_jobs_end_before_their_allocations_or_write_check_json_if_stopped(submitted):
    cluster, jobs = submitted["cluster"], submitted["jobs"]
    cluster.wait(list(jobs.values()), timeout=900)
    check_job_ends_before_its_allocation_or_writes_check_json_if_stopped(
        cluster, submitted["derived"], submitted["stopped"], jobs
    )


def test_the_sweeps_checks_keep_each_node_counts_check_and_the_report_shows_it(submitted):
    sweep_check_keeps_each_node_counts_check_and_the_report_shows_it(submitted["cluster"], *submitted["sweep"])


def test_check_job_on_two_slurm_nodes(submitted):
    """sbatch -N 2 jobs/check.sh: one srun step over both nodes, through env/local.sh, in full mode (the parts
    whose lines are asserted here)."""
    cluster, (work, job) = submitted["cluster"], submitted["full"]
    cluster.wait([job], timeout=900)
    output = (work / f"vit-check-{job}.out").read_text()
    info = cluster.job(job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", output
    assert "check.sh: ready -> " in output
    check = valid_check(work / "check" / "check.json")
    assert check["ok"] and check["nodes"] == 2 and check["launch"]["kind"] == "srun"
    assert check["slurm"]["job_id"] == job
    # the ranks ran on the job's two nodes (of six)
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", info["NodeList"]], env=cluster.env(), capture_output=True, text=True
    ).stdout.split()
    assert sorted({r["node"] for r in check["facts"]["ranks"]}) == sorted(hosts) and len(hosts) == 2, hosts
    assert {m["scope"] for m in check["facts"]["interconnect"]["measurements"]} == {"node", "world"}
    assert lines_by_name(check)["HYBRID_2GPU fp32"]["status"] == "ok"
    # full mode: at least 8 sizes from 8 B to the largest message, per collective and scope, fitted
    measured = check["facts"]["interconnect"]["measurements"]
    assert min(m["bytes"] for m in measured) <= 16 and max(m["bytes"] for m in measured) >= 25 * 2**20
    assert all(m["repeats"] == 3 and m["spread_s"] >= 0 for m in measured)
    assert_fits(
        check,
        min_sizes=8,
        pairs={(c, s) for c in ("all_reduce", "all_gather", "reduce_scatter") for s in ("intra", "inter")},
    )
    assert_calibrates(check, str(work / "check" / "check.json"))


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
            "--ranks-per-node",  # each job's check and run: one rank a node is what this test needs
            "1",
            "--set",
            "train.health_probe_s=0.1",  # the node-health probe after each run, shortened (it defaults to 1 s)
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
