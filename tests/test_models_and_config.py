"""The model registry (true parameter counts, Table 1 of seed 003) and the configuration."""

import time

import pytest
import yaml

from vit_scale import models
from vit_scale.config import load_config, to_yaml

TABLE1 = {"vit_base": 87, "vit_huge": 635, "vit_1b": 914, "vit_3b": 3067, "vit_15b": 14720}


@pytest.mark.parametrize("name, table_m", TABLE1.items())
def test_table1_models_match_the_paper_within_one_percent(name, table_m):
    assert models.count_params(name) / 1e6 == pytest.approx(table_m, rel=0.01)


def test_vit_5b_reports_its_true_count_not_the_table():
    """Table 1's ViT-5B dimensions give ~3.81B parameters with timm's standard MLP, not 5349M."""
    spec = models.MODELS["vit_5b"]
    assert (spec.embed_dim, spec.depth, spec.mlp_dim, spec.num_heads, spec.patch_size) == (1792, 56, 15360, 16, 14)
    assert models.count_params("vit_5b") / 1e9 == pytest.approx(3.807, abs=0.01)


def test_small_models():
    assert models.count_params("vit_micro") < 1_000_000 and models.MODELS["vit_micro"].img_size == 32
    assert models.MODELS["vit_tiny"].embed_dim == 192


def test_vit_15b_is_built_without_memory():
    start = time.time()
    model = models.build_model(models.get_spec("vit_15b"), device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert time.time() - start < 30


def test_flops_per_image_is_three_forwards():
    # forward of ViT-B/16 at 224 px is about 17.6 GMAC = 35 GFLOP; backward twice that
    assert models.flops_per_image("vit_base") / 1e9 == pytest.approx(105, rel=0.03)


def test_yaml_then_overrides_and_the_resolved_config_round_trips(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: vit_tiny\nstrategy: HYBRID_2GPU\ntrain:\n  batch_size: 16\nfsdp:\n  version: 2\n")
    cfg = load_config(str(path), ["train.batch_size=8", "fsdp.limit_all_gathers=off", "system.peak_tflops=191.5"])
    assert (cfg.model, cfg.strategy, cfg.train.batch_size, cfg.fsdp.version) == ("vit_tiny", "HYBRID_2GPU", 8, 2)
    assert cfg.fsdp.limit_all_gathers is False and cfg.system.peak_tflops == 191.5
    dumped = tmp_path / "resolved.yaml"
    dumped.write_text(to_yaml(cfg))
    assert load_config(str(dumped)).to_dict() == cfg.to_dict()
    assert yaml.safe_load(to_yaml(cfg))["deepspeed"]["gradient_clipping"] == 0.0


def test_help_lists_every_key_with_its_default_and_allowed_values(capsys):
    import dataclasses

    from vit_scale.config import BENCHMARK_SECTIONS, Config
    from vit_scale.recipes import finetune, train

    every_section = [f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(getattr(Config(), f.name))]
    for module, sections in ((train, BENCHMARK_SECTIONS), (finetune, every_section)):
        with pytest.raises(SystemExit) as exit_info:
            module._parse_args(["--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        cfg = Config()
        for section in sections:
            for f in dataclasses.fields(getattr(cfg, section)):
                value = getattr(getattr(cfg, section), f.name)
                keys = (
                    [f"{section}.{f.name}.{sub.name}" for sub in dataclasses.fields(value)]
                    if dataclasses.is_dataclass(value)
                    else [f"{section}.{f.name}"]
                )  # finetune.lora.rank ...
                for key in keys:
                    assert f"  {key} = " in text, (module.__name__, key)
        assert "  train.precision = fp32    [fp32 | bf16 | fp16]" in text
        assert "  train.batch_size = 32    [integer >= 1]" in text and "per device" in text
        assert "  strategy = DDP    [DDP, NO_SHARD," in text
    assert "data.path" not in train_help(capsys)  # the benchmark reads no dataset keys


def train_help(capsys) -> str:
    from vit_scale.recipes import train

    with pytest.raises(SystemExit):
        train._parse_args(["--help"])
    return capsys.readouterr().out
