"""ColossalAI Booster plugins: CAI_DDP trains the same model as DDP on the same ranks (real
torchrun launch over gloo, vit_micro, fp32: the session's launch of 2 ranks, tests/shared_launch.py);
every plugin that needs a GPU says so in one line before any work on a CPU; a missing colossalai names
the install command."""

import pytest

import shared_launch
from conftest import (
    FAST,
    assert_same_losses,
    env_without,
    load_runs,
    losses,
    require_package,
    start_train,
    train_refusals,
)


def _two_rank_runs(tmp) -> list:
    out = f"output.dir={tmp / 'runs'}"
    runs = [
        [*FAST, out, "strategy=DDP", "output.study=ddp"],
        [*FAST, out, "strategy=CAI_DDP", "output.study=cai-ddp"],
        [
            *FAST,
            out,
            "strategy=CAI_DDP",
            "colossalai.bucket_cap_mb=1",
            "train.activation_checkpointing=true",
            "output.study=cai-ddp-small-buckets-ac",
        ],
    ]
    return runs


# in the session's launch of 2 ranks (tests/shared_launch.py)
shared_launch.register("test_colossalai", "two_rank_runs", 2, _two_rank_runs, order=2, packages=("colossalai",))


@pytest.fixture(scope="module")
def two_rank_runs(shared_launches):
    require_package("colossalai", "see docs/strategies.md for the install that keeps your torch")
    share = shared_launches.share("test_colossalai", "two_rank_runs")
    return {study: records for (study, _, _), records in load_runs(share.folder / "runs").items()}, share


def test_cai_ddp_equals_ddp(two_rank_runs):
    runs, proc = two_rank_runs
    assert proc.codes == [0, 0, 0]
    reference = losses(runs["ddp"])
    for study in ("cai-ddp", "cai-ddp-small-buckets-ac"):
        end = runs[study][-1]
        assert end["status"] == "ok" and end["replicas_agree"] is True, (study, end)
        assert_same_losses(reference, losses(runs[study]), study)


def test_the_run_records_what_ran(two_rank_runs):
    runs, _ = two_rank_runs
    strategy = runs["cai-ddp"][0]["strategy"]
    assert strategy["family"] == "colossalai" and strategy["implementation"] == "colossalai-TorchDDPPlugin"
    assert strategy["options"]["plugin"] == "TorchDDPPlugin"
    assert strategy["options"]["booster_mixed_precision"] is None
    assert strategy["options"]["optimizer"] == "torch.optim.AdamW"
    assert (strategy["shard_group_size"], strategy["replicate_group_size"]) == (1, 2)
    assert runs["cai-ddp-small-buckets-ac"][0]["strategy"]["options"]["bucket_cap_mb"] == 1
    assert runs["cai-ddp"][0]["versions"]["colossalai"]


# ---------------------------------------------------------------- bad input: one line, exit 2, no work


def test_gpu_only_plugins_and_missing_package_are_one_line(tmp_path):
    # the GPU checks come before the import, so they need no colossalai; the missing-package case
    # is simulated, so it runs whether or not colossalai is installed
    cases = {
        "CAI_DDP_FP16": (["strategy=CAI_DDP_FP16", "train.precision=fp16"], None, ["CAI_DDP_FP16", "needs a GPU"]),
        "CAI_LOW_LEVEL_ZERO": (["strategy=CAI_LOW_LEVEL_ZERO"], None, ["CAI_LOW_LEVEL_ZERO", "needs a GPU"]),
        "CAI_GEMINI": (["strategy=CAI_GEMINI", "colossalai.preset=seed000"], None, ["CAI_GEMINI", "needs a GPU"]),
        "CAI_FSDP": (["strategy=CAI_FSDP"], None, ["CAI_FSDP", "needs a GPU"]),
        "CAI_DDP-fp16": (["strategy=CAI_DDP", "train.precision=fp16"], None, ["train.precision", "needs a GPU"]),
        "bad-zero-stage": (
            ["strategy=CAI_LOW_LEVEL_ZERO", "colossalai.zero_stage=3"],
            None,
            ["colossalai.zero_stage", "allowed: 1, 2"],
        ),
        "colossalai-missing": (
            ["strategy=CAI_DDP"],
            env_without("colossalai", tmp_path),
            ["colossalai", "pip install --no-deps colossalai==0.5.0"],
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
    assert not (tmp_path / "runs").exists()
