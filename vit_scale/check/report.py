"""What `vit-scale check` prints and writes: the header, check.json (the request, the launches,
the facts, the fits and the verdict's lines) and the table, at the end or when a signal stops the
check. No torch: the verdict (check.verdict) turns the facts into lines.
"""

from __future__ import annotations

import json
import os
import sys
import time

from vit_scale.check.ledger import Ledger
from vit_scale.check.options import PARTS, Request
from vit_scale.cluster import emulation, launchers
from vit_scale.errors import UserError

SCHEMA_VERSION = 2  # 2: step_fits, the per-step fits over every group size (1 had fits alone)


def header(request: Request) -> None:
    r = request
    ranks = r.nodes * r.ranks_per_node
    labels = list(dict.fromkeys(a["label"] for a in r.labels))
    own = r.system.emulation.describe_nodes() if r.system.emulation and not r.in_slurm else ""
    print(
        f"{r.prog} on {r.system.name}{f' (emulated node overrides: {own})' if own else ''}: "
        f"{r.nodes} node{'s' if r.nodes > 1 else ''} x "
        f"{r.ranks_per_node} rank{'s' if r.ranks_per_node > 1 else ''} ({ranks} in all, "
        f"{r.system.backend}), {'/'.join(r.precisions)}{', quick' if r.quick else ''}"
    )
    if r.parts != list(PARTS):
        print(f"  parts: {', '.join(r.parts)} (--only)")
    if labels:
        print(f"  strategies: {', '.join(labels)}; collective sizes from {r.model}")
    print(f"  launcher: {launchers.describe(r.kind, r.system, r.ranks_per_node)}; logs: {os.path.join(r.out, 'logs')}")
    print(f"  time limit: {r.time_limit_min:.3g} min ({r.time_limit_why})", flush=True)


def make_folders(out: str) -> None:
    """OUT/logs and OUT/records, before the first launch writes there."""
    for sub in ("logs", "records"):
        try:
            os.makedirs(os.path.join(out, sub), exist_ok=True)
        except OSError as exc:
            raise UserError(f"--out: cannot create {os.path.join(out, sub)}: {exc.strerror}") from None


def assemble(request: Request, facts: dict, attempts: list, stamp: str, emulation_kind: str | None) -> dict:
    """check.json without its verdict: the request, the launches, the facts and the fits.
    `emulation_kind`: isolated, shared, or None (real nodes)."""
    from vit_scale.check.collectives import fits_of, step_fits_of
    from vit_scale.check.environment import collective_logs, transport_facts

    r = request
    logs = collective_logs(r.out, stamp, [a["log"] for a in attempts])
    world = facts.get("world") or {}
    backend = world.get("backend") or r.system.backend
    return {
        "schema": SCHEMA_VERSION,
        "tool": r.prog,
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "system": r.system.name,
        "backend": r.system.backend,
        "nodes": r.nodes,
        "ranks_per_node": r.ranks_per_node,
        "precisions": r.precisions,
        "model": r.model,
        "quick": r.quick,
        "parts": list(request.parts),
        "labels": r.labels,
        "expected_transport": r.expected,
        "slurm": {"job_id": os.environ.get("SLURM_JOB_ID"), "nodelist": os.environ.get("SLURM_JOB_NODELIST")}
        if r.in_slurm
        else None,
        "launch": {
            "kind": r.kind,
            "description": launchers.describe(r.kind, r.system, r.ranks_per_node),
            "attempts": attempts,
            # emulated nodes: own namespaces and CPU quota (isolated), or this machine's, shared
            "emulation": emulation_kind,
        },
        "transport": transport_facts(backend, logs, tuple(r.expected), world.get("gloo_transport", "tcp")),
        "facts": {k: v for k, v in facts.items() if k not in ("compute", "nodes")},
        # the Block's GEMMs timed at the model's shapes (vit_scale.check.gemms): the planner's compute
        "compute": facts.get("compute"),
        # every node's compute and link, the median node and the nodes named slow (vit_scale.check.nodes)
        "per_node": facts.get("nodes"),
        "out": r.out,
        "emulation": emulation_facts(r, emulation_kind),
        # the alpha-beta line of each collective, scope and group size, from the size sweep, and the
        # per-step fit over every group size that a prediction uses (docs/check.md)
        "fits": fits_of((facts.get("interconnect") or {}).get("measurements") or []),
        "step_fits": step_fits_of((facts.get("interconnect") or {}).get("measurements") or []),
    }


def emulation_facts(request: Request, emulation_kind: str | None) -> dict | None:
    """Emulated nodes: `kind` (isolated, shared; as launch.emulation), the profile's rates and shares as
    `description`, and `nodes`, the per-node overrides the check's nodes ran with (a slow node on purpose;
    {} when none, or when the nodes shared this machine and so none was applied). None on real nodes."""
    spec = request.system.emulation
    if emulation_kind is None or spec is None:
        return None
    applied = spec.overrides(emulation.hosts_of(request.nodes)) if emulation_kind == "isolated" else {}
    return {"kind": emulation_kind, "description": spec.describe(), "nodes": applied}


def conclude(request: Request, check: dict) -> int:
    """The verdict on an assembled check: check.json written, the table and each broken line
    printed; the exit code (0 ready, 1 something broken)."""
    from vit_scale.check import verdict
    from vit_scale.check.lines import broken, table

    found = verdict.lines(check)
    bad = broken(found)
    check.update(lines=[line.to_dict() for line in found], ok=not bad, exit_code=1 if bad else 0)
    write_atomically(request.json_path, check)
    print("\n".join(table(found)))
    if bad:
        print(f"{request.prog}: {len(bad)} broken -> {request.json_path}")
        for line in bad:
            print(f"{request.prog}: FAIL {line.one_line()}", file=sys.stderr)
    else:
        print(f"{request.prog}: ready -> {request.json_path}")
    sys.stdout.flush()
    return 1 if bad else 0


def write_stopped(request: Request, ledger: Ledger | None, emulation_kind: str | None) -> None:
    """check.json when a signal stops the check: from what the ledger holds (`Ledger.so_far`),
    every part and label not finished a timeout line. Exit code 143 all the same."""
    from vit_scale.check import verdict

    if ledger is None:
        print(f"{request.prog}: stopped by a signal before any launch; check.json not written", file=sys.stderr)
        return
    facts, attempts = ledger.so_far([(a["label"], a["precision"]) for a in request.labels])
    check = assemble(request, facts, attempts, ledger.stamp, emulation_kind)
    found_lines = verdict.lines(check)
    check.update(lines=[line.to_dict() for line in found_lines], ok=False, exit_code=1)
    try:
        write_atomically(request.json_path, check)
    except OSError:
        return
    timeouts = sum(1 for line in found_lines if line.text.startswith("timeout"))
    if not ledger.written:
        print(
            f"{request.prog}: stopped by a signal; check.json written from what the ranks had reported, "
            f"{timeouts} part(s) unfinished as timeout lines -> {request.json_path}",
            file=sys.stderr,
            flush=True,
        )
    ledger.written = True


def write_atomically(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)
