"""docs/architecture.md's "Adding a strategy family" holds: a family package (its torch-free
`__init__` with an options dataclass and a FAMILY, its `strategy` module, its `cost` module), its
line in FAMILIES and, since it has options, its section's line in Config give the run configuration
its keys, their rules and their --help, `vit-scale plan` its memory and predicted step, and
`vit-scale study` its runs and forecast, with no other edit; and the configuration and the family
packages import without torch.

The toy family is added to a copy of the package, edited as a contributor would edit the source,
and each case runs in a fresh interpreter on that copy.
"""

import os
import shutil
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOY_FAMILY = '''
"""A family of one label, for the test: options and a layout, torch-free."""
from dataclasses import dataclass
from typing import Literal

from vit_scale.distributed.family import Family
from vit_scale.distributed.layout import Layout
from vit_scale.distributed.toy.cost import COSTS
from vit_scale.errors import UserError
from vit_scale.options import AT_LEAST_1, option


@dataclass
class ToyConfig:
    width: int = option(2, "ranks that hold one copy", AT_LEAST_1)
    mode: Literal["fast", "slow"] = option("fast", "how it goes")
    boost: bool = option(False, "only with mode=fast")

    def check(self):
        if self.boost and self.mode != "fast":
            raise UserError("toy.boost: only with toy.mode=fast")


def layout(cfg, label, world_size, ranks_per_node):
    return Layout(label.label, "toy", "toy", "TOY", cfg.toy.width, max(1, world_size // cfg.toy.width), 1)


def _strategy():
    from vit_scale.distributed.toy.strategy import ToyStrategy

    return ToyStrategy


FAMILY = Family(
    "toy",
    labels=("TOY",),
    strategy=_strategy,
    options=ToyConfig,
    layout=layout,
    costs=COSTS,
    plan_flags=(("width", "--toy-width", "default 2 (toy.width)"),),
)
'''

TOY_COST = '''
"""The toy family's planner terms: fp32 weights, gradients and AdamW states on every rank, and one
all-reduce of every gradient over the replicas once the backward is done (toy.width ranks per copy)."""
from vit_scale.distributed.costing import Costs
from vit_scale.distributed.costing.memory import StateMemory, const, per_phase
from vit_scale.distributed.costing.timeline import UnitPlan, group_coll


def memory(sc, shape, lay):
    P = shape.params
    grads = per_phase(0, 4.0 * shape.block_params, 4.0 * P, 4.0 * P)
    zero = const(0.0)
    return StateMemory(4.0 * P, 8.0 * P, grads, zero, zero, 0.0, optimizer_impl="fused")


def traffic(sc, lay, shape, ledger):
    ledger.add("all_reduce", 4 * shape.params, lay.replicate, "strided", lay.shard)


def step_plan(sc, lay, net, units, c):
    group = (lay.replicate, "strided", lay.shard)
    coll = group_coll(sc, net, "all_reduce", 4 * sc.shape.params, group, "replicate", "all-reduce")
    units[0].after_backward = (coll,) if coll else ()
    return UnitPlan(units, rules=["TOY: every gradient all-reduced after the backward"])


COSTS = Costs(memory=memory, traffic=traffic, step_plan=step_plan)
'''

TOY_STRATEGY = '''
"""The toy family's torch half: nothing that trains."""
from vit_scale.distributed.base import Strategy


class ToyStrategy(Strategy):
    family = "toy"

    def setup(self, factory):
        raise NotImplementedError

    def train_step(self, images, labels):
        raise NotImplementedError
'''


def _edit(path, old: str, new: str) -> None:
    with open(path) as f:
        text = f.read()
    assert text.count(old) == 1, f"{path} no longer has {old!r}: update this test's edit"
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def _add_toy(tmp_path, config_line: bool = True, costs: bool = True) -> None:
    """A copy of vit_scale with the toy family added: its folder, its FAMILIES line and (with
    config_line) its section's line in Config, each import beside it; without costs, a family that
    declares no planner terms."""
    package = tmp_path / "vit_scale"
    shutil.copytree(os.path.join(ROOT, "vit_scale"), package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "distributed" / "toy").mkdir()
    (package / "distributed" / "toy" / "__init__.py").write_text(TOY_FAMILY)
    (package / "distributed" / "toy" / "strategy.py").write_text(TOY_STRATEGY)
    (package / "distributed" / "toy" / "cost.py").write_text(TOY_COST)
    if not costs:
        _edit(package / "distributed" / "toy" / "__init__.py", "    costs=COSTS,\n", "")
    registry = package / "distributed" / "__init__.py"
    _edit(registry, "import colossalai, ddp, deepspeed, fsdp\n", "import colossalai, ddp, deepspeed, fsdp, toy\n")
    _edit(
        registry,
        '    "colossalai": colossalai.FAMILY,\n',
        '    "colossalai": colossalai.FAMILY,\n    "toy": toy.FAMILY,\n',
    )
    if config_line:
        config = package / "config.py"
        _edit(
            config,
            "from vit_scale.errors import",
            "from vit_scale.distributed.toy import ToyConfig\nfrom vit_scale.errors import",
        )
        _edit(
            config,
            "    colossalai: ColossalAIConfig = field(default_factory=ColossalAIConfig)\n",
            "    colossalai: ColossalAIConfig = field(default_factory=ColossalAIConfig)\n"
            "    toy: ToyConfig = field(default_factory=ToyConfig)\n",
        )


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    # the edited copy, not the checkout; the checkout's configs/ (system profiles)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "VIT_SCALE_HOME": ROOT}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )


def test_a_family_folder_and_its_two_lines_give_the_config_its_keys(tmp_path):
    _add_toy(tmp_path)
    proc = _python(
        """
        import vit_scale
        assert vit_scale.__file__.startswith('XX'), vit_scale.__file__

        from vit_scale.config import BENCHMARK_SECTIONS, load_config, to_yaml
        from vit_scale.distributed import layout_of
        from vit_scale.errors import UserError
        from vit_scale.recipes import train

        cfg = load_config(None, ["strategy=TOY", "toy.width=4", "toy.mode=slow"])
        print("values", cfg.toy.width, cfg.toy.mode, "toy" in BENCHMARK_SECTIONS)
        print("resolved", "toy:" in to_yaml(cfg))
        print("layout", layout_of("TOY", 8, 8).shard, layout_of("TOY", 8, 8, cfg).shard)
        for bad in (["toy.width=0"], ["toy.mode=medium"], ["toy.mode=slow", "toy.boost=true"]):
            try:
                load_config(None, bad)
            except UserError as exc:
                print("error", exc)
        try:
            train._parse_args(["--help"])
        except SystemExit:
            pass
        from vit_scale.distributed import strategy_class
        print("strategy", strategy_class("toy").__name__)
    """.replace("XX", str(tmp_path)),
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "values 4 slow True" in out and "resolved True" in out and "layout 2 4" in out
    assert "error toy.width: must be at least 1, got 0" in out
    assert "error toy.mode: 'medium' is not allowed; allowed: fast, slow" in out
    assert "error toy.boost: only with toy.mode=fast" in out
    assert "  toy.width = 2    [integer >= 1]\n      ranks that hold one copy" in out
    assert "  toy.mode = fast    [fast | slow]" in out
    assert "TOY" in out.split("  strategy = DDP")[1].split("\n")[0]
    assert "strategy ToyStrategy" in out


def test_a_family_with_options_but_no_config_line_is_named_at_import(tmp_path):
    _add_toy(tmp_path, config_line=False)
    proc = _python("import vit_scale.config", tmp_path)
    assert proc.returncode != 0
    assert "toy: ToyConfig = field(default_factory=ToyConfig)" in proc.stderr.strip().splitlines()[-1]


def test_the_config_and_the_family_packages_import_no_torch(tmp_path):
    shutil.copytree(
        os.path.join(ROOT, "vit_scale"), tmp_path / "vit_scale", ignore=shutil.ignore_patterns("__pycache__")
    )
    proc = _python(
        """
        import sys
        import vit_scale.config
        import vit_scale.distributed.capabilities
        from vit_scale.distributed import FAMILIES, strategy_class
        for family in FAMILIES:
            strategy_class(family)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "deepspeed", "colossalai", "timm"))
        print("heavy", heavy)
    """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "heavy []" in proc.stdout


def test_each_family_loads_its_own_strategy_behind_the_strategy_interface():
    """A FAMILIES line pointing at another family's torch half, or a Strategy grown back into a
    bag of hooks, fails here (the fine-tuning and checkpoint hooks are FinetuneHooks')."""
    from vit_scale.distributed import FAMILIES, strategy_class
    from vit_scale.distributed.base import Strategy

    for name in FAMILIES:
        assert strategy_class(name).family == name
        assert issubclass(strategy_class(name), Strategy)
    public = {m for m in vars(Strategy) if not m.startswith("_")}
    assert public == {"family", "check", "setup", "train_step", "options", "describe", "artifacts", "local_tensors"}


def test_a_family_folder_and_its_two_lines_are_planned(tmp_path):
    """`vit-scale plan` sizes the toy family from its cost module: memory per component, the bytes it
    all-reduces across its replicas, and (with --system) a predicted step; its option has the flag the
    family declares; its rows validate against the plan's schema, whose family names come from the
    registry."""
    _add_toy(tmp_path)
    proc = _python(
        """
        import contextlib, io, json
        import jsonschema
        from vit_scale.plan import PLAN_SCHEMA, main
        from vit_scale.planning.shapes import Shape
        from vit_scale.models import get_spec

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["--model", "vit_tiny", "--strategy", "TOY", "--nodes", "1,2", "--gpus-per-node", "4",
                       "--toy-width", "4", "--system", "frontier", "--no-figure", "--json"])
        doc = json.loads(out.getvalue())
        jsonschema.validate(doc, PLAN_SCHEMA)
        params = Shape.from_spec(get_spec("vit_tiny")).params
        for row in doc["rows"]:
            print("row", row["family"], row["nodes"], row["replicate_group_size"],
                  round(row["components_gib"]["params"] * 2**30 / params, 2),
                  round(row["components_gib"]["optimizer"] * 2**30 / params, 2),
                  row["communication"]["all_reduce"]["inter"] > 0, row["fits"],
                  row["prediction"]["step"]["step_s"] > 0, row["prediction"]["images_per_s"] > 0)
        print("rc", rc, "toy", doc["assumptions"]["toy"])
    """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # 4 ranks a node, --toy-width 4: one copy on one node, 2 on two (the all-reduce then crosses nodes);
    # 4 bytes a parameter for the fp32 weights, 8 for AdamW's two states
    assert "row toy 1 1 4.0 8.0 False True True True" in proc.stdout
    assert "row toy 2 2 4.0 8.0 True True True True" in proc.stdout
    assert "rc 0 toy {'width': 4, 'mode': 'fast', 'boost': False}" in proc.stdout


def test_a_family_without_planner_terms_is_refused_by_the_plan_in_one_line(tmp_path):
    """Asked for by name, a family with no cost module is a one-line error (exit 2); in the default
    list of every label it is left out with why, and the other families are planned."""
    _add_toy(tmp_path, costs=False)
    proc = _python(
        """
        import contextlib, io, json
        from vit_scale.plan import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            print("explicit", main(["--model", "vit_tiny", "--strategy", "TOY", "--json"]), err.getvalue().strip())
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["--model", "vit_tiny", "--json"])
        doc = json.loads(out.getvalue())
        print("default", rc, sorted({r["family"] for r in doc["rows"]}), doc["assumptions"]["refused"]["TOY"])
    """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    why = "TOY: the toy family has no planner model (Family.costs: its cost.py, docs/architecture.md)"
    assert f"explicit 2 vit-scale plan: error: --strategy: {why}" in proc.stdout
    assert f"default 0 ['colossalai', 'ddp', 'deepspeed', 'fsdp'] {why}" in proc.stdout


def test_a_study_plans_and_forecasts_a_family_added_in_one_folder(tmp_path):
    """`vit-scale study --dry-run` lists the toy family's runs with its option, and the study's
    forecast (predict: true) predicts them through the toy family's cost module: nothing of the
    study names a family."""
    _add_toy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "VIT_SCALE_HOME": ROOT}
    argv = ["--system", "frontier", "--dry-run", "--models", "vit_base", "--strategies", "TOY", "--nodes", "1,2"]
    argv += ["--steps", "2", "--warmup-steps", "1", "--repeat", "1", "--set", "toy.width=8", "--predict", "true"]
    proc = subprocess.run(
        [sys.executable, "-m", "vit_scale", "study", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "[1/2] vit_base TOY n1 (8 ranks)" in out and "[2/2] vit_base TOY n2 (16 ranks)" in out
    assert "strategy=TOY" in out and "toy.width=8" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("TOY ")]
    # strategy, nodes, GPUs, memory, fits, step ms, ...: both points predicted to fit and run
    assert [(r[1], r[2], r[4]) for r in rows] == [("1", "8", "yes"), ("2", "16", "yes")], out
    assert all(float(r[5]) > 0 for r in rows), out
    assert not (tmp_path / "runs").exists()


def test_a_run_record_of_a_family_added_in_one_folder_validates_and_reads(tmp_path):
    """A TOY run, recorded as the trainer records a run (analysis.synthetic writes it with the
    registry's own layout), validates against the run record's schema with the registry's family names
    and is read by the analysis' reader; the same record against the four families of the checkout is
    refused with a line naming the family."""
    _add_toy(tmp_path)
    # the analysis beside the edited package, so that it reads the copy's registry
    shutil.copytree(os.path.join(ROOT, "analysis"), tmp_path / "analysis", ignore=shutil.ignore_patterns("__pycache__"))
    proc = _python(
        """
        from analysis.synthetic import write_run
        from vit_scale.distributed import FAMILIES
        from vit_scale.record.reader import read_run
        from vit_scale.record.schema import validate_record_file

        path = write_run("runs", strategy="TOY", model="vit_tiny", nodes=2, ranks_per_node=4)
        records = validate_record_file(path, families=FAMILIES)
        start = records[0]
        print("start", start["strategy"]["label"], start["strategy"]["family"], start["strategy"]["shard_group_size"])
        run = read_run(path)
        print("read", run.start["strategy"]["family"], run.end["status"])
        try:
            validate_record_file(path, families=("ddp", "fsdp", "deepspeed", "colossalai"))
        except ValueError as exc:
            print("refused", str(exc).split(": ", 1)[1])
    """,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "start TOY toy 2" in proc.stdout  # the toy layout: toy.width (2 by default) ranks a copy
    assert "read toy ok" in proc.stdout
    assert (
        "refused strategy.family 'toy' is not a registered family; allowed: ddp, fsdp, deepspeed, colossalai"
        in proc.stdout
    )


def test_a_study_grids_over_an_option_of_a_family_added_in_one_folder(tmp_path):
    """The toy family's flag (Family.plan_flags) is a study option and a grid axis with no study code
    naming it: --toy-width 2,4 makes two runs a point, --help lists it, and a value the option's own
    rule refuses (at least 1) is one line naming the flag, exit 2, before anything runs."""
    _add_toy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "VIT_SCALE_HOME": ROOT}

    def study(*extra):
        argv = ["--system", "frontier", "--dry-run", "--models", "vit_base", "--strategies", "TOY", "--nodes", "1"]
        argv += ["--steps", "2", "--warmup-steps", "1", "--repeat", "1", *extra]
        return subprocess.run(
            [sys.executable, "-m", "vit_scale", "study", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=str(tmp_path),
            timeout=300,
        )

    proc = study("--toy-width", "2,4")
    assert proc.returncode == 0, proc.stderr
    assert "toy.width=2" in proc.stdout and "toy.width=4" in proc.stdout
    assert "[2/2] vit_base TOY n1 (8 ranks)" in proc.stdout
    bad = study("--toy-width", "0")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].endswith(
        "--toy-width: must be at least 1, got 0"
    )
    assert len(bad.stderr.strip().splitlines()) == 1
    helptext = study("--help")
    assert "--toy-width LIST" in helptext.stdout and "(toy.width)" in helptext.stdout
