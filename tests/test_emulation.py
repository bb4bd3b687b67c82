"""The isolated emulation for real (root, ip, a cgroup cpu controller): a study whose orchestrator is
SIGKILLed leaves namespaces and CPU groups that the next study removes before it starts; that next study
runs DDP on 2 isolated nodes, one of them slow on purpose (--set emulation.nodes.local1...: its own HTB
class on both ends of its link and its own CPU quota, read from the kernel while the run is up), its records
say `emulation: isolated` and name the slow node, and once it ends nothing of either is left. Speeds are
measured in benchmarks/prediction_accuracy.py, not here."""

import glob
import json
import os
import re
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
    # two steps (a step took about 1 s over local1's slow link) and a 0.1 s node-health probe (1 s by default):
    # what is checked here is where the run ran, not what it measured
    argv += ["--models", "vit_micro", "--strategies", "DDP", "--batch-size", "4", "--steps", "2"]
    argv += ["--set", "train.health_probe_s=0.1"]
    # one rank a node: what is checked here is per node (its namespace, link and CPU group)
    argv += ["--warmup-steps", "1", "--repeat", "1", "--ranks-per-node", "1", "--no-analysis", *extra]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def leftovers(tag_start: str) -> list:
    return [x for x in emulation.leftovers() if os.path.basename(x).startswith(tag_start)]


def quota(tag: str, node: int) -> int:
    """A node's CPU quota in microseconds a 100 ms period, as the kernel holds it (cgroup v1 or v2)."""
    kind = emulation.cgroup_kind()
    name = "cpu.cfs_quota_us" if kind == "v1" else "cpu.max"
    with open(os.path.join(emulation.cgroup_dir(tag, kind), f"n{node}", name)) as f:
        return int(f.read().split()[0])


def test_killed_study_swept_next_study_isolated_nothing_left(tmp_path):
    # 1. a study killed outright (SIGKILL: no clean-up of its own) once its nodes are up and a rank runs
    killed = study(tmp_path, "killed", "--nodes", "2", "--steps", "1000")
    killed_tag = emulation.study_tag("killed", killed.pid)
    deadline = time.monotonic() + 120
    procs = os.path.join(emulation.CGROUP_ROOT, "cpu", killed_tag, "n1", "cgroup.procs")
    while time.monotonic() < deadline and killed.poll() is None:
        ranks = emulation._netns_pids(f"{killed_tag}-n1")
        if ranks:
            break
        time.sleep(0.2)
    assert killed.poll() is None, killed.stdout.read()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    left = leftovers(killed_tag)
    assert f"{killed_tag}-n0" in left and f"{killed_tag}-sw" in left, left  # what a killed study leaves

    # 2. the next study removes it first, then runs on isolated nodes of its own, local1 a slow node on
    # purpose: half the profile's link rate and half its CPU share
    slow = [
        "--set",
        "emulation.nodes.local1.inter_node_gbps=0.0125",
        "--set",
        "emulation.nodes.local1.cpus_per_node=0.25",
    ]
    nxt = study(tmp_path, "next", "--nodes", "2", *slow)
    tag = emulation.study_tag("next", nxt.pid)
    links, quotas = {}, {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and nxt.poll() is None and not links:
        # its ranks have joined their CPU groups (the setup is done): read what the kernel holds for each node
        if emulation._cgroup_pids(emulation.cgroup_dir(tag, emulation.cgroup_kind())):
            for ns, dev in [(f"{tag}-n0", "eth0"), (f"{tag}-n1", "eth0"), (f"{tag}-sw", "p1")]:
                shown = subprocess.run(["tc", "-n", ns, "class", "show", "dev", dev], capture_output=True, text=True)
                links[(ns, dev)] = shown.stdout
            quotas = {node: quota(tag, node) for node in (0, 1)}
        time.sleep(0.2)
    out, _ = nxt.communicate(timeout=600)
    assert nxt.returncode == 0, out
    assert "nodes: isolated: 2 node namespaces" in out
    assert "(local1: 0.0125 Gbit/s link and 0.25 cores)" in out
    # local1's own HTB class at both ends of its link (its uplink, the switch's port towards it), its own quota
    assert "rate 25Mbit ceil 25Mbit" in links[(f"{tag}-n0", "eth0")], links
    assert "rate 12500Kbit ceil 12500Kbit" in links[(f"{tag}-n1", "eth0")], links
    assert "rate 12500Kbit ceil 12500Kbit" in links[(f"{tag}-sw", "p1")], links
    assert quotas == {0: 50000, 1: 25000}
    records = glob.glob(str(tmp_path / "next" / "vit_micro" / "DDP" / "n2" / "*" / "metrics.jsonl"))
    assert len(records) == 1, out
    with open(records[0]) as f:
        start = json.loads(f.readline())
    assert start["world"]["emulation"] == "isolated" and start["world"]["nodes"] == 2
    assert start["world"]["emulation_nodes"] == {"local1": {"inter_node_gbps": 0.0125, "cpus_per_node": 0.25}}
    assert sorted(start["hosts"]) == ["local0", "local1"]

    # 3. nothing of either: no namespace, no CPU group, no process of the killed study's ranks
    assert leftovers(killed_tag) == [] and leftovers(tag) == []
    assert not os.path.exists(procs)
    mine = subprocess.run(["pgrep", "-f", f"output.dir={tmp_path}"], capture_output=True, text=True).stdout.split()
    assert mine == [], mine


def test_check_names_each_slow_node_and_the_exclude_line(tmp_path):
    """4 isolated nodes, local1's link and local3's CPU share at an eighth: `vit-scale check --only nodes`
    names both, each on a FAIL line with its figure against the median node's, and prints the --exclude=
    list. On 2 shared cores a healthy node's link may now and then read below the line too (it did in one
    full run on 2026-11-28: local2 at 68%): at most one such node, by its link and not far below, is accepted here;
    how often the rule names a healthy node is what benchmarks/slow_node.py measures (19-20 of 20 checks
    name exactly the slow ones)."""
    env = {**os.environ, "PYTHONPATH": ROOT, "VIT_SCALE_EMULATION": "isolated", "OMP_NUM_THREADS": "1"}
    # one rank a node: a node's figures are its ranks' (the slowest), and one rank shows its quota and link
    argv = [PYTHON, "-m", "vit_scale", "check", "--system", "local", "--nodes", "4", "--ranks-per-node", "1"]
    argv += ["--only", "nodes"]
    argv += ["--set", "emulation.nodes.local1.inter_node_gbps=0.003125"]
    argv += ["--set", "emulation.nodes.local3.cpus_per_node=0.0625", "--out", str(tmp_path)]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = [line for line in proc.stderr.splitlines() if line.startswith("vit-scale check: FAIL")]
    # local3 at an eighth of a core may also move its bytes slowly (its retest then says so too): a second
    # line for it
    named = {line.split(":")[1].split()[2] for line in fails}
    assert {"local1", "local3"} <= named and len(named) <= 3, proc.stderr
    for line in fails:
        node = line.split(":")[1].split()[2]
        if node not in ("local1", "local3"):  # a healthy node's marginal reading, never a gross one
            share = int(re.search(r", (\d+)% of the median node's", line).group(1))
            assert " link " in line and share >= 50, proc.stderr
    assert any(line.startswith("vit-scale check: FAIL node local1: link ") for line in fails)
    assert any(line.startswith("vit-scale check: FAIL node local3: compute ") for line in fails)
    assert all("of the median node's" in line for line in fails)
    exclude = f"--exclude={','.join(sorted(named))}"
    assert exclude in proc.stdout
    with open(tmp_path / "check.json") as f:
        check = json.load(f)
    found = check["per_node"]
    assert sorted(found["hosts"]) == ["local0", "local1", "local2", "local3"]
    assert {(n["node"], n["figure"]) for n in found["slow"]} >= {("local1", "link"), ("local3", "compute")}
    assert {n["node"] for n in found["slow"]} == named and found["exclude"] == ",".join(sorted(named))
    assert check["emulation"]["nodes"]["local3"] == {"cpus_per_node": 0.0625}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
