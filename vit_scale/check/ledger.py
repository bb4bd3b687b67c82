"""What the check's launches found, kept across them: the facts, one row per launch, and the row
of whatever was running when the ranks ended or a signal stopped them. No torch.

The launches (check.launches) add to a `Ledger`; check.json (check.report) is written from it,
at the end or, when a signal stops the check, from what it holds at that moment (`so_far`).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import time

STOPPED_BY_SIGNAL = "stopped by a signal (Slurm's at the allocation's end, or a user's)"


class Ledger:
    """The facts and launches so far of one check (`stamp` names its files)."""

    def __init__(self, stamp: str):
        self.stamp = stamp
        self.facts: dict = {"strategies": []}
        self.attempts: list = []
        self.current: dict | None = None  # the launch now running: result, log, attempt, parts, labels, started
        self.written = False  # check.json already written at a signal

    def so_far(self, labels: list) -> tuple[dict, list]:
        """(facts, attempts) when a signal stops the check (Slurm's at the allocation's end, which
        kills KillWait seconds later): what the launches had found and the running one's rank 0 had
        written, every part and label not finished a timeout."""
        facts, attempts = copy.deepcopy(self.facts), list(self.attempts)
        why = STOPPED_BY_SIGNAL
        current = self.current
        if current:
            found = read_facts(current["result"])
            merge(facts, found)
            culprit = found.get("in_progress") or {}
            if culprit.get("label"):
                facts["strategies"].append(
                    {
                        "label": culprit["label"],
                        "precision": culprit["precision"],
                        "status": "timeout",
                        "run_dir": None,
                        "log": current["log"],
                        "error": f"{why} during this label",
                    }
                )
            attempts.append(
                attempt_row(
                    current["attempt"],
                    current["parts"],
                    current["labels"],
                    143,
                    time.time() - current["started"],
                    current["log"],
                    False,
                )
            )
        unfinished(facts, labels, f"not finished: {why}")
        return facts, attempts


def attempt_row(attempt: int, parts: list, labels: list, code: int, seconds: float, log: str, timed_out: bool):
    """check.json's row of one launch."""
    return {
        "attempt": attempt,
        "parts": parts,
        "labels": [list(x) for x in labels],
        "code": code,
        "seconds": round(seconds, 1),
        "log": log,
        "timed_out": timed_out,
        "last_line": last_line(log),
    }


def read_facts(path: str) -> dict:
    """What a launch's rank 0 wrote; nothing when it wrote nothing (yet) or half a file."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def meter_failure(request, culprit: dict, since: float, outcome, log: str) -> dict:
    """The meter's facts when its trainer run took rank 0 down: that run's recorded error (its
    newest run under records/meter, started by this launch), else the launch's last line."""
    from vit_scale.check.strategies import from_record

    runs = [
        d
        for d in glob.glob(os.path.join(request.out, "records", "meter", "*", "DDP", "*", "*"))
        if os.path.getmtime(d) >= since - 1
    ]
    error = from_record(max(runs, key=os.path.getmtime)).get("error") if runs else None
    stopped = stopped_why(outcome, request.time_limit_min)
    if stopped:  # the run was stopped, not ended by itself: what it wrote (if it could) says less
        return {
            "error": f"timeout: {stopped} during the meter's run: {last_line(log)}",
            "settings": culprit.get("settings") or {},
        }
    return {
        "error": f"failed: the trainer's run ended the ranks (exit {outcome.code}): "
        f"{' '.join(str(error or last_line(log)).split())[:300]}",
        "settings": culprit.get("settings") or {},
    }


def stopped_why(outcome, limit_min: float) -> str | None:
    """Why the launch was stopped from outside, or None when its ranks ended by themselves. A
    signal stops the launch as the time limit does: the label then running did not fail, even
    when its trainer was killed before it could write its end record."""
    if outcome.interrupted:
        return STOPPED_BY_SIGNAL
    if outcome.timed_out:
        return f"stopped at --time-limit {limit_min:g} min"
    return None


def blame(request, culprit: dict, stamp: str, attempt: int, outcome, log: str) -> dict:
    """The row of the label that was running when the ranks ended: its run record's status and
    error when it wrote one, else what the launch's end says."""
    from vit_scale.check.strategies import from_record

    run_dir = run_dir_of(request, stamp, culprit["label"], culprit["precision"], attempt)
    row = {
        "label": culprit["label"],
        "precision": culprit["precision"],
        "run_dir": run_dir,
        "log": log,
        **(from_record(run_dir) if run_dir else {"status": "failed", "error": None}),
    }
    stopped = stopped_why(outcome, request.time_limit_min)
    if stopped:
        row.update(status="timeout", error=f"{stopped} during this label: {last_line(log)}")
    elif row["status"] == "ok" or not row.get("error"):
        row.update(
            status="failed" if row["status"] == "ok" else row["status"],
            error=f"the ranks ended (exit {outcome.code}) during this label: {last_line(log)}",
        )
    return row


def run_dir_of(request, stamp: str, label: str, precision: str, attempt: int) -> str | None:
    from vit_scale.check.strategies import MODEL, run_id

    pattern = os.path.join(
        request.out,
        "records",
        "check",
        MODEL,
        label,
        f"n{request.nodes}",
        run_id(stamp, label, precision, attempt) + "*",
    )
    found = sorted(glob.glob(pattern), key=os.path.getmtime)
    return found[-1] if found else None


def unfinished(facts: dict, labels: list, why: str) -> None:
    """Every part a stopped check did not finish, as a timeout: the labels without a row, and the
    meter and collectives when their facts are missing (the verdict makes each a timeout line)."""
    done = {(r["label"], r["precision"]) for r in facts.get("strategies", [])}
    facts.setdefault("strategies", []).extend(
        {"label": label, "precision": precision, "status": "timeout", "run_dir": None, "error": why}
        for label, precision in labels
        if (label, precision) not in done
    )
    if facts.get("world") is not None:
        for part in ("interconnect", "meter"):
            if facts.get(part) is None:
                facts[part] = {"error": f"timeout: {why}"}


def out_of_time(label: str, precision: str, limit_min: float) -> dict:
    return {
        "label": label,
        "precision": precision,
        "status": "timeout",
        "run_dir": None,
        "error": f"not started: the launches before it used all of --time-limit {limit_min:g} min",
    }


def merge(facts: dict, found: dict) -> None:
    """A later launch adds its strategy rows (and whatever part it did) to what the first found."""
    rows = facts.get("strategies", []) + found.get("strategies", [])
    for key, value in found.items():
        if key == "parts_done":
            facts["parts_done"] = list(dict.fromkeys(facts.get("parts_done", []) + value))
        elif key not in ("strategies", "in_progress") and key not in facts:
            facts[key] = value
    facts["strategies"] = rows


def last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [
                line.strip() for line in f if line.strip() and not line.startswith("#") and "NCCL INFO" not in line
            ]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty)"
