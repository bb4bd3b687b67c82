"""`vit-scale study`: every model x strategy (x modifiers x batch sizes) on the node ladder inside
a Slurm allocation, on the GPU ladder of one machine without Slurm, or on emulated nodes of this
CPU; each run supervised, recorded in the ledger, resumable; then the analysis.

jobs/weak_scaling.sh and jobs/plugin_comparison.sh end in `exec python -m vit_scale study`, after
sourcing env/<system>.sh, which `--which-env` names (having checked every option first, so that
bad input is refused before any module is loaded).

Exit code: 0 every run ok (or skipped as not fitting), 1 some run failed, 2 bad input, 143 stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time

from vit_scale.cluster import emulation, launchers, node_local, systems
from vit_scale.cluster.files import home
from vit_scale.cluster.options import option_pairs, take_prog
from vit_scale.cluster.supervise import Supervisor
from vit_scale.cluster.systems import study_file
from vit_scale.cluster.values import minutes, whole
from vit_scale.errors import UserError
from vit_scale.launch.world import free_port
from vit_scale.record.check_file import check_files, check_path, headline, read_check
from vit_scale.run.ending import LAUNCHED_AT
from vit_scale.study.forecast import forecast
from vit_scale.study.ledger import (
    Ledger,
    allocation_line,
    end_for_the_record,
    ok_runs,
    repetitions_done,
    run_result,
    status_of_code,
    summary,
    unattended,
)
from vit_scale.study.lock import StudyLock
from vit_scale.study.plan import BOOLEAN_KEYS, CHOICES, FAMILY_KEYS, STUDY_KEYS, make_plan
from vit_scale.study.preflight import check_first

FLAGS = (
    "--force",
    "--dry-run",
    "--analysis-only",
    "--no-analysis",
    "--check",
    "--exclude-slow-nodes",
    "--which-env",
)
OWN_OPTIONS = ("--config", "--system", "--out", "--report", "--run-time-limit", "--prog")
STUDY_OPTIONS = {option: key for key, (option, _) in STUDY_KEYS.items() if option}
# the plugin comparison's names for two of them
STUDY_OPTIONS.update({"--model": "models", "--batch-sizes": "batch_size"})
PROG = "vit-scale study"  # the name messages start with, unless --prog names the job script
GRACE_S = int(os.environ.get("VIT_SCALE_STEP_GRACE_S", "60"))  # after one rank ends badly

USAGE = """usage: sbatch [-N NODES] [sbatch options] jobs/weak_scaling.sh [options]
       bash jobs/weak_scaling.sh [options]     (no Slurm: this machine's GPUs, or emulated CPU nodes)
       vit-scale study [options]

What to run (lists are comma-separated; defaults come from the study file):
  --config FILE            study file (default: the system's, e.g. configs/studies/local.yaml)
  --study NAME             name of the study: runs go to OUT/NAME, the report to report/NAME
  --models LIST            {models}
  --strategies LIST        {strategies}
  --nodes LIST|ladder      node counts (default ladder: 1, 2, 4 ... the allocation's nodes)
  --gpu-counts LIST|ladder on one GPU machine without Slurm: GPU counts (default ladder: 1, 2, 4 ... all)
  --batch-size LIST        images per GPU (rank) and step; fixed as nodes grow; several: one run each
  --steps N                steps per run
  --warmup-steps N         first steps left out of every figure
  --repeat N|auto[:N]      runs of each point (default: the study file's, 3 in configs/studies/), in rounds:
                           every point once before any point again; 1 gives up the comparison of points
                           (one run each: not compared) and leaves within-run intervals only; auto (at
                           most 7 rounds, auto:N at most N, 3 to 8): 2 rounds, then another round only for
                           the node counts whose best-against-next comparison is still open
Precision and the families' modifiers (several values: each is one more run, a grid):
  --precision LIST         fp32 bf16 fp16
  --activation-checkpointing LIST  true false
{family_options}
  --skip-if-not-fits BOOL  record a run that cannot fit the GPU as skipped instead of running it
  --set KEY=VALUE          any trainer key for every run (repeatable), e.g. --set train.lr=3e-4; emulation.* keys
                           go to the emulated nodes instead (docs/jobs.md): emulation.inter_node_gbps,
                           emulation.cpus_per_node, emulation.nodes.local<i>.inter_node_gbps or .cpus_per_node
                           (one slow node, e.g. --set emulation.nodes.local3.cpus_per_node=0.125)
Where and how:
  --system NAME            {systems} (default: detected)
  --launcher NAME          srun torchrun mpi (default: the system's; mpi = mpi4py bootstrap
                           through srun --mpi=pmix, or mpirun without Slurm)
  --ranks-per-node N       default: the system's (8 on Frontier, the GPUs per node on cuda, 2 locally)
  --out DIR                run records (default: runs)
  --report DIR             analysis output (default: report/STUDY)
  --run-time-limit MIN     stop a run that takes longer (minutes, e.g. 30 or 0.5): its whole process tree is
                           stopped, it is recorded as timeout, and the study goes on
  --force                  run again what an earlier run already recorded as ok
  --dry-run                print the runs and their launch commands; run nothing
  --analysis-only          only the analysis and the summary of what OUT/STUDY holds
  --check                  first `vit-scale check --quick` on the study's nodes, strategies and precisions
                           (OUT/STUDY/check-nN.json for N nodes, the latest also OUT/STUDY/check.json); no run
                           starts when a needed line fails (a node named slow alone does not stop it)
  --exclude-slow-nodes     with --check: run on the allocation less the nodes the check named slow (a rung
                           that no longer fits is skipped, said in one line; OUT/STUDY/nodes_left_out.json)
  --no-analysis            skip the analysis at the end
  -h, --help               this text
Exit code: 0 every run ok (or skipped as not fitting), 1 some run failed, 2 bad input."""


class Options:
    def __init__(self):
        self.flags: set = set()
        self.own: dict = {}
        self.cli: dict = {}  # study key -> value
        self.sets: list = []
        self.help = False


def parse(argv: list) -> Options:
    opts = Options()
    for opt, value in option_pairs(argv, ("-h", "--help", *FLAGS)):
        if opt in ("-h", "--help"):
            opts.help = True
        elif value is None:
            opts.flags.add(opt)
        elif opt in OWN_OPTIONS:
            opts.own[opt] = value
        elif opt == "--set":
            opts.sets.append(value)
        elif opt in STUDY_OPTIONS:
            opts.cli[STUDY_OPTIONS[opt]] = value
        else:
            allowed = " ".join(
                [
                    "--config",
                    *[o for o in STUDY_OPTIONS if o not in ("--model", "--batch-sizes")],
                    "--system",
                    "--out",
                    "--report",
                    "--run-time-limit",
                    *FLAGS[:-1],
                    "--help",
                ]
            )
            raise UserError(f"unknown option '{opt}'; allowed: {allowed}")
    return opts


def usage() -> str:
    from vit_scale.distributed import all_labels
    from vit_scale.models import MODELS

    return USAGE.format(
        models=" ".join(MODELS),
        strategies=" ".join(all_labels()),
        systems=" ".join(systems.known_systems()),
        family_options=family_options_help(),
    )


def family_options_help() -> str:
    """A line per family option the study grids over (study.plan.FAMILY_KEYS, from Family.plan_flags):
    its flag and what it allows."""
    lines = []
    for key, (flag, trainer_key) in FAMILY_KEYS.items():
        allowed = " ".join(CHOICES.get(key, ())) or ("true false" if key in BOOLEAN_KEYS else "")
        lines.append(f"  {flag + ' LIST':<24} {allowed}  ({trainer_key})".rstrip())
    return "\n".join(lines)


class StudyRun:
    """What the study needs to know about where it runs, and its plan. `prog`: the name its
    messages start with (the job script's, when one started it)."""

    def __init__(self, opts: Options, prog: str = PROG):
        self.opts = opts
        self.prog = prog
        if "--exclude-slow-nodes" in opts.flags and "--check" not in opts.flags:
            raise UserError("--exclude-slow-nodes: needs --check, whose nodes part names the slow nodes")
        self.left_out: dict = {}  # {host: why}: the nodes the check named slow, with --exclude-slow-nodes
        self.dry_run = "--dry-run" in opts.flags
        self.analysis_only = "--analysis-only" in opts.flags
        self.force = "--force" in opts.flags
        self.in_slurm = systems.in_slurm()
        name = opts.own.get("--system") or os.environ.get("VIT_SCALE_SYSTEM") or systems.detect_system()
        self.system = systems.read_system(name)
        # a GPU machine without Slurm runs its own ladder over GPUs
        self.one_machine = not self.in_slurm and self.system.one_rank_per_gpu and not self.system.needs_slurm
        if self.system.needs_slurm and not self.in_slurm and not self.dry_run and not self.analysis_only:
            elsewhere = [s for s in systems.known_systems() if not systems.read_system(s).needs_slurm]
            raise UserError(
                f"--system: {name} runs inside a Slurm allocation (sbatch jobs/weak_scaling.sh, or "
                f"salloc); without Slurm allowed: {', '.join(elsewhere)}"
            )
        limit = opts.own.get("--run-time-limit")
        self.time_limit = minutes("--run-time-limit", limit) if limit is not None else None
        ranks_per_node = 0 if self.analysis_only else self._ranks_per_node()
        self.alloc_nodes = 0
        if self.in_slurm and not self.analysis_only:
            self.alloc_nodes = systems.allocation_size()
        self.plan = make_plan(
            study_file(opts.own.get("--config"), self.system),
            opts.cli,
            opts.sets,
            self.system,
            ranks_per_node,
            self.alloc_nodes,
            one_machine=self.one_machine,
            analysis_only=self.analysis_only,
        )
        # the emulated nodes as --set emulation.* leaves them (a slow node on purpose): what the runs and
        # the check get
        self.system = dataclasses.replace(self.system, emulation=self.plan.emulation)
        # launch through Slurm inside an allocation, and in a dry run of a system that has no other way
        self.use_slurm = self.in_slurm or (self.dry_run and self.system.needs_slurm)
        launcher = self.plan.launcher
        if launcher == "mpi" and not self.use_slurm and not self.one_machine and not self.dry_run:
            import shutil

            if shutil.which("mpirun") is None:
                raise UserError(
                    "--launcher: mpi without Slurm needs mpirun (apt-get install openmpi-bin); "
                    "allowed here: srun, torchrun"
                )
        self.out = os.path.abspath(opts.own.get("--out", "runs"))
        self.study_dir = os.path.join(self.out, self.plan.name)
        self.report = opts.own.get("--report") or os.path.join("report", self.plan.name)
        self.python = os.environ.get("VIT_SCALE_PYTHON") or "python"

    def _ranks_per_node(self) -> int:
        given = self.opts.own.get("--ranks-per-node") or self.opts.cli.get("ranks_per_node")
        if given is not None:
            return whole("--ranks-per-node", given)
        if not self.system.one_rank_per_gpu:
            return whole(f"configs/systems/{self.system.name}.yaml: ranks_per_node", self.system.ranks_per_node)
        gpus = systems.slurm_gpus_per_node() if self.in_slurm else 0
        gpus = gpus or systems.gpus_here()
        if not gpus:
            where = "this allocation" if self.in_slurm else "this machine"
            fix = (
                "submit with --gpus-per-node=N or give --ranks-per-node"
                if self.in_slurm
                else "run it on a machine with NVIDIA GPUs (nvidia-smi lists them) or give --ranks-per-node"
            )
            raise UserError(f"--system: {self.system.name} runs one rank per GPU, but {where} shows none; {fix}")
        return gpus

    # ------------------------------------------------------------ the study

    def header(self) -> None:
        p, total = self.plan, len(self.plan.runs)
        size = (
            f"GPUs {','.join(map(str, p.rank_counts))}" if self.one_machine else f"nodes {','.join(map(str, p.nodes))}"
        )
        strategies = "strategy" if len(p.strategies) == 1 else "strategies"
        own = self.system.emulation.describe_nodes() if self.system.emulation and not self.use_slurm else ""
        if p.adaptive:
            points = len(p.points)
            count = f"{total} to {points * p.repeat} runs"
            rounds = f" x 2 to {p.repeat} rounds, more where the comparison is open (--repeat auto:{p.repeat})"
        else:
            count = f"{total} run{'' if total == 1 else 's'}"
            rounds = f" x {p.repeat} repetitions, in rounds" if p.repeat > 1 else ""
        print(
            f"vit-scale study '{p.name}' on {self.system.name}{f' (emulated node overrides: {own})' if own else ''}"
            f": {count} "
            f"({len(p.models)} model(s) x {len(p.strategies)} {strategies}{' x grid ' + p.grid if p.grid else ''}"
            f" x {size}{rounds})"
        )
        if p.repeat == 1 and total > 1:
            print(
                "  one run per point (--repeat 1): the report will compare no two points (one run each: not "
                "compared), and its intervals are within-run, blind to run-to-run variation"
            )
        kind = launchers.launch_kind(p.launcher, self.use_slurm, self.one_machine, p.ranks_per_node * max(p.nodes))
        job = os.environ.get("SLURM_JOB_ID")
        where = (
            f"up to {p.ranks_per_node} GPUs on this machine"
            if self.one_machine
            else f"{p.ranks_per_node} rank{'s' if p.ranks_per_node > 1 else ''} per node"
        )
        print(
            f"  {where}, launcher: {launchers.describe(kind, self.system, p.ranks_per_node)}"
            + (f", job {job} on {os.environ.get('SLURM_JOB_NODELIST', '')}" if job else "")
        )
        print(f"  settings: {' '.join(p.common)}")
        print(f"  records: {self.study_dir}   logs: {os.path.join(self.study_dir, 'logs')}")
        if self.dry_run:
            print("  dry run: nothing is started")
        sys.stdout.flush()

    def run_all(self) -> int:
        """Every run, on isolated emulated nodes where the profile asks for them and this machine allows
        it; those are removed however the study ends (a SIGKILLed one's by the next study: emulation.sweep)."""
        p = self.plan
        self.emulation = None
        if not self.dry_run and p.runs:
            kind = launchers.launch_kind(p.launcher, self.use_slurm, self.one_machine, p.ranks_per_node * max(p.nodes))
            self.emulation = emulation.for_launches(
                kind, self.system, p.name, max(p.nodes), p.ranks_per_node, lambda line: print(f"  {line}", flush=True)
            )
            if self.emulation:
                print(f"  nodes: {self.emulation.describe()}", flush=True)
        try:
            return self._run_all()
        finally:
            if self.emulation:
                emulation.stop(self.emulation)

    def _run_all(self) -> int:
        p = self.plan
        logs = self._log_folder()
        ledger = Ledger(os.path.join(self.study_dir, "study_runs.tsv"))
        supervisor = None if self.dry_run else Supervisor(GRACE_S)
        nodes_here = systems.allocation_nodes() if self.in_slurm else []
        self.prepare_kernels(supervisor, logs)
        if "--check" in self.opts.flags and p.runs:
            code = check_first(self, supervisor)
            if code:
                return code
        forecast(self)  # predict: true: the predicted table and figure before the first run
        nodes_here = self.nodes_to_use(nodes_here)
        started, failed, done = time.monotonic(), 0, 0
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        tag = f"j{os.environ['SLURM_JOB_ID']}" if self.in_slurm else f"p{os.getpid()}"
        done_before = {} if self.force else self.repetitions_done_before()
        index = 0
        while True:
            if supervisor and supervisor.interrupted:
                break
            if index == len(p.runs) and not self.next_round():  # --repeat auto: another round?
                break
            run = p.runs[index]
            index += 1
            label = self._label(index, run)
            parent = self.parent_dir(run)
            kind = launchers.launch_kind(p.launcher, self.use_slurm, self.one_machine, run.ranks)
            earlier = done_before.get((parent, tuple(run.settings), run.repetition))
            if earlier and unattended(earlier, ledger, logs):
                print(
                    f"{label}: {earlier} says ok, but it has no ledger row: its study was killed before the run "
                    f"ended, which then ran unattended; running it again",
                    flush=True,
                )
                earlier = None
            if earlier:
                self._skip_done_earlier(label, run, kind, earlier, ledger)
                done += 1
                continue
            if self.left_out and run.nodes > len(nodes_here):
                self._skip_too_few_nodes(label, run, kind, len(nodes_here), ledger)
                continue
            run_id = f"{stamp}-{tag}.{index}"
            launch = self._launch(run, kind, run_id, index, nodes_here)
            if self.dry_run:
                show_launch(label, launch)
                continue
            failed += not self._run_one(label, run, kind, launch, run_id, logs, supervisor, ledger)
            done += 1
        if self.dry_run:
            return 0
        return self.finish(ledger, failed, done, time.monotonic() - started, supervisor)

    def next_round(self) -> bool:
        """--repeat auto, at the end of a round from the second: the look (analysis/sequential.py, the
        report's test at the look's level) and the next round's runs for the node counts still open.
        False when there is none: not adaptive, a dry run, the last round done, or every comparison decided."""
        p = self.plan
        after = p.runs[-1].repetition if p.runs else 0
        if not p.adaptive or after >= p.repeat:
            return False
        if self.dry_run:
            print(
                f"then after each round from the second, a look: the node counts whose best-against-next "
                f"comparison is still open run another round, up to round {p.repeat} (docs/jobs.md)"
            )
            return False
        looks = self.look(after)
        open_groups = (
            None if looks is None else {(x["model"], x["nodes"], x["world_size"]) for x in looks if not x["decided"]}
        )
        more = [
            dataclasses.replace(point, repetition=after + 1)
            for point in p.points
            if open_groups is None or (point.model, point.nodes, point.ranks) in open_groups
        ]
        if more:
            print(
                f"  round {after + 1} of at most {p.repeat}: {len(more)} run{'s' if len(more) > 1 else ''}", flush=True
            )
        p.runs.extend(more)
        return bool(more)

    def look(self, after: int) -> list | None:
        """The look after round `after`, one line per model and node count; None when it could not be made
        (every node count then counts as open: a failed look never stops a comparison early)."""
        script = os.path.join(home(), "analysis", "sequential.py")
        argv = [sys.executable, script, self.study_dir, "--round", str(after), "--max", str(self.plan.repeat)]
        done = subprocess.run(argv, capture_output=True, text=True)
        try:
            found = json.loads(done.stdout)
        except ValueError:
            found = None
        if done.returncode != 0 or not isinstance(found, dict):
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"  look after round {after} failed ({why}): every node count runs another round", flush=True)
            return None
        print(f"  look after round {after} of at most {self.plan.repeat} (level {found['level']:.2%}):", flush=True)
        for x in found["looks"]:
            where = f"{x['model']} n{x['nodes']}" + (f" ({x['world_size']} ranks)" if self.one_machine else "")
            vs = f"{x['best']} / {x['runner_up']} {x['ratio']:.3f}" if x["runner_up"] else x["best"]
            state = "decided" if x["decided"] else "open"
            print(f"    {where}: {vs}: {x['why']}: {state}", flush=True)
        return found["looks"]

    def _log_folder(self) -> str:
        """STUDY/logs, and the emulated nodes' folders, made now unless this is a dry run."""
        logs = os.path.join(self.study_dir, "logs")
        if not self.dry_run:
            try:
                os.makedirs(logs, exist_ok=True)
            except OSError as exc:
                raise UserError(f"--out: cannot create {logs}: {exc.strerror}") from None
            self.make_node_dirs()
        return logs

    def _label(self, index: int, run) -> str:
        """The run's line in the study's output: '[3/12] vit_micro FULL_SHARD n2 (4 ranks) repetition 2/3'."""
        p = self.plan
        label = f"[{index}/{len(p.runs)}] {run.model} {run.strategy} " + (
            f"{run.ranks} GPU{'s' if run.ranks > 1 else ''}"
            if self.one_machine
            else f"n{run.nodes} ({run.ranks} rank{'s' if run.ranks > 1 else ''})"
        )
        if run.variant != "-":
            label += " " + run.variant.replace(",", " ")
        if p.adaptive:
            label += f" round {run.repetition} (at most {p.repeat})"
        elif p.repeat > 1:
            label += f" repetition {run.repetition}/{p.repeat}"
        return label

    def _skip_done_earlier(self, label: str, run, kind: str, earlier: str, ledger) -> None:
        """A repetition an earlier study ran ok: skipped, and booked in this study's ledger if it is not there yet."""
        print(f"{label} ... ok earlier, skipped (--force runs it again): {earlier}", flush=True)
        if not self.dry_run and not ledger.has_run(earlier):
            ledger.add(
                model=run.model,
                strategy=run.strategy,
                variant=run.variant,
                nodes=run.nodes,
                ranks=run.ranks,
                launcher=kind,
                status="ok",
                images_per_s=run_result(earlier)[1],
                seconds=0,
                run_dir=earlier,
                repetition=run.repetition,
            )

    def nodes_to_use(self, nodes_here: list[str]) -> list[str]:
        """The nodes the runs are placed on: the allocation's, or with emulated nodes their names, less the
        nodes left out (--exclude-slow-nodes); the allocation's as before when none is left out."""
        if not self.left_out:
            return nodes_here
        if not self.in_slurm:  # emulated nodes: local0 .. local<N-1>, isolated or sharing this machine
            nodes_here = emulation.hosts_of(self.emulation.nodes if self.emulation else max(self.plan.nodes))
        return [n for n in nodes_here if n not in self.left_out]

    def _skip_too_few_nodes(self, label: str, run, kind: str, usable: int, ledger) -> None:
        """A rung the nodes left out no longer fit: one line, a ledger row, no run."""
        print(
            f"{label} ... skipped: needs {run.nodes} nodes, {usable} left after leaving out "
            f"{', '.join(self.left_out)} (named slow by the check)",
            flush=True,
        )
        if not self.dry_run:
            ledger.add(
                model=run.model,
                strategy=run.strategy,
                variant=run.variant,
                nodes=run.nodes,
                ranks=run.ranks,
                launcher=kind,
                status="skipped",
                seconds=0,
                repetition=run.repetition,
            )

    def _launch(self, run, kind: str, run_id: str, index: int, nodes_here: list[str]):
        """The commands that start one run: its launcher's, its rendezvous address, wrapped for emulated nodes."""
        if self.in_slurm:
            addr = systems.node_address(nodes_here[0], self.system.master_addr) if nodes_here else "127.0.0.1"
        elif self.emulation:  # the run's first emulated node, which need not be local0 when nodes are left out
            addr = self.emulation.address_of(nodes_here[0]) if nodes_here else self.emulation.master_addr
        else:
            addr = "127.0.0.1"
        port = free_port()
        if self.use_slurm and not self.in_slurm:  # a dry run far from the system: found when the job runs
            addr, port = "{address of the first node}", "{a free port}"
        launch = launchers.build(
            kind,
            self.python,
            run.settings
            + run.system_settings
            + [
                f"output.dir={self.out}",
                f"output.study={self.plan.name}",
                f"output.run_id={run_id}",
                f"output.repetition={run.repetition}",
            ],
            system=self.system,
            nodes=run.nodes,
            ranks_per_node=run.ranks_per_node,
            nodelist=",".join(nodes_here[: run.nodes]),
            master_addr=addr,
            master_port=port,
            time_limit_min=math.ceil(self.time_limit) if self.use_slurm and self.time_limit else None,
            grace_s=GRACE_S,
            rdzv_id=f"{os.environ.get('SLURM_JOB_ID', '0')}.{index}",
            as_root=os.geteuid() == 0,
        )
        if self.emulation and kind in emulation.WRAPPABLE:
            launch = self.emulation.wrap_launch(launch)
        return launch

    def _run_one(self, label: str, run, kind: str, launch, run_id: str, logs: str, supervisor, ledger) -> bool:
        """Runs one launch under the supervisor, says how it ended, books it in the ledger; True when it did
        not fail (ok, or skipped as not fitting)."""
        print(f"{label} ... ", end="", flush=True)
        log = os.path.join(logs, f"{run.model}.{run.strategy}.n{run.nodes}.{run_id}.log")
        # the trainer's start-up is counted from here (its end record's time_split)
        launch.env[LAUNCHED_AT] = f"{time.time():.3f}"
        with open(log, "w") as f:
            f.write(launch.log_header())
        outcome = supervisor.run(launch, log, self.time_limit * 60 if self.time_limit else None)
        run_dir = os.path.join(self.parent_dir(run), run_id)
        status, ips, error = run_result(run_dir)
        if outcome.timed_out and status in ("none", "failed"):
            error = f"stopped after --run-time-limit {self.time_limit:g} min" + (
                "; its processes did not end on SIGTERM and were killed" if outcome.killed else ""
            )
            end_for_the_record(run_dir, "timeout", error)
            status = "timeout"
        elif status == "none":
            status = status_of_code(outcome.code)
            error = f"exit code {outcome.code}, {error}; last line of the log: {last_line(log)}"
        seconds = round(outcome.seconds, 1)
        ok = status in ("ok", "skipped")
        if status == "ok":
            print(f"ok {ips} img/s ({seconds:.0f} s)")
        elif status == "skipped":
            print(f"skipped: {error or 'does not fit'}")
        else:
            print(f"{status.upper()} (exit {outcome.code}, {seconds:.0f} s): {error[:300]}")
            print(f"      log: {log}")
        sys.stdout.flush()
        ledger.add(
            model=run.model,
            strategy=run.strategy,
            variant=run.variant,
            nodes=run.nodes,
            ranks=run.ranks,
            launcher=kind,
            exit_code=outcome.code,
            status=status,
            images_per_s=ips,
            seconds=seconds,
            run_dir=run_dir if os.path.isdir(run_dir) else "-",
            log=log,
            repetition=run.repetition,
        )
        return ok

    def parent_dir(self, run) -> str:
        """Where the trainer puts the run directories of one point (each run its own run id)."""
        return os.path.join(self.study_dir, run.model, run.strategy, f"n{run.nodes}")

    def repetitions_done_before(self) -> dict:
        """(point's directory, settings, repetition) -> the earlier ok run that stands for it, looked
        up once before the first run (a run this study makes fills its own repetition only)."""
        done = {}
        for run in self.plan.runs:
            point = (self.parent_dir(run), tuple(run.settings))
            if run.repetition == 1:  # the first round holds every point once
                for repetition, run_dir in repetitions_done(ok_runs(*point), self.plan.repeat).items():
                    done[(*point, repetition)] = run_dir
        return done

    def prepare_kernels(self, supervisor, logs: str) -> None:
        """`vit-scale prepare` on a compute node before the first run, when a strategy of the study
        needs JIT kernels: no run's time limit or first step then includes a compiler."""
        from vit_scale.distributed.kernels import kernels_for

        p = self.plan
        if not p.runs or not any(kernels_for(p.strategies, kind) for kind in ("cpu", "cuda", "rocm")):
            return
        argv = [self.python, "-m", "vit_scale", "prepare", "--strategies", ",".join(p.strategies)]
        if self.use_slurm:
            gpu = ["--gpus-per-task=1"] if self.system.backend == "nccl" else []
            argv = ["srun", "--nodes=1", "--ntasks=1", *gpu, *argv]
        if supervisor is None:
            print(f"  kernels first: {launchers.show_command(argv)}")
            return
        print("  kernels: building what the strategies need before the first run ...", flush=True)
        log = os.path.join(logs, "prepare.log")
        outcome = supervisor.run(launchers.Launch("prepare", [(argv, {})]), log)
        with open(log, errors="replace") as f:
            for line in f:
                # its per-kernel lines, and its one-line errors (e.g. a CUDA toolkit that does not match torch's)
                if line.startswith(("  ", "vit-scale prepare:")) or "FAILED" in line:
                    print(f"  {line.rstrip()}")
        if outcome.code != 0:
            print(
                f"{self.prog}: some kernels could not be built (see {log}); the runs that need them build or fail "
                f"on their own",
                file=sys.stderr,
            )
        sys.stdout.flush()

    def make_node_dirs(self) -> None:
        """Node-local directories the env script asked for (e.g. MIOpen's cache under /tmp), on every node."""
        dirs = os.environ.get("VIT_SCALE_NODE_DIRS", "").split()
        if self.in_slurm and dirs and not self.analysis_only:
            code = subprocess.call(["srun", f"--nodes={self.alloc_nodes}", "--ntasks-per-node=1", "mkdir", "-p", *dirs])
            if code:
                print(f"{self.prog}: could not create {' '.join(dirs)} on every node", file=sys.stderr)

    def finish(self, ledger, failed: int, done: int, elapsed: float, supervisor) -> int:
        p = self.plan
        print()
        interrupted = supervisor is not None and supervisor.interrupted
        if interrupted:
            print(
                f"Study '{p.name}' interrupted after {done} of {len(p.runs)} runs. Submit the same command again "
                f"to resume: runs recorded as ok are skipped."
            )
        elif not self.analysis_only:
            total = len(p.runs)
            print(
                f"Study '{p.name}' on {self.system.name}: {total} run{'' if total == 1 else 's'} in "
                f"{int(elapsed) // 60}m{int(elapsed) % 60}s, {failed} failed."
            )
        else:
            print(f"Study '{p.name}': the runs recorded in {self.study_dir}")
        rows = ledger.rows()
        if rows:
            print("\n".join(summary(rows, "g" if self.one_machine else "n")))
        print(f"  run records: {self.study_dir}")
        # each node count's check (a sweep's jobs share the directory); a job: its own node count's
        checks = check_files(self.study_dir)
        own = check_path(self.study_dir, max(p.nodes or [0]), p.models[0] if len(p.models) == 1 else None)
        mine = [c for c in checks if c[2] == own] or [c for c in checks if c[0] == max(p.nodes or [0]) and not c[1]]
        if self.analysis_only:
            mine = checks
        earlier = read_check(self.study_dir) if not checks else None
        if earlier:  # a directory from before checks were kept per node count
            mine = [(0, None, "", earlier)]
        for nodes, model, _, check in mine:
            shared = sum(1 for c in checks if c[0] == nodes) > 1  # the model tells them apart
            named = f"n{nodes}{f' {model}' if model and shared else ''}: " if len(checks) > 1 else ""
            print(f"  check:       {named}{headline(check)}")
        report_ok = True
        if "--no-analysis" not in self.opts.flags and not interrupted:
            report_ok = self.analysis()
        if rows and not self.analysis_only:
            print(allocation_line(rows))
        if interrupted:
            return 143
        return 1 if failed or not report_ok else 0

    def analysis(self) -> bool:
        script = os.path.join(home(), "analysis", "weak_scaling.py")
        log = os.path.join(self.study_dir, "logs", "analysis.log")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "w") as f:
            code = subprocess.call(
                [sys.executable, script, self.study_dir, "--out", self.report], stdout=f, stderr=subprocess.STDOUT
            )
        if code != 0:
            print(f"{self.prog}: the analysis failed; see {log}", file=sys.stderr)
            with open(log) as f:
                sys.stderr.writelines(f.readlines()[-5:])
            return False
        report = os.path.abspath(self.report)
        plots = " ".join(sorted(n for n in os.listdir(report) if n.endswith(".png")))
        print(f"  report:      {report}/report.md")
        print(f"  plots:       {report}/ {plots or '(none)'}")
        print(f"  table:       {report}/results.csv")
        return True


def show_launch(label: str, launch) -> None:
    """A dry run's lines for one run: its label, then each command it would start (several run side by side)."""
    print(label)
    if len(launch.commands) > 1:
        for line in launch.shown():
            print(f"    {line} &")
    else:
        env = " ".join(f"{k}={v}" for k, v in launch.env.items())
        print(f"    {env + ' ' if env else ''}{launch.shown()[0]}")


def last_line(path: str) -> str:
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return lines[-1] if lines else "(empty)"


def main(argv=None) -> int:
    prog, argv = take_prog(sys.argv[1:] if argv is None else argv, PROG)
    try:
        opts = parse(argv)
        if opts.help:
            if "--which-env" in opts.flags:
                print("none")
            else:
                print(usage())
            return 0
        study = StudyRun(opts, prog)
        if "--which-env" in opts.flags:
            # what the job script sources before it starts the study (nothing for a dry run), and where it
            # first copies the environment on every node when it does (docs/jobs.md, "Start-up at scale")
            if study.dry_run or study.analysis_only:
                print("none" if study.dry_run else study.system.env_script)
            else:
                print(node_local.which_env_answer(study.system.env_script, study.system, study.alloc_nodes, prog))
            return 0
        # a study already running the same runs in this directory: refused here, before any output
        with StudyLock.for_study(study, prog, argv):
            if not study.analysis_only:
                study.header()
            return study.run_all()
    except UserError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
