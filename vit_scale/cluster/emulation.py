"""Emulated nodes that are separate: each node's ranks in a network namespace of its own and a CPU group
of its own, on this one machine (the local profile without Slurm).

    node i   namespace <tag>-n<i>: lo (its ranks talk to each other here), eth0 = 10.213.0.<i+1>/24
    switch   namespace <tag>-sw: a bridge joining one veth port per node
    links    HTB on both ends of each node's veth (its egress and the switch's egress towards it), at the
             profile's inter-node bandwidth: the node's uplink and downlink
    CPU      cgroup <tag>/n<i>, quota = the profile's cores per node (v1 cpu.cfs_quota_us, v2 cpu.max)
    one node emulation.nodes.local<i> gives node i a rate or share of its own (a slow node on purpose, for
             `vit-scale check` to find); the run records name it (world.emulation_nodes)

Every address lives in a namespace the run made: the host's namespace gets no address, no route and no
interface (the veth pairs are created with both ends already inside the run's namespaces), so nothing
the ranks send can leave them. The tag names the study and the orchestrator's pid
(vsemu-<study>-p<pid>); a later run removes whatever carries a tag whose pid is gone (a SIGKILLed
study), and every run removes its own on the way out, success, failure or signal.

Without root, without `ip`, without namespaces or without a cpu controller, `start` says why in one
line and returns None: the ranks then share this machine's loopback and cores as they always did
(`emulation: shared` in the records). Torch is never imported here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

from vit_scale.errors import UserError

PREFIX = "vsemu"
SUBNET = "10.213.0"  # inside the run's namespaces only; the host never sees it
DEVICE = "eth0"  # each node's uplink, the device gloo binds to (GLOO_SOCKET_IFNAME)
PERIOD_US = 100_000
NETNS_DIR = "/run/netns"  # where `ip netns add` puts a namespace's name
CGROUP_ROOT = os.environ.get("VIT_SCALE_CGROUP_ROOT", "/sys/fs/cgroup")
MODES = ("auto", "isolated", "shared")
TAG = re.compile(rf"^({PREFIX}-[a-z0-9_.-]*-p(\d+))(?:-(sw|n\d+))?$")


NODE_KEYS = ("inter_node_gbps", "cpus_per_node")  # what a node's own entry in emulation.nodes may set
HOST = re.compile(r"^local(0|[1-9]\d*)$")  # an emulated node's name, as the run records give it
NODES_ENV = "VIT_SCALE_EMULATION_NODES"  # the overrides of a run's hosts, for its start record (JSON)


def host_index(name: str) -> int:
    """local<i> -> i (ValueError for any other name)."""
    if not HOST.match(str(name)):
        raise ValueError(f"not an emulated node's name: {name!r}")
    return int(str(name)[len("local") :])


def hosts_of(nodes: int) -> list[str]:
    """The names of a run's emulated nodes, local0 .. local<nodes-1>."""
    return [f"local{i}" for i in range(nodes)]


@dataclass
class Spec:
    """The profile's `emulation:` section: every node's link rate and CPU share, and `nodes`, the per-node
    overrides (local<i> -> {inter_node_gbps or cpus_per_node: a number}) that make one node slow."""

    inter_node_gbps: float | None = None  # None: links not shaped
    cpus_per_node: float | None = None  # None: no CPU quota
    nodes: dict = field(default_factory=dict)  # host -> {key: number}
    # host -> where its override was given (the profile's path, --set), for the errors that name it
    origin: dict = field(default_factory=dict, compare=False, repr=False)

    def for_node(self, node: int) -> tuple[float | None, float | None]:
        """(link rate in Gbit/s, CPU share in cores) of node `node`: its own where it has one."""
        own = self.nodes.get(f"local{node}", {})
        return own.get("inter_node_gbps", self.inter_node_gbps), own.get("cpus_per_node", self.cpus_per_node)

    def rates(self, nodes: int) -> list:
        return [self.for_node(i)[0] for i in range(nodes)]

    def shares(self, nodes: int) -> list:
        return [self.for_node(i)[1] for i in range(nodes)]

    def overrides(self, hosts) -> dict:
        """The per-node overrides of these hosts (a run's), in node order."""
        hosts = set(hosts)
        return {h: dict(v) for h, v in sorted(self.nodes.items(), key=lambda kv: host_index(kv[0])) if h in hosts}

    def check_hosts(self, nodes: int) -> None:
        """Every override names one of the `nodes` emulated nodes a study or check runs on (one-line
        UserError naming where it was given otherwise), before anything is written or started."""
        outside = sorted((h for h in self.nodes if host_index(h) >= nodes), key=host_index)
        if outside:
            allowed = "local0" if nodes == 1 else f"local0 to local{nodes - 1}"
            raise UserError(
                f"{self.origin.get(outside[0], 'emulation')}: emulation.nodes.{outside[0]}: not one of the "
                f"{nodes} node{'s' if nodes > 1 else ''} this runs on; allowed: {allowed}"
            )

    def describe_nodes(self) -> str:
        """'local2: 0.00625 Gbit/s link, local3: 0.125 cores', or '' without overrides."""
        said = []
        for host, own in self.overrides(self.nodes).items():
            parts = []
            if "inter_node_gbps" in own:
                parts.append(f"{own['inter_node_gbps']:g} Gbit/s link")
            if "cpus_per_node" in own:
                parts.append(f"{own['cpus_per_node']:g} cores")
            said.append(f"{host}: {' and '.join(parts)}")
        return ", ".join(said)

    def describe(self) -> str:
        link = f"{self.inter_node_gbps:g} Gbit/s links" if self.inter_node_gbps else "unshaped links"
        cpu = f"{self.cpus_per_node:g} cores a node" if self.cpus_per_node else "no CPU quota"
        own = self.describe_nodes()
        return f"{link}, {cpu}" + (f" ({own})" if own else "")

    def section(self) -> dict:
        """The profile section this spec reads from (read_spec(spec.section()) == spec)."""
        return {
            "inter_node_gbps": self.inter_node_gbps,
            "cpus_per_node": self.cpus_per_node,
            "nodes": {h: dict(v) for h, v in self.nodes.items()},
        }


def _positive(value, where: str, name: str, nullable: bool):
    """A positive finite number, or (nullable) None; one-line UserError otherwise."""
    if value is None and nullable:
        return None
    try:
        number = float(value) if not isinstance(value, bool) else 0.0
    except (TypeError, ValueError):
        number = 0.0
    if not 0 < number < float("inf"):
        allowed = "a number above 0, or null" if nullable else "a number above 0"
        raise UserError(f"{where}: {name}: '{value}' is not allowed; allowed: {allowed}")
    return number


def read_spec(section, where: str) -> Spec | None:
    """`emulation: {inter_node_gbps: 0.2, cpus_per_node: 0.5, nodes: {local3: {cpus_per_node: 0.125}}}` of
    a system profile (None: no section)."""
    if section is None:
        return None
    if not isinstance(section, dict):
        raise UserError(f"{where}: emulation must be a mapping of inter_node_gbps, cpus_per_node and nodes")
    unknown = sorted(set(section) - {*NODE_KEYS, "nodes"})
    if unknown:
        raise UserError(
            f"{where}: emulation.{unknown[0]} is not allowed; allowed: inter_node_gbps, cpus_per_node, nodes"
        )
    values = {key: _positive(section.get(key), where, f"emulation.{key}", nullable=True) for key in NODE_KEYS}
    nodes = _read_nodes(section.get("nodes"), where)
    return Spec(**values, nodes=nodes, origin=dict.fromkeys(nodes, where))


def _read_nodes(nodes, where: str) -> dict:
    if nodes is None:
        return {}
    if not isinstance(nodes, dict):
        raise UserError(
            f"{where}: emulation.nodes must be a mapping of node names (local0, local1 ...) to "
            "inter_node_gbps and cpus_per_node"
        )
    found = {}
    for host, own in nodes.items():
        if not HOST.match(str(host)):
            raise UserError(
                f"{where}: emulation.nodes.{host} is not allowed; allowed: node names as the records give "
                "them, local0, local1 ..."
            )
        name = f"emulation.nodes.{host}"
        if not isinstance(own, dict) or not own:
            raise UserError(f"{where}: {name} must be a mapping; allowed keys: {', '.join(NODE_KEYS)}")
        bad = sorted(set(own) - set(NODE_KEYS))
        if bad:
            raise UserError(f"{where}: {name}.{bad[0]} is not allowed; allowed: {', '.join(NODE_KEYS)}")
        found[str(host)] = {key: _positive(value, where, f"{name}.{key}", nullable=False) for key, value in own.items()}
    return found


SET_KEYS = (
    "emulation.inter_node_gbps",
    "emulation.cpus_per_node",
    "emulation.nodes.local<i>.inter_node_gbps",
    "emulation.nodes.local<i>.cpus_per_node",
)


def is_set_key(key: str) -> bool:
    """A --set key that is the emulation's, not the trainer's."""
    return key == "emulation" or str(key).startswith("emulation.")


def with_sets(spec: Spec | None, sets: list, where: str = "--set", system: str = "") -> Spec:
    """The spec with `--set emulation.KEY=VALUE` items applied, in order ((key, value) pairs); one-line
    UserError on a key or value not allowed, or on a profile that emulates no nodes."""
    if not sets:
        return spec
    if spec is None:
        raise UserError(
            f"{where}: {sets[0][0]} is not allowed on {system or 'this system'}, whose profile emulates no nodes "
            "(no emulation section); allowed: a system with one, e.g. --system local"
        )
    section, given = spec.section(), set()
    for key, value in sets:
        parts = str(key).split(".")
        text = str(value).strip()
        number = None if text.lower() in ("null", "none", "~") else text
        if len(parts) == 2 and parts[1] in NODE_KEYS:
            section[parts[1]] = number
        elif len(parts) == 4 and parts[1] == "nodes" and parts[3] in NODE_KEYS:
            if not HOST.match(parts[2]):
                raise UserError(
                    f"{where}: emulation.nodes.{parts[2]} is not allowed; allowed: node names as the records "
                    "give them, local0, local1 ..."
                )
            section["nodes"].setdefault(parts[2], {})[parts[3]] = text
            given.add(parts[2])
        else:
            raise UserError(f"{where}: '{key}' is not allowed; allowed: {', '.join(SET_KEYS)}")
    new = read_spec(section, where)
    new.origin = {h: where if h in given else spec.origin.get(h, where) for h in new.nodes}
    return new


def mode_asked() -> str:
    """VIT_SCALE_EMULATION: auto (isolated where this machine allows it), isolated, shared."""
    mode = os.environ.get("VIT_SCALE_EMULATION", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise UserError(f"VIT_SCALE_EMULATION: '{mode}' is not allowed; allowed: {', '.join(MODES)}")
    return mode


def study_tag(study: str, pid: int | None = None) -> str:
    """vsemu-<study, lower case, at most 24 safe characters>-p<pid>."""
    safe = re.sub(r"[^a-z0-9_.-]+", "-", study.lower()).strip("-.")[:24] or "run"
    return f"{PREFIX}-{safe}-p{os.getpid() if pid is None else pid}"


# ---------------------------------------------------------------- what this machine allows


def cgroup_kind(root: str = CGROUP_ROOT) -> str | None:
    """'v1' when the v1 cpu controller is mounted at ROOT/cpu, 'v2' when the unified hierarchy at ROOT
    offers cpu, else None. Detected, not assumed: a hybrid machine may mount v2 with no controller in it."""
    if os.path.isfile(os.path.join(root, "cpu", "cpu.cfs_quota_us")):
        return "v1"
    # v2: offered at the root and handed down to its children (systemd does; this module does not change
    # the root's settings)
    try:
        with (
            open(os.path.join(root, "cgroup.controllers")) as f,
            open(os.path.join(root, "cgroup.subtree_control")) as g,
        ):
            return "v2" if "cpu" in f.read().split() and "cpu" in g.read().split() else None
    except OSError:
        return None


def cgroup_dir(tag: str, kind: str, root: str = CGROUP_ROOT) -> str:
    return os.path.join(root, "cpu", tag) if kind == "v1" else os.path.join(root, tag)


def why_not(spec: Spec | None, nodes: int, euid: int | None = None, root: str = CGROUP_ROOT) -> str | None:
    """Why isolated nodes cannot be made here (one clause), or None when they can be tried."""
    if spec is None:
        return "the system profile has no emulation section"
    if (os.geteuid() if euid is None else euid) != 0:
        return "it needs root (network namespaces, cgroups)"
    if shutil.which("ip") is None:
        return "it needs the ip command (apt-get install iproute2)"
    if shutil.which("nsenter") is None:
        return "it needs the nsenter command (apt-get install util-linux)"
    if any(spec.rates(nodes)) and shutil.which("tc") is None:
        return "shaping the links needs the tc command (apt-get install iproute2)"
    if not os.path.isdir("/proc/self/ns") or not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces"
    shares = [s for s in spec.shares(nodes) if s]
    if shares and cgroup_kind(root) is None:
        return f"no cgroup cpu controller under {root} (neither v1 cpu.cfs_quota_us nor v2 cpu.max)"
    # the quotas are ceilings, but nodes whose shares add up to more than the machine would not get them
    if sum(shares) > (os.cpu_count() or 1) + 1e-9:
        if len(set(shares)) == 1 and len(shares) == nodes:
            return (
                f"{nodes} nodes x {shares[0]:g} cores is more than this machine's {os.cpu_count()} "
                "(lower emulation.cpus_per_node or the node count)"
            )
        return (
            f"the {nodes} nodes' CPU shares add up to {sum(shares):g} cores, more than this machine's "
            f"{os.cpu_count()} (lower emulation.cpus_per_node, a node's own, or the node count)"
        )
    return None


# ---------------------------------------------------------------- the commands (pure)


def address(node: int) -> str:
    return f"{SUBNET}.{node + 1}"


def netns(tag: str, node: int | None) -> str:
    """A node's namespace, or (node None) the switch's."""
    return f"{tag}-sw" if node is None else f"{tag}-n{node}"


MTU_FRAME = 1514  # an Ethernet frame at the veth's default MTU of 1500


def shaping(ns: str, dev: str, gbps: float) -> list[list[str]]:
    """One segment a packet on `dev`, then an HTB root qdisc with one class at `gbps`, everything in it.

    The burst is what the link may send at line rate after it was idle: 2 ms of the rate, at least two
    frames. A larger one (a 64 KiB GSO packet, which HTB needs whole) refills while the ranks compute and
    lets a step's small collectives through unshaped: FSDP's per-unit all-reduces then crossed a 25 Mbit/s
    link in half the time its rate allows, large buffers did not. gso_max_segs 1 keeps packets to one
    frame so that the small burst can pass them."""
    # kbit, not mbit: a slow node's rate (a quarter of 25 Mbit/s is 6.25) is shaped as given, not rounded
    kbit = max(8, round(gbps * 1e6))
    burst = max(2 * MTU_FRAME, int(gbps * 1e9 / 8 * 0.002))
    return [
        ["ip", "-n", ns, "link", "set", "dev", dev, "gso_max_segs", "1"],
        ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
        [
            "ip",
            "netns",
            "exec",
            ns,
            "tc",
            "class",
            "add",
            "dev",
            dev,
            "parent",
            "1:",
            "classid",
            "1:10",
            "htb",
            "rate",
            f"{kbit}kbit",
            "ceil",
            f"{kbit}kbit",
            "burst",
            str(burst),
            "cburst",
            str(burst),
            "quantum",
            "60000",
        ],
    ]


def per_node(value, nodes: int) -> list:
    """A value for every node (one number or None) or already one each (a list): one each."""
    return list(value) if isinstance(value, (list, tuple)) else [value] * nodes


def network_commands(tag: str, nodes: int, gbps) -> list[list[str]]:
    """The ip/tc commands that make the switch, the nodes and their links, in order. `gbps`: every node's
    link rate (None: not shaped), or a list of each node's (Spec.rates: a slow node's own)."""
    rates = per_node(gbps, nodes)
    sw = netns(tag, None)
    cmds = [["ip", "netns", "add", sw], ["ip", "-n", sw, "link", "add", "br0", "type", "bridge"]]
    cmds.append(["ip", "-n", sw, "link", "set", "br0", "up"])
    for i in range(nodes):
        ns, port = netns(tag, i), f"p{i}"
        cmds += [
            ["ip", "netns", "add", ns],
            # both ends created inside the run's namespaces: no interface ever appears in the host's
            ["ip", "link", "add", DEVICE, "netns", ns, "type", "veth", "peer", "name", port, "netns", sw],
            ["ip", "-n", sw, "link", "set", port, "master", "br0"],
            ["ip", "-n", sw, "link", "set", port, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "addr", "add", f"{address(i)}/24", "dev", DEVICE],
            ["ip", "-n", ns, "link", "set", DEVICE, "up"],
        ]
        if rates[i]:
            cmds += shaping(ns, DEVICE, rates[i]) + shaping(sw, port, rates[i])
    return cmds


def cgroup_writes(tag: str, nodes: int, cpus, kind: str, root: str = CGROUP_ROOT) -> list[tuple[str, str]]:
    """(file, text) to write after making each node's directory, in order. `cpus`: every node's share in
    cores, or a list of each node's (Spec.shares); a node whose share is None keeps no quota."""
    top = cgroup_dir(tag, kind, root)
    writes = []
    if kind == "v2":
        writes.append((os.path.join(top, "cgroup.subtree_control"), "+cpu"))
    for i, share in enumerate(per_node(cpus, nodes)):
        if not share:
            continue
        quota = max(1000, round(share * PERIOD_US))
        node = os.path.join(top, f"n{i}")
        if kind == "v1":
            writes += [
                (os.path.join(node, "cpu.cfs_period_us"), str(PERIOD_US)),
                (os.path.join(node, "cpu.cfs_quota_us"), str(quota)),
            ]
        else:
            writes.append((os.path.join(node, "cpu.max"), f"{quota} {PERIOD_US}"))
    return writes


def threads_per_rank(cpus: float | None, ranks_per_node: int) -> int:
    """Torch's threads in each rank: the node's cores shared among its ranks, at least one."""
    if not cpus:
        return 1
    return max(1, int(cpus / ranks_per_node + 0.5))


# ---------------------------------------------------------------- a running emulation


@dataclass
class Emulation:
    tag: str
    nodes: int
    spec: Spec
    ranks_per_node: int
    cgroup: str | None = None  # v1 / v2, None when no quota
    made: list = field(default_factory=list)  # namespaces made so far, for clean-up

    @property
    def master_addr(self) -> str:
        return address(0)

    def node_of(self, name: str) -> int:
        """local<i> -> i, for a node this emulation made (ValueError for any other name)."""
        node = host_index(name)
        if node >= self.nodes:
            raise ValueError(f"{name}: this emulation has {self.nodes} nodes, local0 to local{self.nodes - 1}")
        return node

    def address_of(self, name: str) -> str:
        """The address of node `name` (local<i>), where a run whose first node it is meets (its rendezvous):
        a run that leaves nodes out may not start on local0."""
        return address(self.node_of(name))

    def threads(self, node: int) -> int:
        """Torch's threads in each rank of node `node`, from that node's own share."""
        return threads_per_rank(self.spec.for_node(node)[1], self.ranks_per_node)

    def describe(self) -> str:
        base = threads_per_rank(self.spec.cpus_per_node, self.ranks_per_node)
        own = ", ".join(f"local{i}: {self.threads(i)}" for i in range(self.nodes) if self.threads(i) != base)
        return (
            f"isolated: {self.nodes} node namespaces {self.tag}-n0..n{self.nodes - 1} on {SUBNET}.0/24, "
            f"{self.spec.describe()}, {base} thread(s) a rank{f' ({own})' if own else ''}"
            f"{f' (cgroup {self.cgroup})' if self.cgroup else ''}"
        )

    def procs_file(self, node: int) -> str | None:
        if not self.cgroup:
            return None
        return os.path.join(cgroup_dir(self.tag, self.cgroup), f"n{node}", "cgroup.procs")

    def wrap(self, argv: list, extra: dict, node: int, hosts=None) -> tuple[list, dict]:
        """One rank's command, run inside node `node`'s namespace; the rank joins the node's CPU group
        itself before its process group (vit_scale.launch.world.join_cpu_group: its imports stay outside
        the quota). `hosts`: the run's node names, whose overrides its start record names (default: all)."""
        # nsenter, not `ip netns exec`: that one mounts a sysfs of the namespace's own, which hides the
        # cgroup files the rank must write to join its CPU group
        inner = ["nsenter", f"--net={NETNS_DIR}/{netns(self.tag, node)}", "--", *argv]
        procs = self.procs_file(node)
        env = {
            **extra,
            **({"VIT_SCALE_CPU_GROUP": procs} if procs else {}),
            "GLOO_SOCKET_IFNAME": DEVICE,
            "OMP_NUM_THREADS": str(self.threads(node)),
            "VIT_SCALE_EMULATED": "isolated",
            # compact JSON: the shown command (dry run, log header) stays one shell word
            NODES_ENV: json.dumps(
                self.spec.overrides(hosts_of(self.nodes) if hosts is None else hosts), separators=(",", ":")
            ),
        }
        return inner, env

    def wrap_launch(self, launch):
        """Each command of a `processes`, `torchrun` or `single` launch inside its node (the node from
        VIT_SCALE_NODE_NAME=local<i>, any of this emulation's nodes: a run may leave some out; a single
        rank is node 0)."""
        names = [extra.get("VIT_SCALE_NODE_NAME", "local0") for _, extra in launch.commands]
        hosts = list(dict.fromkeys(names))
        launch.commands = [
            self.wrap(argv, {**extra, "VIT_SCALE_NODE_NAME": name}, self.node_of(name), hosts)
            for (argv, extra), name in zip(launch.commands, names, strict=True)
        ]
        return launch


def run(cmd: list) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout).strip().splitlines()
        raise OSError(f"{' '.join(cmd)}: {text[-1] if text else f'exit {proc.returncode}'}")


def start(study: str, nodes: int, ranks_per_node: int, spec: Spec | None, say) -> Emulation | None:
    """Isolated nodes for a study, or None (after one line through `say`) when the ranks must share."""
    mode = mode_asked()
    if mode == "shared":
        say(f"emulated nodes share this machine's network and cores (VIT_SCALE_EMULATION=shared){unapplied(spec)}")
        return None
    reason = why_not(spec, nodes)
    if reason is None:
        sweep()
        quota = any(spec.shares(nodes))
        emu = Emulation(study_tag(study), nodes, spec, ranks_per_node, cgroup_kind() if quota else None)
        try:
            make(emu)
            return emu
        except OSError as exc:
            stop(emu)
            reason = f"setting them up failed: {exc}"
    if mode == "isolated":
        raise UserError(f"VIT_SCALE_EMULATION=isolated: isolated nodes cannot be made here: {reason}")
    say(f"emulated nodes share this machine's network and cores: isolated ones not made, {reason}{unapplied(spec)}")
    return None


def unapplied(spec: Spec | None) -> str:
    """What a shared emulation leaves out of the per-node overrides asked for ('' when none were)."""
    own = spec.describe_nodes() if spec else ""
    return f"; the per-node overrides ({own}) are not applied" if own else ""


def make(emu: Emulation) -> None:
    for cmd in network_commands(emu.tag, emu.nodes, emu.spec.rates(emu.nodes)):
        if cmd[:3] == ["ip", "netns", "add"]:
            emu.made.append(cmd[3])
        run(cmd)
    if emu.cgroup:
        top = cgroup_dir(emu.tag, emu.cgroup)
        os.makedirs(top, exist_ok=True)
        if emu.cgroup == "v2":  # the children need the controller before they exist
            _write(os.path.join(top, "cgroup.subtree_control"), "+cpu")
        for i in range(emu.nodes):
            os.makedirs(os.path.join(top, f"n{i}"), exist_ok=True)
        for path, text in cgroup_writes(emu.tag, emu.nodes, emu.spec.shares(emu.nodes), emu.cgroup):
            _write(path, text)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def stop(emu: Emulation) -> None:
    """Remove everything of this emulation (its processes first, should any be left)."""
    remove(emu.tag)


# ---------------------------------------------------------------- clean-up, also of a killed run's


def namespaces() -> list[str]:
    """This machine's named network namespaces (ip netns list: 'NAME' or 'NAME (id: N)')."""
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def cgroup_tops(root: str = CGROUP_ROOT) -> list[str]:
    """Directories of the emulation's CPU groups under both hierarchies."""
    found = []
    for parent in (os.path.join(root, "cpu"), root):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        found += [os.path.join(parent, n) for n in names if TAG.match(n) and os.path.isdir(os.path.join(parent, n))]
    return found


def leftovers(tag_prefix: str = PREFIX) -> list[str]:
    """What emulations left on this machine (namespaces and CPU groups), whoever made them."""
    return [n for n in namespaces() if n.startswith(tag_prefix)] + [
        d for d in cgroup_tops() if os.path.basename(d).startswith(tag_prefix)
    ]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_tags(names: list[str], is_alive=alive) -> list[str]:
    """The tags among these names whose orchestrator (the pid in the tag) is gone."""
    tags = {}
    for name in names:
        found = TAG.match(os.path.basename(name))
        if found:
            tags[found.group(1)] = int(found.group(2))
    return sorted(tag for tag, pid in tags.items() if not is_alive(pid))


def sweep() -> list[str]:
    """Remove what emulations whose study was killed outright left behind; the tags removed."""
    stale = stale_tags(namespaces() + cgroup_tops())
    for tag in stale:
        remove(tag)
    return stale


def _kill(pids: set) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _netns_pids(ns: str) -> set:
    try:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {int(p) for p in out.split() if p.isdigit()}


def _cgroup_pids(top: str) -> set:
    pids = set()
    for here, _, files in os.walk(top):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(here, "cgroup.procs")) as f:
                    pids |= {int(p) for p in f.read().split()}
            except OSError:
                pass
    return pids


def remove(tag: str) -> None:
    """Every namespace and CPU group of one tag, after killing what still runs in them (the ranks of a
    killed study: its own processes, which its supervisor can no longer stop)."""
    spaces = [n for n in namespaces() if n == f"{tag}-sw" or re.fullmatch(rf"{re.escape(tag)}-n\d+", n)]
    tops = [d for d in cgroup_tops() if os.path.basename(d) == tag]
    pids = set().union(*(_netns_pids(n) for n in spaces), *(_cgroup_pids(d) for d in tops)) - {os.getpid()}
    _kill(pids)
    for ns in spaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    deadline = time.monotonic() + 10
    for top in tops:
        try:
            children = sorted(os.path.join(top, c) for c in os.listdir(top) if os.path.isdir(os.path.join(top, c)))
        except OSError:  # removed meanwhile (two sweeps at once)
            continue
        for d in [*children, top]:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:  # a process that would not die: leave it, say so
                        print(f"vit-scale: could not remove the CPU group {d}")
                        break
                    time.sleep(0.1)


# ---------------------------------------------------------------- what the orchestrators call

WRAPPABLE = ("processes", "torchrun", "single")  # launches whose every command is one node's


def for_launches(kind: str, system, name: str, nodes: int, ranks_per_node: int, say) -> Emulation | None:
    """The isolated nodes a study's or a check's launches of this kind run on, or None (shared, said in one
    line where the profile asks for isolation)."""
    spec = getattr(system, "emulation", None)
    if spec is None or kind not in (*WRAPPABLE, "mpi-local"):
        return None
    if kind == "mpi-local":
        say(
            "emulated nodes share this machine's network and cores: mpirun starts every rank itself, "
            f"isolated nodes need --launcher srun or torchrun{unapplied(spec)}"
        )
        return None
    return start(name, nodes, ranks_per_node, spec, say)
