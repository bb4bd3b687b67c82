"""Helpers for the tests of jobs/: a stand-in for the trainer's python that makes one chosen run
fail for real, and a view of the run records by (strategy, nodes)."""
import os
import sys

from conftest import load_runs

# The trainer itself, with one change: rank 1 runs out of memory in its second training step
# (after one step's collectives, as a real OOM would). The failure then goes through the
# trainer's real paths (rank 1's error file, rank 0's end record with status oom, every rank's
# exit code 3) under whatever launcher the job script used.
INJECT_OOM = '''
import sys

from vit_scale.recipes import train

real_train = train.Run.train


def train_out_of_memory(self):
    if self.world.rank == 1:
        real_setup = self.strategy.setup

        def setup(factory):
            real_setup(factory)
            real_step, steps = self.strategy.train_step, []

            def step(images, labels):
                steps.append(1)
                if len(steps) == 2:
                    raise MemoryError("injected by the test: rank 1 is out of memory")
                return real_step(images, labels)

            self.strategy.train_step = step

        self.strategy.setup = setup
    return real_train(self)


train.Run.train = train_out_of_memory
sys.exit(train.main(sys.argv[1:]))
'''

# VIT_SCALE_PYTHON for the job script: the real python, except for trainer runs of STRATEGY on
# 2 nodes (srun: SLURM_STEP_NUM_NODES; processes/torchrun: GROUP_WORLD_SIZE)
WRAPPER = '''#!/bin/bash
if [ "${{1:-}} ${{2:-}} ${{3:-}}" = "-m vit_scale train" ] && [[ " $* " == *" strategy={strategy} "* ]] &&
   [ "${{SLURM_STEP_NUM_NODES:-${{GROUP_WORLD_SIZE:-1}}}}" = 2 ]; then
  shift 3
  exec {python} {inject} "$@"
fi
exec {python} "$@"
'''


# env/*.sh activate this venv (the one running the tests), or none outside a venv
TEST_VENV = sys.prefix if sys.prefix != sys.base_prefix else ""


def job_env(**extra) -> dict:
    """This process's environment for a job script: no Slurm job of its own, and the tests'
    python for the trainer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(VIT_SCALE_PYTHON=sys.executable, VIT_SCALE_VENV=TEST_VENV)
    env.update(extra)
    return env


def python_failing(tmp_dir, strategy: str) -> str:
    """Path of a VIT_SCALE_PYTHON under which STRATEGY on 2 nodes runs out of memory."""
    inject = os.path.join(str(tmp_dir), "inject_oom.py")
    with open(inject, "w") as f:
        f.write(INJECT_OOM)
    wrapper = os.path.join(str(tmp_dir), "python-failing")
    with open(wrapper, "w") as f:
        f.write(WRAPPER.format(strategy=strategy, python=sys.executable, inject=inject))
    os.chmod(wrapper, 0o755)
    return wrapper


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
