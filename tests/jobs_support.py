"""Helpers for the tests of jobs/: a stand-in for the trainer's python that makes one chosen run
fail for real, and a view of the run records by (strategy, nodes)."""

import os
import sys

from conftest import load_runs

# The trainer itself, with one change: when WHEN holds (evaluated on the run), its second
# training step does ACTION instead (after one step's collectives, as a real failure would). The
# failure then goes through the trainer's real paths under whatever launcher started it. ENTRY is
# what the process runs: the trainer (TRAINER), or another program that trains (vit-scale check).
INJECT = """
import signal, subprocess, sys, time

from vit_scale.recipes import train

real_train = train.Run.train


def second_step_goes_wrong(self):
    if {when}:
        real_setup = self.strategy.setup

        def setup(factory):
            real_setup(factory)
            real_step, steps = self.strategy.train_step, []

            def step(images, labels):
                steps.append(1)
                if len(steps) == 2:
                    {action}
                return real_step(images, labels)

            self.strategy.train_step = step

        self.strategy.setup = setup
    return real_train(self)


train.Run.train = second_step_goes_wrong
{entry}
"""
TRAINER = "sys.exit(train.main(sys.argv[1:]))"

# VIT_SCALE_PYTHON for a job script: the real python, except for the trainer's runs that CONDITION
# (bash) picks, which run the trainer with the injected change
WRAPPER = """#!/bin/bash
if [ "${{1:-}} ${{2:-}} ${{3:-}}" = "-m vit_scale train" ] && {condition}; then
  shift 3
  exec {python} {inject} "$@"
fi
exec {python} "$@"
"""


def python_injecting(
    tmp_dir, name: str, when: str, action: str, condition: str = "true", python: str = sys.executable
) -> str:
    inject = os.path.join(str(tmp_dir), f"inject_{name}.py")
    with open(inject, "w") as f:
        f.write(INJECT.format(when=when, action=action, entry=TRAINER))
    wrapper = os.path.join(str(tmp_dir), f"python-{name}")
    with open(wrapper, "w") as f:
        f.write(WRAPPER.format(condition=condition, python=python, inject=inject))
    os.chmod(wrapper, 0o755)
    return wrapper


# env/*.sh activate this venv (the one running the tests), or none outside a venv
TEST_VENV = sys.prefix if sys.prefix != sys.base_prefix else ""


def small_venv(tmp_dir) -> str:
    """A venv of a few files that sees the tests' packages (torch and the rest) through a .pth file: what a
    job copies to node-local storage in seconds (jobs/lib/node_local_env.sh), its python's sys.prefix the
    copy's own while torch still comes from the tests' venv."""
    import site
    import subprocess

    venv = os.path.join(str(tmp_dir), "small-venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    (site_packages,) = [p for p in os.listdir(os.path.join(venv, "lib")) if p.startswith("python")]
    with open(os.path.join(venv, "lib", site_packages, "site-packages", "tests_venv.pth"), "w") as f:
        f.write("".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages()))
    return venv


def job_env(**extra) -> dict:
    """This process's environment for a job script: no Slurm job of its own, and the tests'
    python for the trainer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(VIT_SCALE_PYTHON=sys.executable, VIT_SCALE_VENV=TEST_VENV)
    env.update(extra)
    return env


def python_failing(tmp_dir, strategy: str, python: str = sys.executable) -> str:
    """A VIT_SCALE_PYTHON under which STRATEGY on 2 nodes (srun: SLURM_STEP_NUM_NODES;
    processes/torchrun: GROUP_WORLD_SIZE) runs out of memory on rank 1; every other run is PYTHON's
    (`python`: the one first on the PATH the job sets up)."""
    return python_injecting(
        tmp_dir,
        "failing",
        "self.world.rank == 1",
        'raise MemoryError("injected by the test: rank 1 is out of memory")',
        f'[[ " $* " == *" strategy={strategy} "* ]] && [ "${{SLURM_STEP_NUM_NODES:-${{GROUP_WORLD_SIZE:-1}}}}" = 2 ]',
        python,
    )


def python_hanging(tmp_dir, marker: str) -> str:
    """A VIT_SCALE_PYTHON under which a DDP run wedges in its second step: it starts a child
    (`sleep MARKER`), ignores SIGTERM and blocks."""
    return python_injecting(
        tmp_dir,
        "hanging",
        'self.cfg.strategy == "DDP"',
        f'subprocess.Popen(["sleep", "{marker}"]); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)',
    )


def runs_by_strategy_and_nodes(study_dir) -> dict:
    """{(strategy, nodes): [(start, end or None), ...]} for every run record of a study, each
    record validated against the schema."""
    found = {}
    for records in load_runs(study_dir).values():
        start = records[0]
        end = records[-1] if records[-1]["event"] == "end" else None
        key = (start["strategy"]["label"], start["world"]["nodes"])
        found.setdefault(key, []).append((start, end))
    return found
