"""What the ranks run on: versions, devices and their binding, modules, JIT kernels; and the
network transport the collective library really chose, read from its own log lines.

The transport: NCCL and RCCL print, with NCCL_DEBUG=INFO (the worker sets it with
NCCL_DEBUG_SUBSYS=INIT,NET on the ranks that prove the transport, `logs_transport`), the network
they loaded,
  "NCCL INFO Using network IB" | "Using network Socket" | "Using network AWS Libfabric"
(src/init.cc: INFO(NCCL_INIT, "Using network %s", ...)), and for each connection to a rank on
another node the transport it goes through,
  "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0" | "via NET/Socket/0" | "via NET/AWS Libfabric/0/GDRDMA"
(src/transport/net.cc: INFO(NCCL_INIT|NCCL_NET, "... via NET/%s/%d..."); within a node, P2P or
SHM). gloo has one transport on Linux, TCP. The parsing here is torch-free; the orchestrator
runs it on the launch's log files, read as a stream and only until a connection between nodes
is seen.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator

# what a profile without `inter_node_transport` expects between nodes, by its backend
EXPECTED_BY_BACKEND = {"nccl": ("ib", "ofi"), "gloo": ("tcp",)}
TRANSPORTS = ("ib", "ofi", "socket", "tcp")
USING_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
VIA_NET = re.compile(r"via NET/([^/\n]+)/")
NCCL_LOGGING = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
LOGGING_NODES = 2  # the ranks of this many nodes log: enough to see connections between nodes


def transport_class(network: str) -> str:
    """A network's name as NCCL prints it -> ib, ofi, socket (or the name itself, lower case)."""
    name = network.strip().lower()
    if "socket" in name:
        return "socket"
    if "libfabric" in name or "ofi" in name:
        return "ofi"
    if name.startswith("ib"):
        return "ib"  # NCCL's verbs transport, and IBext (SHARP's collnet) alike
    return name


def expected_transport(profile: list, backend: str) -> tuple:
    """The system profile's `inter_node_transport`, else what its backend should use."""
    return tuple(profile) or EXPECTED_BY_BACKEND.get(backend, ())


def nccl_transport(logs) -> dict:
    """What NCCL's INFO lines say: the network it loaded, and the transports its connections
    between nodes went through (empty when every peer was on the rank's node). `logs` is one
    text, or files as iterables of lines; reading stops at the end of the first file that shows a
    connection between nodes, so that a launch's many files are not all read."""
    networks, between_nodes, evidence = {}, {}, []
    for lines in [logs.splitlines()] if isinstance(logs, str) else logs:
        for line in lines:
            found = USING_NETWORK.search(line)
            if found:
                networks.setdefault(found.group(1), None)
                if len(evidence) < 4 and line.strip() not in evidence:
                    evidence.append(line.strip())
                continue
            found = VIA_NET.search(line)
            if found:
                if found.group(1) not in between_nodes and len(evidence) < 8:
                    evidence.append(line.strip())
                between_nodes[found.group(1)] = None
        if between_nodes:
            break
    return {"networks": list(networks), "between_nodes": list(between_nodes), "evidence": evidence}


def nccl_log_name(stamp: str, attempt: int) -> str:
    """NCCL_DEBUG_FILE's name: NCCL puts the host for %h and the process id for %p."""
    return f"nccl.{stamp}.{attempt}.%h.%p.log"


def logs_transport(rank: int, ranks_per_node: int) -> bool:
    """Whether this rank writes NCCL's INFO lines: every rank of the first LOGGING_NODES nodes (with
    srun's block placement), at most 16 files on Frontier whatever the node count. Every rank of
    them and not their local rank 0 alone: NCCL chooses which GPU of a node carries each ring's
    connection to the next node (the one nearest a NIC), and the sender on node 0 and the receiver
    on node 1 are among these ranks whichever it is."""
    return rank < LOGGING_NODES * max(1, ranks_per_node)


def nccl_logging(log_path: str) -> dict:
    """The environment that makes NCCL write its INFO lines to a file per process (unbuffered:
    src/debug.cc, ncclDebugInit), read once, at NCCL's first use in the process."""
    return {**NCCL_LOGGING, "NCCL_DEBUG_FILE": log_path}


def collective_logs(out: str, stamp: str, rank_logs: list) -> Iterator[Iterable[str]]:
    """NCCL's lines of this check, file by file, each a stream of lines (nothing concatenated):
    its files (one per logging process), then the launches' logs, where they land when NCCL could
    not open the file."""
    folder, prefix = os.path.join(out, "logs"), f"nccl.{stamp}."
    try:
        with os.scandir(folder) as entries:  # in the directory's order: no list of every name
            for entry in entries:
                if entry.name.startswith(prefix) and entry.name.endswith(".log"):
                    yield lines_of(entry.path)
    except OSError:
        pass
    for path in rank_logs:
        yield lines_of(path)


def lines_of(path: str) -> Iterator[str]:
    try:
        with open(path, errors="replace") as f:
            yield from f
    except OSError:
        return


def transport_facts(backend: str, logs, expected: tuple, gloo_transport: str = "tcp") -> dict:
    """The transport between nodes as observed, beside what is expected (`logs`: as nccl_transport)."""
    if backend == "gloo":
        observed = [gloo_transport.lower()]
        return {
            "backend": "gloo",
            "observed": observed,
            "networks": [],
            "between_nodes": observed,
            "expected": list(expected),
            "source": "gloo (TCP is its one transport on Linux)",
            "evidence": [],
        }
    seen = nccl_transport(logs)
    used = seen["between_nodes"] or seen["networks"]
    return {
        "backend": backend,
        "observed": list(dict.fromkeys(transport_class(n) for n in used)),
        "networks": seen["networks"],
        "between_nodes": seen["between_nodes"],
        "expected": list(expected),
        "source": "NCCL_DEBUG=INFO lines"
        + ("" if seen["between_nodes"] else " ('Using network', no connection between nodes seen)"),
        "evidence": seen["evidence"],
    }


# ---------------------------------------------------------------- on the ranks (torch from here on)

VISIBLE_DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def cpu_list(cpus) -> str:
    """{0,1,2,5} -> "0-2,5"."""
    cpus = sorted(cpus)
    runs, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            runs.append(f"{start}" if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(runs)


def rank_facts(world) -> dict:
    """This rank: where it runs, which device it drives, what it may see, which cores it is bound to."""
    facts = {
        "rank": world.rank,
        "node": world.node_name,
        "local_rank": world.local_rank,
        "device_type": world.device_type,
        "device_index": world.device_index,
        "device_name": None,
        "device_id": None,
        "visible_devices": {k: os.environ[k] for k in VISIBLE_DEVICE_VARIABLES if k in os.environ},
        "cpus": cpu_list(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    if world.device_type != "cpu":
        import torch

        props = torch.cuda.get_device_properties(world.device_index)
        facts["device_name"] = props.name
        facts["device_id"] = gpu_identity(props)
    return facts


def gpu_identity(props) -> str | None:
    """What tells two GPUs of a node apart: the PCI address (domain:bus:device, as torch's own
    torch/numa/binding.py reads it from the device properties), else the UUID when it looks real.
    ROCr can report a placeholder UUID such as "GPU-XX" for every device, which would make all of
    a node's ranks look like one GPU."""
    address = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    if all(isinstance(n, int) for n in address) and any(address):
        domain, bus, device = address
        return f"pci {domain:04x}:{bus:02x}:{device:02x}"
    uuid = str(getattr(props, "uuid", None) or "")
    return uuid if real_uuid(uuid) else None


def real_uuid(uuid: str) -> bool:
    """A UUID with at least 8 hex digits, not all zeros ("GPU-XX" and empty ones are placeholders)."""
    digits = [c for c in uuid.lower().removeprefix("gpu-") if c in "0123456789abcdef"]
    return len(digits) >= 8 and any(c != "0" for c in digits)


def driver_version(device_type: str) -> str | None:
    """The kernel driver's version, from the files the drivers publish (no nvidia-smi/rocm-smi)."""
    paths = {"cuda": "/proc/driver/nvidia/version", "rocm": "/sys/module/amdgpu/version"}
    path = paths.get(device_type)
    if not path:
        return None
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]*)", text) if device_type == "cuda" else None
    return found.group(1) if found else (text.split()[0] if text.split() else None)


def loaded_modules() -> list[str]:
    """Lmod's and Environment Modules' list of what is loaded."""
    return [m for m in os.environ.get("LOADEDMODULES", "").split(":") if m]


def host_facts(world) -> dict:
    """Rank 0's view: software versions, the driver, modules."""
    from vit_scale.record.versions import software_versions

    versions = software_versions()
    versions["driver"] = driver_version(world.device_type)
    return {"versions": versions, "modules": loaded_modules()}


def kernel_facts(labels: list, device_kind: str) -> list[dict]:
    """Each JIT kernel the labels need on this device kind, whether it is built where this rank
    looks for it ($TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions), and which labels need it."""
    from vit_scale.distributed.kernels import kernels_for

    users: dict = {}
    for label in labels:
        for kernel in kernels_for([label], device_kind):
            users.setdefault(kernel.key, (kernel, []))[1].append(label)
    facts = []
    for key, (kernel, labels_) in users.items():
        try:
            built, where, error = kernel.built(), kernel.build_dir(), None
        except ImportError as exc:
            built, where, error = False, None, f"{exc.name or kernel.package} is not installed"
        facts.append({"key": key, "labels": labels_, "built": built, "build_dir": where, "error": error})
    return facts
