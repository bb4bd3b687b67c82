"""A study file and the command line's options -> the runs of the study, each checked against
the trainer's own tables of models and strategies before anything starts."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import typing
from dataclasses import dataclass, field

from vit_scale.cluster import emulation
from vit_scale.cluster.files import load_yaml
from vit_scale.cluster.values import FALSE, TRUE, as_list, normalise_bool, whole
from vit_scale.errors import UserError
from vit_scale.run.peaks import math_precision


def _family_keys() -> tuple[dict, dict, tuple]:
    """The options each family offers `vit-scale plan` as flags (Family.plan_flags) are study keys and
    grid axes too, named after the flag (--fsdp-version: fsdp_version, trainer key fsdp.version); their
    choices, or true/false, from the family's options dataclass. A family added in one folder brings
    its own."""
    from vit_scale.distributed import FAMILIES

    keys, choices, booleans = {}, {}, []
    for name, family in FAMILIES.items():
        hints = typing.get_type_hints(family.options) if family.options else {}
        for option, flag, _ in family.plan_flags:
            key = flag.removeprefix("--").replace("-", "_")
            keys[key] = (flag, f"{name}.{option}")
            if hints.get(option) is bool:
                booleans.append(key)
            elif typing.get_origin(hints.get(option)) is typing.Literal:
                choices[key] = tuple(str(c) for c in typing.get_args(hints[option]))
    return keys, choices, tuple(booleans)


FAMILY_KEYS, FAMILY_CHOICES, FAMILY_BOOLEANS = _family_keys()

# study key -> (command-line option, trainer key or None)
STUDY_KEYS = {
    "study": ("--study", None),
    "models": ("--models", "model"),
    "strategies": ("--strategies", "strategy"),
    "nodes": ("--nodes", None),
    "gpu_counts": ("--gpu-counts", None),
    "ranks_per_node": ("--ranks-per-node", None),
    "batch_size": ("--batch-size", "train.batch_size"),
    "steps": ("--steps", "train.steps"),
    "warmup_steps": ("--warmup-steps", "train.warmup_steps"),
    "repeat": ("--repeat", None),
    "precision": ("--precision", "train.precision"),
    "activation_checkpointing": ("--activation-checkpointing", "train.activation_checkpointing"),
    **FAMILY_KEYS,
    "skip_if_not_fits": ("--skip-if-not-fits", "plan.skip_if_not_fits"),
    "launcher": ("--launcher", None),
    "predict": ("--predict", None),  # vit_scale/study/forecast.py: the predicted curves before the runs
    "set": ("--set", None),
    "settings": (None, None),
    "description": (None, None),
}
# the names a study file may also use for a key (the plugin comparison's file says model, batch_sizes)
ALIASES = {"model": "models", "batch_sizes": "batch_size"}
# several values make a grid: each combination is one more run (Figure 1 of seed 003; batch size
# is the axis of the plugin comparison)
GRID_KEYS = (
    "batch_size",
    "precision",
    "activation_checkpointing",
    *FAMILY_KEYS,
)
CHOICES = {
    "precision": ("fp32", "bf16", "fp16"),
    **FAMILY_CHOICES,
}
BOOLEAN_KEYS = (
    "activation_checkpointing",
    *FAMILY_BOOLEANS,
    "skip_if_not_fits",
)
LAUNCHERS = ("srun", "torchrun", "mpi")
DEFAULTS = {"batch_size": 32, "steps": 30, "warmup_steps": 5, "nodes": "ladder", "gpu_counts": "ladder"}


@dataclass
class PlannedRun:
    model: str
    strategy: str
    nodes: int
    ranks_per_node: int
    variant: str  # the modifiers that vary within the study, "-" when none do
    settings: list  # trainer KEY=VALUE that make this measurement what it is
    system_settings: list  # trainer KEY=VALUE about the system (peak TFLOP/s), not part of identity
    repetition: int = 1  # which of the study's --repeat runs of this point (1, 2 ...)

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass
class Study:
    name: str
    models: list
    strategies: list
    nodes: list  # node counts; with one machine and no Slurm, [1]
    rank_counts: list  # GPU counts on one machine without Slurm (the ladder), else []
    launcher: str
    common: list  # trainer KEY=VALUE for every run
    grid: str  # the modifiers with several values, for the header
    ranks_per_node: int  # on one machine without Slurm: the GPUs found
    runs: list = field(default_factory=list)
    repeat: int = 1  # runs of each point (--repeat), in rounds: see interleave(); with auto, the most rounds
    adaptive: bool = False  # --repeat auto[:N]: 2 rounds, then one more where the comparison is still open
    points: list = field(default_factory=list)  # each point once (round 1): what a further round repeats
    predict: bool = False  # `predict: true`: the predicted curves before the first run (study/forecast.py)
    # the system profile's emulated nodes with --set emulation.* applied (None: the profile has none), and
    # those --set items, which the study's --check passes on
    emulation: object = None
    emulation_sets: list = field(default_factory=list)


def ladder(largest: int) -> list[int]:
    """1, 2, 4 ... up to `largest`, and `largest` itself when it is not a power of two."""
    rungs, n = [], 1
    while n < largest:
        rungs.append(n)
        n *= 2
    rungs.append(largest)
    return rungs


def merge(study_file: str, cli: dict, sets: list) -> tuple[dict, dict]:
    """Study file, then the command line. Returns (settings, where each came from)."""
    data = load_yaml(study_file) if study_file else {}
    values, origin = dict(DEFAULTS), {}
    values["study"] = os.path.splitext(os.path.basename(study_file))[0] if study_file else "study"
    for key, value in data.items():
        key = ALIASES.get(key, key)
        if key not in STUDY_KEYS:
            raise UserError(f"{study_file}: unknown key '{key}'; allowed: {', '.join(STUDY_KEYS)}")
        values[key], origin[key] = value, f"'{key}' in {study_file}"
    extra = dict(values.get("set") or {})
    for item in sets:
        name, eq, val = item.partition("=")
        if not eq or not name:
            raise UserError(
                f"--set: expected KEY=VALUE (a trainer key such as fsdp.use_orig_params=true, or an emulated "
                f"node's such as emulation.nodes.local3.cpus_per_node=0.125), got '{item}'"
            )
        extra[name] = val
    values["set"] = extra
    for key, value in cli.items():
        values[key], origin[key] = value, STUDY_KEYS[key][0]
    return values, origin


class _Options:
    """The merged settings and where each came from, for the one-line errors that name the option."""

    def __init__(self, study_file: str, cli: dict, sets: list):
        self.study_file, self.cli = study_file, cli
        self.values, self.origin = merge(study_file, cli, sets)

    def where(self, key: str) -> str:
        return self.origin.get(key, STUDY_KEYS[key][0])

    def whole_number(self, key: str, minimum: int, value=None) -> int:
        return whole(self.where(key), self.values[key] if value is None else value, minimum)


def _study_name(o: _Options) -> str:
    name = str(o.values.get("study") or "")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise UserError(f"{o.where('study')}: '{name}' is not allowed; allowed: letters, digits, '.', '_' and '-'")
    return name


def _models(o: _Options) -> list:
    from vit_scale.models import MODELS

    models = as_list(o.values.get("models"))
    if not models:
        raise UserError(f"{o.where('models')}: no model given; allowed: {', '.join(MODELS)}")
    for model in models:
        if model not in MODELS:
            raise UserError(f"{o.where('models')}: unknown model '{model}'; allowed: {', '.join(MODELS)}")
    return models


def _strategies(o: _Options, system, per_node: int) -> list:
    """The labels, each parsed; a hybrid group must divide a node's ranks (per_node 0: not known)."""
    from vit_scale.distributed import parse_strategy

    strategies = as_list(o.values.get("strategies"))
    if not strategies:
        raise UserError(f"{o.where('strategies')}: no strategy given")
    for label in strategies:
        try:
            g = parse_strategy(label).hybrid_group
        except UserError as exc:
            raise UserError(f"{o.where('strategies')}: {str(exc).split(': ', 1)[1]}") from None
        if g and per_node and per_node % g:
            fitting = [str(d) for d in range(1, per_node + 1) if per_node % d == 0]
            raise UserError(
                f"{o.where('strategies')}: {label} shards over groups of {g} ranks within a node, but "
                f"system {system.name} runs {per_node} ranks per node; allowed: "
                f"HYBRID_<g>GPU with g in {', '.join(fitting)}"
            )
    return strategies


def _gpu_counts(o: _Options, system, ranks_per_node: int) -> list:
    """One GPU machine without Slurm: the ladder is over its GPUs, on one node."""
    cli = o.cli
    if "nodes" in cli and as_list(cli["nodes"]) != ["1"]:
        raise UserError(
            f"--nodes: '{cli['nodes']}' is not allowed without Slurm on {system.name}; allowed: 1 "
            f"(this machine; --gpu-counts gives the GPU counts)"
        )
    rank_counts = counts(o.values["gpu_counts"], o.where("gpu_counts"), ranks_per_node, "GPU")
    if rank_counts[-1] > ranks_per_node:
        raise UserError(
            f"{o.where('gpu_counts')}: {rank_counts[-1]} GPUs is more than this machine's "
            f"{ranks_per_node}; allowed: 1 to {ranks_per_node}"
        )
    return rank_counts


def _node_counts(o: _Options, alloc_nodes: int) -> list:
    if str(o.values["nodes"]).strip() == "ladder" and not alloc_nodes:
        raise UserError(
            f"{o.where('nodes')}: 'ladder' needs the largest node count, which only an allocation "
            f"gives; allowed outside one: a list such as 1,2,4 (--nodes), or --max-nodes N with "
            f"submit_sweep.sh"
        )
    nodes = counts(o.values["nodes"], o.where("nodes"), alloc_nodes, "node")
    if alloc_nodes and nodes[-1] > alloc_nodes:
        raise UserError(
            f"{o.where('nodes')}: {nodes[-1]} nodes is more than this allocation's {alloc_nodes}; "
            f"allowed: 1 to {alloc_nodes} (or submit with sbatch -N {nodes[-1]})"
        )
    return nodes


def _steps(o: _Options) -> tuple[int, int]:
    steps = o.whole_number("steps", 2)
    warmup = o.whole_number("warmup_steps", 0)
    if warmup >= steps and "steps" in o.cli and "warmup_steps" not in o.cli:
        # a short smoke test (--steps 4) over a study file's warm-up keeps most of its steps timed
        warmup = max(1, steps // 4)
    if warmup >= steps:
        raise UserError(
            f"{o.where('warmup_steps')}: {warmup} is not allowed; allowed: fewer than the {steps} steps, "
            f"so that some steps are timed"
        )
    return steps, warmup


def _predict(o: _Options) -> bool:
    predict = as_list(o.values.get("predict"))
    if len(predict) > 1 or (predict and predict[0].lower() not in TRUE + FALSE):
        raise UserError(f"{o.where('predict')}: '{','.join(predict)}' is not allowed; allowed: true, false")
    return bool(predict) and predict[0].lower() in TRUE


def _launcher(o: _Options, system) -> str:
    launcher = str(o.values.get("launcher") or system.launcher or "srun")
    if launcher not in system.launchers:
        raise UserError(
            f"{o.where('launcher')}: '{launcher}' is not allowed on {system.name}; "
            f"allowed: {', '.join(system.launchers)}"
        )
    return launcher


def _precision_table(o: _Options) -> dict:
    """precision may also be a table: strategy -> precision, with `default` for the rest (the plugin
    comparison runs each plugin at the precision the seeds used). Taken out of the grid's values."""
    if not isinstance(o.values.get("precision"), dict):
        return {}
    precision_of = {str(k): str(v) for k, v in o.values.pop("precision").items()}
    for key, value in precision_of.items():
        if value not in CHOICES["precision"]:
            raise UserError(
                f"{o.where('precision')}: {value!r} for {key} is not allowed; "
                f"allowed: {', '.join(CHOICES['precision'])}"
            )
    return precision_of


def _per_strategy(o: _Options) -> dict:
    per_strategy = o.values.get("settings") or {}
    if not isinstance(per_strategy, dict) or not all(
        isinstance(v, list) and all("=" in str(x) for x in v) for v in per_strategy.values() if v is not None
    ):
        raise UserError(f"{o.study_file}: settings must map a strategy to a list of key=value")
    return per_strategy


def _grid(o: _Options) -> list[tuple[str, list[str]]]:
    """The grid keys given (batch size, precision and the FSDP modifiers), each with its values."""
    grid: list[tuple[str, list[str]]] = []
    for key in GRID_KEYS:
        if key not in o.values:
            continue
        items = as_list(o.values[key])
        option = o.where(key)
        if not items:
            raise UserError(f"{option}: no value given")
        for value in items:
            if key == "batch_size":
                o.whole_number(key, 1, value)
            elif key in BOOLEAN_KEYS:
                if value not in TRUE + FALSE:
                    raise UserError(f"{option}: '{value}' is not allowed; allowed: true, false")
            elif key in CHOICES:
                if value not in CHOICES[key]:
                    raise UserError(f"{option}: '{value}' is not allowed; allowed: {', '.join(CHOICES[key])}")
            else:
                _trainer_value(o, key, value)
        items = [normalise_bool(v) if key in BOOLEAN_KEYS else v for v in items]
        grid.append((key, list(dict.fromkeys(items))))
    return grid


def _trainer_value(o: _Options, key: str, value) -> None:
    """A family option with neither choices nor true/false (a number): the trainer's own rule for its
    key decides, before any run starts."""
    from vit_scale.config import load_config

    try:
        load_config(None, [f"{STUDY_KEYS[key][1]}={value}"])
    except UserError as exc:
        raise UserError(f"{o.where(key)}: {str(exc).split(': ', 1)[-1]}") from None


def _emulation(o: _Options, system, nodes: list, alloc_nodes: int) -> tuple:
    """(the profile's emulation spec with --set emulation.* applied, those items as KEY=VALUE): routed to
    the emulated nodes, never to the trainer; an override naming a node the study does not run on is
    refused here, before anything is written or started."""
    settings = o.values.get("set") or {}
    pairs = [(k, v) for k, v in settings.items() if emulation.is_set_key(k)]
    for key, _ in pairs:
        del settings[key]
    spec = emulation.with_sets(system.emulation, pairs, "--set", system.name)
    # inside an allocation the nodes are real ones (and not emulated): local<i> names none of them
    if spec is not None and nodes and not alloc_nodes:
        spec.check_hosts(max(nodes))
    return spec, [f"{k}={normalise_bool(v) if isinstance(v, bool) else v}" for k, v in pairs]


def _common_settings(o: _Options, steps: int, warmup: int, system) -> list:
    """The trainer settings every run gets: steps, the fit verdict, and --set's keys."""
    common = [f"train.steps={steps}", f"train.warmup_steps={warmup}"]
    if "skip_if_not_fits" in o.values:
        common.append(f"plan.skip_if_not_fits={normalise_bool(as_list(o.values['skip_if_not_fits'])[0])}")
        if system.device_memory_gib:
            common.append(f"plan.device_memory_gib={system.device_memory_gib}")
    for key, value in (o.values.get("set") or {}).items():
        value = normalise_bool(value) if isinstance(value, bool) else str(value)
        if not re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", str(key)) or re.search(r"\s", value):
            raise UserError(
                f"--set: '{key}={value}' is not allowed; allowed: a dotted trainer key and a value "
                f"without spaces, e.g. fsdp.use_orig_params=true"
            )
        if key.split(".")[0] == "output":
            raise UserError(f"--set: {key} is chosen by the study; use --out and --study instead")
        common.append(f"{key}={value}")
    return common


def _runs(study: Study, grid: list, precision_of: dict, per_strategy: dict, shapes: list, system) -> list:
    """Every point of models x strategies x grid x shapes, in that order, one PlannedRun each."""
    varying = {key for key, items in grid if len(items) > 1}
    runs = []
    for model in study.models:
        for label in study.strategies:
            for combo in itertools.product(*[items for _, items in grid]):
                variant = dict(zip([key for key, _ in grid], combo, strict=True))  # batch_size always among them
                if precision_of and "precision" not in variant:
                    variant["precision"] = precision_of.get(label, precision_of.get("default", "fp32"))
                settings = [f"model={model}", f"strategy={label}"]
                settings += [f"{STUDY_KEYS[k][1]}={v}" for k, v in variant.items()]
                settings += study.common + [str(x) for x in per_strategy.get(label) or []]
                peak = system.peak_for(run_arithmetic(variant.get("precision", "fp32"), settings, system))
                system_settings = [f"system.peak_tflops={peak}"] if peak is not None else []
                shown = ",".join(f"{k}={v}" for k, v in variant.items() if k in varying) or "-"
                for n, per_node in shapes:
                    runs.append(
                        PlannedRun(
                            model,
                            label,
                            n,
                            per_node,
                            shown,
                            settings + [f"system.ranks_per_node={per_node}"],
                            system_settings,
                        )
                    )
    return runs


def make_plan(
    study_file: str,
    cli: dict,
    sets: list,
    system,
    ranks_per_node: int,
    alloc_nodes: int,
    one_machine: bool = False,
    analysis_only: bool = False,
) -> Study:
    """The study's runs from its file and the command line, every option checked first (one line
    naming the option on a bad one). `one_machine`: a GPU machine without Slurm, where the ladder is
    over GPUs (`ranks_per_node` is then the number of GPUs found). `alloc_nodes`: the allocation's
    size, 0 = not in one."""
    o = _Options(study_file, cli, sets)
    name, models = _study_name(o), _models(o)
    if "ranks_per_node" in o.values:
        ranks_per_node = o.whole_number("ranks_per_node", 1)
    strategies = _strategies(o, system, 0 if one_machine else ranks_per_node)
    rank_counts: list[int] = []
    if analysis_only:
        nodes = []
    elif one_machine:
        nodes, rank_counts = [1], _gpu_counts(o, system, ranks_per_node)
    else:
        nodes = _node_counts(o, alloc_nodes)
    steps, warmup = _steps(o)
    repeat, adaptive = repeat_option(o.where("repeat"), o.values.get("repeat", 1))
    predict = _predict(o)
    launcher = _launcher(o, system)
    precision_of = _precision_table(o)
    per_strategy = _per_strategy(o)
    grid = _grid(o)
    spec, emulation_sets = _emulation(o, system, [] if one_machine else nodes, alloc_nodes)
    common = _common_settings(o, steps, warmup, system)

    varied = " ".join(f"{k}={','.join(v)}" for k, v in grid if len(v) > 1)
    study = Study(name, models, strategies, nodes, rank_counts, launcher, common, varied, ranks_per_node)
    shapes = [(1, g) for g in rank_counts] if one_machine else [(n, ranks_per_node) for n in nodes]
    study.runs = _runs(study, grid, precision_of, per_strategy, shapes, system)
    if not one_machine and launcher in ("srun", "mpi"):
        refuse_qgz_under_one_gpu_per_task(study.runs, system, o.where("strategies"))
    study.repeat, study.adaptive = repeat, adaptive
    study.predict = predict
    study.emulation, study.emulation_sets = spec, emulation_sets
    study.points = study.runs
    study.runs = interleave(study.runs, FIRST_ROUNDS if adaptive else repeat)
    return study


# --repeat auto: every point runs FIRST_ROUNDS times before the first look; at most AUTO_MAX rounds by
# default. The maxima allowed are those analysis/sequential.py has a last-look level for (its MAXIMA).
FIRST_ROUNDS = 2
AUTO_MAX = 7
AUTO_MAXIMA = range(3, 9)


def repeat_option(where: str, value) -> tuple[int, bool]:
    """(rounds, adaptive) from --repeat: N (a fixed number of rounds), auto (at most AUTO_MAX) or auto:N."""
    text = str(value).strip()
    if text == "auto" or text.startswith("auto:"):
        most = text[len("auto:") :] if text != "auto" else str(AUTO_MAX)
        if not most.isdigit() or int(most) not in AUTO_MAXIMA:
            raise UserError(
                f"{where}: '{text}' is not allowed; allowed: auto (at most {AUTO_MAX} rounds) or auto:N, N from "
                f"{AUTO_MAXIMA.start} to {AUTO_MAXIMA.stop - 1} (the most rounds), or a whole number of at least 1"
            )
        return int(most), True
    if not text.isdigit() or int(text) < 1:
        raise UserError(
            f"{where}: '{text}' is not allowed; allowed: a whole number of at least 1, auto or auto:N "
            f"(N from {AUTO_MAXIMA.start} to {AUTO_MAXIMA.stop - 1})"
        )
    return int(text), False


def interleave(points: list, repeat: int) -> list:
    """The runs of `repeat` repetitions of each point, in rounds: every point once, in the plan's
    order (model, strategy, grid, node or GPU count), before any point a second time. A slow
    period of the machine (a noisy neighbour, a throttled node) then falls on one round of every
    strategy rather than on every repetition of one; the spread between rounds is what the analysis
    measures as run-to-run variation."""
    return [dataclasses.replace(run, repetition=r) for r in range(1, repeat + 1) for run in points]


def gpus_per_task(srun_flags: str) -> int | None:
    """The GPUs each task sees under these srun flags (--gpus-per-task=N), None when they do not say."""
    words = srun_flags.split()
    for i, word in enumerate(words):
        value = (
            word.partition("=")[2]
            if word.startswith("--gpus-per-task=")
            else (words[i + 1] if word == "--gpus-per-task" and i + 1 < len(words) else None)
        )
        if value is not None:
            return int(value) if value.isdigit() else None
    return None


def refuse_qgz_under_one_gpu_per_task(runs: list, system, option: str) -> None:
    """ZeRO++'s qgZ under srun flags that show each rank fewer GPUs than its node runs ranks: the
    trainer refuses it on the compute node (distributed.deepspeed.qgz_refusal), after a launch and
    the queue; the profile's flags say it now."""
    from vit_scale.distributed.deepspeed import QGZ_OPTION, QGZ_WRONG_RANKS, DeepSpeedConfig, qgz_refusal

    visible = gpus_per_task(system.srun_flags)
    if visible is None:
        return
    for run in runs:
        if run.strategy != "ZEROPP":
            continue
        qgz = DeepSpeedConfig().quantized_gradients  # the last setting wins, as in the trainer
        for setting in run.settings:
            key, _, value = str(setting).partition("=")
            if key == QGZ_OPTION:
                qgz = value.lower() in TRUE
        if qgz_refusal(qgz, visible, run.ranks_per_node, run.nodes):
            raise UserError(
                f"{option}: ZEROPP with {QGZ_OPTION}=true (qgZ) cannot run on {system.name}, whose srun_flags "
                f"give each rank {visible} GPU (--gpus-per-task={visible}) while {run.ranks_per_node} ranks share "
                f"a node, so {QGZ_WRONG_RANKS}; allowed: --set {QGZ_OPTION}=false (qwZ and hpZ stay)"
            )


def run_arithmetic(precision: str, settings: list, system) -> str:
    """The precision whose peak the system profile gives this run for MFU, by the trainer's own
    rule, read from the run's settings (the last train.tf32 among them wins, as in the trainer)."""
    tf32 = False
    for setting in settings:
        key, _, value = str(setting).partition("=")
        if key == "train.tf32":
            tf32 = value.lower() in TRUE
    return math_precision(precision, tf32, "cpu" if system.backend == "gloo" else "gpu")


def counts(value, option: str, largest: int, unit: str) -> list[int]:
    """`ladder` (1, 2, 4 ... largest) or a list of whole numbers, sorted."""
    if str(value).strip() == "ladder":
        return ladder(largest)
    found = []
    for item in as_list(value):
        if not re.fullmatch(r"\d+", item) or int(item) < 1:
            raise UserError(f"{option}: '{item}' is not allowed; allowed: {unit} counts such as 1,2,4 or 'ladder'")
        found.append(int(item))
    if not found:
        raise UserError(f"{option}: no {unit} count given; allowed: {unit} counts such as 1,2,4 or 'ladder'")
    return sorted(set(found))
