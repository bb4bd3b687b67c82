"""The planner's parameter, gradient and optimizer components against the tensors a real wrapped
vit_micro holds after one step, on 2 CPU ranks (tests/plan_tensors.py's cases in the session's torchrun
launch of 2 ranks, tests/shared_launch.py), and the trainer's plan.skip_if_not_fits path in the same launch.

Exact, in bytes of storage with padding, for the largest rank, which is what the planner states:
DDP, FSDP1 and ZeRO ranks hold the same, except that FSDP2 pads each parameter's dim 0 (later
ranks hold less) and a ZeRO-1/2 rank's gradient buffer keeps the parameters that straddle its
partition boundary whole (so ranks differ by those).
"""

import glob
import json
import os

import pytest

import shared_launch
from vit_scale.record.schema import validate_record_file

STATE_CASES = [
    "DDP",
    "NO_SHARD",
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "FULL_SHARD:fsdp.use_orig_params=true",
    "FULL_SHARD:fsdp.version=2",
    "ZERO1",
    "ZERO2",
    "ZERO3",
    "ZERO3:deepspeed.param_persistence_threshold=0",
]
COMPONENTS = ("params", "grads", "optimizer")


def _runs(folder) -> list:
    runs = folder / "runs"
    common = (
        f"model=vit_micro,train.batch_size=2,train.steps=3,train.warmup_steps=1,output.dir={runs},"
        "plan.skip_if_not_fits=true,train.health_probe_s=0.1"  # the node-health probe shortened (1 s by default)
    )
    train_cases = [
        f"train:{common},strategy=FULL_SHARD,plan.device_memory_gib=0.01,output.study=skip",
        f"train:{common},strategy=FULL_SHARD,plan.device_memory_gib=64,output.study=fits",
    ]
    return [["@driver", "plan_tensors", str(folder / "tensors.json"), *STATE_CASES, *train_cases]]


# in the session's launch of 2 ranks (tests/shared_launch.py), last: after test_deepspeed's runs, whose first
# DeepSpeed run is to be the process's first
shared_launch.register("test_plan_tensors", "launch", 2, _runs, order=4)


@pytest.fixture(scope="module")
def launch(shared_launches):
    share = shared_launches.share("test_plan_tensors", "launch")
    assert share.codes == [0], share.stdout[-3000:] + share.stderr[-5000:]
    results = {r["case"]: r for r in json.loads((share.folder / "tensors.json").read_text())}
    return results, share.folder / "runs"


@pytest.mark.parametrize("case", STATE_CASES)
def test_states_equal_the_real_tensors(launch, case):
    results, _ = launch
    ranks = results[case]["ranks"]
    predicted = ranks[0]["predicted"]
    for component in COMPONENTS:
        measured = [r["measured"][component] for r in ranks]
        assert max(measured) == predicted[component], (case, component, measured, predicted[component])
        uneven = case.endswith("fsdp.version=2") or (case in ("ZERO1", "ZERO2") and component == "grads")
        if not uneven:
            assert len(set(measured)) == 1, (case, component, measured)


def test_the_auto_optimizer_rule_is_torchs(launch):
    """Every family's parameters pass torch's check for the multi-tensor kernels (FSDP1's
    FlatParameter included), so the fused AdamW the trainer asks for on a GPU applies to all of
    them, and the planner's 'auto' says fused."""
    results, _ = launch
    for case in STATE_CASES:
        for rank in results[case]["ranks"]:
            assert rank["measured"]["foreach_capable"] is True, case
            assert rank["predicted"]["optimizer_impl_auto"] == "fused", case


def test_a_run_that_cannot_fit_is_recorded_as_skipped(launch):
    results, runs = launch
    skip = next(r for c, r in results.items() if "output.study=skip" in c)
    fits = next(r for c, r in results.items() if "output.study=fits" in c)
    assert skip["codes"] == [6, 6] and fits["codes"] == [0, 0]
    [skipped] = glob.glob(os.path.join(str(runs), "skip", "**", "metrics.jsonl"), recursive=True)
    records = validate_record_file(skipped)
    assert [r["event"] for r in records] == ["start", "end"]
    start, end = records
    assert end["status"] == "skipped" and end["steps_done"] == 0
    assert end["error"].startswith("does not fit: predicted ") and end["error"].endswith(" GiB > 0.01 GiB")
    assert start["plan"]["fits"] is False and start["plan"]["device_memory_gib"] == 0.01
    [ran] = glob.glob(os.path.join(str(runs), "fits", "**", "metrics.jsonl"), recursive=True)
    records = validate_record_file(ran)
    assert records[-1]["status"] == "ok" and records[0]["plan"]["fits"] is True
    assert isinstance(records[0]["plan"]["memory_gib"], float)
