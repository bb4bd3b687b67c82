"""The isolated emulation's decisions, without making anything: the profile section, the names, the ip/tc
command lists (every address and interface inside the run's own namespaces), the CPU group files for
cgroup v1 and v2, what is detected, which leftovers count as stale, and the one-line fall-back."""

import os

import pytest

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
    assert len(rates) == 6 and all(c[c.index("rate") + 1] == "200mbit" for c in rates)
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
