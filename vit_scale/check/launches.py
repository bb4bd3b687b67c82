"""The check's launches of vit_scale.check.worker over every rank of the nodes: each one built
(the spec the worker reads, the study's launchers, emulated nodes here) and supervised, the labels
left after one that took the ranks down started in a new launch, one --time-limit for them all.
No torch: what each launch found goes into a Ledger (check.ledger).
"""

from __future__ import annotations

import math
import os
import time

from vit_scale.check import report
from vit_scale.check.ledger import (
    Ledger,
    attempt_row,
    blame,
    merge,
    meter_failure,
    out_of_time,
    read_facts,
    unfinished,
)
from vit_scale.check.options import PARTS, Request
from vit_scale.cluster import emulation, launchers, systems
from vit_scale.launch.world import free_port

PROGRAM = ("-m", "vit_scale.check.worker")
GRACE_S = 30  # after one rank ends badly, how long the others get


class Launches:
    """The launches of one request, on the nodes it names (isolated emulated ones while
    `start_nodes` .. `stop_nodes` holds them)."""

    def __init__(self, request: Request):
        self.request = request
        self.emulation = None  # isolated emulated nodes, while the check runs on them
        self.emulation_kind = None  # check.json: isolated, shared, or None (real nodes)
        self.ledger: Ledger | None = None  # the launches so far, for check.json when a signal stops the check

    def start_nodes(self) -> None:
        """Isolated emulated nodes where the profile asks for them (`stop_nodes` removes them
        however the check ends)."""
        r = self.request
        self.emulation = emulation.for_launches(
            r.kind,
            r.system,
            "check",
            r.nodes,
            r.ranks_per_node,
            lambda line: print(f"  {line}", flush=True),
        )
        if self.emulation:
            print(f"  nodes: {self.emulation.describe()}", flush=True)
        self.emulation_kind = (
            ("isolated" if self.emulation else "shared")
            if r.system.emulation is not None and r.kind in (*emulation.WRAPPABLE, "mpi-local")
            else None
        )

    def stop_nodes(self) -> None:
        if self.emulation:
            emulation.stop(self.emulation)

    def write_stopped(self) -> None:
        """check.json from what the launches had found when a signal came."""
        report.write_stopped(self.request, self.ledger, self.emulation_kind)

    def launch_until_done(self, supervisor, stamp: str) -> tuple[dict, list]:
        """The first launch does every part; when a label took the ranks down, the labels after it
        get a launch of their own."""
        r = self.request
        self.ledger = Ledger(stamp)
        facts, attempts = self.ledger.facts, self.ledger.attempts
        remaining = [(a["label"], a["precision"]) for a in r.labels]
        parts = list(r.parts)
        deadline = time.monotonic() + r.time_limit_min * 60  # one limit for every launch together
        while not supervisor.interrupted:
            left_s = deadline - time.monotonic()
            if left_s < 1:
                facts["strategies"] += [
                    out_of_time(label, precision, r.time_limit_min) for label, precision in remaining
                ]
                break
            attempt = len(attempts) + 1
            started = time.time()
            found, outcome, log = self.launch(supervisor, parts, remaining, attempt, stamp, left_s)
            attempts.append(
                attempt_row(attempt, parts, remaining, outcome.code, outcome.seconds, log, outcome.timed_out)
            )
            merge(facts, found)
            culprit = found.get("in_progress")
            if culprit and culprit.get("part") == "meter":
                facts["meter"] = meter_failure(r, culprit, started, outcome, log)
            elif culprit:
                facts["strategies"].append(blame(r, culprit, stamp, attempt, outcome, log))
            done = {(row["label"], row["precision"]) for row in facts["strategies"]}
            remaining = [x for x in remaining if x not in done]
            if outcome.timed_out:
                facts["strategies"] += [
                    out_of_time(label, precision, r.time_limit_min) for label, precision in remaining
                ]
                unfinished(facts, [], f"not finished: stopped at --time-limit {r.time_limit_min:g} min")
                break
            if not culprit or found.get("world") is None:
                break
            # the meter and the GEMMs ran on rank 0 before the world formed: not again
            parts = [p for p in parts if p not in ("meter", "compute") and p not in found.get("parts_done", [])]
            if not remaining:
                parts = [p for p in parts if p != "strategies"]
            if not parts:
                break
        return facts, attempts

    def spec(self, parts: list, labels: list, attempt: int, stamp: str, result: str) -> dict:
        """What one launch's worker is to do (it reads this file on every rank)."""
        from vit_scale.check.environment import nccl_log_name

        r = self.request
        return {
            "parts": parts,
            "labels": [list(x) for x in labels],
            "model": r.model,
            "precisions": r.precisions,
            "batch_size": r.batch_size,
            "peak_tflops": {p: r.system.peak_for(p) for p in r.precisions},
            "quick": r.quick,
            "records": os.path.join(r.out, "records"),
            "result": result,
            "run_prefix": stamp,
            "attempt": attempt,
            # the few ranks that prove the transport log NCCL's lines here (check.environment.logs_transport)
            "nccl_log": os.path.join(r.out, "logs", nccl_log_name(stamp, attempt))
            if r.system.backend == "nccl"
            else None,
        }

    def launch(self, supervisor, parts: list, labels: list, attempt: int, stamp: str, left_s: float):
        """One launch over every rank, supervised for at most `left_s`: (what its rank 0 wrote,
        the supervisor's outcome, its log)."""
        r = self.request
        spec_path = os.path.join(r.out, "logs", f"spec.{stamp}.{attempt}.json")
        result = os.path.join(r.out, "logs", f"facts.{stamp}.{attempt}.json")
        report.write_atomically(spec_path, self.spec(parts, labels, attempt, stamp, result))
        nodes_here = systems.allocation_nodes() if r.in_slurm else []
        addr = systems.node_address(nodes_here[0], r.system.master_addr) if nodes_here else "127.0.0.1"
        if self.emulation:
            addr = self.emulation.master_addr
        launch = launchers.build(
            r.kind,
            r.python,
            [f"spec={spec_path}"],
            system=r.system,
            nodes=r.nodes,
            ranks_per_node=r.ranks_per_node,
            nodelist=",".join(nodes_here[: r.nodes]),
            master_addr=addr,
            master_port=free_port(),
            time_limit_min=math.ceil(left_s / 60) if r.use_slurm else None,
            grace_s=GRACE_S,
            rdzv_id=f"{os.environ.get('SLURM_JOB_ID', '0')}.check{attempt}",
            as_root=os.geteuid() == 0,
            program=PROGRAM,
        )
        if self.emulation and r.kind in emulation.WRAPPABLE:
            launch = self.emulation.wrap_launch(launch)
        log = os.path.join(r.out, "logs", f"check.{stamp}.{attempt}.log")
        with open(log, "w") as f:
            f.write(launch.log_header())
        what = (
            "every part"
            if parts == list(PARTS)
            else f"the {len(labels)} label(s) left"
            if parts == ["strategies"]
            else ", ".join(parts)
            if attempt == 1
            else f"{', '.join(parts)} (without the meter)"
        )
        print(f"  launch {attempt}: {what} ... ", end="", flush=True)
        self.ledger.current = {
            "result": result,
            "log": log,
            "attempt": attempt,
            "parts": parts,
            "labels": labels,
            "started": time.time(),
        }
        outcome = supervisor.run(launch, log, left_s, on_signal=self.write_stopped)
        self.ledger.current = None
        print(f"exit {outcome.code} ({outcome.seconds:.0f} s)", flush=True)
        return read_facts(result), outcome, log
