"""What a study does with the nodes its check named slow (check.json's `per_node`, vit_scale.check.nodes).

With `--exclude-slow-nodes` the study runs every step on the allocation less those nodes (their names
left out of each srun step's --nodelist, or of the emulated nodes' set), skips with one line each rung that
no longer fits, and writes which nodes were left out and why to OUT/STUDY/nodes_left_out.json, which the
report shows. Without it the study goes on on every node and says so; the report then flags the points that
ran on a named node. No torch.
"""

from __future__ import annotations

import json
import os

LEFT_OUT_FILE = "nodes_left_out.json"


def named_slow(check: dict | None) -> dict[str, str]:
    """{host: why} of the nodes a check named (empty for a check without the nodes part)."""
    found = (check or {}).get("per_node") or {}
    out: dict[str, str] = {}
    for named in found.get("slow") or []:
        why = f"{named['figure']} {named['share']:.0%} of the median node's"
        out[named["node"]] = f"{out[named['node']]}, {why}" if named["node"] in out else why
    return out


def only_slow_nodes_broken(check: dict | None) -> bool:
    """True when every broken line of the check is a slow node's: the system works, one node is slow."""
    lines = (check or {}).get("lines") or []
    broken = [line for line in lines if line.get("needed") and line["status"] in ("fail", "refused")]
    return bool(broken) and all(line["check"].startswith("node ") for line in broken)


def usable(names: list[str], left_out: dict) -> list[str]:
    """The nodes a study runs on: the allocation's (or the emulated ones) in order, less those left out."""
    return [n for n in names if n not in left_out]


def write_left_out(study_dir: str, left_out: dict, check_path: str) -> str:
    """OUT/STUDY/nodes_left_out.json: which nodes the study left out, why, and by which check."""
    path = os.path.join(study_dir, LEFT_OUT_FILE)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"left_out": left_out, "check": check_path}, f, indent=1)
    os.replace(tmp, path)
    return path


def read_left_out(study_dir: str) -> dict:
    """{host: why} a study left out (empty when it left none out, or the file cannot be read)."""
    try:
        with open(os.path.join(study_dir, LEFT_OUT_FILE)) as f:
            return dict(json.load(f).get("left_out") or {})
    except (OSError, ValueError, AttributeError):
        return {}
