#!/usr/bin/env python3
"""The parts of jobs/weak_scaling.sh that are easier in Python than in bash: reading the YAML of
configs/, checking a study against the trainer's own tables of models and strategies, listing
the runs, and reading run records. It imports neither torch nor the trainer's heavy modules, so
it runs on a login node.

    study.py system  SYSTEM_YAML                      -> shell assignments SYS_*
    study.py plan    --study-file F --system-file S [--ranks-per-node R] [--alloc-nodes N]
                     [--cli KEY=VALUE ...]            -> shell assignments + RUNS=(...)
    study.py find-ok DIR KEY=VALUE...                 -> the ok run under DIR with these settings
    study.py record  RUN_DIR                          -> "status images_per_s error"
    study.py summary RUNS_TSV                         -> the table printed at the end of a study

Errors in user input are printed as one line ("--option: what is wrong; allowed: ...") and
exit with code 2, the trainer's code for bad input.
"""
from __future__ import annotations

import argparse
import csv
import glob
import itertools
import os
import re
import shlex
import sys

HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# study key -> (command-line option, trainer key or None). Order is the order of the grid.
STUDY_KEYS = {
    "study": ("--study", None),
    "models": ("--models", "model"),
    "strategies": ("--strategies", "strategy"),
    "nodes": ("--nodes", None),
    "batch_size": ("--batch-size", "train.batch_size"),
    "steps": ("--steps", "train.steps"),
    "warmup_steps": ("--warmup-steps", "train.warmup_steps"),
    "precision": ("--precision", "train.precision"),
    "activation_checkpointing": ("--activation-checkpointing", "train.activation_checkpointing"),
    "fsdp_version": ("--fsdp-version", "fsdp.version"),
    "backward_prefetch": ("--backward-prefetch", "fsdp.backward_prefetch"),
    "limit_all_gathers": ("--limit-all-gathers", "fsdp.limit_all_gathers"),
    "forward_prefetch": ("--forward-prefetch", "fsdp.forward_prefetch"),
    "use_orig_params": ("--use-orig-params", "fsdp.use_orig_params"),
    "skip_if_not_fits": ("--skip-if-not-fits", "plan.skip_if_not_fits"),
    "launcher": ("--launcher", None),
    "set": ("--set", None),
    "description": (None, None),
}
# modifiers that may hold several values: each combination is one more run (a grid, Figure 1)
GRID_KEYS = ("precision", "activation_checkpointing", "fsdp_version", "backward_prefetch",
             "limit_all_gathers", "forward_prefetch", "use_orig_params")
MODIFIER_CHOICES = {
    "precision": ("fp32", "bf16", "fp16"),
    "fsdp_version": ("1", "2"),
    "backward_prefetch": ("none", "pre", "post"),
}
BOOLEAN_KEYS = ("activation_checkpointing", "limit_all_gathers", "forward_prefetch", "use_orig_params",
                "skip_if_not_fits")
LAUNCHERS = ("srun", "torchrun", "mpi")
# what a study file may leave out: the trainer's own defaults, and the ladder of the allocation
DEFAULTS = {"batch_size": 32, "steps": 30, "warmup_steps": 5, "nodes": "ladder"}
SYSTEM_KEYS = ("name", "description", "env_script", "ranks_per_node", "backend", "launcher", "launchers",
               "srun_flags", "torchrun_srun_flags", "mpi_flags", "master_addr", "peak_tflops",
               "device_memory_gib", "needs_slurm", "default_study", "sbatch_flags")


class BadInput(Exception):
    pass


PROG = "study.py"


def fail(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(2)


def load_yaml(path: str) -> dict:
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as exc:
        raise BadInput(f"--config: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise BadInput(f"--config: {path} is not valid YAML"
                       f"{f' (line {mark.line + 1})' if mark else ''}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise BadInput(f"--config: {path} must hold a mapping of keys")
    return data


def as_list(value) -> list[str]:
    """YAML lists, comma-separated strings and scalars all become a list of strings."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, str):
        items = value.replace(",", " ").split()
    else:
        items = [value]
    return [str(v).lower() if isinstance(v, bool) else str(v) for v in items]


def shell_assign(name: str, value) -> str:
    if isinstance(value, (list, tuple)):
        return f"{name}=({' '.join(shlex.quote(str(v)) for v in value)})"
    if isinstance(value, bool):
        value = str(value).lower()
    return f"{name}={shlex.quote('' if value is None else str(value))}"


# ---------------------------------------------------------------- system profiles

def read_system(path: str) -> dict:
    data = load_yaml(path)
    unknown = sorted(set(data) - set(SYSTEM_KEYS))
    if unknown:
        raise BadInput(f"{path}: unknown key {unknown[0]}; allowed: {', '.join(SYSTEM_KEYS)}")
    return data


def cmd_system(args) -> None:
    data = read_system(args.file)
    for key in SYSTEM_KEYS:
        value = data.get(key)
        if key == "peak_tflops" and isinstance(value, dict):
            value = " ".join(f"{k}={v}" for k, v in value.items())  # per precision
        if key == "launchers":
            value = " ".join(as_list(value))
        print(shell_assign(f"SYS_{key.upper()}", value))


# ---------------------------------------------------------------- the plan of a study

def trainer_tables():
    """The trainer's own model table and strategy parser: one source of truth for the names."""
    sys.path.insert(0, HOME)
    from vit_scale.distributed import parse_strategy
    from vit_scale.errors import UserError
    from vit_scale.models import MODELS

    return list(MODELS), parse_strategy, UserError


def merge_settings(study: dict, study_file: str, cli: list[str]) -> tuple[dict, dict]:
    """Study file, then the command line. Returns (settings, where each came from)."""
    settings, origin = dict(DEFAULTS), {}
    # a study is named after its file unless it says otherwise
    settings["study"] = os.path.splitext(os.path.basename(study_file))[0]
    for key, value in study.items():
        if key not in STUDY_KEYS:
            allowed = ", ".join(k for k in STUDY_KEYS)
            raise BadInput(f"{study_file}: unknown key '{key}'; allowed: {allowed}")
        settings[key], origin[key] = value, f"'{key}' in {study_file}"
    extra = dict(settings.get("set") or {})
    for item in cli:
        key, _, value = item.partition("=")
        if key == "set":
            name, eq, val = value.partition("=")
            if not eq or not name:
                raise BadInput(f"--set: expected KEY=VALUE (a trainer key such as fsdp.use_orig_params=true), got '{value}'")
            extra[name] = val
            continue
        settings[key], origin[key] = value, STUDY_KEYS[key][0]
    settings["set"] = extra
    return settings, origin


def ladder(max_nodes: int) -> list[int]:
    """1, 2, 4 ... up to max_nodes, and max_nodes itself when it is not a power of two."""
    rungs, n = [], 1
    while n < max_nodes:
        rungs.append(n)
        n *= 2
    rungs.append(max_nodes)
    return rungs


def plan(args) -> dict:
    study = load_yaml(args.study_file) if args.study_file else {}
    settings, origin = merge_settings(study, args.study_file or "the study file", args.cli or [])
    system = read_system(args.system_file)
    models_known, parse_strategy, UserError = trainer_tables()

    def where(key):
        return origin.get(key, STUDY_KEYS[key][0])

    def whole_number(key, minimum):
        value = str(settings[key])
        if not re.fullmatch(r"\d+", value) or int(value) < minimum:
            raise BadInput(f"{where(key)}: '{value}' is not allowed; allowed: a whole number of at least {minimum}")
        return int(value)

    name = str(settings.get("study") or "")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise BadInput(f"{where('study')}: '{name}' is not allowed; allowed: letters, digits, '.', '_' and '-'")

    models = as_list(settings.get("models"))
    if not models:
        raise BadInput(f"{where('models')}: no model given; allowed: {', '.join(models_known)}")
    for model in models:
        if model not in models_known:
            raise BadInput(f"{where('models')}: unknown model '{model}'; allowed: {', '.join(models_known)}")

    ranks_per_node = args.ranks_per_node
    strategies = as_list(settings.get("strategies"))
    if not strategies:
        raise BadInput(f"{where('strategies')}: no strategy given")
    for label in strategies:
        try:
            parsed = parse_strategy(label)
        except UserError as exc:
            raise BadInput(f"{where('strategies')}: {str(exc).split(': ', 1)[1]}") from None
        g = parsed.hybrid_group
        if g and ranks_per_node and ranks_per_node % g:
            fitting = [str(d) for d in range(1, ranks_per_node + 1) if ranks_per_node % d == 0]
            raise BadInput(f"{where('strategies')}: {label} shards over groups of {g} ranks within a node, but "
                           f"system {system.get('name')} runs {ranks_per_node} ranks per node; allowed: "
                           f"HYBRID_<g>GPU with g in {', '.join(fitting)}")

    nodes_value = settings["nodes"]
    if args.analysis_only:
        nodes = []
    elif str(nodes_value).strip() == "ladder":
        if not args.alloc_nodes:
            raise BadInput(f"{where('nodes')}: 'ladder' needs the largest node count, which only an allocation "
                           f"gives; allowed outside one: a list such as 1,2,4 (--nodes), or --max-nodes N with "
                           f"submit_sweep.sh")
        nodes = ladder(args.alloc_nodes)
    else:
        nodes = []
        for item in as_list(nodes_value):
            if not re.fullmatch(r"\d+", item) or int(item) < 1:
                raise BadInput(f"{where('nodes')}: '{item}' is not allowed; allowed: node counts such as 1,2,4 or 'ladder'")
            nodes.append(int(item))
        nodes = sorted(set(nodes))
    if args.alloc_nodes and nodes and nodes[-1] > args.alloc_nodes:
        raise BadInput(f"{where('nodes')}: {nodes[-1]} nodes is more than this allocation's {args.alloc_nodes}; "
                       f"allowed: 1 to {args.alloc_nodes} (or submit with sbatch -N {nodes[-1]})")

    batch_size = whole_number("batch_size", 1)
    steps = whole_number("steps", 2)
    warmup = whole_number("warmup_steps", 0)
    if warmup >= steps:
        raise BadInput(f"{where('warmup_steps')}: {warmup} is not allowed; allowed: fewer than the {steps} steps, "
                       f"so that some steps are timed")

    launcher = str(settings.get("launcher") or system.get("launcher") or "srun")
    allowed_launchers = as_list(system.get("launchers")) or list(LAUNCHERS)
    if launcher not in allowed_launchers:
        raise BadInput(f"{where('launcher')}: '{launcher}' is not allowed "
                       f"on {system.get('name')}; allowed: {', '.join(allowed_launchers)}")

    # modifiers: one value or several (a grid)
    grid: list[tuple[str, list[str]]] = []
    for key in GRID_KEYS:
        if key not in settings:
            continue
        values = as_list(settings[key])
        option = where(key)
        if not values:
            raise BadInput(f"{option}: no value given")
        for value in values:
            if key in BOOLEAN_KEYS:
                if value not in ("true", "false", "on", "off", "yes", "no", "1", "0"):
                    raise BadInput(f"{option}: '{value}' is not allowed; allowed: true, false")
            elif value not in MODIFIER_CHOICES[key]:
                raise BadInput(f"{option}: '{value}' is not allowed; allowed: {', '.join(MODIFIER_CHOICES[key])}")
        values = [normalise_bool(v) if key in BOOLEAN_KEYS else v for v in values]
        grid.append((key, list(dict.fromkeys(values))))

    common = [f"train.batch_size={batch_size}", f"train.steps={steps}", f"train.warmup_steps={warmup}"]
    if "skip_if_not_fits" in settings:
        common.append(f"plan.skip_if_not_fits={normalise_bool(as_list(settings['skip_if_not_fits'])[0])}")
        if system.get("device_memory_gib"):
            common.append(f"plan.device_memory_gib={system['device_memory_gib']}")
    for key, value in (settings.get("set") or {}).items():
        value = normalise_bool(value) if isinstance(value, bool) else str(value)
        if not re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", str(key)) or re.search(r"\s", value):
            raise BadInput(f"--set: '{key}={value}' is not allowed; allowed: a dotted trainer key and a value "
                           f"without spaces, e.g. fsdp.use_orig_params=true")
        if key.split(".")[0] == "output":
            raise BadInput(f"--set: {key} is chosen by the job script; use --out and --study instead")
        common.append(f"{key}={value}")

    peak = system.get("peak_tflops")
    runs = []
    for model in models:
        for label in strategies:
            for combo in itertools.product(*[values for _, values in grid]):
                variant = dict(zip([key for key, _ in grid], combo))
                overrides = [f"{STUDY_KEYS[k][1]}={v}" for k, v in variant.items()]
                precision = variant.get("precision", "fp32")
                if isinstance(peak, dict) and peak.get(precision) is not None:
                    overrides.append(f"system.peak_tflops={peak[precision]}")
                elif isinstance(peak, (int, float)):
                    overrides.append(f"system.peak_tflops={peak}")
                # only the modifiers that vary name the run in progress lines and the summary
                shown = ",".join(f"{k}={v}" for k, v in variant.items() if len(dict(grid)[k]) > 1) or "-"
                for n in nodes:
                    runs.append(f"{model} {label} {n} {shown} {','.join(overrides) or '-'}")
    return {"STUDY": name, "MODELS": models, "STRATEGIES": strategies, "NODES": nodes,
            "LAUNCHER": launcher, "COMMON_OVERRIDES": common, "RUNS": runs,
            "GRID": " ".join(f"{k}={','.join(v)}" for k, v in grid if len(v) > 1)}


def normalise_bool(value) -> str:
    return "true" if str(value).lower() in ("true", "on", "yes", "1") else "false"


def cmd_plan(args) -> None:
    for key, value in plan(args).items():
        print(shell_assign(key, value))


# ---------------------------------------------------------------- run records

def read_record(run_dir: str) -> tuple[dict | None, dict | None]:
    """(start, end) of a run directory, through the toolkit's one record reader."""
    sys.path.insert(0, HOME)
    from vit_scale.record.reader import start_and_end

    return start_and_end(run_dir)


def flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def same_value(recorded, wanted: str) -> bool:
    import yaml

    try:
        wanted_value = yaml.safe_load(wanted)
    except yaml.YAMLError:
        wanted_value = wanted
    if isinstance(recorded, (int, float)) and isinstance(wanted_value, (int, float)) \
            and not isinstance(recorded, bool):
        return float(recorded) == float(wanted_value)
    return recorded == wanted_value or str(recorded) == wanted


def cmd_find_ok(args) -> None:
    """Print the newest run under DIR whose record says ok and whose config has every KEY=VALUE."""
    wanted = [item.partition("=")[::2] for item in args.settings]
    for path in sorted(glob.glob(os.path.join(args.dir, "*", "metrics.jsonl")), reverse=True):
        run_dir = os.path.dirname(path)
        start, end = read_record(run_dir)
        if not start or not end or end.get("status") != "ok":
            continue
        config = flat(start.get("config") or {})
        if all(key in config and same_value(config[key], value) for key, value in wanted):
            print(run_dir)
            return
    sys.exit(1)


def cmd_record(args) -> None:
    start, end = read_record(args.run_dir)
    if end is None:
        print("none - " + ("the run started but wrote no end record" if start else "no run record"))
        return
    ips = (end.get("images_per_s") or {}).get("mean")
    error = " ".join(str(end.get("error") or "").split())
    print(f"{end.get('status', 'failed')} {f'{ips:.1f}' if ips is not None else '-'} {error}".rstrip())


def cmd_names(args) -> None:
    """The trainer's model or strategy names on one line, for the job scripts' --help."""
    models, _, _ = trainer_tables()
    from vit_scale.distributed import all_labels

    print(" ".join(models if args.what == "models" else all_labels()))


# ---------------------------------------------------------------- the summary table

def cmd_summary(args) -> None:
    with open(args.tsv) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        print("no runs")
        return
    latest = {}
    for row in rows:  # a resumed study lists a run again: the last line about it wins
        latest[(row["model"], row["strategy"], row["variant"], int(row["nodes"]))] = row
    nodes = sorted({key[3] for key in latest})
    lines = sorted({key[:3] for key in latest}, key=lambda k: (rows_order(rows, k), k))
    header = ["model", "strategy"] + (["variant"] if any(k[2] != "-" for k in lines) else []) \
        + [f"n{n} img/s" for n in nodes]
    table = [header]
    for model, strategy, variant in lines:
        row = [model, strategy] + ([variant] if len(header) > 2 + len(nodes) else [])
        for n in nodes:
            item = latest.get((model, strategy, variant, n))
            if item is None:
                row.append("")
            elif item["status"] == "ok" and item["images_per_s"] not in ("", "-"):
                row.append(item["images_per_s"])
            else:
                row.append(item["status"])
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  " + "  ".join(cell.ljust(w) if i < len(header) - len(nodes) else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(r, widths))))
    counts = {}
    for row in latest.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    print("  " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))


def rows_order(rows, key) -> int:
    for i, row in enumerate(rows):
        if (row["model"], row["strategy"], row["variant"]) == key:
            return i
    return len(rows)


def main() -> None:
    global PROG
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prog", default=PROG, help="the script name errors start with")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("system")
    p.add_argument("file")
    p.set_defaults(func=cmd_system)
    p = sub.add_parser("plan")
    p.add_argument("--study-file")
    p.add_argument("--system-file", required=True)
    p.add_argument("--ranks-per-node", type=int, default=0)
    p.add_argument("--alloc-nodes", type=int, default=0)
    p.add_argument("--cli", action="append", help="KEY=VALUE given on the command line")
    p.add_argument("--analysis-only", action="store_true", help="no runs: only the study's name and settings")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("find-ok")
    p.add_argument("dir")
    p.add_argument("settings", nargs="*")
    p.set_defaults(func=cmd_find_ok)
    p = sub.add_parser("record")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_record)
    p = sub.add_parser("names")
    p.add_argument("what", choices=("models", "strategies"))
    p.set_defaults(func=cmd_names)
    p = sub.add_parser("summary")
    p.add_argument("tsv")
    p.set_defaults(func=cmd_summary)
    args = parser.parse_args()
    PROG = args.prog
    try:
        args.func(args)
    except BadInput as exc:
        fail(str(exc))


if __name__ == "__main__":
    main()
