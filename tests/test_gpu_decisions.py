"""Decisions the toolkit makes for GPU runs, checked on a CPU as pure functions of what a GPU
machine would report (issue 18, items 3, 4, 9, 11). The mechanisms themselves need a GPU; what
is mocked here is only what cannot exist on this machine, and each test says what:
- DeepSpeed's throughput timer: the generated config, read by DeepSpeed's own config parser and
  driven through its own ThroughputTimer; only the accelerator's synchronize() is replaced by a
  counter (the CPU accelerator's is a no-op).
- ZeRO++ qgZ: the refusal as a function of (device count, ranks per node, nodes); the strategy's
  check with torch.cuda.device_count() replaced (no GPU here).
- CAI_LOW_LEVEL_ZERO + cpu_offload on ROCm: the trainer's check with a World that says rocm, and
  `vit-scale plan --device rocm` in-process.
- `vit-scale prepare` on a CUDA machine: a fake `nvcc` script and torch.version.cuda set to 13.0.
"""

import json
import os
import stat

import pytest

from conftest import require_module, require_package
from vit_scale.config import load_config
from vit_scale.distributed import parse_strategy
from vit_scale.errors import UserError
from vit_scale.launch.world import World


def _world(device_type, world_size=8, ranks_per_node=8):
    return World(
        "srun",
        0,
        world_size,
        0,
        ranks_per_node,
        max(1, world_size // ranks_per_node),
        "n0",
        "n0",
        29500,
        device_type=device_type,
        device_index=0 if device_type != "cpu" else None,
        backend="nccl" if device_type != "cpu" else "gloo",
    )


def _deepspeed(device_type, overrides, world_size=8, ranks_per_node=8):
    from vit_scale.distributed.deepspeed.strategy import DeepSpeedStrategy

    cfg = load_config(None, overrides)
    return DeepSpeedStrategy(cfg, parse_strategy(cfg.strategy), _world(device_type, world_size, ranks_per_node))


# ---------------------------------------------------------------- item 3: DeepSpeed's throughput timer


class _CountingAccelerator:
    def __init__(self):
        self.synchronized = 0

    def synchronize(self):
        self.synchronized += 1


def _synchronizations(ds_config: dict, monkeypatch, steps=6) -> int:
    """Device synchronisations DeepSpeed's ThroughputTimer makes over `steps` engine steps under
    `ds_config`, driven as the engine drives it (start in forward, stop in step)."""
    timer_module = require_module("deepspeed.utils.timer", "pip install 'vit-scale[deepspeed]'")
    from deepspeed.utils.config import get_timers_config

    accelerator = _CountingAccelerator()
    monkeypatch.setattr(timer_module, "get_accelerator", lambda: accelerator)
    timer = timer_module.ThroughputTimer(get_timers_config(ds_config), batch_size=8, steps_per_output=10**9)
    for _ in range(steps):
        timer.start()
        timer.stop(global_step=True, report_speed=False)
    return accelerator.synchronized


def test_deepspeed_config_keeps_its_throughput_timer_from_synchronising(monkeypatch):
    for label in ("ZERO1", "ZERO3"):
        strategy = _deepspeed("cuda", [f"strategy={label}", "train.precision=bf16"])
        config = json.loads(strategy.artifacts()["deepspeed.json"])  # the file the run directory gets
        assert config["timers"] == {"throughput": {"enabled": False, "synchronized": False}}
        assert config["wall_clock_breakdown"] is False
        assert _synchronizations(config, monkeypatch) == 0, label
    # what DeepSpeed 0.19.8 does without the key: two waits a step once past its start step
    assert _synchronizations({}, monkeypatch) > 0


# ---------------------------------------------------------------- item 4: ZeRO++ qgZ and visible GPUs


def test_qgz_is_refused_unless_each_rank_sees_its_nodes_gpus():
    from vit_scale.distributed.deepspeed import qgz_refusal

    # Frontier's srun --gpus-per-task=1: each rank sees one GCD of eight on its node
    for nodes in (1, 8):
        error = qgz_refusal(True, device_count=1, ranks_per_node=8, nodes=nodes)
        assert error.startswith("deepspeed.quantized_gradients: ") and "\n" not in error
        assert "torch.cuda.device_count(), 1 here, but 8 ranks" in error
        assert "--gpus-per-node" in error and "deepspeed.quantized_gradients=false" in error
    assert qgz_refusal(False, device_count=1, ranks_per_node=8, nodes=8) is None  # qgZ off: nothing to refuse
    assert qgz_refusal(True, device_count=4, ranks_per_node=4, nodes=2) is None  # all of a node's GPUs visible
    # more GPUs visible than ranks: across nodes DeepSpeed groups the wrong ranks (or drops qgZ) ...
    assert qgz_refusal(True, device_count=8, ranks_per_node=4, nodes=2) is not None
    # ... on one node it counts no node and reduce-scatters unquantised, as ZeRO++ does on one node
    assert qgz_refusal(True, device_count=8, ranks_per_node=1, nodes=1) is None


def test_zeropp_check_refuses_qgz_with_one_gpu_per_rank(monkeypatch):
    """torch.cuda.device_count() is replaced: there is no GPU here."""
    require_package("deepspeed", "pip install 'vit-scale[deepspeed]'")  # check() ends by importing it
    import torch

    from vit_scale.distributed.deepspeed import qgz_refusal
    from vit_scale.distributed.deepspeed.strategy import DeepSpeedStrategy

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = load_config(None, ["strategy=ZEROPP"])
    for kind in ("rocm", "cuda"):
        with pytest.raises(UserError) as refused:
            DeepSpeedStrategy.check(cfg, parse_strategy("ZEROPP"), _world(kind, 16, 8))
        assert str(refused.value) == qgz_refusal(True, 1, 8, 2)
    qwz_only = load_config(None, ["strategy=ZEROPP", "deepspeed.quantized_gradients=false"])
    DeepSpeedStrategy.check(qwz_only, parse_strategy("ZEROPP"), _world("rocm", 16, 8))  # hpZ + qwZ still run


def test_one_node_zeropp_says_qgz_is_not_used():
    from vit_scale.distributed.deepspeed import layout

    cfg = load_config(None, ["strategy=ZEROPP"])
    one_node = layout(cfg, parse_strategy("ZEROPP"), 8, 8).notes
    two_nodes = layout(cfg, parse_strategy("ZEROPP"), 16, 8).notes
    assert any("qgZ between nodes only" in note for note in one_node)
    assert not any("qgZ" in note for note in two_nodes)


# ---------------------------------------------------------------- item 9: LowLevelZero's HybridAdam on ROCm

OFFLOAD = ["strategy=CAI_LOW_LEVEL_ZERO", "colossalai.cpu_offload=true"]


def test_low_level_zero_offload_is_refused_on_rocm_in_the_table():
    from vit_scale.distributed.capabilities import capability, refusal

    offload, plain = load_config(None, OFFLOAD), load_config(None, ["strategy=CAI_LOW_LEVEL_ZERO"])
    for precision in ("fp32", "bf16", "fp16"):
        error = refusal("CAI_LOW_LEVEL_ZERO", precision, "rocm", offload)
        assert error.startswith("colossalai.cpu_offload: ") and "HybridAdam" in error
        assert refusal("CAI_LOW_LEVEL_ZERO", precision, "rocm", plain) is None
        assert refusal("CAI_LOW_LEVEL_ZERO", precision, "cuda", offload) is None
    assert capability("CAI_LOW_LEVEL_ZERO", "bf16", "rocm").refused_with  # the docs' table marks the pair


def test_trainer_and_plan_refuse_low_level_zero_offload_on_rocm_with_one_line(capsys):
    """The trainer's check with a World that says rocm (no ROCm GPU here); it refuses before
    importing colossalai. `vit-scale plan` in-process, as the shell would run it."""
    from vit_scale import plan
    from vit_scale.distributed.capabilities import refusal
    from vit_scale.distributed.colossalai.strategy import ColossalAIStrategy

    cfg = load_config(None, OFFLOAD)
    expected = refusal("CAI_LOW_LEVEL_ZERO", "bf16", "rocm", cfg)
    with pytest.raises(UserError) as refused:
        ColossalAIStrategy.check(cfg, parse_strategy("CAI_LOW_LEVEL_ZERO"), _world("rocm"))
    assert str(refused.value) == expected

    explicit = ["--model", "vit_base", "--device", "rocm", "--strategy", "CAI_LOW_LEVEL_ZERO"]
    assert plan.main([*explicit, "--set", "colossalai.cpu_offload=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(expected), err
    assert plan.main(["--model", "vit_base", "--device", "rocm", "--set", "colossalai.cpu_offload=true"]) == 0
    out = capsys.readouterr().out
    # the table wraps its prose at 119 columns: the line read joined
    assert f"left out: CAI_LOW_LEVEL_ZERO ({expected.split(': ', 1)[1]})" in " ".join(out.split())
    assert plan.main(explicit) == 0 and "CAI_LOW_LEVEL_ZERO" in capsys.readouterr().out  # no offload: planned


# ---------------------------------------------------------------- item 11: the CUDA toolkit against torch's CUDA


def test_toolkit_of_another_major_version_is_refused_with_what_to_do():
    from vit_scale.distributed.kernels import toolkit_problem

    error = toolkit_problem("13.0", "/sw/cuda/12.4", "12.4")
    assert "/sw/cuda/12.4 is 12.4" in error and "CUDA 13.0" in error
    assert "module load cuda/13" in error and "CUDA_HOME" in error and "\n" not in error
    assert toolkit_problem("13.0", "/sw/cuda/13.1", "13.1") is None  # a minor difference only warns
    assert toolkit_problem("12.8", "/sw/cuda/12.4", "12.4") is None
    assert toolkit_problem(None, "/sw/cuda/12.4", "12.4") is None  # CPU or ROCm torch: no nvcc build
    assert "no CUDA toolkit" in toolkit_problem("13.0", None, None)
    assert "did not run" in toolkit_problem("13.0", "/sw/cuda/13.0", None)


def _fake_toolkit(root, release: str) -> str:
    """A directory laid out as a CUDA toolkit whose bin/nvcc prints `release`, as nvcc does."""
    bindir = root / f"cuda-{release}" / "bin"
    bindir.mkdir(parents=True)
    nvcc = bindir / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        f"echo 'Cuda compilation tools, release {release}, V{release}.99'\n"
    )
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return str(bindir.parent)


def test_toolkit_is_found_as_torch_finds_it(tmp_path):
    from vit_scale.distributed.kernels import cuda_home, nvcc_release

    home = _fake_toolkit(tmp_path, "12.4")
    on_path = {"PATH": os.path.join(home, "bin") + os.pathsep + "/usr/bin"}
    assert cuda_home(on_path) == home and nvcc_release(home) == "12.4"
    assert cuda_home({**on_path, "CUDA_HOME": "/sw/cuda/13.0"}) == "/sw/cuda/13.0"  # CUDA_HOME wins
    assert nvcc_release(str(tmp_path / "nowhere")) is None


def test_prepare_stops_before_building_on_a_major_mismatch(tmp_path, monkeypatch, capsys):
    """A CUDA 13 torch (torch.version.cuda replaced: this torch is a CPU build) with the site's CUDA
    12.4 module loaded (a fake nvcc first on PATH)."""
    import torch

    from vit_scale.study import prepare

    home = _fake_toolkit(tmp_path, "12.4")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", os.path.join(home, "bin") + os.pathsep + os.environ["PATH"])
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert prepare.main(["--device", "cuda", "--strategies", "ZEROPP,CAI_GEMINI"]) == 1
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == [
        f"vit-scale prepare: error: the CUDA toolkit at {home} is 12.4 but this torch is built with CUDA 13.0, "
        "and no kernel builds across CUDA major versions (ColossalAI refuses, DeepSpeed would compile against the "
        "wrong CUDA): load a cuda module of CUDA 13.x "
        "(e.g. `module load cuda/13`; env/cuda.sh loads VIT_SCALE_MODULES, default `cuda`) or set CUDA_HOME to "
        "a CUDA 13 toolkit"
    ]
    assert "building" not in out and "kernel(s)" not in out  # nothing was started
