"""DeepSpeed ZeRO strategies train the same model as DDP: same per-step losses on the same ranks,
replicas agree, status ok; the generated config is in the run directory; bad input is one line.
Real torchrun launches over gloo, vit_micro, fp32, several runs per launch (tests/run_many.py): the
session's launches of 2 and of 4 ranks (tests/shared_launch.py).

DeepSpeed compiles two ops on a CPU the first time they are used (cached under
~/.cache/torch_extensions, or $TORCH_EXTENSIONS_DIR): `deepspeed_shm_comm` (~30 s), which every
engine would build, is skipped by the strategy (`deepspeed.skip_shm_comm`, default on: the op
serves inference all-reduce only); `cpu_adam` (~45 s) is needed by optimizer offload, and only
the one offload run in `two_rank_runs` uses it, and the `deepspeed_cpu_adam` fixture (conftest.py)
compiles it beforehand in one process, so no multi-rank launch waits for a build.
"""

import json
import os

import pytest

import shared_launch
from conftest import (
    FAST,
    assert_same_losses,
    by_study,
    env_without,
    load_runs,
    losses,
    require_package,
    start_train,
    train_refusals,
)


def _run_dir(records, out_dir):
    start = records[0]
    matches = [
        os.path.join(root)
        for root, _, files in os.walk(out_dir)
        if "metrics.jsonl" in files and root.endswith(start["run_id"]) and f"/{start['study']}/" in root
    ]
    assert len(matches) == 1, matches
    return matches[0]


NO_QUANT = ["deepspeed.quantized_weights=false", "deepspeed.quantized_gradients=false"]


def _two_rank_runs(tmp) -> list:
    out = f"output.dir={tmp / 'runs'}"
    runs = [
        [*FAST, out, "strategy=DDP", "output.study=ddp"],
        # first DeepSpeed run of the process: zero.Init must find DeepSpeed's comm already set up
        [
            *FAST,
            out,
            "strategy=ZERO3",
            "train.init=meta",
            "deepspeed.param_persistence_threshold=0",
            "output.study=zero3-meta",
        ],
        [*FAST, out, "strategy=ZERO1", "output.study=zero1"],
        [*FAST, out, "strategy=ZERO2", "output.study=zero2"],
        [
            *FAST,
            out,
            "strategy=ZERO2",
            "deepspeed.overlap_comm=false",
            "deepspeed.reduce_bucket_size=20000",
            "deepspeed.allgather_bucket_size=20000",
            "output.study=zero2-small-buckets",
        ],
        [*FAST, out, "strategy=ZERO3", "output.study=zero3"],
        # vit_micro's parameters are all under the default persistence threshold: 0 shards every one
        [
            *FAST,
            out,
            "strategy=ZERO3",
            "deepspeed.param_persistence_threshold=0",
            "deepspeed.prefetch_bucket_size=10000",
            "output.study=zero3-sharded",
        ],
        [*FAST, out, "strategy=ZEROPP", *NO_QUANT, "deepspeed.param_persistence_threshold=0", "output.study=zeropp"],
        # not compared with DDP: these options must train and keep replicas equal
        [
            *FAST,
            out,
            "strategy=ZERO2",
            "train.precision=bf16",
            "train.activation_checkpointing=true",
            "output.study=zero2-bf16-ac",
        ],
        [
            *FAST,
            out,
            "strategy=ZERO3",
            "train.precision=bf16",
            "deepspeed.param_persistence_threshold=0",
            "output.study=zero3-bf16",
        ],
        # the one run that needs a compiled op (cpu_adam, for DeepSpeed's CPU Adam; built by the fixture)
        [
            *FAST,
            out,
            "strategy=ZERO3",
            "deepspeed.offload_optimizer=true",
            "deepspeed.offload_params=true",
            "deepspeed.param_persistence_threshold=0",
            "output.study=zero3-offload",
        ],
    ]
    return runs


# in the session's launch of 2 ranks (tests/shared_launch.py) before any other module's DeepSpeed run: its
# ZERO3 meta run is the process's first; the offload run needs the compiled op
shared_launch.register(
    "test_deepspeed",
    "two_rank_runs",
    2,
    _two_rank_runs,
    order=1,
    needs=("deepspeed_cpu_adam",),
    packages=("deepspeed",),
)


@pytest.fixture(scope="module")
def two_rank_runs(shared_launches):
    require_package("deepspeed", "pip install 'vit-scale[deepspeed]'")
    share = shared_launches.share("test_deepspeed", "two_rank_runs")
    return by_study(load_runs(share.folder / "runs")), share.folder / "runs", share


def test_every_run_ok_and_replicas_agree(two_rank_runs):
    runs, _, proc = two_rank_runs
    assert len(runs) == 11
    for study, records in runs.items():
        end = records[-1]
        assert end["event"] == "end" and end["status"] == "ok", (study, end)
        assert end["replicas_agree"] is True, study
        assert end["steps_done"] == 4 and end["timed_steps"] == 3
        assert end["memory"]["peak_rss_gib"]["max"] > 0
    assert proc.codes == [0] * 11
    # no run waited for the shm_comm op build
    assert "deepspeed_shm_comm" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("study", ["zero1", "zero2", "zero2-small-buckets", "zero3", "zero3-sharded", "zeropp"])
def test_zero_stages_equal_ddp_on_two_ranks(two_rank_runs, study):
    runs, _, _ = two_rank_runs
    assert_same_losses(losses(runs["ddp"]), losses(runs[study]), study)


def test_offload_trains_with_deepspeeds_optimizer(two_rank_runs):
    runs, _, _ = two_rank_runs
    records = runs["zero3-offload"]
    options = records[0]["strategy"]["options"]
    assert options["offload_optimizer"] is True and options["offload_params"] is True
    assert options["optimizer"].startswith("DeepSpeedCPUAdam")
    step_losses = losses(records)
    assert len(step_losses) == 4 and all(0 < x < 20 for x in step_losses)


def test_the_run_records_what_ran(two_rank_runs):
    runs, out_dir, _ = two_rank_runs
    zero3 = runs["zero3-sharded"][0]["strategy"]
    assert zero3["family"] == "deepspeed" and zero3["implementation"] == "deepspeed-zero3"
    assert (zero3["shard_group_size"], zero3["replicate_group_size"]) == (2, 1)
    assert zero3["options"]["zero_stage"] == 3 and zero3["options"]["gradient_clipping"] == 0.0
    assert zero3["options"]["param_persistence_threshold"] == 0
    zero2 = runs["zero2-small-buckets"][0]["strategy"]
    assert (zero2["shard_group_size"], zero2["replicate_group_size"]) == (1, 2)
    assert zero2["options"]["overlap_comm"] is False and zero2["options"]["allgather_bucket_size"] == 20000
    zeropp = runs["zeropp"][0]["strategy"]
    assert zeropp["implementation"] == "deepspeed-zero3-pp"
    # hpZ defaults to the ranks per node: both ranks of this one-node launch
    assert zeropp["options"]["hpz_partition_size"] == 2
    assert zeropp["options"]["quantized_weights"] is False and zeropp["options"]["quantized_gradients"] is False
    bf16 = runs["zero2-bf16-ac"][0]["strategy"]["options"]
    assert bf16["precision"] == "bf16" and bf16["activation_checkpointing"] is True
    assert runs["zero3-meta"][0]["config"]["train"]["init"] == "meta"
    assert any("zero.Init" in note for note in runs["zero3-meta"][0]["strategy"]["notes"])
    assert runs["zero3"][0]["versions"]["deepspeed"]


def test_generated_config_is_in_the_run_directory(two_rank_runs):
    runs, out_dir, _ = two_rank_runs
    with open(os.path.join(_run_dir(runs["zeropp"], out_dir), "deepspeed.json")) as f:
        config = json.load(f)
    assert config["gradient_clipping"] == 0.0
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["train_batch_size"] == 8
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["zero_hpz_partition_size"] == 2
    assert zero["zero_quantized_weights"] is False and zero["zero_quantized_gradients"] is False
    assert "optimizer" not in config  # the client torch AdamW, as DDP uses
    with open(os.path.join(_run_dir(runs["zero3-offload"], out_dir), "deepspeed.json")) as f:
        offload = json.load(f)
    assert offload["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert offload["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert offload["optimizer"]["type"] == "AdamW"
    assert not os.path.exists(os.path.join(_run_dir(runs["ddp"], out_dir), "deepspeed.json"))


def _four_rank_runs(tmp) -> list:
    """Two emulated nodes of two ranks: hpZ's default partition (ranks per node) is 2 of 4 ranks."""
    out = f"output.dir={tmp / 'runs'}"
    nodes = "system.ranks_per_node=2"
    runs = [
        [*FAST, out, nodes, "strategy=DDP", "output.study=ddp"],
        [
            *FAST,
            out,
            nodes,
            "strategy=ZEROPP",
            *NO_QUANT,
            "deepspeed.param_persistence_threshold=0",
            "output.study=zeropp",
        ],
        [*FAST, out, nodes, "strategy=ZERO3", "deepspeed.param_persistence_threshold=0", "output.study=zero3"],
    ]
    return runs


# in the session's launch of 4 ranks, after the runs without DeepSpeed and test_predicted_bytes' cases
shared_launch.register("test_deepspeed", "four_rank_runs", 4, _four_rank_runs, order=2, packages=("deepspeed",))


@pytest.fixture(scope="module")
def four_rank_runs(shared_launches):
    require_package("deepspeed", "pip install 'vit-scale[deepspeed]'")
    return by_study(load_runs(shared_launches.share("test_deepspeed", "four_rank_runs").folder / "runs"))


@pytest.mark.parametrize("study", ["zeropp", "zero3"])
def test_zero3_and_hpz_equal_ddp_on_four_ranks(four_rank_runs, study):
    end = four_rank_runs[study][-1]
    assert end["status"] == "ok" and end["replicas_agree"] is True, end
    assert_same_losses(losses(four_rank_runs["ddp"]), losses(four_rank_runs[study]), study)


def test_hpz_partition_defaults_to_ranks_per_node(four_rank_runs):
    start = four_rank_runs["zeropp"][0]
    assert start["world"]["world_size"] == 4 and start["world"]["ranks_per_node"] == 2
    assert start["strategy"]["options"]["hpz_partition_size"] == 2
    assert (start["strategy"]["shard_group_size"], start["strategy"]["replicate_group_size"]) == (4, 1)


# ---------------------------------------------------------------- bad input: one line, exit 2, no work


def test_bad_input_is_one_line_before_any_work(tmp_path):
    require_package("deepspeed", "pip install 'vit-scale[deepspeed]'")
    cases = {
        "zeropp-quantisation-on-cpu": (["strategy=ZEROPP"], None, ["ZEROPP", "needs a GPU", "quantized_weights"]),
        "zeropp-qgz-only-on-cpu": (["strategy=ZEROPP", "deepspeed.quantized_weights=false"], None, ["needs a GPU"]),
        "fp16-on-cpu": (["strategy=ZERO1", "train.precision=fp16"], None, ["train.precision", "needs a GPU"]),
        "param-offload-on-zero2": (
            ["strategy=ZERO2", "deepspeed.offload_params=true"],
            None,
            ["deepspeed.offload_params", "ZeRO-3 only"],
        ),
        "hpz-not-dividing": (
            ["strategy=ZEROPP", *NO_QUANT, "deepspeed.hpz_partition_size=3"],
            None,
            ["deepspeed.hpz_partition_size", "must divide"],
        ),
        "deepspeed-missing": (
            ["strategy=ZERO2"],
            env_without("deepspeed", tmp_path),
            ["deepspeed", "pip install 'vit-scale[deepspeed]'"],
        ),
    }
    # the simulated absence needs its own environment, so its own process; the rest share one
    # (conftest.train_refusals)
    missing = {name: start_train(args, tmp_path, env) for name, (args, env, _) in cases.items() if env}
    results = train_refusals({name: args for name, (args, env, _) in cases.items() if not env}, tmp_path)
    for name, proc in missing.items():
        stdout, stderr = proc.communicate(timeout=180)
        results[name] = (proc.returncode, stdout, stderr)
    for name, (code, stdout, stderr) in results.items():
        lines = stderr.strip().splitlines()
        assert code == 2, (name, code, stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("vit-scale: error: "), (name, stderr)
        assert "Traceback" not in stderr + stdout, name
        for fragment in cases[name][2]:
            assert fragment in lines[0], (name, lines[0])
    assert not (tmp_path / "runs").exists()  # nothing was written


# ---------------------------------------------------------------- the generated config, as a GPU run would get it


def _strategy_on(device_type, overrides, world_size=16, ranks_per_node=8):
    """The strategy object alone: its config is built from the run config and the world, with no
    process group and no deepspeed import, so GPU settings can be checked on a CPU."""
    from vit_scale.config import load_config
    from vit_scale.distributed import parse_strategy
    from vit_scale.distributed.deepspeed.strategy import DeepSpeedStrategy
    from vit_scale.launch.world import World

    cfg = load_config(None, overrides)
    world = World(
        "srun",
        0,
        world_size,
        0,
        ranks_per_node,
        world_size // ranks_per_node,
        "n0",
        "n0",
        29500,
        device_type=device_type,
        device_index=0 if device_type != "cpu" else None,
        backend="nccl" if device_type != "cpu" else "gloo",
    )
    return DeepSpeedStrategy(cfg, parse_strategy(cfg.strategy), world)


def test_generated_config_for_a_gpu_run():
    strategy = _strategy_on(
        "cuda",
        [
            "strategy=ZEROPP",
            "train.precision=fp16",
            "train.batch_size=32",
            "deepspeed.offload_optimizer=true",
            "deepspeed.gradient_clipping=1.0",
        ],
    )
    config = json.loads(strategy.artifacts()["deepspeed.json"])
    assert config["fp16"]["enabled"] is True and config["bf16"]["enabled"] is False
    assert config["train_batch_size"] == 32 * 16 and config["gradient_clipping"] == 1.0
    zero = config["zero_optimization"]
    assert zero["zero_hpz_partition_size"] == 8  # ranks per node
    assert zero["zero_quantized_weights"] is True and zero["zero_quantized_gradients"] is True
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "offload_param" not in zero and config["optimizer"]["type"] == "AdamW"
    assert strategy.options()["hpz_partition_size"] == 8 and strategy.options()["skip_shm_comm"] is False
    override = _strategy_on("cuda", ["strategy=ZEROPP", "deepspeed.hpz_partition_size=4"])
    assert override.ds_config["zero_optimization"]["zero_hpz_partition_size"] == 4
    bf16 = _strategy_on("cuda", ["strategy=ZERO2", "train.precision=bf16"]).ds_config
    assert bf16["bf16"]["enabled"] is True and "zero_hpz_partition_size" not in bf16["zero_optimization"]
    assert bf16["zero_optimization"]["stage"] == 2 and "optimizer" not in bf16


def test_default_clipping_is_off():
    from vit_scale.config import Config

    assert Config().deepspeed.gradient_clipping == 0.0
    assert _strategy_on("cpu", ["strategy=ZERO1"], 2, 2).ds_config["gradient_clipping"] == 0.0
