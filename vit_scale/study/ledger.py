"""The study's ledger (OUT/STUDY/study_runs.tsv: one line per run attempted or found done), the
earlier ok runs with the same settings (resume: which repetitions of a point are done), and the
table printed at the end."""

from __future__ import annotations

import csv
import glob
import json
import os
import statistics
import time

from vit_scale.record.reader import read_run_dir, start_and_end
from vit_scale.record.writer import EXIT_CODES, METRICS_FILE

COLUMNS = (
    "time",
    "job",
    "model",
    "strategy",
    "variant",
    "nodes",
    "ranks",
    "launcher",
    "exit_code",
    "status",
    "images_per_s",
    "seconds",
    "run_dir",
    "log",
    "repetition",
)
STATUS_OF_CODE = {code: status for status, code in EXIT_CODES.items()}
STATUS_OF_CODE[2] = "bad-input"


def status_of_code(code: int) -> str:
    """For a run that left no end record: what its exit code says (a run that exited 0 without
    a record did not do its job)."""
    status = STATUS_OF_CODE.get(code, "failed")
    return "failed" if status == "ok" else status


class Ledger:
    def __init__(self, path: str):
        self.path = path

    def add(self, **row) -> None:
        new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        row.setdefault("time", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        row.setdefault("job", os.environ.get("SLURM_JOB_ID") or "-")
        with open(self.path, "a") as f:
            if new:
                f.write("\t".join(COLUMNS) + "\n")
            f.write("\t".join(str(row.get(c, "-")).replace("\t", " ") for c in COLUMNS) + "\n")

    def rows(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            lines = list(csv.reader(f, delimiter="\t"))
        header = lines[0] if lines else []
        if tuple(header) == COLUMNS[: len(header)]:
            # a ledger begun by an older version lacks the newer last columns (repetition), which the
            # lines this version appends to it have
            header = list(COLUMNS)
        return [dict(zip(header, line, strict=False)) for line in lines[1:] if line]

    def has_run(self, run_dir: str) -> bool:
        """Whether a row names this run directory already: one row a run, however often it is resumed.
        Compared by the path inside the study directory, so that a study moved, copied or reached
        through a symbolic link still knows its runs (rows hold the path the study had then)."""
        inside = _parts(os.path.relpath(os.path.abspath(run_dir), os.path.dirname(os.path.abspath(self.path))))
        if not inside or inside[0] == os.pardir:  # not under the study: only the very path
            return any(row.get("run_dir") == run_dir for row in self.rows())
        return any(_parts(row.get("run_dir") or "")[-len(inside) :] == inside for row in self.rows())


def _parts(path: str) -> list[str]:
    return [part for part in os.path.normpath(path).split(os.sep) if part not in ("", os.curdir)]


def unattended(run_dir: str, ledger: Ledger, logs: str) -> bool:
    """A run a study launched (its log is in the study's logs/) that has no ledger row: the study
    writes the row once it has seen the run end, so this run ended, if at all, after its study had
    died (killed outright), unsupervised and maybe beside the resumed study's next run."""
    launched = glob.glob(os.path.join(logs, f"*.{glob.escape(os.path.basename(run_dir))}.log"))
    return bool(launched) and not ledger.has_run(run_dir)


def run_result(run_dir: str) -> tuple[str, str, str]:
    """(status, images/s, error) from a run's record; status "none" when it has no end record."""
    start, end = start_and_end(run_dir)
    if end is None:
        return "none", "-", "the run started but wrote no end record" if start else "no run record"
    ips = (end.get("images_per_s") or {}).get("mean")
    return (
        str(end.get("status", "failed")),
        f"{ips:.1f}" if ips is not None else "-",
        " ".join(str(end.get("error") or "").split()),
    )


def end_for_the_record(run_dir: str, status: str, error: str) -> bool:
    """A run that was killed before writing its end record (SIGKILL after the time limit) gets one
    written for it, so the analysis lists it as what it was. Only when a start record is there:
    a run directory without one belongs to no run the reader can place."""
    rec = read_run_dir(run_dir)
    if rec is None or rec.end is not None:
        return False
    start, steps = rec.start, rec.last_step or 0  # steps are numbered from 1: the last is how many
    path = rec.path
    now = time.time()
    line = {
        "event": "end",
        "time": now,
        "status": status,
        "error": error,
        "failed_rank": None,
        "steps_done": steps,
        "timed_steps": 0,
        "wall_time_s": round(now - float(start.get("time", now)), 3),
        "images_per_s": None,
        "images_per_s_per_device": None,
        "memory": None,
        "tflops_per_device": None,
        "mfu": None,
        "replicas_agree": None,
        "replica_checksums": None,
        "final_loss": None,
        "written_by": "vit-scale study: the run was stopped before it wrote its end record",
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
    return True


def _flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same_value(recorded, wanted: str) -> bool:
    import yaml

    try:
        wanted_value = yaml.safe_load(wanted)
    except yaml.YAMLError:
        wanted_value = wanted
    if isinstance(recorded, (int, float)) and isinstance(wanted_value, (int, float)) and not isinstance(recorded, bool):
        return float(recorded) == float(wanted_value)
    return recorded == wanted_value or str(recorded) == wanted


def find_ok(parent: str, settings: list) -> str | None:
    """The newest run under `parent` whose record says ok and whose config has every KEY=VALUE."""
    found = ok_runs(parent, settings)
    return found[0][0] if found else None


def ok_runs(parent: str, settings: list) -> list[tuple[str, int]]:
    """The runs under `parent` whose record says ok and whose config has every KEY=VALUE, newest
    first, each with the repetition its record names (0 when none: from before repeats)."""
    wanted = [item.partition("=")[::2] for item in settings]
    found = []
    for path in sorted(glob.glob(os.path.join(parent, "*", METRICS_FILE)), reverse=True):
        run_dir = os.path.dirname(path)
        start, end = start_and_end(run_dir)
        if not start or not end or end.get("status") != "ok":
            continue
        config = _flat(start.get("config") or {})
        if all(key in config and _same_value(config[key], value) for key, value in wanted):
            repetition = config.get("output.repetition")
            found.append((run_dir, repetition if isinstance(repetition, int) else 0))
    return found


def repetitions_done(found: list[tuple[str, int]], repeat: int) -> dict[int, str]:
    """Repetition (1 .. repeat) -> the earlier ok run that stands for it. A run fills the repetition
    its record names where that one is free; the rest (runs from before repeats, a second ok run of
    one repetition, one beyond `repeat`) fill the free ones, newest first. So a resume counts what
    is done: 2 ok runs of a point with --repeat 3 leave one to run, whichever failed."""
    done: dict[int, str] = {}
    spare = []
    for run_dir, repetition in found:
        if 1 <= repetition <= repeat and repetition not in done:
            done[repetition] = run_dir
        else:
            spare.append(run_dir)
    for repetition in range(1, repeat + 1):
        if repetition not in done and spare:
            done[repetition] = spare.pop(0)
    return done


def repetition_of(row: dict) -> int:
    """A ledger row's repetition; 1 for rows written before repeats (no such column)."""
    value = str(row.get("repetition") or "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def summary(rows: list[dict], per: str = "n") -> list[str]:
    """Model x strategy (x variant) against node or GPU count; the last line about each repetition
    of a point wins (a resumed study lists a run again). Where points have several repetitions a
    cell is the median img/s of the ok ones and [ok/repetitions]."""
    if not rows:
        return ["  no runs"]
    latest = {}
    for row in rows:
        size = int(row["nodes"]) if per == "n" else int(row["ranks"])
        latest[(row["model"], row["strategy"], row["variant"], size, repetition_of(row))] = row
    points: dict = {}
    for key, row in latest.items():
        points.setdefault(key[:4], []).append(row)
    repeats = sorted({len(group) for group in points.values()})
    position = {id(row): i for i, row in enumerate(rows)}
    sizes = sorted({key[3] for key in points})
    order = {}
    for row in rows:
        order.setdefault((row["model"], row["strategy"], row["variant"]), len(order))
    lines = sorted({key[:3] for key in points}, key=lambda k: order[k])
    with_variant = any(k[2] != "-" for k in lines)
    unit = "n" if per == "n" else "g"
    header = ["model", "strategy"] + (["variant"] if with_variant else []) + [f"{unit}{s} img/s" for s in sizes]
    table = [header]
    for model, strategy, variant in lines:
        row = [model, strategy] + ([variant] if with_variant else [])
        for s in sizes:
            group = points.get((model, strategy, variant, s))
            if group is None:
                row.append("")
                continue
            ok = [float(r["images_per_s"]) for r in group if r["status"] == "ok" and r["images_per_s"] not in ("", "-")]
            # without a measured run: the status of the one the ledger lists last
            cell = f"{statistics.median(ok):.1f}" if ok else max(group, key=lambda r: position[id(r)])["status"]
            row.append(cell + (f" [{len(ok)}/{len(group)}]" if repeats[-1] > 1 else ""))
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    fixed = len(header) - len(sizes)
    out = [
        "  "
        + "  ".join(
            cell.ljust(w) if i < fixed else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in table
    ]
    counts: dict = {}
    for row in latest.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    line = "  " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    if repeats[-1] > 1:
        each = f"{repeats[0]}" if len(repeats) == 1 else f"{repeats[0]} to {repeats[-1]}"
        line += (
            f"; {each} repetitions of each point: img/s is the median of its ok ones, [k/n] k of its n repetitions ok"
        )
    out.append(line)
    return out


def allocation(rows: list[dict]) -> dict:
    """Where the study's allocation went, over the runs its ledger says it launched (a row with seconds;
    runs found ok earlier cost this study nothing): node-seconds in all (nodes x the launch's wall time,
    as the study timed it), and of them, from each run's end record (time_split), in start-up, warm-up
    and timed windows; `split_runs` counts the runs whose record has the split."""
    out = {"runs": 0, "node_s": 0.0, "startup_node_s": 0.0, "warmup_node_s": 0.0, "timed_node_s": 0.0, "split_runs": 0}
    for row in rows:
        try:
            seconds, nodes = float(row.get("seconds") or 0), int(row.get("nodes") or 0)
        except ValueError:
            continue
        if seconds <= 0:
            continue
        out["runs"] += 1
        out["node_s"] += nodes * seconds
        run_dir = row.get("run_dir") or "-"
        end = start_and_end(run_dir)[1] if os.path.isdir(run_dir) else None
        split = (end or {}).get("time_split") or {}
        if split.get("timed_s") is None:
            continue
        out["split_runs"] += 1
        for key in ("startup", "warmup", "timed"):
            out[f"{key}_node_s"] += nodes * float(split.get(f"{key}_s") or 0.0)
    return out


def allocation_line(rows: list[dict]) -> str:
    """The study's last line: node-seconds spent and the share in timed windows (docs/jobs.md)."""
    a = allocation(rows)
    if not a["runs"]:
        return "  allocation:  no run launched by this study"
    spent = a["node_s"]
    share = lambda key: f"{a[key] / spent:.1%}" if spent else "-"  # noqa: E731
    unsplit = a["runs"] - a["split_runs"]
    return (
        f"  allocation:  {spent:,.0f} node-seconds ({spent / 3600:.3g} node-hours) over {a['runs']} "
        f"run{'s' if a['runs'] != 1 else ''}: {share('timed_node_s')} in timed windows, {share('startup_node_s')} "
        f"start-up, {share('warmup_node_s')} warm-up"
        + (f" ({unsplit} run(s) without a time split in their record count as untimed)" if unsplit else "")
    )
