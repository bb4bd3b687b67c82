"""docs/architecture.md's "Adding a strategy family" holds: a family file with an options dataclass
and one FAMILIES line give the run configuration its keys, their rules and their --help, with no
edit to vit_scale/config.py; and the configuration and the family files import without torch.

Each case runs in a fresh interpreter: the registry is read once, when the configuration is
first imported, as in a real process.
"""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOY_FAMILY = '''
"""A family of one label, for the test: options and a layout, nothing that trains."""
from dataclasses import dataclass
from typing import Literal

from vit_scale.distributed.base import Strategy
from vit_scale.distributed.layout import Layout
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


class ToyStrategy(Strategy):
    family = "toy"
    labels = ("TOY",)
    options_class = ToyConfig

    @classmethod
    def layout(cls, cfg, label, world_size, ranks_per_node):
        return Layout(label.label, "toy", "toy", "TOY", cfg.toy.width, max(1, world_size // cfg.toy.width), 1)

    def setup(self, factory):
        raise NotImplementedError

    def train_step(self, images, labels):
        raise NotImplementedError
'''


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )


def test_a_family_file_and_one_registry_line_give_the_config_its_keys(tmp_path):
    (tmp_path / "toy_family.py").write_text(TOY_FAMILY)
    proc = _python(
        """
        import vit_scale.distributed as registry
        registry.FAMILIES["toy"] = "toy_family:ToyStrategy"   # the one line

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
    """,
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


def test_the_config_and_the_family_files_import_no_torch(tmp_path):
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
