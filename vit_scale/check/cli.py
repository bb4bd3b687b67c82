"""`vit-scale check`: prove a system ready before a study spends its allocation.

jobs/check.sh ends in `exec python -m vit_scale check`, after sourcing env/<system>.sh, which
`--which-env` names (having checked every option first). The study runs it first with `--check`.

This orchestrator imports no torch: it reads the system profile, starts ONE launch of
vit_scale.check.worker over every rank of the nodes (the launchers the study uses: srun in an
allocation, emulated nodes here), reads what the worker's rank 0 wrote, starts the labels left
after one that took the ranks down in a new launch, reads the collective library's log lines,
and turns it all into lines, a table and check.json.

Exit code: 0 every needed line holds, 1 something is broken, 2 bad input, 143 stopped (by a signal:
check.json is written all the same, from what the ranks had reported, the rest as timeout lines).
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time

from vit_scale.cluster import emulation, launchers, systems
from vit_scale.cluster.files import load_yaml
from vit_scale.cluster.options import option_pairs, take_prog
from vit_scale.cluster.supervise import Supervisor
from vit_scale.cluster.systems import study_file
from vit_scale.cluster.values import as_list, minutes, whole
from vit_scale.errors import UserError
from vit_scale.launch.world import free_port

PROG = "vit-scale check"  # the name messages and check.json's "tool" give, unless --prog names another
PROGRAM = ("-m", "vit_scale.check.worker")
SCHEMA_VERSION = 2  # 2: step_fits, the per-step fits over every group size (1 had fits alone)
FLAGS = ("--quick", "--which-env")
OPTIONS = (
    "--system",
    "--nodes",
    "--ranks-per-node",
    "--strategies",
    "--precision",
    "--model",
    "--batch-size",
    "--expect-transport",
    "--launcher",
    "--out",
    "--json",
    "--time-limit",
)
DEFAULT_BATCH = 32  # per device, for the timed GEMMs, when neither --batch-size nor the study file gives one
GRACE_S = 30  # after one rank ends badly, how long the others get
DEFAULT_LIMIT_MIN = 30.0  # --time-limit without an allocation, and at most this within one
PARTS = ("meter", "compute", "environment", "interconnect", "strategies")
STOPPED_BY_SIGNAL = "stopped by a signal (Slurm's at the allocation's end, or a user's)"

USAGE = """usage: vit-scale check [options]
       sbatch [-N NODES] jobs/check.sh [options]     (bash jobs/check.sh without Slurm)

Checks, on the nodes and through the launcher, env script and system profile a study would use:
the environment (versions, GPUs per rank and their binding, modules, the network transport the
collective library really uses between nodes, JIT kernels), all-reduce / all-gather /
reduce-scatter bandwidth at the strategies' sizes within and across nodes, every strategy label
a few steps, and the meter. Writes check.json and a table; each failure is one line.

  --system NAME           {systems} (default: detected)
  --nodes N               nodes (default: the allocation's; 1 without Slurm, where nodes are emulated)
  --ranks-per-node N      default: the system's (8 on Frontier, the GPUs per node on cuda, 2 locally)
  --strategies LIST       labels to run (default: every label; those the capability table refuses here
                          are listed as refused and do not fail the check unless named here)
  --precision LIST        fp32 bf16 fp16 (default: the system's study file's)
  --model NAME            whose Block sizes the collectives and the timed GEMMs use (default: the study
                          file's largest model)
  --batch-size N          per device, for the timed GEMMs (default: the study file's, else 32)
  --expect-transport LIST ib ofi socket tcp: the transport between nodes that is fine here (default:
                          $VIT_SCALE_EXPECT_TRANSPORT, else frontier ofi, cuda ib or ofi, local tcp)
  --launcher NAME         srun torchrun mpi (default: the system's)
  --quick                 fewer sizes, iterations and steps (what `vit-scale study --check` runs)
  --out DIR               check.json, logs/, records/ (default: runs/check)
  --json PATH             where check.json goes (default: OUT/check.json)
  --time-limit MIN        stop the check after this many minutes, every launch together (default: 30;
                          in a Slurm job at most the job's time left less a margin, so that check.json
                          is written before Slurm ends the job)
  -h, --help              this text
Exit code: 0 every needed line holds, 1 something is broken, 2 bad input, 143 stopped by a signal
(check.json written all the same, what was not finished as timeout lines)."""


def usage() -> str:
    return USAGE.format(systems=" ".join(systems.known_systems()))


class Options:
    def __init__(self):
        self.flags: set = set()
        self.values: dict = {}
        self.help = False


def parse(argv: list) -> Options:
    opts = Options()
    for opt, value in option_pairs(argv, ("-h", "--help", *FLAGS)):
        if opt in ("-h", "--help"):
            opts.help = True
        elif value is None:
            opts.flags.add(opt)
        elif opt in OPTIONS:
            opts.values[opt] = value
        else:
            raise UserError(f"unknown option '{opt}'; allowed: {' '.join(OPTIONS + FLAGS[:1])} --help")
    return opts


class Check:
    """What is asked, where it runs, and running it. `prog`: the name its messages start with (the
    job script's, or `vit-scale study --check`)."""

    def __init__(self, opts: Options, prog: str = PROG):
        v = opts.values
        self.prog = prog
        self.quick = "--quick" in opts.flags
        self.in_slurm = systems.in_slurm()
        name = v.get("--system") or os.environ.get("VIT_SCALE_SYSTEM") or systems.detect_system()
        self.system = systems.read_system(name)
        self.one_machine = not self.in_slurm and self.system.one_rank_per_gpu and not self.system.needs_slurm
        if self.system.needs_slurm and not self.in_slurm:
            raise UserError(f"--system: {name} runs inside a Slurm allocation (sbatch jobs/check.sh, or salloc)")
        self.alloc_nodes = systems.allocation_size() if self.in_slurm else 0
        self.nodes = self._nodes(v.get("--nodes"))
        self.ranks_per_node = self._ranks_per_node(v.get("--ranks-per-node"), "--which-env" in opts.flags)
        study = self._study_defaults()
        self.precisions = self._precisions(v.get("--precision"), study)
        self.model = self._model(v.get("--model"), study)
        self.batch_size = self._batch_size(v.get("--batch-size"), study)
        self.labels = self._labels(v.get("--strategies"))
        self.expected = self._expected(v.get("--expect-transport") or os.environ.get("VIT_SCALE_EXPECT_TRANSPORT"))
        self.launcher = v.get("--launcher") or self.system.launcher or "srun"
        if self.launcher not in self.system.launchers:
            raise UserError(
                f"--launcher: '{self.launcher}' is not allowed on {name}; allowed: {', '.join(self.system.launchers)}"
            )
        self.out = os.path.abspath(v.get("--out", os.path.join("runs", "check")))
        self.json_path = os.path.abspath(v.get("--json") or os.path.join(self.out, "check.json"))
        self.time_limit_min, self.time_limit_why = self._time_limit(v.get("--time-limit"), "--which-env" in opts.flags)
        # the interpreter running the check (the env script's, in a job), unless told otherwise as the study is
        self.python = os.environ.get("VIT_SCALE_PYTHON") or sys.executable
        self.use_slurm = self.in_slurm
        self.emulation = None  # isolated emulated nodes, while the check runs on them
        self.emulation_kind = None  # check.json: isolated, shared, or None (real nodes)
        self.progress: dict = {}  # the launches so far, for check.json when a signal stops the check
        self.kind = launchers.launch_kind(
            self.launcher, self.use_slurm, self.one_machine, self.nodes * self.ranks_per_node
        )

    # ------------------------------------------------------------ what is asked

    def _nodes(self, given) -> int:
        if given is None:
            return self.alloc_nodes or 1
        nodes = whole("--nodes", given)
        if self.in_slurm and nodes > self.alloc_nodes:
            raise UserError(
                f"--nodes: {nodes} is more than this allocation's {self.alloc_nodes}; allowed: 1 to "
                f"{self.alloc_nodes} (or submit with sbatch -N {nodes})"
            )
        if self.one_machine and nodes != 1:
            raise UserError(
                f"--nodes: {nodes} is not allowed without Slurm on {self.system.name}; allowed: 1 (this machine)"
            )
        return nodes

    def _ranks_per_node(self, given, only_env: bool) -> int:
        if given is not None:
            return whole("--ranks-per-node", given)
        if not self.system.one_rank_per_gpu:
            return whole(f"configs/systems/{self.system.name}.yaml: ranks_per_node", self.system.ranks_per_node)
        gpus = (systems.slurm_gpus_per_node() if self.in_slurm else 0) or systems.gpus_here()
        if not gpus and not only_env:
            where = "this allocation" if self.in_slurm else "this machine"
            raise UserError(
                f"--system: {self.system.name} runs one rank per GPU, but {where} shows none; submit with "
                f"--gpus-per-node=N, or give --ranks-per-node"
            )
        return gpus or 1

    def _time_limit(self, given, only_env: bool) -> tuple[float, str]:
        """(minutes, where they come from). In an allocation the default ends before the allocation
        does: Slurm's SIGTERM at its end would stop the check, and KillWait later kill it."""
        if given is not None:
            return minutes("--time-limit", given), "--time-limit"
        left = None if only_env or not self.in_slurm else systems.allocation_minutes_left()
        if left is None:
            return DEFAULT_LIMIT_MIN, "the default"
        limit, margin = limit_within(left)
        if limit >= DEFAULT_LIMIT_MIN:
            return DEFAULT_LIMIT_MIN, "the default"
        return limit, (
            f"job {os.environ.get('SLURM_JOB_ID')} has {left:.1f} min left, less a {margin:.1f} min "
            f"margin to stop the ranks and write check.json"
        )

    def _study_defaults(self) -> dict:
        try:
            return load_yaml(study_file(None, self.system), "--system")
        except UserError:
            return {}

    def _batch_size(self, given, study: dict) -> int:
        if given is not None:
            return whole("--batch-size", given)
        batch = study.get("batch_size")  # a study file's, when it is one number
        return batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else DEFAULT_BATCH

    def _precisions(self, given, study: dict) -> list:
        from vit_scale.distributed import PRECISIONS

        value = given if given is not None else study.get("precision", "fp32")
        if isinstance(value, dict):  # a study file's per-strategy table: its values
            value = list(dict.fromkeys(str(v) for v in value.values()))
        precisions = list(dict.fromkeys(as_list(value))) or ["fp32"]
        for p in precisions:
            if p not in PRECISIONS:
                raise UserError(f"--precision: '{p}' is not allowed; allowed: {', '.join(PRECISIONS)}")
        return precisions

    def _model(self, given, study: dict) -> str:
        from vit_scale.models import MODELS
        from vit_scale.planning.shapes import Shape

        if given is not None:
            if given not in MODELS:
                raise UserError(f"--model: unknown model '{given}'; allowed: {', '.join(MODELS)}")
            return given
        models = [m for m in as_list(study.get("models") or study.get("model")) if m in MODELS] or ["vit_micro"]
        return max(models, key=lambda m: Shape.from_spec(MODELS[m]).params)

    def _labels(self, given) -> list[dict]:
        from vit_scale.check.strategies import concrete
        from vit_scale.distributed import all_labels, parse_strategy

        named = given is not None
        labels = as_list(given) if named else [concrete(label, self.ranks_per_node) for label in all_labels()]
        if named and not labels:
            raise UserError("--strategies: no strategy given")
        for label in labels:
            try:
                parse_strategy(label)
            except UserError as exc:
                raise UserError(f"--strategies: {str(exc).split(': ', 1)[1]}") from None
        return [
            {"label": label, "precision": p, "needed": named}
            for label in dict.fromkeys(labels)
            for p in self.precisions
        ]

    def _expected(self, given) -> list:
        from vit_scale.check.environment import TRANSPORTS, expected_transport

        where = "--expect-transport"
        if not given:
            given, where = (
                self.system.inter_node_transport,
                f"configs/systems/{self.system.name}.yaml: inter_node_transport",
            )
        expected = as_list(given)
        for t in expected:
            if t not in TRANSPORTS:
                raise UserError(f"{where}: '{t}' is not allowed; allowed: {', '.join(TRANSPORTS)}")
        return list(expected_transport(expected, self.system.backend))

    # ------------------------------------------------------------ running it

    def header(self) -> None:
        ranks = self.nodes * self.ranks_per_node
        labels = list(dict.fromkeys(a["label"] for a in self.labels))
        print(
            f"{self.prog} on {self.system.name}: {self.nodes} node{'s' if self.nodes > 1 else ''} x "
            f"{self.ranks_per_node} rank{'s' if self.ranks_per_node > 1 else ''} ({ranks} in all, "
            f"{self.system.backend}), {'/'.join(self.precisions)}{', quick' if self.quick else ''}"
        )
        print(f"  strategies: {', '.join(labels)}; collective sizes from {self.model}")
        print(
            f"  launcher: {launchers.describe(self.kind, self.system, self.ranks_per_node)}; "
            f"logs: {os.path.join(self.out, 'logs')}"
        )
        print(f"  time limit: {self.time_limit_min:.3g} min ({self.time_limit_why})", flush=True)

    def run(self, supervisor=None) -> int:
        from vit_scale.check import verdict
        from vit_scale.check.lines import broken, table

        supervisor = supervisor or Supervisor(GRACE_S)
        for sub in ("logs", "records"):
            try:
                os.makedirs(os.path.join(self.out, sub), exist_ok=True)
            except OSError as exc:
                raise UserError(f"--out: cannot create {os.path.join(self.out, sub)}: {exc.strerror}") from None
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid()}"
        # isolated emulated nodes where the profile asks for them (removed however the check ends)
        self.emulation = emulation.for_launches(
            self.kind,
            self.system,
            "check",
            self.nodes,
            self.ranks_per_node,
            lambda line: print(f"  {line}", flush=True),
        )
        if self.emulation:
            print(f"  nodes: {self.emulation.describe()}", flush=True)
        self.emulation_kind = (
            ("isolated" if self.emulation else "shared")
            if self.system.emulation is not None and self.kind in (*emulation.WRAPPABLE, "mpi-local")
            else None
        )
        try:
            facts, attempts = self.launch_until_done(supervisor, stamp)
        finally:
            if self.emulation:
                emulation.stop(self.emulation)
        if supervisor.interrupted:
            # what the last write from the signal's moment had, and what the launch added since
            self.write_stopped()
            return 143
        check = self.assemble(facts, attempts, stamp)
        found = verdict.lines(check)
        bad = broken(found)
        check.update(lines=[line.to_dict() for line in found], ok=not bad, exit_code=1 if bad else 0)
        write_atomically(self.json_path, check)
        print("\n".join(table(found)))
        if bad:
            print(f"{self.prog}: {len(bad)} broken -> {self.json_path}")
            for line in bad:
                print(f"{self.prog}: FAIL {line.one_line()}", file=sys.stderr)
        else:
            print(f"{self.prog}: ready -> {self.json_path}")
        sys.stdout.flush()
        return 1 if bad else 0

    def write_stopped(self) -> None:
        """check.json when a signal stops the check (Slurm's at the allocation's end, which kills
        KillWait seconds later): what the launches had found and the running one's rank 0 had
        written, every part and label not finished a timeout line. Exit code 143 all the same."""
        from vit_scale.check import verdict

        p = self.progress
        if not p:
            print(f"{self.prog}: stopped by a signal before any launch; check.json not written", file=sys.stderr)
            return
        facts, attempts = copy.deepcopy(p["facts"]), list(p["attempts"])
        why = STOPPED_BY_SIGNAL
        current = p.get("current")
        if current:
            try:
                with open(current["result"]) as f:
                    found = json.load(f)
            except (OSError, ValueError):
                found = {}
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
                {
                    "attempt": current["attempt"],
                    "parts": current["parts"],
                    "labels": [list(x) for x in current["labels"]],
                    "code": 143,
                    "seconds": round(time.time() - current["started"], 1),
                    "log": current["log"],
                    "timed_out": False,
                    "last_line": last_line(current["log"]),
                }
            )
        unfinished(facts, [(a["label"], a["precision"]) for a in self.labels], f"not finished: {why}")
        check = self.assemble(facts, attempts, p["stamp"])
        found_lines = verdict.lines(check)
        check.update(lines=[line.to_dict() for line in found_lines], ok=False, exit_code=1)
        try:
            write_atomically(self.json_path, check)
        except OSError:
            return
        timeouts = sum(1 for line in found_lines if line.text.startswith("timeout"))
        if not p["written"]:
            print(
                f"{self.prog}: stopped by a signal; check.json written from what the ranks had reported, "
                f"{timeouts} part(s) unfinished as timeout lines -> {self.json_path}",
                file=sys.stderr,
                flush=True,
            )
        p["written"] = True

    def launch_until_done(self, supervisor, stamp: str) -> tuple[dict, list]:
        """The first launch does every part; when a label took the ranks down, the labels after it
        get a launch of their own."""
        facts: dict = {"strategies": []}
        attempts: list = []
        self.progress = {"stamp": stamp, "facts": facts, "attempts": attempts, "current": None, "written": False}
        remaining = [(a["label"], a["precision"]) for a in self.labels]
        parts = list(PARTS)
        deadline = time.monotonic() + self.time_limit_min * 60  # one limit for every launch together
        while not supervisor.interrupted:
            left_s = deadline - time.monotonic()
            if left_s < 1:
                facts["strategies"] += [
                    out_of_time(label, precision, self.time_limit_min) for label, precision in remaining
                ]
                break
            attempt = len(attempts) + 1
            started = time.time()
            found, outcome, log = self.launch(supervisor, parts, remaining, attempt, stamp, left_s)
            attempts.append(
                {
                    "attempt": attempt,
                    "parts": parts,
                    "labels": [list(x) for x in remaining],
                    "code": outcome.code,
                    "seconds": round(outcome.seconds, 1),
                    "log": log,
                    "timed_out": outcome.timed_out,
                    "last_line": last_line(log),
                }
            )
            merge(facts, found)
            culprit = found.get("in_progress")
            if culprit and culprit.get("part") == "meter":
                facts["meter"] = self.meter_failure(culprit, started, outcome, log)
            elif culprit:
                facts["strategies"].append(self.blame(culprit, stamp, attempt, outcome, log))
            done = {(r["label"], r["precision"]) for r in facts["strategies"]}
            remaining = [x for x in remaining if x not in done]
            if outcome.timed_out:
                facts["strategies"] += [
                    out_of_time(label, precision, self.time_limit_min) for label, precision in remaining
                ]
                unfinished(facts, [], f"not finished: stopped at --time-limit {self.time_limit_min:g} min")
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

    def meter_failure(self, culprit: dict, since: float, outcome, log: str) -> dict:
        """The meter's facts when its trainer run took rank 0 down: that run's recorded error (its
        newest run under records/meter, started by this launch), else the launch's last line."""
        import glob

        from vit_scale.check.strategies import from_record

        runs = [
            d
            for d in glob.glob(os.path.join(self.out, "records", "meter", "*", "DDP", "*", "*"))
            if os.path.getmtime(d) >= since - 1
        ]
        error = from_record(max(runs, key=os.path.getmtime)).get("error") if runs else None
        stopped = self.stopped_why(outcome)
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

    def stopped_why(self, outcome) -> str | None:
        """Why the launch was stopped from outside, or None when its ranks ended by themselves. A
        signal stops the launch as the time limit does: the label then running did not fail, even
        when its trainer was killed before it could write its end record."""
        if outcome.interrupted:
            return STOPPED_BY_SIGNAL
        if outcome.timed_out:
            return f"stopped at --time-limit {self.time_limit_min:g} min"
        return None

    def blame(self, culprit: dict, stamp: str, attempt: int, outcome, log: str) -> dict:
        """The row of the label that was running when the ranks ended: its run record's status and
        error when it wrote one, else what the launch's end says."""
        from vit_scale.check.strategies import from_record

        run_dir = self.run_dir_of(stamp, culprit["label"], culprit["precision"], attempt)
        row = {
            "label": culprit["label"],
            "precision": culprit["precision"],
            "run_dir": run_dir,
            "log": log,
            **(from_record(run_dir) if run_dir else {"status": "failed", "error": None}),
        }
        stopped = self.stopped_why(outcome)
        if stopped:
            row.update(status="timeout", error=f"{stopped} during this label: {last_line(log)}")
        elif row["status"] == "ok" or not row.get("error"):
            row.update(
                status="failed" if row["status"] == "ok" else row["status"],
                error=f"the ranks ended (exit {outcome.code}) during this label: {last_line(log)}",
            )
        return row

    def launch(self, supervisor, parts: list, labels: list, attempt: int, stamp: str, left_s: float):
        from vit_scale.check.environment import nccl_log_name

        spec_path = os.path.join(self.out, "logs", f"spec.{stamp}.{attempt}.json")
        result = os.path.join(self.out, "logs", f"facts.{stamp}.{attempt}.json")
        spec = {
            "parts": parts,
            "labels": [list(x) for x in labels],
            "model": self.model,
            "precisions": self.precisions,
            "batch_size": self.batch_size,
            "peak_tflops": {p: self.system.peak_for(p) for p in self.precisions},
            "quick": self.quick,
            "records": os.path.join(self.out, "records"),
            "result": result,
            "run_prefix": stamp,
            "attempt": attempt,
            # the few ranks that prove the transport log NCCL's lines here (check.environment.logs_transport)
            "nccl_log": os.path.join(self.out, "logs", nccl_log_name(stamp, attempt))
            if self.system.backend == "nccl"
            else None,
        }
        write_atomically(spec_path, spec)
        nodes_here = systems.allocation_nodes() if self.in_slurm else []
        addr = systems.node_address(nodes_here[0], self.system.master_addr) if nodes_here else "127.0.0.1"
        if self.emulation:
            addr = self.emulation.master_addr
        launch = launchers.build(
            self.kind,
            self.python,
            [f"spec={spec_path}"],
            system=self.system,
            nodes=self.nodes,
            ranks_per_node=self.ranks_per_node,
            nodelist=",".join(nodes_here[: self.nodes]),
            master_addr=addr,
            master_port=free_port(),
            time_limit_min=math.ceil(left_s / 60) if self.use_slurm else None,
            grace_s=GRACE_S,
            rdzv_id=f"{os.environ.get('SLURM_JOB_ID', '0')}.check{attempt}",
            as_root=os.geteuid() == 0,
            program=PROGRAM,
        )
        if self.emulation and self.kind in emulation.WRAPPABLE:
            launch = self.emulation.wrap_launch(launch)
        log = os.path.join(self.out, "logs", f"check.{stamp}.{attempt}.log")
        with open(log, "w") as f:
            f.write(launch.log_header())
        what = (
            "every part"
            if len(parts) == len(PARTS)
            else f"the {len(labels)} label(s) left"
            if parts == ["strategies"]
            else f"{', '.join(parts)} (without the meter)"
        )
        print(f"  launch {attempt}: {what} ... ", end="", flush=True)
        self.progress["current"] = {
            "result": result,
            "log": log,
            "attempt": attempt,
            "parts": parts,
            "labels": labels,
            "started": time.time(),
        }
        outcome = supervisor.run(launch, log, left_s, on_signal=self.write_stopped)
        self.progress["current"] = None
        print(f"exit {outcome.code} ({outcome.seconds:.0f} s)", flush=True)
        try:
            with open(result) as f:
                found = json.load(f)
        except (OSError, ValueError):
            found = {}
        return found, outcome, log

    def run_dir_of(self, stamp: str, label: str, precision: str, attempt: int) -> str | None:
        import glob

        from vit_scale.check.strategies import MODEL, run_id

        pattern = os.path.join(
            self.out, "records", "check", MODEL, label, f"n{self.nodes}", run_id(stamp, label, precision, attempt) + "*"
        )
        found = sorted(glob.glob(pattern), key=os.path.getmtime)
        return found[-1] if found else None

    def assemble(self, facts: dict, attempts: list, stamp: str = "") -> dict:
        from vit_scale.check.collectives import fits_of, step_fits_of
        from vit_scale.check.environment import collective_logs, transport_facts

        logs = collective_logs(self.out, stamp, [a["log"] for a in attempts])
        world = facts.get("world") or {}
        backend = world.get("backend") or self.system.backend
        return {
            "schema": SCHEMA_VERSION,
            "tool": self.prog,
            "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "system": self.system.name,
            "backend": self.system.backend,
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "precisions": self.precisions,
            "model": self.model,
            "quick": self.quick,
            "parts": list(PARTS),
            "labels": self.labels,
            "expected_transport": self.expected,
            "slurm": {"job_id": os.environ.get("SLURM_JOB_ID"), "nodelist": os.environ.get("SLURM_JOB_NODELIST")}
            if self.in_slurm
            else None,
            "launch": {
                "kind": self.kind,
                "description": launchers.describe(self.kind, self.system, self.ranks_per_node),
                "attempts": attempts,
                # emulated nodes: own namespaces and CPU quota (isolated), or this machine's, shared
                "emulation": self.emulation_kind,
            },
            "transport": transport_facts(backend, logs, tuple(self.expected), world.get("gloo_transport", "tcp")),
            "facts": {k: v for k, v in facts.items() if k != "compute"},
            # the Block's GEMMs timed at the model's shapes (vit_scale.check.gemms): the planner's compute
            "compute": facts.get("compute"),
            "out": self.out,
            # the alpha-beta line of each collective, scope and group size, from the size sweep, and the
            # per-step fit over every group size that a prediction uses (docs/check.md)
            "fits": fits_of((facts.get("interconnect") or {}).get("measurements") or []),
            "step_fits": step_fits_of((facts.get("interconnect") or {}).get("measurements") or []),
        }


def limit_within(left_min: float) -> tuple[float, float]:
    """(the check's limit, the margin) for an allocation with `left_min` minutes left: a tenth of it,
    at least 1 and at most 5 minutes, for stopping the ranks (STOP_GRACE_S) and writing check.json;
    never less than half of what is left."""
    margin = min(5.0, max(1.0, left_min / 10))
    return max(0.1, math.floor(max(left_min - margin, left_min / 2) * 10) / 10), margin


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


def write_atomically(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None, supervisor=None) -> int:
    """`vit-scale check ARGV`; the entry point of the command and of a caller in this process (the
    study's --check), whose `supervisor` then carries its signal handling into the check's launches."""
    prog, argv = take_prog(sys.argv[1:] if argv is None else argv, PROG)
    try:
        opts = parse(argv)
        if opts.help:
            print("none" if "--which-env" in opts.flags else usage())
            return 0
        check = Check(opts, prog)
        if "--which-env" in opts.flags:
            print(check.system.env_script)
            return 0
        check.header()
        return check.run(supervisor)
    except UserError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
