"""The isolated emulation for real (root, ip, a cgroup cpu controller): a study whose orchestrator is
SIGKILLed leaves namespaces and CPU groups that the next study removes before it starts; that next study
runs DDP on 2 isolated nodes, its records say `emulation: isolated`, and once it ends nothing of either
is left. Speeds are measured in benchmarks/prediction_accuracy.py, not here."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import IN_CI, PYTHON, ROOT
from vit_scale.cluster import emulation
from vit_scale.cluster.systems import read_system

REASON = emulation.why_not(read_system("local").emulation, 2)
pytestmark = pytest.mark.skipif(REASON is not None and not IN_CI, reason=f"isolated emulation: {REASON}")


def study(out, name, *extra):
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "VIT_SCALE_PYTHON": PYTHON,
        "VIT_SCALE_EMULATION": "isolated",
        "OMP_NUM_THREADS": "1",
    }
    argv = [PYTHON, "-m", "vit_scale", "study", "--system", "local", "--study", name, "--out", str(out)]
    argv += ["--models", "vit_micro", "--strategies", "DDP", "--batch-size", "4", "--steps", "4"]
    argv += ["--warmup-steps", "1", "--repeat", "1", "--no-analysis", *extra]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def leftovers(tag_start: str) -> list:
    return [x for x in emulation.leftovers() if os.path.basename(x).startswith(tag_start)]


def test_killed_study_swept_next_study_isolated_nothing_left(tmp_path):
    # 1. a study killed outright (SIGKILL: no clean-up of its own) once its nodes are up and a rank runs
    killed = study(tmp_path, "killed", "--nodes", "2", "--steps", "1000")
    tag = emulation.study_tag("killed", killed.pid)
    deadline = time.monotonic() + 120
    procs = os.path.join(emulation.CGROUP_ROOT, "cpu", tag, "n1", "cgroup.procs")
    while time.monotonic() < deadline and killed.poll() is None:
        ranks = emulation._netns_pids(f"{tag}-n1")
        if ranks:
            break
        time.sleep(0.2)
    assert killed.poll() is None, killed.stdout.read()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    left = leftovers(tag)
    assert f"{tag}-n0" in left and f"{tag}-sw" in left, left  # what a killed study leaves

    # 2. the next study removes it first, then runs on isolated nodes of its own
    nxt = study(tmp_path, "next", "--nodes", "2")
    out, _ = nxt.communicate(timeout=600)
    assert nxt.returncode == 0, out
    assert "nodes: isolated: 2 node namespaces" in out
    records = glob.glob(str(tmp_path / "next" / "vit_micro" / "DDP" / "n2" / "*" / "metrics.jsonl"))
    assert len(records) == 1, out
    with open(records[0]) as f:
        start = json.loads(f.readline())
    assert start["world"]["emulation"] == "isolated" and start["world"]["nodes"] == 2
    assert sorted(start["hosts"]) == ["local0", "local1"]

    # 3. nothing of either: no namespace, no CPU group, no process of the killed study's ranks
    assert leftovers(tag) == [] and leftovers(emulation.study_tag("next", nxt.pid)) == []
    assert not os.path.exists(procs)
    mine = subprocess.run(["pgrep", "-f", f"output.dir={tmp_path}"], capture_output=True, text=True).stdout.split()
    assert mine == [], mine


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
