"""Shared helpers. Multi-rank tests start real processes (torchrun or plain env:// ranks) that
talk over gloo; nothing about torch.distributed is mocked."""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
IN_CI = os.environ.get("CI", "").lower() == "true"
# The suite's studies share this machine's loopback and cores (emulation: shared): an isolated emulated node
# computes at its quota (half a core), which would make every multi-rank test several times slower. The
# tests of the isolated emulation (test_emulation*.py) ask for it themselves.
os.environ.setdefault("VIT_SCALE_EMULATION", "shared")
# DeepSpeed's CPU Adam is built under $TORCH_EXTENSIONS_DIR (by default ~/.cache/torch_extensions), and its build
# file names the paths of the venv it was built from: a session of a checkout at another path (another worktree,
# its .venv a link to the same venv) rebuilt it there, and the next session here rebuilt it back, each time 50 to
# 130 s of both cores (12 builds on 2026-11-28) beside the tests. A folder a venv path keeps each one's build.
os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR",
    os.path.join(
        os.path.expanduser("~"),
        ".cache",
        "torch_extensions",
        "vit-scale-tests-" + hashlib.sha256(sys.prefix.encode()).hexdigest()[:12],
    ),
)
FAST = [
    "model=vit_micro",
    "train.steps=4",
    "train.warmup_steps=1",
    "train.batch_size=4",
    "train.print_every=100",
    # the node-health probe after the window, shortened: one run of the suite is many runs
    "train.health_probe_s=0.1",
]


# ---------------------------------------------------------------- tests by kind

# Each test module's kind, kept here in one place. A module has the kind of its heaviest test.
#   unit       no ranks, no system tools: `pytest -m unit` is the fast subset (CONTRIBUTING.md)
#   multirank  trains: real ranks (one or more) over gloo, torchrun, env:// processes, emulated nodes
#   cluster    needs a system tool that --with-test-tools installs: Slurm, Lmod, MPI, shellcheck
KINDS = {  # one module a line, sorted: branches that add modules then merge without conflict
    "unit": [
        "test_alpha_beta",
        "test_adding_a_family",
        "test_analysis",
        "test_check_nodes",
        "test_check_scale",
        "test_compute_from_check",
        "test_emulation_units",
        "test_end_record",
        "test_env_setup_venv",
        "test_finetune_units",
        "test_gpu_acceptance",
        "test_gpu_decisions",
        "test_house",
        "test_memory_window",
        "test_node_health",
        "test_models_and_config",
        "test_node_local",
        "test_peaks",
        "test_plan",
        "test_plan_predict",
        "test_prediction",
        "test_published_frontier",
        "test_sequential",
        "test_stats",
        "test_step_fit",
        "test_step_meter",
        "test_step_time",
        "test_traces_hta",
        # its two ranks exit at the configuration check, before any process group
        "test_trainer_bad_input",
    ],
    "multirank": [
        "test_analysis_contract",
        "test_capabilities",
        "test_check_groups",
        "test_check_meter",
        "test_colossalai",
        "test_compile",
        "test_deepspeed",
        "test_emulation",
        "test_finetune",
        "test_fsdp_fp16",
        "test_jobs",
        "test_lora",
        "test_meta_init",
        "test_plan_tensors",
        "test_predicted_bytes",
        "test_profiling",
        "test_study",
        "test_study_orphans",
        "test_study_repeat",
        "test_tracking",
        "test_trainer_equivalence",
        "test_trainer_failures",
    ],
    "cluster": [
        "test_check",
        "test_check_allocations",
        "test_env_lmod",
        "test_jobs_slurm",
        "test_launchers",
        "test_shellcheck",
        "test_study_lock",
    ],
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(config, items):
    kind_of = {module: kind for kind, modules in KINDS.items() for module in modules}
    unknown = set()
    for item in items:
        kind = kind_of.get(item.path.stem)
        if kind is None:
            unknown.add(item.path.name)
        else:
            item.add_marker(kind)
    if unknown:
        raise pytest.UsageError(
            f"tests/conftest.py: KINDS gives no kind to {', '.join(sorted(unknown))}; "
            "add each module to unit, multirank or cluster"
        )


def require_tool(name: str) -> None:
    """Outside CI a missing system tool skips the test; in CI it fails it (CI installs them all)."""
    if shutil.which(name) is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed, and CI must run this test (.ci/run installs it)")
        pytest.skip(f"{name} not installed (bash env/setup_venv.sh local --with-test-tools installs it)")


def require_package(name: str, install: str) -> None:
    """A Python package the test needs: skipped outside CI when missing, a failure in CI (.ci/run
    installs every extra). Looked up, not imported: importing DeepSpeed or ColossalAI takes seconds."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed, and CI must run this test ({install})")
        pytest.skip(f"{name} not installed ({install})", allow_module_level=True)


def require_module(name: str, install: str):
    """require_package, then the module itself."""
    import importlib

    require_package(name, install)
    return importlib.import_module(name)


# `vit-scale prepare` for DeepSpeed's CPU Adam, started when collection ends if a selected test needs it: its
# build (about 45 s on a fresh machine, one or two cores) then runs beside the tests before the first one that
# needs it (test_check_allocations' jobs spend minutes waiting on their limits), not inside that test's setup.
PREPARE_CPU_ADAM = [PYTHON, "-m", "vit_scale", "prepare", "--strategies", "ZERO1"]
_prepare = {}  # "proc": the Popen, "out": its output file


def pytest_sessionstart(session):
    """The project's sources byte-compiled once, into the __pycache__ folders a first import writes: where
    PYTHONDONTWRITEBYTECODE is set (as on the 2-core machine the suite's time is measured on) no process
    writes them, and each of the suite's hundreds of processes compiled what it imported anew. A source
    edited later is compiled anew by whoever imports it (the cache keeps its mtime and size)."""
    if not sys.dont_write_bytecode:
        return  # the first import writes them
    import compileall

    for folder in ("vit_scale", "analysis"):
        compileall.compile_dir(os.path.join(ROOT, folder), quiet=1)


def pytest_collection_finish(session):
    import gc
    import importlib.util

    import slurm_fixture

    # What collection imported (torch, timm, pandas, the test modules) lives to the session's end: frozen, it is
    # left out of the collector's walks. A full collection in this process then takes microseconds instead of
    # 0.17-0.35 s (torch, timm and the trainer alone: 345,000 objects), and end_one_rank_group runs two a test
    gc.collect()
    gc.freeze()

    slurm_fixture.start_early(session)  # the Slurm jobs that mostly wait, when selected tests need them
    if importlib.util.find_spec("deepspeed") is None or session.config.option.collectonly:
        return
    if any("deepspeed_cpu_adam" in getattr(item, "fixturenames", ()) for item in session.items):
        import tempfile

        out = tempfile.TemporaryFile(mode="w+")
        _prepare.update(out=out, proc=subprocess.Popen(PREPARE_CPU_ADAM, cwd=ROOT, stdout=out, stderr=out, text=True))


def pytest_sessionfinish(session):
    import slurm_fixture

    proc = _prepare.get("proc")
    if proc is not None and proc.poll() is None:  # a run stopped before any test needed it
        proc.kill()
        proc.wait()
    slurm_fixture.stop_all()


@pytest.fixture(scope="session")
def deepspeed_cpu_adam():
    """DeepSpeed's CPU Adam op, compiled once, in one process, before a multi-rank launch needs it.
    On a fresh machine the first offload run compiled it inside the run (about 45 s quiet, minutes
    under load) in every rank at once, racing the launch's timeouts: the suite then failed at
    random. `vit-scale prepare` also clears a lock that a build killed half-way left behind.
    (It is the command a study runs before its first run.) Started in the background when
    collection ends (pytest_collection_finish); waited for here."""
    require_package("deepspeed", "pip install 'vit-scale[deepspeed]'")
    proc, out = _prepare.pop("proc", None), _prepare.pop("out", None)
    if proc is None:
        done = subprocess.run(PREPARE_CPU_ADAM, cwd=ROOT, capture_output=True, text=True, timeout=900)
        code, output = done.returncode, done.stdout + done.stderr
    else:
        code = proc.wait(timeout=900)
        out.seek(0)
        output = out.read()
        out.close()
    assert code == 0, output[-6000:]
    print(output.strip())


@pytest.fixture(scope="session")
def shared_launches(request, tmp_path_factory):
    """The launches several modules' runs share, one per rank count, each started by the first fixture that
    asks (tests/shared_launch.py)."""
    import shared_launch

    return shared_launch.Launches(request, tmp_path_factory)


def init_one_rank_group() -> None:
    """A real gloo process group of one rank in this process, for tests of code that needs one.
    Its store lives in memory: a FileStore of world size 1 can hang in destroy_process_group
    (pytorch/pytorch#31467), which once held a CI run at the end of a test until CI's time ran out."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def end_one_rank_group(*owners) -> None:
    """Destroy the group of init_one_rank_group, after ending what holds it: each owner's attributes (a
    strategy's DDP model and optimizer) are dropped and collected first, so the owner is spent afterwards.
    A DDP model sits in reference cycles and its Reducer holds the process group: left alone, the group outlived
    destroy_process_group and died whenever the cyclic collector next ran, in a later test, with the GIL held:
    gloo's destructor joined its worker thread there while the worker waited for the GIL, and the suite hung
    until CI's time ran out. Collected here, the Reducer goes while the group is still registered, and the
    group ends in destroy_process_group, at this known point."""
    import gc

    import torch.distributed as dist

    for owner in owners:
        if owner is not None:
            vars(owner).clear()
    gc.collect()
    _let_gloo_workers_settle()
    dist.destroy_process_group()
    gc.collect()  # whatever the group's end released


def _let_gloo_workers_settle(limit_s: float = 5.0) -> None:
    """Sleep (the GIL released) until no gloo worker thread of this process is runnable, twice in a row.
    The group's end joins its workers with the GIL held, and a worker still finishing the last collective
    takes the GIL to drop that collective's tensor: a worker the OS held back (a loaded machine) then never
    finishes. Seen so: main thread in ProcessGroupGloo's destructor (thread join), worker in
    ~AsyncBroadcastWork -> decref_pyobject -> take_gil. Linux shows thread states in /proc; elsewhere a pause."""
    deadline = time.monotonic() + limit_s
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
        quiet = 0 if any(_runnable_gloo_worker(task) for task in glob.glob("/proc/self/task/*")) else quiet + 1


def _runnable_gloo_worker(task: str) -> bool:
    try:
        with open(os.path.join(task, "comm")) as comm, open(os.path.join(task, "stat")) as stat:
            return comm.read().strip() == "pt_gloo_runloop" and stat.read().rsplit(")", 1)[1].split()[0] == "R"
    except (OSError, IndexError):
        return False  # the thread ended meanwhile


def torchrun(nproc: int, args: list[str], timeout: int = 300, env=None) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def run_many(nproc: int, runs: list[list[str]], tmp_path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Several trainer runs in one launch (one process group): each launch costs seconds of imports."""
    spec = tmp_path / f"runs-{nproc}.json"
    spec.write_text(json.dumps(runs))
    proc = torchrun(nproc, [os.path.join(ROOT, "tests", "run_many.py"), str(spec)], timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def run_outputs(stdout: str, count: int) -> list[str]:
    """Rank 0's output of each run of a run_many launch, in order (each opens with a line "RUN_MANY i")."""
    import re

    pieces = re.split(r"^RUN_MANY (\d+)\n", stdout, flags=re.M)
    found = {int(index): text for index, text in zip(pieces[1::2], pieces[2::2], strict=True)}
    assert sorted(found) == list(range(count)), stdout[-3000:]
    return [found[i] for i in range(count)]


def load_runs(out_dir) -> dict:
    """{(study, strategy, run_id): records} for every run under out_dir, each record validated."""
    from vit_scale.distributed import FAMILIES
    from vit_scale.record.schema import validate_record_file

    found = {}
    for path in sorted(glob.glob(os.path.join(str(out_dir), "**", "metrics.jsonl"), recursive=True)):
        records = validate_record_file(path, families=FAMILIES)
        start = records[0]
        found[(start["study"], start["strategy"]["label"], start["run_id"])] = records
    return found


def losses(records) -> list[float]:
    return [r["loss"] for r in records if r["event"] == "step"]


# ---------------------------------------------------------------- shared by the strategy tests

REL_TOL = 2e-5  # reduction order differs between all-reduce and reduce-scatter; nothing else may


def assert_same_losses(reference, other, what, steps=4):
    assert len(reference) == len(other) == steps, what
    for step, (a, b) in enumerate(zip(reference, other, strict=True), 1):
        assert abs(a - b) <= REL_TOL * abs(a), f"{what}: step {step} loss {b} differs from DDP's {a}"


def by_study(runs: dict) -> dict:
    return {study: records for (study, _, _), records in runs.items()}


def start_train(args, tmp_path, env=None) -> subprocess.Popen:
    """One `python -m vit_scale train` with the fast settings, its output under tmp_path/runs."""
    return subprocess.Popen(
        [PYTHON, "-m", "vit_scale", "train", *FAST, f"output.dir={tmp_path / 'runs'}", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


# `vit-scale train` for each case in turn, in one process: fd 1 and 2 go to files of their own per case, so
# that every line a case prints (C++'s and a logger's too) is its own
REFUSALS = """
import json, os, sys

from vit_scale.cli import main

cases, out = json.load(open(sys.argv[1])), sys.argv[2]
for name, args in cases.items():
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(os.path.join(out, name + ".out"), "w") as o, open(os.path.join(out, name + ".err"), "w") as e:
        os.dup2(o.fileno(), 1)
        os.dup2(e.fileno(), 2)
        try:
            code = main(["train", *args])
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
    with open(os.path.join(out, name + ".code"), "w") as f:
        f.write(str(code))
"""


def train_refusals(cases: dict, tmp_path) -> dict:
    """{name: (exit code, stdout, stderr)} of `vit-scale train` with FAST and output under tmp_path/runs,
    for inputs it refuses before any work: all in one process (each start of one costs seconds of imports),
    the command's own main() in turn, its output per case as separate processes would print it."""
    work = tmp_path / "refusals"
    work.mkdir()
    spec = work / "cases.json"
    spec.write_text(
        json.dumps({name: [*FAST, f"output.dir={tmp_path / 'runs'}", *args] for name, args in cases.items()})
    )
    proc = subprocess.run(
        [PYTHON, "-c", REFUSALS, str(spec), str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        name: tuple(
            int(text) if kind == "code" else text
            for kind, text in ((k, (work / f"{name}.{k}").read_text()) for k in ("code", "out", "err"))
        )
        for name in cases
    }


def env_without(module: str, tmp_path) -> dict:
    """Absence of a package, simulated: a directory on PYTHONPATH (searched before site-packages)
    holds a `<module>.py` that raises ModuleNotFoundError, exactly what `import <module>` raises
    when the package is not installed."""
    shim = tmp_path / f"no-{module}"
    shim.mkdir()
    (shim / f"{module}.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n")
    return {"PYTHONPATH": os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
