"""jobs/check.sh against its allocation's end, on the real Slurm of tests/slurm_fixture.py: the
check's default --time-limit comes from the job's time left (less a margin, printed), so the check
ends first and writes check.json; and when the allocation ends first all the same (a --time-limit
longer than the job), Slurm's SIGTERM still leaves check.json, the unfinished parts as timeout
lines, exit code 143. One label is made to hang in its second step (the worker run through a
VIT_SCALE_PYTHON that patches the trainer, as tests/jobs_support.py does for the study), so that
neither check can finish on its own."""
import json
import os
import re

import jobs_support
from conftest import PYTHON, ROOT
from slurm_fixture import slurm_cluster  # noqa: F401  (the session fixture)

CHECK_SH = os.path.join(ROOT, "jobs", "check.sh")
ARGS = ["--system", "local", "--quick", "--strategies", "DDP,FULL_SHARD,NO_SHARD", "--out", "check"]
WORKER = "from vit_scale.check import worker  # noqa: E402\nsys.exit(worker.main(sys.argv[1:]))"
WRAPPER = '''#!/bin/bash
if [ "${{1:-}} ${{2:-}}" = "-m vit_scale.check.worker" ]; then
  shift 2
  exec {python} {inject} "$@"
fi
exec {python} "$@"
'''


def hanging_python(work) -> str:
    """FULL_SHARD sleeps in its second step, ignoring nothing: only a stop ends it."""
    inject, wrapper = work / "inject_hang.py", work / "python-hanging"
    inject.write_text(jobs_support.INJECT.format(when='self.cfg.strategy == "FULL_SHARD"',
                                                 action="time.sleep(3600)", entry=WORKER))
    wrapper.write_text(WRAPPER.format(python=PYTHON, inject=inject))
    wrapper.chmod(0o755)
    return str(wrapper)


def lines_of(path) -> dict:
    with open(path) as f:
        return {line["check"]: line for line in json.load(f)["lines"]}


def test_check_job_ends_before_its_allocation_or_writes_check_json_when_stopped(slurm_cluster, tmp_path):  # noqa: F811
    derived, stopped = tmp_path / "derived", tmp_path / "stopped"
    jobs = {}
    for work, sbatch, extra in ((derived, ["--time=3"], []), (stopped, ["--time=2"], ["--time-limit", "30"])):
        work.mkdir()
        jobs[work] = slurm_cluster.sbatch(["-N", "1", *sbatch, CHECK_SH, *ARGS, *extra], cwd=work,
                                          VIT_SCALE_PYTHON=hanging_python(work), VIT_SCALE_STOP_GRACE_S="3")
    slurm_cluster.wait(list(jobs.values()), timeout=400)

    # the default limit: the job's 3 minutes left, less the margin; the check stops itself and says so
    job = jobs[derived]
    output = (derived / f"vit-check-{job}.out").read_text()
    assert re.search(rf"  time limit: 1\.[89] min \(job {job} has [23]\.\d+ min left, less a 1\.0 min margin to stop the "
                     rf"ranks and write check\.json\)", output), output
    info = slurm_cluster.job(job)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", (info, output)
    found = lines_of(derived / "check" / "check.json")
    assert found["DDP fp32"]["status"] == "ok", found
    assert found["FULL_SHARD fp32"]["text"].startswith("timeout: stopped at --time-limit 1."), found
    assert found["NO_SHARD fp32"]["text"].startswith("timeout: not started"), found

    # the allocation ends first: Slurm's SIGTERM, KillWait (5 s here) before its SIGKILL
    job = jobs[stopped]
    output = (stopped / f"vit-check-{job}.out").read_text()
    assert "  time limit: 30 min (--time-limit)" in output, output
    info = slurm_cluster.job(job)
    assert info["JobState"] == "TIMEOUT", (info, output)
    assert "check.sh: stopped by a signal; check.json written from what the ranks had reported" in output, output
    found = lines_of(stopped / "check" / "check.json")
    assert found["DDP fp32"]["status"] == "ok", found
    for name in ("FULL_SHARD fp32", "NO_SHARD fp32"):
        assert found[name]["status"] == "fail" and found[name]["text"].startswith("timeout: "), found[name]
    assert "stopped by a signal" in found["FULL_SHARD fp32"]["text"]
