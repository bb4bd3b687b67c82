"""check.json read back, for the study's summary and the analysis report. No torch.

The facts a reader of figures needs beside them: the verdict, the versions, the transport
between nodes, and the bus bandwidth of each collective within and across nodes. Beside the run
record's reader because both are what the analysis reads of a study directory: `vit-scale check`
writes the file, this reads it, and the analysis may import only what lies below the check.
"""

from __future__ import annotations

import glob
import json
import os
import re

CHECK_FILE = "check.json"
CHECK_SCHEMAS = (1, 2)  # the check.json schemas this reads (vit_scale.check.report.SCHEMA_VERSION writes the last)
# A study's check of its N nodes (what `vit-scale study --check` writes): check-n<N>.json, or
# check-n<N>-<MODEL>.json where the study has one model, as each job of a --per-model sweep has: those
# jobs run side by side on one node count, each checking its own model into the same study directory.
CHECK_OF_NODES = re.compile(r"check-n(\d+)(?:-(.+))?\.json")
LEFT_OUT_FILE = "nodes_left_out.json"  # the nodes a study left out (vit_scale.study.slow_nodes writes it)


def check_path(directory: str, nodes: int, model: str | None = None) -> str:
    """Where a study's check of `nodes` nodes (of `model`, where the name carries it) is kept."""
    return os.path.join(directory, f"check-n{nodes}{f'-{model}' if model else ''}.json")


def read_check(directory: str) -> dict | None:
    """DIRECTORY/check.json, or None when there is none or it cannot be read."""
    return read_check_file(os.path.join(directory, CHECK_FILE))


def read_check_file(path: str) -> dict | None:
    """One check file (check.json, or a study's check-n<N>.json), or None when it cannot be read."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    # schema 2 adds the per-step fits (step_fits); everything schema 1 had is there as it was
    return data if isinstance(data, dict) and data.get("schema") in CHECK_SCHEMAS else None


def verdict(check: dict) -> str:
    broken = [
        line for line in check.get("lines") or [] if line.get("needed") and line.get("status") in ("fail", "refused")
    ]
    return "ready" if not broken else f"{len(broken)} broken"


def versions(check: dict) -> str:
    v = (check.get("facts") or {}).get("versions") or {}
    parts = [f"torch {v['torch']}"] if v.get("torch") else []
    parts += [
        f"{name} {v[key]}"
        for key, name in (("cuda", "CUDA"), ("hip", "HIP"), ("nccl", "NCCL/RCCL"), ("driver", "driver"))
        if v.get(key)
    ]
    return ", ".join(parts)


def transport(check: dict) -> str:
    t = check.get("transport") or {}
    observed = ", ".join(t.get("observed") or []) or "unknown"
    networks = ", ".join(t.get("between_nodes") or t.get("networks") or [])
    return (
        f"{observed}{f' ({networks})' if networks and networks != observed else ''}, expected "
        f"{' or '.join(t.get('expected') or []) or '?'}"
    )


def bandwidth_rows(check: dict) -> list[dict]:
    """One row a measurement of a strategy's own size (a Block, DDP's bucket, ZeRO's): what the
    figures' communication rides on (the sweep's other sizes feed the fits)."""
    found = ((check.get("facts") or {}).get("interconnect") or {}).get("measurements") or []
    return [m for m in found if m.get("size") in ("block", "bucket", "zero_bucket")]


def latency_rows(check: dict) -> list[dict]:
    """The smallest size of each collective, scope and group size: its time is the latency."""
    found = ((check.get("facts") or {}).get("interconnect") or {}).get("measurements") or []
    smallest: dict = {}
    for m in found:
        key = (m.get("collective"), m.get("scope"), m.get("ranks"))
        if m.get("size") == "latency" and (key not in smallest or m["bytes"] < smallest[key]["bytes"]):
            smallest[key] = m
    return list(smallest.values())


def headline(check: dict) -> str:
    """One line: verdict, versions, transport, the bucket all-reduce's bus bandwidth in the widest scope."""
    rows = [m for m in bandwidth_rows(check) if m.get("collective") == "all_reduce" and m.get("size") == "bucket"]
    widest = max(rows, key=lambda m: m.get("ranks", 0), default=None)
    where = "across nodes" if widest and widest["scope"] == "world" else "within a node"
    bw = f", all_reduce busbw {widest['busbw_gbs']:.3g} GB/s {where}" if widest else ""
    software = versions(check)
    return (
        f"{verdict(check)} ({check.get('time_iso', '?')}): {software + '; ' if software else ''}transport "
        f"{transport(check)}{bw}"
    )


def check_files(directory: str) -> list[tuple[int, str | None, str, dict]]:
    """(node count, model or None, path, check) of each node count's check in a study directory
    (CHECK_OF_NODES; a sweep's jobs each write theirs), by node count, then model."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(directory), "check-n*.json")):
        name = CHECK_OF_NODES.fullmatch(os.path.basename(path))
        check = read_check_file(path) if name else None
        if check is not None:
            found.append((int(name.group(1)), name.group(2), path, check))
    return sorted(found, key=lambda item: (item[0], item[1] or ""))


def checks_of(directory: str) -> list[tuple[int, dict]]:
    """(node count, check) of each check in a study directory (check_files without the names)."""
    return [(nodes, check) for nodes, _, _, check in check_files(directory)]


def named_slow(check: dict | None) -> dict[str, str]:
    """{host: why} of the nodes a check named (empty for a check without the nodes part)."""
    found = (check or {}).get("per_node") or {}
    out: dict[str, str] = {}
    for named in found.get("slow") or []:
        why = f"{named['figure']} {named['share']:.0%} of the median node's"
        out[named["node"]] = f"{out[named['node']]}, {why}" if named["node"] in out else why
    return out


def read_left_out(study_dir: str) -> dict:
    """{host: why} a study left out (empty when it left none out, or the file cannot be read)."""
    try:
        with open(os.path.join(study_dir, LEFT_OUT_FILE)) as f:
            return dict(json.load(f).get("left_out") or {})
    except (OSError, ValueError, AttributeError):
        return {}
