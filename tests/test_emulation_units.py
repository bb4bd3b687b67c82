"""The isolated emulation's decisions, without making anything: the profile section, the names, the ip/tc
command lists (every address and interface inside the run's own namespaces), the CPU group files for
cgroup v1 and v2, what is detected, which leftovers count as stale, and the one-line fall-back. A slow node
on demand: a node's own rate and share (the profile's emulation.nodes, or --set emulation.* on the study's
and the check's command lines, dry runs and refusals as a user runs them), applied to its link, quota and
threads, named in the records; and runs that leave nodes out (a nodelist of local<i> names)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from vit_scale.cluster import emulation as emu
from vit_scale.cluster import launchers
from vit_scale.cluster.systems import read_system
from vit_scale.errors import UserError
from vit_scale.launch.world import join_cpu_group


def test_profile_section_read_and_refused():
    assert emu.read_spec({"inter_node_gbps": 0.2, "cpus_per_node": 0.5}, "f.yaml") == emu.Spec(0.2, 0.5)
    assert emu.read_spec({"inter_node_gbps": None}, "f.yaml") == emu.Spec(None, None)
    assert emu.read_spec(None, "f.yaml") is None
    with pytest.raises(UserError, match=r"f.yaml: emulation.latency_us is not allowed; allowed: inter_node_gbps"):
        emu.read_spec({"latency_us": 5}, "f.yaml")
    with pytest.raises(UserError, match=r"emulation.cpus_per_node: '-1' is not allowed; allowed: a number above 0"):
        emu.read_spec({"cpus_per_node": -1}, "f.yaml")
    # the local profile states both
    spec = read_system("local").emulation
    assert spec.inter_node_gbps > 0 and spec.cpus_per_node > 0


def test_names_follow_the_study_and_the_orchestrator():
    tag = emu.study_tag("My Study/2", pid=4242)
    assert tag == "vsemu-my-study-2-p4242"
    assert emu.netns(tag, 3) == "vsemu-my-study-2-p4242-n3" and emu.netns(tag, None).endswith("-sw")
    assert emu.TAG.match(emu.netns(tag, 3)).group(1) == tag
    assert emu.study_tag("x" * 80, pid=1) == f"vsemu-{'x' * 24}-p1"


def test_network_stays_inside_the_runs_namespaces():
    tag = "vsemu-t-p1"
    cmds = emu.network_commands(tag, 3, 0.2)
    for cmd in cmds:
        assert cmd[0] == "ip"
        assert "route" not in cmd and "nat" not in " ".join(cmd)
        if cmd[1:3] == ["link", "add"] and "veth" in cmd:
            # both ends born inside the run's namespaces: no interface in the host's
            assert cmd[cmd.index("netns") + 1].startswith(tag) and cmd[-2:] == ["netns", f"{tag}-sw"]
        elif cmd[1] == "-n" or cmd[1:3] == ["netns", "exec"] or cmd[1:3] == ["netns", "add"]:
            assert any(a.startswith(tag) for a in cmd)
        else:
            raise AssertionError(f"a command outside the run's namespaces: {cmd}")
    addresses = [c[c.index("add") + 1] for c in cmds if "addr" in c]
    assert addresses == ["10.213.0.1/24", "10.213.0.2/24", "10.213.0.3/24"]
    # each node shaped both ways: its own egress and the switch's towards it
    rates = [c for c in cmds if "class" in c]
    assert len(rates) == 6 and all(c[c.index("rate") + 1] == "200000kbit" for c in rates)
    assert {c[3] for c in rates} == {f"{tag}-n0", f"{tag}-n1", f"{tag}-n2", f"{tag}-sw"}
    assert not [c for c in emu.network_commands(tag, 3, None) if "tc" in c]  # unshaped: no qdisc at all


def test_link_idle_time_buys_no_free_bytes():
    """A shaped link passes at most a few frames at line rate after an idle spell: with a 64 KiB burst
    (one GSO packet) FSDP's small per-unit collectives crossed the local profile's 25 Mbit/s link between
    compute phases at twice the rate it is shaped to. So packets are one frame (gso_max_segs 1 on every
    shaped end, before its qdisc) and the burst is 2 ms of the rate, at least two frames."""
    tag = "vsemu-t-p1"
    cmds = emu.network_commands(tag, 2, 0.025)
    shaped = {(c[c.index("dev") + 1], c[3]) for c in cmds if "class" in c}
    segs = {(c[c.index("dev") + 1], c[2]) for c in cmds if "gso_max_segs" in c}
    assert segs == shaped and all(c[c.index("gso_max_segs") + 1] == "1" for c in cmds if "gso_max_segs" in c)
    for dev, ns in shaped:
        at = [k for k, c in enumerate(cmds) if dev in c and ns in c and ("gso_max_segs" in c or "qdisc" in c)]
        assert "gso_max_segs" in cmds[at[0]] and "qdisc" in cmds[at[1]]
    # 2 ms of 25 Mbit/s: 6250 bytes, about 4 frames; the old 64 KiB let 10 of a step's collectives through free
    assert {int(c[c.index("burst") + 1]) for c in cmds if "class" in c} == {6250}
    slow = emu.network_commands(tag, 2, 0.001)  # 1 Mbit/s: 2 ms is 250 bytes, below a frame
    assert {int(c[c.index("burst") + 1]) for c in slow if "class" in c} == {2 * emu.MTU_FRAME}


def test_cpu_groups_v1_and_v2(tmp_path):
    v1 = emu.cgroup_writes("vsemu-t-p1", 2, 0.5, "v1", root="/cg")
    assert v1 == [
        ("/cg/cpu/vsemu-t-p1/n0/cpu.cfs_period_us", "100000"),
        ("/cg/cpu/vsemu-t-p1/n0/cpu.cfs_quota_us", "50000"),
        ("/cg/cpu/vsemu-t-p1/n1/cpu.cfs_period_us", "100000"),
        ("/cg/cpu/vsemu-t-p1/n1/cpu.cfs_quota_us", "50000"),
    ]
    v2 = emu.cgroup_writes("vsemu-t-p1", 2, 1.5, "v2", root="/cg")
    assert v2[0] == ("/cg/vsemu-t-p1/cgroup.subtree_control", "+cpu")
    assert v2[1:] == [("/cg/vsemu-t-p1/n0/cpu.max", "150000 100000"), ("/cg/vsemu-t-p1/n1/cpu.max", "150000 100000")]
    # detected, not assumed
    assert emu.cgroup_kind(str(tmp_path)) is None
    (tmp_path / "cgroup.controllers").write_text("hugetlb\n")
    assert emu.cgroup_kind(str(tmp_path)) is None  # a v2 hierarchy without cpu (this machine's kind)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    assert emu.cgroup_kind(str(tmp_path)) is None  # offered, but not handed down to child groups
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory\n")
    assert emu.cgroup_kind(str(tmp_path)) == "v2"
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert emu.cgroup_kind(str(tmp_path)) == "v1"


def test_threads_follow_the_share():
    assert emu.threads_per_rank(0.5, 2) == 1
    assert emu.threads_per_rank(4, 2) == 2
    assert emu.threads_per_rank(None, 2) == 1


def test_why_not_and_the_one_line_fall_back(tmp_path, monkeypatch):
    spec = emu.Spec(0.2, 0.5)
    assert emu.why_not(None, 2) == "the system profile has no emulation section"
    assert emu.why_not(spec, 2, euid=1000) == "it needs root (network namespaces, cgroups)"
    assert "cpu controller" in emu.why_not(spec, 2, euid=0, root=str(tmp_path))
    too_many = emu.why_not(emu.Spec(None, 1.0), (os.cpu_count() or 1) + 1, euid=0)
    assert too_many is None or "more than this machine's" in too_many  # None where ip is missing first
    monkeypatch.setattr(emu.os, "geteuid", lambda: 1000)
    said = []
    monkeypatch.setenv("VIT_SCALE_EMULATION", "auto")
    assert emu.start("s", 2, 2, spec, said.append) is None
    assert said == [
        "emulated nodes share this machine's network and cores: isolated ones not made, "
        "it needs root (network namespaces, cgroups)"
    ]
    # a slow node asked for where the nodes must share this machine: the line says it is not applied
    said.clear()
    assert emu.start("s", 2, 2, emu.Spec(0.2, 0.5, {"local1": {"cpus_per_node": 0.125}}), said.append) is None
    assert said[0].endswith("; the per-node overrides (local1: 0.125 cores) are not applied"), said
    monkeypatch.setenv("VIT_SCALE_EMULATION", "isolated")
    with pytest.raises(UserError, match="VIT_SCALE_EMULATION=isolated: isolated nodes cannot be made here: it needs"):
        emu.start("s", 2, 2, spec, said.append)
    monkeypatch.setenv("VIT_SCALE_EMULATION", "bridge")
    with pytest.raises(UserError, match="VIT_SCALE_EMULATION: 'bridge' is not allowed; allowed: auto, isolated"):
        emu.start("s", 2, 2, spec, said.append)


def test_stale_means_the_orchestrator_is_gone():
    names = ["vsemu-a-p11-n0", "vsemu-a-p11-sw", "/sys/fs/cgroup/cpu/vsemu-a-p11", "vsemu-b-p22-n0", "other-ns"]
    assert emu.stale_tags(names, is_alive=lambda pid: pid == 22) == ["vsemu-a-p11"]
    assert emu.stale_tags(names, is_alive=lambda pid: True) == []


def test_each_rank_enters_its_node(tmp_path):
    e = emu.Emulation("vsemu-t-p1", 2, emu.Spec(0.2, 1.0), 2, cgroup="v1")
    launch = launchers.build(
        "processes",
        "python",
        ["model=vit_micro"],
        system=read_system("local"),
        nodes=2,
        ranks_per_node=2,
        nodelist="",
        master_addr=e.master_addr,
        master_port=29500,
        time_limit_min=None,
        grace_s=5,
        rdzv_id="0",
    )
    assert all(extra["VIT_SCALE_EMULATED"] == "shared" for _, extra in launch.commands)
    e.wrap_launch(launch)
    for rank, (argv, extra) in enumerate(launch.commands):
        node = rank // 2
        assert argv[:3] == ["nsenter", f"--net=/run/netns/vsemu-t-p1-n{node}", "--"] and argv[3] == "python"
        assert extra["MASTER_ADDR"] == "10.213.0.1" and extra["GLOO_SOCKET_IFNAME"] == "eth0"
        assert extra["VIT_SCALE_EMULATED"] == "isolated" and extra["OMP_NUM_THREADS"] == "1"
        assert extra["VIT_SCALE_CPU_GROUP"].endswith(f"/cpu/vsemu-t-p1/n{node}/cgroup.procs")
    # the rank moves itself in (after its imports)
    procs = tmp_path / "cgroup.procs"
    assert join_cpu_group({"VIT_SCALE_CPU_GROUP": str(procs)}) and procs.read_text() == str(os.getpid())
    assert not join_cpu_group({})


def test_report_note_names_the_emulation():
    import pandas as pd

    from analysis.report import emulation_note

    rows = {"hosts": ["local0,local1"] * 2, "device_type": ["cpu"] * 2, "nodes": [1, 2], "world_size": [2, 4]}
    isolated = emulation_note(pd.DataFrame({**rows, "emulation": ["isolated"] * 2}))
    assert "isolated" in isolated and "network namespace of their own" in isolated
    shared = emulation_note(pd.DataFrame({**rows, "emulation": ["shared"] * 2}))
    assert "emulation: shared" in shared and "not how a strategy scales" in shared


# ---------------------------------------------------------------- a slow node on demand (issue 36, item 1)


def test_a_node_of_its_own_read_from_the_profile_and_refused_in_one_line():
    spec = emu.read_spec(
        {
            "inter_node_gbps": 0.025,
            "cpus_per_node": 0.5,
            "nodes": {"local2": {"inter_node_gbps": 0.00625}, "local3": {"cpus_per_node": 0.125}},
        },
        "f.yaml",
    )
    assert spec.nodes == {"local2": {"inter_node_gbps": 0.00625}, "local3": {"cpus_per_node": 0.125}}
    # each node's rate and share: its own where it has one, the profile's elsewhere
    assert [spec.for_node(i) for i in range(4)] == [(0.025, 0.5), (0.025, 0.5), (0.00625, 0.5), (0.025, 0.125)]
    assert spec.describe() == "0.025 Gbit/s links, 0.5 cores a node (local2: 0.00625 Gbit/s link, local3: 0.125 cores)"
    refused = {
        "not a mapping": ([1], "f.yaml: emulation.nodes must be a mapping of node names"),
        "host name": ({"n3": {"cpus_per_node": 1}}, "f.yaml: emulation.nodes.n3 is not allowed; allowed: node names"),
        "leading zero": ({"local03": {"cpus_per_node": 1}}, "emulation.nodes.local03 is not allowed"),
        "key": (
            {"local1": {"latency_us": 5}},
            "f.yaml: emulation.nodes.local1.latency_us is not allowed; allowed: inter_node_gbps, cpus_per_node",
        ),
        "empty": ({"local1": {}}, "f.yaml: emulation.nodes.local1 must be a mapping; allowed keys"),
        "zero": (
            {"local1": {"cpus_per_node": 0}},
            "f.yaml: emulation.nodes.local1.cpus_per_node: '0' is not allowed; allowed: a number above 0",
        ),
        "negative": ({"local1": {"inter_node_gbps": -1}}, "emulation.nodes.local1.inter_node_gbps: '-1' is not"),
        "infinite": ({"local1": {"inter_node_gbps": float("inf")}}, "'inf' is not allowed; allowed: a number above 0"),
        "null": ({"local1": {"cpus_per_node": None}}, "'None' is not allowed; allowed: a number above 0"),
        "a word": ({"local1": {"cpus_per_node": "slow"}}, "'slow' is not allowed"),
        "a boolean": ({"local1": {"cpus_per_node": True}}, "'True' is not allowed"),
    }
    for what, (nodes, message) in refused.items():
        with pytest.raises(UserError) as caught:
            emu.read_spec({"cpus_per_node": 0.5, "nodes": nodes}, "f.yaml")
        assert message in str(caught.value) and "\n" not in str(caught.value), what
    with pytest.raises(
        UserError, match=r"emulation.speed is not allowed; allowed: inter_node_gbps, cpus_per_node, nodes"
    ):
        emu.read_spec({"speed": 1}, "f.yaml")


def test_set_routes_emulation_keys_and_a_host_outside_the_run_is_refused():
    base = read_system("local").emulation
    spec = emu.with_sets(
        base,
        [("emulation.nodes.local3.cpus_per_node", "0.125"), ("emulation.inter_node_gbps", "null")],
        "--set",
        "local",
    )
    assert spec.for_node(3) == (None, 0.125) and spec.for_node(0) == (None, base.cpus_per_node)
    assert emu.with_sets(base, [], "--set") is base
    for key, value, message in [
        ("emulation.nodes.local3.speed", "1", "--set: 'emulation.nodes.local3.speed' is not allowed; allowed: "),
        ("emulation.latency_us", "1", "'emulation.latency_us' is not allowed; allowed: emulation.inter_node_gbps"),
        ("emulation.nodes.node3.cpus_per_node", "1", "--set: emulation.nodes.node3 is not allowed; allowed: node"),
        ("emulation.nodes.local3.cpus_per_node", "null", "'null' is not allowed; allowed: a number above 0"),
        ("emulation.cpus_per_node", "-2", "--set: emulation.cpus_per_node: '-2' is not allowed"),
    ]:
        with pytest.raises(UserError) as caught:
            emu.with_sets(base, [(key, value)], "--set", "local")
        assert message in str(caught.value) and str(caught.value).startswith("--set: "), str(caught.value)
    with pytest.raises(UserError, match=r"--set: emulation.cpus_per_node is not allowed on frontier, whose profile"):
        emu.with_sets(None, [("emulation.cpus_per_node", "1")], "--set", "frontier")
    # the run's node count is known: an override on a node it does not have names where it was given
    spec.check_hosts(4)
    with pytest.raises(UserError, match=r"^--set: emulation.nodes.local3: not one of the 2 nodes this runs on; "):
        spec.check_hosts(2)
    from_profile = emu.read_spec({"nodes": {"local5": {"cpus_per_node": 1}}}, "local.yaml")
    with pytest.raises(UserError, match=r"^local.yaml: emulation.nodes.local5: not one of the 1 node this runs on; "):
        from_profile.check_hosts(1)


def test_a_slow_node_gets_its_own_link_quota_and_threads(tmp_path, monkeypatch):
    tag = "vsemu-t-p1"
    spec = emu.Spec(0.025, 0.5, {"local2": {"inter_node_gbps": 0.00625}, "local3": {"cpus_per_node": 0.125}})
    cmds = emu.network_commands(tag, 4, spec.rates(4))
    rate = {(c[3], c[c.index("dev") + 1]): c[c.index("rate") + 1] for c in cmds if "class" in c}
    # node 2's link is shaped at its own rate at both ends: its uplink (its eth0) and its downlink (switch port p2)
    assert rate[(f"{tag}-n2", "eth0")] == rate[(f"{tag}-sw", "p2")] == "6250kbit"
    assert {v for k, v in rate.items() if "2" not in k[1] and not k[0].endswith("n2")} == {"25000kbit"}
    # its own quota: an eighth of the period for node 3, half for the others (v1 and v2)
    v1 = dict(emu.cgroup_writes(tag, 4, spec.shares(4), "v1", root="/cg"))
    assert v1["/cg/cpu/vsemu-t-p1/n3/cpu.cfs_quota_us"] == "12500"
    assert v1["/cg/cpu/vsemu-t-p1/n2/cpu.cfs_quota_us"] == "50000"
    v2 = dict(emu.cgroup_writes(tag, 4, spec.shares(4), "v2", root="/cg"))
    assert v2["/cg/vsemu-t-p1/n3/cpu.max"] == "12500 100000" and v2["/cg/vsemu-t-p1/n0/cpu.max"] == "50000 100000"
    # a node override with no base value: only that node is shaped, only that node has a quota
    alone = emu.Spec(None, None, {"local1": {"inter_node_gbps": 0.1, "cpus_per_node": 0.25}})
    shaped = {c[3] for c in emu.network_commands(tag, 3, alone.rates(3)) if "class" in c}
    assert shaped == {f"{tag}-n1", f"{tag}-sw"}
    assert [c[c.index("dev") + 1] for c in emu.network_commands(tag, 3, alone.rates(3)) if "class" in c] == [
        "eth0",
        "p1",
    ]
    assert emu.cgroup_writes(tag, 3, alone.shares(3), "v1", root="/cg") == [
        ("/cg/cpu/vsemu-t-p1/n1/cpu.cfs_period_us", "100000"),
        ("/cg/cpu/vsemu-t-p1/n1/cpu.cfs_quota_us", "25000"),
    ]
    # threads follow each node's share: 4 cores a node give 2 ranks 2 threads each, a quarter core 1
    big = emu.Emulation(tag, 4, emu.Spec(None, 4.0, {"local3": {"cpus_per_node": 0.25}}), 2, cgroup="v1")
    assert [big.threads(i) for i in range(4)] == [2, 2, 2, 1]
    assert "4 cores a node (local3: 0.25 cores), 2 thread(s) a rank (local3: 1) (cgroup v1)" in big.describe()
    # the capacity check adds the nodes' own shares (tools and a v1 cpu controller as on this machine kind)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    monkeypatch.setattr(emu.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(emu.os, "cpu_count", lambda: 2)
    assert emu.why_not(spec, 4, euid=0, root=str(tmp_path)) is None  # 3 x 0.5 + 0.125 cores fit 2
    heavy = emu.Spec(None, 0.5, {"local3": {"cpus_per_node": 1}})
    assert emu.why_not(heavy, 4, euid=0, root=str(tmp_path)) == (
        "the 4 nodes' CPU shares add up to 2.5 cores, more than this machine's 2 (lower emulation.cpus_per_node, "
        "a node's own, or the node count)"
    )
    assert emu.why_not(heavy, 3, euid=0, root=str(tmp_path)) is None  # a 3-node emulation has no local3


def test_runs_that_leave_nodes_out_start_on_the_named_ones(monkeypatch):
    """Infrastructure for leaving a slow node out: the launchers of this machine take the node names from
    the nodelist, the emulation puts each rank in the namespace its name gives and names the run's own
    overrides to the ranks, whose start record carries them."""
    from vit_scale.run.start import emulation_nodes

    spec = emu.Spec(0.025, 0.5, {"local2": {"cpus_per_node": 0.125}, "local3": {"inter_node_gbps": 0.01}})
    e = emu.Emulation("vsemu-t-p1", 4, spec, 2, cgroup="v1")
    assert e.address_of("local3") == "10.213.0.4" and e.address_of("local0") == e.master_addr
    with pytest.raises(ValueError):
        e.address_of("local4")

    def build(kind, nodes, nodelist):
        return launchers.build(
            kind,
            "python",
            ["model=vit_micro"],
            system=read_system("local"),
            nodes=nodes,
            ranks_per_node=2,
            nodelist=nodelist,
            master_addr=e.address_of(nodelist.split(",")[0]) if nodelist else e.master_addr,
            master_port=29500,
            time_limit_min=None,
            grace_s=5,
            rdzv_id="0",
        )

    launch = e.wrap_launch(build("processes", 3, "local1,local3,local0"))
    assert [x["VIT_SCALE_NODE_NAME"] for _, x in launch.commands] == ["local1"] * 2 + ["local3"] * 2 + ["local0"] * 2
    assert [a[1] for a, _ in launch.commands] == [f"--net=/run/netns/vsemu-t-p1-n{i}" for i in (1, 1, 3, 3, 0, 0)]
    # rank 0 (on local1) hosts the rendezvous: its node's address
    assert {x["MASTER_ADDR"] for _, x in launch.commands} == {"10.213.0.2"}
    assert [x["GROUP_RANK"] for _, x in launch.commands] == ["0", "0", "1", "1", "2", "2"]
    # the run's own overrides (local2 is not in it), one shell word in the shown command
    assert {x[emu.NODES_ENV] for _, x in launch.commands} == {'{"local3":{"inter_node_gbps":0.01}}'}
    monkeypatch.setenv(emu.NODES_ENV, launch.commands[0][1][emu.NODES_ENV])
    assert emulation_nodes() == {"local3": {"inter_node_gbps": 0.01}}
    monkeypatch.delenv(emu.NODES_ENV)
    assert emulation_nodes() is None  # not on isolated emulated nodes

    torchrun = e.wrap_launch(build("torchrun", 2, "local2,local3"))
    assert [x["VIT_SCALE_NODE_NAME"] for _, x in torchrun.commands] == ["local2", "local3"]
    assert [next(w for w in a if w.startswith("--node_rank")) for a, _ in torchrun.commands] == [
        "--node_rank=0",
        "--node_rank=1",
    ]
    assert all("--master_addr=10.213.0.3" in a for a, _ in torchrun.commands)
    # local2's quarter core: one thread a rank, its own CPU group
    assert torchrun.commands[0][1]["VIT_SCALE_CPU_GROUP"].endswith("/vsemu-t-p1/n2/cgroup.procs")
    assert json.loads(torchrun.commands[0][1][emu.NODES_ENV]) == spec.nodes
    mpi = build("mpi-local", 2, "local0,local3")
    assert [w for w in mpi.commands[0][0] if w.startswith("VIT_SCALE_NODE_NAME=")] == [
        "VIT_SCALE_NODE_NAME=local0",
        "VIT_SCALE_NODE_NAME=local3",
    ]
    single = e.wrap_launch(build("single", 1, "local1"))
    assert single.commands[0][1]["VIT_SCALE_NODE_NAME"] == "local1" and "n1" in single.commands[0][0][1]
    # without a nodelist: local0 .. local<n-1>, as before
    plain = build("processes", 2, "")
    assert [x["VIT_SCALE_NODE_NAME"] for _, x in plain.commands] == ["local0", "local0", "local1", "local1"]
    with pytest.raises(ValueError):
        e.wrap_launch(build("torchrun", 2, "local3,local4"))


def test_the_records_schemas_take_the_overrides():
    import jsonschema

    from vit_scale.check.schema import CHECK_SCHEMA
    from vit_scale.record.schema import START

    record = START["properties"]["world"]["properties"]["emulation_nodes"]
    jsonschema.validate({"local3": {"cpus_per_node": 0.125}}, record)
    jsonschema.validate(None, record)
    for bad in ({"n3": {"cpus_per_node": 1}}, {"local3": {"cpus_per_node": 0}}, {"local3": {"speed": 1}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, record)
    check = CHECK_SCHEMA["properties"]["emulation"]
    jsonschema.validate({"kind": "isolated", "description": "x", "nodes": {"local2": {"inter_node_gbps": 1}}}, check)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"kind": "isolated", "nodes": {"local2": {}}}, check)


def user_runs(tmp_path, command, *args):
    """`python -m vit_scale COMMAND ARGS` as a user types it, in an empty folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = ROOT
    return subprocess.run(
        [sys.executable, "-m", "vit_scale", command, "--system", "local", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_study_set_gives_a_node_its_own_share_and_refuses_one_it_does_not_run_on(tmp_path):
    study = ["--models", "vit_micro", "--strategies", "DDP", "--repeat", "1", "--dry-run", "--check"]
    slow = "emulation.nodes.local3.cpus_per_node=0.125"
    proc = user_runs(tmp_path, "study", *study, "--nodes", "1,4", "--set", slow, "--set", "train.lr=0.001")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("vit-scale study 'local' on local (emulated node overrides: local3: 0.125 cores): ")
    # the emulated nodes' key goes to the nodes and to the check the study runs first, never to the trainer
    trainer = [line for line in lines if "vit_scale train" in line]
    assert len(trainer) == 2 + 8 and all("train.lr=0.001" in line and "emulation" not in line for line in trainer)
    assert f"--set {slow}" in next(line for line in lines if line.startswith("  check first:"))
    assert os.listdir(tmp_path) == []

    for args, message in [
        (["--nodes", "1,2", "--set", slow], "--set: emulation.nodes.local3: not one of the 2 nodes this runs on; "),
        (["--nodes", "4", "--set", "emulation.nodes.local3.cpus_per_node=0"], "'0' is not allowed; allowed: a number"),
        (["--nodes", "4", "--set", "emulation.nodes.local3.speed=1"], "'emulation.nodes.local3.speed' is not allowed"),
    ]:
        proc = user_runs(tmp_path, "study", *study, *args)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("vit-scale study: --set: ")
        assert message in proc.stderr, proc.stderr
        assert os.listdir(tmp_path) == []


def test_check_set_names_the_overrides_in_its_header_and_check_json(tmp_path, capsys):
    from vit_scale.check import report
    from vit_scale.check.options import Request, parse

    out = tmp_path / "c"
    proc = user_runs(
        tmp_path, "check", "--nodes", "2", "--out", str(out), "--set", "emulation.nodes.local2.cpus_per_node=1"
    )
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists()
    assert proc.stderr.splitlines() == [
        "vit-scale check: --set: emulation.nodes.local2: not one of the 2 nodes this runs on; allowed: local0 to local1"
    ]
    proc = user_runs(tmp_path, "check", "--nodes", "2", "--out", str(out), "--set", "train.lr=1")
    assert proc.returncode == 2 and "(the check takes no trainer keys)" in proc.stderr and not out.exists()

    request = Request(
        parse(
            [
                *("--system", "local", "--nodes", "2", "--strategies", "DDP", "--out", str(out)),
                *("--set", "emulation.nodes.local1.inter_node_gbps=0.00625", "--set", "emulation.cpus_per_node=0.25"),
            ]
        )
    )
    assert request.system.emulation.for_node(1) == (0.00625, 0.25)
    assert request.system.emulation.for_node(0) == (read_system("local").emulation.inter_node_gbps, 0.25)
    report.header(request)
    assert "on local (emulated node overrides: local1: 0.00625 Gbit/s link): 2 nodes" in capsys.readouterr().out
    assert report.emulation_facts(request, "isolated") == {
        "kind": "isolated",
        "description": "0.025 Gbit/s links, 0.25 cores a node (local1: 0.00625 Gbit/s link)",
        "nodes": {"local1": {"inter_node_gbps": 0.00625}},
    }
    # shared nodes ran without the override: check.json does not claim it
    assert report.emulation_facts(request, "shared")["nodes"] == {}
    assert report.emulation_facts(request, None) is None
