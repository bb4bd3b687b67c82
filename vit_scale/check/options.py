"""`vit-scale check`'s options: parsed, checked, and turned into the request the launches run.

`parse(argv)` sorts the command line into flags and values; `Request(opts)` checks each value
against the system profile, the allocation and the study file's defaults (one-line UserError, exit
code 2, before anything is written) and keeps what the check then runs: system, nodes, ranks per
node, labels, precisions, model, launcher, time limit, where check.json goes. No torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

from vit_scale.cluster import emulation, launchers, systems
from vit_scale.cluster.files import load_yaml
from vit_scale.cluster.options import option_pairs
from vit_scale.cluster.systems import study_file
from vit_scale.cluster.values import as_list, minutes, whole
from vit_scale.errors import UserError

PROG = "vit-scale check"  # the name messages and check.json's "tool" give, unless --prog names another
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
    "--only",
)
DEFAULT_BATCH = 32  # per device, for the timed GEMMs, when neither --batch-size nor the study file gives one
DEFAULT_LIMIT_MIN = 30.0  # --time-limit without an allocation, and at most this within one
PARTS = ("meter", "compute", "environment", "nodes", "interconnect", "strategies")  # what a check does, in order

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
  --only PARTS            run only these parts of {parts}
                          (e.g. --only nodes: every node's compute and link, the slow ones named)
  --time-limit MIN        stop the check after this many minutes, every launch together (default: 30;
                          in a Slurm job at most the job's time left less a margin, so that check.json
                          is written before Slurm ends the job)
  --set KEY=VALUE         the emulated nodes without Slurm (repeatable; docs/jobs.md): emulation.inter_node_gbps,
                          emulation.cpus_per_node, emulation.nodes.local<i>.inter_node_gbps or .cpus_per_node
                          (one slow node, e.g. --set emulation.nodes.local3.cpus_per_node=0.125)
  -h, --help              this text
Exit code: 0 every needed line holds, 1 something is broken, 2 bad input, 143 stopped by a signal
(check.json written all the same, what was not finished as timeout lines)."""


def usage() -> str:
    return USAGE.format(systems=" ".join(systems.known_systems()), parts=" ".join(PARTS))


class Options:
    def __init__(self):
        self.flags: set = set()
        self.values: dict = {}
        self.sets: list = []  # --set KEY=VALUE, in order (the emulated nodes' keys)
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
        elif opt == "--set":
            opts.sets.append(value)
        else:
            raise UserError(f"unknown option '{opt}'; allowed: {' '.join(OPTIONS + FLAGS[:1])} --set --help")
    return opts


class Request:
    """What is asked and where it runs, every option checked. `prog`: the name its messages start
    with (the job script's, or `vit-scale study --check`)."""

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
        self.system = dataclasses.replace(self.system, emulation=self._emulation(opts.sets))
        self.ranks_per_node = self._ranks_per_node(v.get("--ranks-per-node"), "--which-env" in opts.flags)
        study = self._study_defaults()
        self.precisions = self._precisions(v.get("--precision"), study)
        self.model = self._model(v.get("--model"), study)
        self.batch_size = self._batch_size(v.get("--batch-size"), study)
        self.parts = self._parts(v.get("--only"))
        self.labels = self._labels(v.get("--strategies")) if "strategies" in self.parts else []
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
        self.kind = launchers.launch_kind(
            self.launcher, self.use_slurm, self.one_machine, self.nodes * self.ranks_per_node
        )

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

    def _emulation(self, sets: list):
        """The profile's emulated nodes with --set emulation.* applied; an override naming a node the check
        does not run on is refused here, before anything is written or started."""
        pairs = []
        for item in sets:
            key, eq, value = item.partition("=")
            if not eq or not emulation.is_set_key(key):
                raise UserError(
                    f"--set: '{item}' is not allowed; allowed: KEY=VALUE with KEY one of "
                    f"{', '.join(emulation.SET_KEYS)} (the check takes no trainer keys)"
                )
            pairs.append((key, value))
        spec = emulation.with_sets(self.system.emulation, pairs, "--set", self.system.name)
        if spec is not None and not self.in_slurm:  # in an allocation the nodes are real, none is local<i>
            spec.check_hosts(self.nodes)
        return spec

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

    def _parts(self, given) -> list:
        """The parts to run, in the check's order (--only; default every part)."""
        if given is None:
            return list(PARTS)
        asked = as_list(given)
        for part in asked:
            if part not in PARTS:
                raise UserError(f"--only: '{part}' is not a part of the check; allowed: {', '.join(PARTS)}")
        if not asked:
            raise UserError(f"--only: no part given; allowed: {', '.join(PARTS)}")
        return [p for p in PARTS if p in asked]

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


def limit_within(left_min: float) -> tuple[float, float]:
    """(the check's limit, the margin) for an allocation with `left_min` minutes left: a tenth of it,
    at least 1 and at most 5 minutes, for stopping the ranks (STOP_GRACE_S) and writing check.json;
    never less than half of what is left."""
    margin = min(5.0, max(1.0, left_min / 10))
    return max(0.1, math.floor(max(left_min - margin, left_min / 2) * 10) / 10), margin
