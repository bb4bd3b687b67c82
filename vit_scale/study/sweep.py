"""`vit-scale sweep` (jobs/submit_sweep.sh): the study across allocations. One sbatch job per node
count (and per model with --per-model), each running jobs/weak_scaling.sh on its node count, then
an analysis job that Slurm starts once all of them have ended, however they ended
(--dependency=afterany). Small jobs get through a queue sooner than one big one, and a job cut by
its time limit leaves the others intact. Everything is checked before the first sbatch; submitting
the same sweep again resumes it (runs recorded ok are skipped).

stdout holds only the job ids (study jobs, then the analysis job); a dry run prints every sbatch
command and the srun lines of each job instead.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys

from vit_scale.cluster import launchers, systems
from vit_scale.cluster.files import home
from vit_scale.cluster.options import option_pairs, take_prog
from vit_scale.cluster.systems import study_file
from vit_scale.cluster.values import whole
from vit_scale.errors import UserError
from vit_scale.study import cli as study_cli
from vit_scale.study.plan import make_plan

SWEEP_VALUES = (
    "--nodes",
    "--max-nodes",
    "--system",
    "--account",
    "--partition",
    "--qos",
    "--time",
    "--analysis-time",
    "--gpus-per-node",
    "--logs",
    "--out",
)
SWEEP_FLAGS = ("--per-model", "--dry-run")
PASSED_VALUES = ("--config", "--report", "--run-time-limit", "--ranks-per-node")
# each job's study: --check checks that job's nodes first (its own OUT/STUDY/check-nN.json, or
# check-nN-MODEL.json when the job has one model: --per-model's jobs of one node count run side by side)
PASSED_FLAGS = ("--force", "--check")

USAGE = """usage: jobs/submit_sweep.sh [sweep options] [study options of jobs/weak_scaling.sh]

Sweep options:
  --nodes LIST          node counts, one job each (default: the study file's list)
  --max-nodes N         with a study whose nodes are 'ladder': 1, 2, 4 ... N
  --per-model           one job per node count and model
  --system NAME         frontier cuda local (default: $VIT_SCALE_SYSTEM, else frontier on
                        Frontier, else local)
  --account A           sbatch -A
  --partition P         sbatch -p
  --qos Q               sbatch -q
  --time T              time limit of each study job (default: the #SBATCH line of weak_scaling.sh)
  --analysis-time T     time limit of the analysis job (default 00:30:00)
  --gpus-per-node N     GPUs (ranks) per node; needed for --system cuda
  --logs DIR            where the jobs' output goes (default: logs, created if missing)
  --out DIR             run records (default: runs)
  --dry-run             print every sbatch command and the srun lines of each job; submit nothing
  -h, --help            this text
Study options (passed to every job): --config --study --models --strategies --batch-size --steps
  --warmup-steps --repeat --precision --activation-checkpointing, the families' modifiers
  (--fsdp-version ...: jobs/weak_scaling.sh --help lists them), --skip-if-not-fits --set
  --launcher --ranks-per-node --run-time-limit --force --report
  --check               each job checks its nodes first (vit-scale check --quick; OUT/STUDY/check-nN.json)"""

PROG = "vit-scale sweep"  # the name messages start with, unless --prog names the job script


def parse(argv):
    own, passed, study, sets, flags = {}, [], {}, [], set()
    for opt, value in option_pairs(argv, ("-h", "--help", *PASSED_FLAGS, *SWEEP_FLAGS)):
        if opt in ("-h", "--help"):
            flags.add("--help")
        elif opt in PASSED_FLAGS:
            passed.append(opt)
        elif value is None:
            flags.add(opt)
        elif opt in SWEEP_VALUES:
            own[opt] = value
        elif opt in PASSED_VALUES:
            own[opt] = value
            passed += [opt, value]
        elif opt == "--models":
            study["models"] = value  # each job gets its own --models
        elif opt == "--set":
            sets.append(value)
            passed += [opt, value]
        elif opt in study_cli.STUDY_OPTIONS:
            study[study_cli.STUDY_OPTIONS[opt]] = value
            passed += [opt, value]
        else:
            raise UserError(
                f"unknown option '{opt}'; allowed: {' '.join(SWEEP_VALUES + SWEEP_FLAGS)} and the study "
                f"options of jobs/weak_scaling.sh (see --help)"
            )
    return own, passed, study, sets, flags


def main(argv=None) -> int:
    prog, argv = take_prog(sys.argv[1:] if argv is None else argv, PROG)
    try:
        return sweep(argv, prog)
    except UserError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code


def sweep(argv, prog: str = PROG) -> int:
    own, passed, study, sets, flags = parse(argv)
    if "--help" in flags:
        print(USAGE)
        return 0
    dry_run = "--dry-run" in flags
    name, system, ranks = _system_and_ranks(own)
    if not dry_run and shutil.which("sbatch") is None:
        raise UserError(
            "--dry-run: sbatch is not on PATH, so nothing can be submitted here; allowed without Slurm: --dry-run"
        )

    # the whole study, checked now: a bad model or strategy must fail here, not in the queue an hour later
    if "--nodes" in own:
        study["nodes"] = own["--nodes"]
    plan = make_plan(
        study_file(own.get("--config"), system), study, sets, system, ranks, int(own.get("--max-nodes", 0))
    )

    out = os.path.abspath(own.get("--out", "runs"))
    logs = _log_folder(own, dry_run)
    sbatch = _Sbatch(
        _sbatch_options(own, system, ranks, logs), os.path.join(home(), "jobs", "weak_scaling.sh"), dry_run
    )
    job_args = ["--system", name, "--study", plan.name, "--out", out]
    if system.one_rank_per_gpu:
        job_args += ["--ranks-per-node", str(ranks)]

    per_model = "--per-model" in flags
    groups = plan.models if per_model else [",".join(plan.models)]
    sbatch.say(
        f"Sweep of study '{plan.name}' on {name}: {len(plan.nodes)} node count(s) x {len(groups)} model group(s), "
        f"then the analysis"
    )
    job_ids: list[str] = []
    for nodes in plan.nodes:
        for models in groups:
            job_name = f"vit-{plan.name}-n{nodes}" + (f"-{models}" if per_model else "")
            time_opt = [f"--time={own['--time']}"] if "--time" in own else []
            args = [*job_args, "--nodes", str(nodes), "--models", models, "--no-analysis", *passed]
            try:
                job_ids.append(sbatch.submit(job_name, [f"--nodes={nodes}", *time_opt], args))
            except RuntimeError as exc:
                print(
                    f"{prog}: sbatch refused {job_name} ({exc}); jobs submitted so far: {' '.join(job_ids) or 'none'}",
                    file=sys.stderr,
                )
                return 1
            if dry_run:
                _show_job_steps(args, ranks)
            else:
                sbatch.say(f"submitted {job_name}: job {job_ids[-1]}")
    try:
        analysis = sbatch.submit(
            f"vit-{plan.name}-analysis",
            [
                "--nodes=1",
                f"--time={own.get('--analysis-time', '00:30:00')}",
                "--dependency=afterany:" + ":".join(job_ids),
            ],
            [*job_args, "--analysis-only", *passed],
        )
    except RuntimeError as exc:
        print(
            f"{prog}: sbatch refused the analysis job ({exc}); the study jobs {' '.join(job_ids)} are queued",
            file=sys.stderr,
        )
        return 1
    if dry_run:
        sbatch.say("dry run: nothing was submitted")
        return 0
    sbatch.say(f"submitted vit-{plan.name}-analysis: job {analysis}, after jobs {' '.join(job_ids)} end")
    sbatch.say(
        f"job output: {logs}/   run records: {out}/{plan.name}   report: report/{plan.name} "
        f"(once job {analysis} has run)"
    )
    print(" ".join(job_ids + [analysis]))
    return 0


def _system_and_ranks(own: dict) -> tuple[str, systems.SystemProfile, int]:
    """The system's name, its profile, and the ranks each node runs (a GPU count where one rank drives one GPU)."""
    name = (
        own.get("--system") or os.environ.get("VIT_SCALE_SYSTEM") or ("frontier" if systems.on_frontier() else "local")
    )
    system = systems.read_system(name)
    for option in ("--max-nodes", "--gpus-per-node", "--ranks-per-node"):
        if option in own:
            whole(option, own[option])
    gpus = own.get("--gpus-per-node") or own.get("--ranks-per-node")
    if not system.one_rank_per_gpu:
        return name, system, int(gpus or system.ranks_per_node)
    if not gpus:
        raise UserError(
            f"--gpus-per-node: {name} runs one rank per GPU, so say how many GPUs each node gets; "
            f"allowed: a whole number such as 4"
        )
    return name, system, int(gpus)


def _log_folder(own: dict, dry_run: bool) -> str:
    logs = os.path.abspath(own.get("--logs", "logs"))
    if not dry_run:
        # Slurm fails a job whose --output directory is missing, silently: make it before submitting
        try:
            os.makedirs(logs, exist_ok=True)
        except OSError as exc:
            raise UserError(f"--logs: cannot create {logs}: {exc.strerror}") from None
    return logs


def _sbatch_options(own: dict, system, ranks: int, logs: str) -> list[str]:
    """The sbatch options every job of the sweep shares."""
    common = [f"--output={logs}/%x-%j.out"]
    for option in ("--account", "--partition", "--qos"):
        if option in own:
            common.append(f"{option}={own[option]}")
    if system.one_rank_per_gpu:
        common.append(f"--gpus-per-node={ranks}")
    return common + system.sbatch_flags.split()


class _Sbatch:
    """Submits the sweep's jobs, or on a dry run prints each sbatch command and returns a placeholder id."""

    def __init__(self, common: list[str], script: str, dry_run: bool):
        self.common, self.script, self.dry_run = common, script, dry_run

    def say(self, text: str) -> None:
        # a dry run's story is its output; a real sweep keeps stdout for the job ids
        print(text, file=sys.stdout if self.dry_run else sys.stderr, flush=True)

    def submit(self, job_name: str, sbatch_options: list[str], script_args: list[str]) -> str:
        cmd = [
            "sbatch",
            "--parsable",
            f"--job-name={job_name}",
            *self.common,
            *sbatch_options,
            self.script,
            *script_args,
        ]
        if self.dry_run:
            print(launchers.show_command(cmd))
            return "{" + job_name + "}"
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip() or f"sbatch exit code {proc.returncode}")
        return proc.stdout.strip().split(";")[0]  # --parsable prints "id" or "id;cluster"


def _show_job_steps(args: list[str], ranks: int) -> None:
    """What one job will run, step by step: the study's own dry run, its step lines indented under the job."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        study_cli.main(["--dry-run", *args, "--ranks-per-node", str(ranks)])
    for line in text.getvalue().splitlines():
        if line.startswith("[") or line.startswith("    "):
            print(f"    {line}")


if __name__ == "__main__":
    sys.exit(main())
