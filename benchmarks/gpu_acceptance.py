"""GPU acceptance (issue 39): one bounded script that proves the trainer, the check and the planner on
one H100-class GPU, printing each figure as it goes and writing one JSON of figures beside their bars.

    python benchmarks/gpu_acceptance.py [--steps a,b] [--budget 480] [--out PATH] [--work DIR]
    python benchmarks/gpu_acceptance.py --dry-run      # on any machine: the plan, every command, no run
    python benchmarks/gpu_acceptance.py --list         # the steps, what each measures, its bar, its budget

On the GPU machine (torch with CUDA and timm already there; nothing else is installed):

    pip install --no-deps -e . && PYTHONUNBUFFERED=1 python benchmarks/gpu_acceptance.py

Each measurement is a subprocess of the project's own tools under `timeout -s KILL <s>`, each step
with its own budget (the plan is printed first); when the total budget (default 480 s) cannot cover
a step any more, it and the ones after it are skipped with a line. Every vit_base measurement is
bf16, batch 32, on the one GPU:

  facts     device name and memory, torch, CUDA/ROCm, NCCL, driver (benchmarks/gpu_facts.py)
  overhead  benchmarks/trainer_overhead.py: the trainer against a bare PyTorch loop, DDP, NO_SHARD,
            FULL_SHARD, SHARD_GRAD_OP, FSDP2; ratio = trainer/bare images/s, bar >= 0.97 each
  memory    `vit-scale plan --json` for the same runs against the peak the trainer measured in the
            overhead step's records (peak allocated; peak active where both sides have it), bar 5%
  compile   vit_huge under FSDP2 (each Block compiled, as the trainer compiles FSDP), eager then
            train.compile=true: first-step time, images/s and MFU, compiled against eager
  check     `vit-scale check --quick` on the one GPU: the GEMM compute line per precision, the meter
            lines (overhead, event timing against host-synchronised, memory), and every label in
            fp32, bf16 and fp16 (vit_micro, a few steps): runs, or is refused in one line. DeepSpeed's
            and ColossalAI's labels are walked where those packages are installed, else reported
            'not installed'
  profile   one FSDP (FULL_SHARD) run with profile.enabled=true; its trace's breakdown
            (analysis/traces.py) against Holistic Trace Analysis' on the same trace
            (benchmarks/trace_vs_hta.py; 'not installed' without HTA)

The JSON (--out; default $OUT/gpu_acceptance.json when $OUT is set, else runs/gpu_acceptance/
gpu_acceptance.json) is rewritten after every step, so a run cut short still leaves what it found;
each command's output goes to a log beside it (gpu_acceptance_logs/). Exit code: 0 every measured
bar held, 1 a bar failed or a step failed, 2 bad arguments (one line). The dry run imports no torch.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # acceptance_figures, beside this file

from acceptance_figures import (  # noqa: E402
    MEMORY_BAR,
    OPTIONAL_LABELS,
    OVERHEAD_BAR,
    PAIRS,
    PRECISIONS,
    TORCH_LABELS,
    check_rows,
    compile_rows,
    find_run,
    memory_rows,
    not_measured,
    profile_rows,
    ratio_row,
    read_json,
    read_record,
    row,
)

PROG = "gpu_acceptance.py"
SCHEMA = 1
MAX_BUDGET_S = 480  # the whole, on one H100: 8 minutes
MARK = "VIT_SCALE_ACCEPTANCE"  # in every command's environment: what a timeout leaves behind is found by it


class BadArgument(Exception):
    """One line for the user, exit code 2."""


# ---------------------------------------------------------------- the plan


@dataclass
class Command:
    what: str
    argv: list
    timeout_s: int
    ok_codes: tuple = (0,)  # exit codes that mean it ran to the end (its figures then say how it went)

    def shell(self) -> str:
        return shlex.join(["timeout", "-s", "KILL", str(self.timeout_s), *self.argv])


@dataclass
class Step:
    name: str
    what: str
    bar: str
    commands: Callable  # (Context) -> [Command]
    collect: Callable  # (Context, [result of each command]) -> [measurement rows]
    needs: tuple = ()

    def budget_s(self, ctx) -> int:
        return sum(c.timeout_s for c in self.commands(ctx))


@dataclass
class Context:
    python: str
    work: str
    installed: dict = field(default_factory=dict)  # optional package -> importable here

    def path(self, *parts) -> str:
        return os.path.join(self.work, *parts)

    def train(self, study: str, run_id: str, *overrides) -> list:
        return [
            self.python,
            "-m",
            "vit_scale",
            "train",
            *overrides,
            "train.print_every=1000000",
            f"output.dir={self.work}",
            f"output.study={study}",
            f"output.run_id={run_id}",
        ]


VIT_BASE = ("model=vit_base", "train.batch_size=32", "train.precision=bf16")


def facts_commands(ctx) -> list:
    return [
        Command("device and versions", [ctx.python, "benchmarks/gpu_facts.py", "--out", ctx.path("facts.json")], 20)
    ]


def overhead_commands(ctx) -> list:
    argv = [ctx.python, "benchmarks/trainer_overhead.py", "--device", "cuda", "--ranks", "1"]
    argv += ["--pairs", ",".join(PAIRS), "--model", "vit_base", "--batch-size", "32", "--precision", "bf16"]
    argv += ["--steps", "20", "--warmup", "5", "--rounds", "2"]
    argv += ["--keep", ctx.path("overhead"), "--json", ctx.path("overhead.json")]
    return [Command("trainer against bare loop, 5 strategies x 2 rounds", argv, 110)]


def plan_argv(ctx, strategies: str, fsdp_version: int) -> list:
    return [
        *(ctx.python, "-m", "vit_scale", "plan", "--model", "vit_base", "--strategy", strategies),
        *("--nodes", "1", "--gpus-per-node", "1", "--device", "cuda", "--batch-size", "32", "--precision", "bf16"),
        *("--fsdp-version", str(fsdp_version), "--json"),
    ]


def memory_commands(ctx) -> list:
    return [
        Command("planner, DDP and FSDP1", plan_argv(ctx, "DDP,NO_SHARD,FULL_SHARD,SHARD_GRAD_OP", 1), 5),
        Command("planner, FSDP2", plan_argv(ctx, "FULL_SHARD", 2), 5),
    ]


COMPILE = ("model=vit_huge", "strategy=FULL_SHARD", "fsdp.version=2", "train.batch_size=32", "train.precision=bf16")
COMPILE_STEPS = ("train.steps=15", "train.warmup_steps=5")


def compile_commands(ctx) -> list:
    return [
        Command("vit_huge FSDP2 eager", ctx.train("compile", "eager", *COMPILE, *COMPILE_STEPS), 45),
        Command(
            "vit_huge FSDP2 compiled",
            ctx.train("compile", "compiled", *COMPILE, *COMPILE_STEPS, "train.compile=true"),
            90,
        ),
    ]


CHECK_TIMEOUT_S = 130
CHECK_MARGIN_S = (
    30  # the check stops at its own limit this much earlier (its ranks get 20 s, STOP_GRACE_S), then writes check.json
)


def check_labels(ctx) -> list:
    return [
        *TORCH_LABELS,
        *(label for pkg, labels in OPTIONAL_LABELS.items() if ctx.installed.get(pkg) for label in labels),
    ]


def check_commands(ctx) -> list:
    argv = [ctx.python, "-m", "vit_scale", "check", "--system", "cuda", "--launcher", "torchrun"]
    argv += ["--nodes", "1", "--ranks-per-node", "1", "--strategies", ",".join(check_labels(ctx))]
    argv += ["--precision", ",".join(PRECISIONS), "--model", "vit_base", "--batch-size", "32", "--quick"]
    argv += ["--out", ctx.path("check"), "--time-limit", f"{(CHECK_TIMEOUT_S - CHECK_MARGIN_S) / 60:.2f}"]
    # exit code 1 is a verdict (e.g. a named label refused), read from check.json's lines like the rest
    return [Command("vit-scale check on the one GPU", argv, CHECK_TIMEOUT_S, ok_codes=(0, 1))]


PROFILE = ("strategy=FULL_SHARD", *VIT_BASE, "train.steps=8", "train.warmup_steps=3", "profile.enabled=true")


def profile_commands(ctx) -> list:
    run_dir = ctx.path("profile", "vit_base", "FULL_SHARD", "n1", "traced")
    return [
        Command("vit_base FULL_SHARD, profiled", ctx.train("profile", "traced", *PROFILE), 45),
        Command(
            "breakdown against HTA",
            [ctx.python, "benchmarks/trace_vs_hta.py", run_dir, "--json", ctx.path("trace_vs_hta.json")],
            15,
        ),
    ]


# ---------------------------------------------------------------- each step's collect


def collect_facts(ctx, results) -> list:
    found = read_json(ctx.path("facts.json")) or {}
    device = found.get("device") or {}
    gpu = device.get("type") in ("cuda", "rocm")
    why = {} if gpu else {"note": f"no GPU visible (device type {device.get('type')})"}
    return [row("facts", "device", device.get("name"), "", "a CUDA or ROCm GPU", gpu, **found, **why)]


def overhead_doc(ctx) -> dict:
    return read_json(ctx.path("overhead.json")) or {}


def collect_overhead(ctx, results) -> list:
    pairs = overhead_doc(ctx).get("pairs") or {}
    return [
        ratio_row(
            label,
            (pairs.get(label) or {}).get("bare", []),
            [read_record(d) for d in pairs.get(label, {}).get("run_dirs", [])],
        )
        for label in PAIRS
    ]


def collect_memory(ctx, results) -> list:
    planned = {}
    for version, result in zip((1, 2), results, strict=False):
        for r in (result.get("json") or {}).get("rows", []):
            planned["FSDP2" if version == 2 else r["strategy"]] = r
    pairs = overhead_doc(ctx).get("pairs") or {}
    return [
        x
        for label in PAIRS
        for x in memory_rows(
            label, planned.get(label), [read_record(d) for d in pairs.get(label, {}).get("run_dirs", [])]
        )
    ]


def collect_compile(ctx, results) -> list:
    return compile_rows(
        read_record(find_run(ctx.work, "compile", "eager")), read_record(find_run(ctx.work, "compile", "compiled"))
    )


def collect_check(ctx, results) -> list:
    return check_rows(read_json(ctx.path("check", "check.json")), ctx.installed)


def collect_profile(ctx, results) -> list:
    return profile_rows(read_json(ctx.path("trace_vs_hta.json")))


STEPS = (
    Step("facts", "device name, torch, CUDA/ROCm, NCCL, driver", "a GPU is visible", facts_commands, collect_facts),
    Step(
        "overhead",
        "trainer against a bare loop: DDP, NO_SHARD, FULL_SHARD, SHARD_GRAD_OP, FSDP2",
        f">= {OVERHEAD_BAR} each",
        overhead_commands,
        collect_overhead,
    ),
    Step(
        "memory",
        "planner's peak allocated (and active) against the trainer's measured, the overhead step's runs",
        f"within {MEMORY_BAR:.0%}",
        memory_commands,
        collect_memory,
        needs=("overhead",),
    ),
    Step(
        "compile",
        "vit_huge FSDP2 compiled against eager: first step, images/s, MFU",
        "reported; no graph in the timed window",
        compile_commands,
        collect_compile,
    ),
    Step(
        "check",
        "vit-scale check: GEMM compute lines, meter lines, every label x precision",
        "compute timed below peak; meter overhead >= 0.90, timing and memory within 5%; each label ok or refused",
        check_commands,
        collect_check,
    ),
    Step(
        "profile",
        "one FSDP run's trace: our breakdown against HTA's",
        "compute within 2%, idle within 0.5%, overlap within 0.5 points",
        profile_commands,
        collect_profile,
    ),
)
STEP_NAMES = tuple(s.name for s in STEPS)


# ---------------------------------------------------------------- arguments


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2, as the project's commands do
        raise BadArgument(message)


def parse(argv: list) -> argparse.Namespace:
    parser = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default=",".join(STEP_NAMES), help=f"comma-separated, from {', '.join(STEP_NAMES)}")
    parser.add_argument("--budget", default=str(MAX_BUDGET_S), help="seconds for the whole (default 480)")
    parser.add_argument("--out", default=None, help="the JSON (default $OUT/gpu_acceptance.json, else runs/...)")
    parser.add_argument("--work", default=None, help="run records and check output (default: a new runs/ folder)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and every command; run nothing")
    parser.add_argument("--list", action="store_true", help="the steps, their bars and budgets")
    parser.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.steps = selected_steps(args.steps)
    args.budget = positive_seconds(args.budget)
    args.out = writable_out(args.out)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    args.work = os.path.abspath(args.work or os.path.join(ROOT, "runs", "gpu_acceptance", stamp))
    return args


def selected_steps(text: str) -> list:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise BadArgument(f"--steps: no step given; allowed: {', '.join(STEP_NAMES)}")
    for name in names:
        if name not in STEP_NAMES:
            raise BadArgument(f"--steps: unknown step '{name}'; allowed: {', '.join(STEP_NAMES)}")
    for step in STEPS:
        missing = [n for n in step.needs if step.name in names and n not in names]
        if missing:
            raise BadArgument(f"--steps: {step.name} reads the {', '.join(missing)} step's records; add {missing[0]}")
    if "facts" not in names:  # the device and versions every figure needs beside it
        names.insert(0, "facts")
    return [s for s in STEPS if s.name in names]


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise BadArgument(f"--budget: '{text}' is not a positive number of seconds")
    return value


def writable_out(path: str | None) -> str:
    if path is None:
        base = os.environ.get("OUT") or os.path.join(ROOT, "runs", "gpu_acceptance")
        path = os.path.join(base, "gpu_acceptance.json")
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise BadArgument(f"--out: {path} is a directory; give a file path")
    parent = os.path.dirname(path)
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:  # a file made and removed at once: os.access says yes to root even on /proc
        if not os.path.isdir(existing):
            raise OSError
        tempfile.TemporaryFile(dir=existing).close()
    except OSError:
        raise BadArgument(f"--out: {parent} is not writable; give a path in a writable directory") from None
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise BadArgument(f"--out: {path} is not writable")
    return path


def installed_packages() -> dict:
    """Which optional packages are importable, without importing them."""
    import importlib.util

    return {pkg: importlib.util.find_spec(pkg) is not None for pkg in OPTIONAL_LABELS}


# ---------------------------------------------------------------- running


def print_plan(steps: list, ctx: Context, budget: float, dry: bool) -> None:
    total = sum(s.budget_s(ctx) for s in steps)
    print(f"{PROG}: {len(steps)} steps, budgets {total} s in all, total budget {budget:g} s", flush=True)
    for step in steps:
        print(f"  {step.name:9} {step.budget_s(ctx):4d} s  {step.what}; bar: {step.bar}", flush=True)
        if dry:
            for c in step.commands(ctx):
                print(f"      {c.shell()}", flush=True)
    missing = [p for p, ok in ctx.installed.items() if not ok]
    if missing:
        print(f"  not installed here, so their labels are reported 'not installed': {', '.join(missing)}", flush=True)


def run_command(cmd: Command, timeout_s: int, log_path: str, token: str) -> dict:
    """Run under `timeout -s KILL`, each output line printed as it comes and kept in the log; then end
    whatever it left (torchrun's workers start sessions of their own, out of timeout's reach). The
    output is read on a thread: a process left behind holds the pipe open, and must not hold this
    script until it ends by itself."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", MARK: token}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    argv = ["timeout", "-s", "KILL", str(timeout_s), *cmd.argv]
    started = time.monotonic()
    output: list = []
    with open(log_path, "w") as log:
        log.write(shlex.join(argv) + "\n")
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        reader = threading.Thread(target=relay, args=(proc.stdout, log, output), daemon=True)
        reader.start()
        code = proc.wait()
        seconds = time.monotonic() - started
        left = end_leftovers(token)
        reader.join(timeout=10)
    result = {
        "what": cmd.what,
        "command": shlex.join(argv),
        "exit_code": code,
        "timed_out": code in (124, 137, -9),
        "seconds": round(seconds, 1),
        "log": log_path,
        "leftover_processes_ended": left,
    }
    if cmd.argv[-1] == "--json":  # vit-scale plan --json: the document is its stdout
        try:
            result["json"] = json.loads("".join(output))
        except ValueError:
            result["json"] = None
    return result


def relay(stream, log, output: list) -> None:
    for line in stream:
        log.write(line)
        output.append(line)
        print(f"    | {line.rstrip()}", flush=True)


def end_leftovers(token: str) -> int:
    """SIGKILL the processes whose environment carries this command's mark (Linux /proc)."""
    ended = 0
    needle = f"{MARK}={token}".encode()
    for env_file in glob.glob("/proc/[0-9]*/environ"):
        pid = int(env_file.split("/")[2])
        if pid == os.getpid():
            continue
        try:
            with open(env_file, "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            os.kill(pid, signal.SIGKILL)
            ended += 1
        except OSError:
            continue  # gone already, or not ours
    return ended


def run_step(step: Step, ctx: Context, deadline: float, log_dir: str) -> dict:
    """Each command with its own timeout, cut to what is left of the total; a command that cannot get
    half its budget is skipped with the rest of the step."""
    results = []
    status = "ok"
    for i, cmd in enumerate(step.commands(ctx)):
        left = int(deadline - time.monotonic())
        if left < cmd.timeout_s / 2:
            print(f"  skipped {step.name}: {cmd.what} needs up to {cmd.timeout_s} s, {max(left, 0)} s left", flush=True)
            status = "skipped"
            break
        print(f"  {step.name}: {cmd.what} (timeout {min(cmd.timeout_s, left)} s)", flush=True)
        result = run_command(
            cmd, min(cmd.timeout_s, left), os.path.join(log_dir, f"{step.name}.{i}.log"), uuid.uuid4().hex
        )
        results.append(result)
        if result["timed_out"]:
            status = "timeout"
        elif result["exit_code"] not in cmd.ok_codes and status == "ok":
            status = "failed"
    if results:
        rows = step.collect(ctx, results)
    else:  # nothing ran: one row saying so, rather than each figure's own guess at why it is missing
        rows = [not_measured(step.name, step.name, step.bar, "skipped: the total budget ran out")]
    return {"name": step.name, "status": status, "budget_s": step.budget_s(ctx), "commands": results, "rows": rows}


def print_rows(rows: list) -> None:
    for r in rows:
        verdict = {True: "PASS", False: "FAIL", None: "    "}[r["pass"]]
        value = r["value"] if not isinstance(r["value"], float) else f"{r['value']:.4g}"
        text = (
            f"{value} {r['unit']}".strip()
            if r["value"] is not None
            else f"not measured: {r.get('note') or 'not in the record'}"
        )
        print(
            f"  {verdict} {r['step']:8} {r['name']:32} {text}" + (f"  (bar {r['bar']})" if r["bar"] else ""), flush=True
        )


def document(args, ctx: Context, steps_done: list, started: float) -> dict:
    """The JSON: device and versions, every step and every measurement with its bar and verdict."""
    rows = [r for s in steps_done for r in s["rows"]]
    facts = next((r for r in rows if r["step"] == "facts"), {})
    return {
        "schema": SCHEMA,
        "tool": "benchmarks/gpu_acceptance.py",
        "time_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.monotonic() - started, 1),
        "budget_s": args.budget,
        "work": ctx.work,
        "device": facts.get("device"),
        "versions": facts.get("versions"),
        "installed": ctx.installed,
        "steps": [{k: v for k, v in s.items() if k != "rows"} for s in steps_done],
        "measurements": rows,
        "passed": sum(r["pass"] is True for r in rows),
        "failed": sum(r["pass"] is False for r in rows),
        "not_judged": sum(r["pass"] is None for r in rows),
    }


def write_atomically(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)


def run_all(args, ctx: Context) -> int:
    started = time.monotonic()
    deadline = started + args.budget
    log_dir = os.path.join(os.path.dirname(args.out), "gpu_acceptance_logs")
    os.makedirs(log_dir, exist_ok=True)
    os.makedirs(ctx.work, exist_ok=True)
    done: list = []
    for step in args.steps:
        print(f"{step.name}: {step.what}", flush=True)
        result = run_step(step, ctx, deadline, log_dir)
        done.append(result)
        print_rows(result["rows"])
        write_atomically(args.out, document(args, ctx, done, started))
    doc = document(args, ctx, done, started)
    print(
        f"{PROG}: {doc['passed']} passed, {doc['failed']} failed, {doc['not_judged']} not judged, "
        f"{doc['seconds']:g} s; {args.out}",
        flush=True,
    )
    broken = doc["failed"] or any(s["status"] in ("failed", "timeout") for s in done)
    return 1 if broken else 0


def main(argv=None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except BadArgument as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    ctx = Context(args.python, args.work, installed_packages())
    if args.list:
        for step in STEPS:
            print(f"{step.name:9} {step.budget_s(ctx):4d} s  {step.what}; bar: {step.bar}")
        return 0
    print_plan(args.steps, ctx, args.budget, args.dry_run)
    if args.dry_run:
        print(f"{PROG}: dry run; figures would go to {args.out}, records under {args.work}", flush=True)
        return 0
    return run_all(args, ctx)


if __name__ == "__main__":
    sys.exit(main())
