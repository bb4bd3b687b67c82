"""Fine-tuning on real images with real torchrun launches over gloo (2 CPU ranks).

The dataset is scikit-learn's bundled digits (1,797 real 8x8 scans of handwritten digits, 10
classes, no download), written as an image folder (train/ and val/, 80/20 per class) and
upscaled to vit_micro's 32 px; the resuming runs train on 40 images a class of it (6 steps an epoch)
and evaluate on all of val/. The scenarios (two launches in all: FULL_SHARD stopped by its signal
alone, then every other run in one launch of `vit-scale finetune`'s session):
- DDP trains vit_micro from scratch to at least 90% validation accuracy;
- DDP, from a pretrained file (another head), saves every 5 steps; a second run resumes from step 5,
  across the epoch's end;
- FULL_SHARD, from the same file, takes DDP's steps: the same losses and evaluations;
- FULL_SHARD is stopped by SIGUSR1 after step 4 (sharded checkpoint, exit 7), then resumes with
  checkpoint.resume=auto;
- ZERO2 (DeepSpeed, engine checkpoint) runs 8 steps saving every 4; a second run resumes from step 4;
- CAI_DDP (ColossalAI TorchDDPPlugin, whole state dicts) does the same;
and a resumed run's per-step losses equal the uninterrupted run's.
"""

import csv
import glob
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import time

import pytest

from conftest import PYTHON, ROOT, require_module, require_package, run_many, run_outputs, torchrun

require_module("sklearn", "the digits come with scikit-learn: pip install 'vit-scale[test]'")
jsonschema = require_module("jsonschema", "pip install 'vit-scale[test]'")

# the first test that needs `launches` waits for its three launches (nine runs): on a loaded 2-core
# machine (load 30) they took 20 minutes, the suite's per-test limit (pyproject.toml); quiet, a few
pytestmark = pytest.mark.timeout(2400)

MIN_ACCURACY = 0.90
# the node-health probe at a run's end, shortened (1 s by default): nothing here reads it, and the runs are many
PROBE = "train.health_probe_s=0.1"
# from scratch, no augmentation, 12 epochs of 44 steps of 2 x 16 images: 94.7%, 95.3%, 94.7% with
# seeds 0, 1, 2 under DDP (16 epochs: 96.1%, 96.1%, 98.3%, 8 s more of the suite; 10 epochs: 91.6%,
# 93.3%, 94.4%, too near the bar). (lr 4e-3 with a shorter warm-up once sat at chance for epochs: 77%.)
# Batches of 8 (89 steps an epoch, lr 2e-3, a warm-up of one epoch), 7 epochs in 21 s: 94.7% with seed 0 but
# 79.7% and 78.3% with seeds 1 and 2; 6 epochs 85.5%, 69.1% (2026-11-28).
EPOCHS = 12
ACCURACY = [
    "model=vit_micro",
    "train.batch_size=16",
    "train.lr=2e-3",
    "finetune.lr_warmup_steps=44",
    f"finetune.epochs={EPOCHS}",
    "data.augment=none",
    "train.print_every=1000",
    "train.warmup_steps=2",
    PROBE,
]
# short runs for resuming, with everything that could break "the same losses": random crops and
# flips, two loader workers per rank, accumulation over two micro-batches, clipping, label smoothing
SHORT = [
    "model=vit_micro",
    "train.batch_size=16",
    "finetune.accumulation_steps=2",
    "train.lr=4e-3",
    "finetune.lr_warmup_steps=5",
    "finetune.epochs=2",
    "data.augment=standard",
    "data.workers=2",
    "train.print_every=1000",
    "train.warmup_steps=2",
    PROBE,
]
# FULL_SHARD reduce-scatters where DDP all-reduces: the same sums in another order, over 12 steps
# (it held over 44 steps of all 1,438 training images too)
FSDP_REL_TOL = 1e-4
SHORT_PER_CLASS = 40  # training images a class of the resuming runs (their epochs took 22 steps each with all)
SHORT_STEPS = 12  # 400 training images / 2 ranks / 16 / 2 micro-batches = 6 steps per epoch, 2 epochs

# ---------------------------------------------------------------- helpers


def write_digits(root) -> dict:
    """The digits as PNGs, one folder per class, 20% of each class in val/; returns image counts."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = random.Random(0)
    counts = {"train": 0, "val": 0}
    for label in range(10):
        members = [i for i, y in enumerate(digits.target) if y == label]
        rng.shuffle(members)
        n_val = round(0.2 * len(members))
        for k, i in enumerate(members):
            split = "val" if k < n_val else "train"
            os.makedirs(os.path.join(root, split, str(label)), exist_ok=True)
            pixels = (digits.images[i] * (255 / 16)).astype(np.uint8)  # 0..16 gray levels
            Image.fromarray(pixels, "L").resize((32, 32), Image.BILINEAR).save(
                os.path.join(root, split, str(label), f"{i:04d}.png")
            )
            counts[split] += 1
    return counts


def finetune(args, env=None, nproc=2):
    start = time.time()
    proc = torchrun(nproc, ["-m", "vit_scale", "finetune", *args], timeout=900, env=env)
    return proc, time.time() - start


def rank_exit_codes(proc) -> list[int]:
    if proc.returncode == 0:
        return [0]
    return [int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", proc.stdout + proc.stderr)]


def read_run(out_dir, study) -> list[dict]:
    """The one run of `study` under out_dir, every record checked against the schema."""
    from vit_scale.record.schema import BY_EVENT

    paths = glob.glob(os.path.join(str(out_dir), study, "**", "metrics.jsonl"), recursive=True)
    assert len(paths) == 1, paths
    records = [json.loads(line) for line in open(paths[0])]
    for record in records:
        jsonschema.validate(record, BY_EVENT[record["event"]])
    assert records[0]["event"] == "start" and records[-1]["event"] == "end"
    return records


def run_dir(records) -> str:
    start = records[0]
    cfg = start["config"]
    return os.path.join(
        cfg["output"]["dir"],
        start["study"],
        cfg["model"],
        cfg["strategy"],
        f"n{start['world']['nodes']}",
        start["run_id"],
    )


def losses_by_step(records) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records if r["event"] == "step"}


def evals(records) -> list[dict]:
    return [r for r in records if r["event"] == "eval"]


def assert_resumed_losses_match(resumed: dict, reference: dict, what: str) -> None:
    assert resumed, what
    for step, loss in resumed.items():
        # the same batches, augmentations, parameters and optimizer state: the same numbers
        assert loss == pytest.approx(reference[step], rel=1e-6, abs=1e-7), f"{what}: step {step}"


# ---------------------------------------------------------------- fixtures: one launch per scenario


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    return str(root), write_digits(str(root))


@pytest.fixture(scope="module")
def short_digits(digits, tmp_path_factory) -> str:
    """The resuming runs' data: SHORT_PER_CLASS training images a class (links into `digits`), and all
    of val/. Their claims (the same losses after a resume, FULL_SHARD's steps as DDP's) need two epochs,
    not many steps: with every image an epoch took 22 steps of the suite's time, here 6."""
    root = tmp_path_factory.mktemp("digits-short")
    for label in range(10):
        source = os.path.join(digits[0], "train", str(label))
        os.makedirs(root / "train" / str(label))
        for name in sorted(os.listdir(source))[:SHORT_PER_CLASS]:
            os.symlink(os.path.join(source, name), root / "train" / str(label) / name)
    os.symlink(os.path.join(digits[0], "val"), root / "val")
    return str(root)


def _short_run(digits, tmp, strategy: str) -> list:
    """8 steps with SHORT's accumulation and clipping, checkpointed every 4, and the run resumed from
    step 4: for strategies whose accumulation and clipping are their own (DeepSpeed's engine boundary
    counter, ColossalAI's booster.no_sync)."""
    common = [
        f"data.path={digits[0]}",
        *SHORT,
        "data.workers=0",
        "finetune.steps=8",
        f"strategy={strategy}",
        f"output.dir={tmp / 'runs'}",
    ]
    whole = [*common, f"output.study={strategy}-whole", f"checkpoint.dir={tmp / strategy / 'ck'}"]
    resumed = [
        *common,
        f"output.study={strategy}-resumed",
        f"checkpoint.dir={tmp / strategy / 'ck2'}",
        f"checkpoint.resume={tmp / strategy / 'ck' / 'step-00000004'}",
    ]
    return [[*whole, "checkpoint.every_steps=4", "checkpoint.keep=0"], resumed]


@pytest.fixture(scope="module")
def launches(digits, short_digits, pretrained_file, tmp_path_factory):
    """Every run here in two launches (a launch costs seconds of imports; they took four): FULL_SHARD
    stopped by SIGUSR1 after step 4 alone (it ends its ranks, exit 7), then the accuracy run, the
    uninterrupted runs and every resumed run in one launch of `vit-scale finetune`'s session
    (tests/run_many.py), each resumed run after the run it resumes. Each run sets its own seeds, so its
    place in a launch does not change its numbers."""
    tmp = tmp_path_factory.mktemp("finetune")
    out = f"output.dir={tmp / 'runs'}"
    data = f"data.path={short_digits}"
    # DDP from a pretrained file (another head), saving every 5 steps, and resumed from step 5
    ddp = [data, *SHORT, "strategy=DDP", f"finetune.pretrained={pretrained_file}", out]
    ddp_whole = [*ddp, "output.study=ddp-whole", f"checkpoint.dir={tmp / 'ddp-ck'}", "checkpoint.every_steps=5"]
    ddp_resumed = [
        *ddp,
        "output.study=ddp-resumed",
        f"checkpoint.dir={tmp / 'ddp-ck2'}",
        f"checkpoint.resume={tmp / 'ddp-ck' / 'step-00000005'}",
    ]
    # FULL_SHARD as the job script requeues it: the same command line each time, checkpoint.resume=auto;
    # from the same pretrained file as DDP, so that its uninterrupted run takes DDP's steps
    fsdp = [data, *SHORT, "strategy=FULL_SHARD", f"finetune.pretrained={pretrained_file}", out]
    requeue = [*fsdp, f"checkpoint.dir={tmp / 'fsdp-ck'}", "checkpoint.resume=auto"]
    short = {  # the engines' own accumulation and clipping, where installed
        strategy: _short_run(digits, tmp, strategy)
        for strategy, package in (("ZERO2", "deepspeed"), ("CAI_DDP", "colossalai"))
        if importlib.util.find_spec(package) is not None
    }
    # the longest run here (528 steps), DDP's. FULL_SHARD's fine-tuning is held to DDP's losses and
    # evaluations step by step instead (test_full_shard_fine_tuning_takes_ddps_steps_and_evaluations): a
    # second accuracy run (then 704 steps) for it cost 85 s of the suite. Its batches are read in the training
    # process: a loader worker a rank starts with each epoch's training and evaluation (24 starts here) and
    # sends every batch through a pipe: the run took 38 and 43 s with one, 33 and 35 s without, and the same
    # 94.7% (the resuming runs keep two workers a rank)
    accuracy = [f"data.path={digits[0]}", *ACCURACY, "strategy=DDP", "data.workers=0", out, "output.study=acc"]

    runs = {
        "acc": accuracy,
        "ddp-whole": [*ddp_whole, "checkpoint.keep=0"],
        "fsdp-whole": [*fsdp, "output.study=fsdp-whole", "checkpoint.at_end=false"],
        **{f"{s}-whole": pair[0] for s, pair in short.items()},
        "ddp-resumed": ddp_resumed,
        "fsdp-resumed": [*requeue, "output.study=fsdp-resumed"],
        **{f"{s}-resumed": pair[1] for s, pair in short.items()},
    }
    stopped = torchrun(
        2,
        ["-m", "vit_scale", "finetune", *requeue, "output.study=fsdp-stopped"],
        timeout=900,
        env={"VIT_SCALE_TEST_SIGNAL_AT_STEP": "4"},  # in epoch 1: the resumed run crosses its end
    )
    stdout = launch_finetunes(runs, tmp / "launch")
    found = {study: read_run(tmp / "runs", study) for study in [*runs, "fsdp-stopped"]}
    for study, records in found.items():
        print(f"\n{study}: {records[-1]['wall_time_s']:.0f} s")
    return {
        "runs": found,
        "stdout": stdout,
        "stopped_proc": stopped,
        "checkpoints": {
            "ddp": str(tmp / "ddp-ck"),
            "fsdp": str(tmp / "fsdp-ck"),
            **{s: str(tmp / s / "ck") for s in short},
        },
    }


def launch_finetunes(runs: dict, tmp) -> dict:
    """{study: rank 0's output} of fine-tuning runs in one launch, each asked to end ok."""
    tmp.mkdir()
    proc = run_many(2, [["@finetune", *args] for args in runs.values()], tmp, timeout=1800)
    assert f"EXIT CODES {[0] * len(runs)}" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
    return dict(zip(runs, run_outputs(proc.stdout, len(runs)), strict=True))


@pytest.fixture(scope="module")
def accuracy_run(launches):
    records = launches["runs"]["acc"]
    return {
        "records": records,
        "seconds": records[-1]["wall_time_s"],
        "stdout": launches["stdout"]["acc"],
        "strategy": "DDP",
    }


@pytest.fixture(scope="module")
def pretrained_file(tmp_path_factory):
    """A vit_micro checkpoint for 5 classes, as a user would bring one (safetensors if installed)."""
    import torch

    from vit_scale.models import build_model, get_spec

    torch.manual_seed(42)
    state = build_model(get_spec("vit_micro"), 5).state_dict()
    folder = tmp_path_factory.mktemp("pretrained")
    try:
        from safetensors.torch import save_file

        path = str(folder / "vit_micro_5.safetensors")
        save_file(state, path)
    except ImportError:
        path = str(folder / "vit_micro_5.pth")
        torch.save(state, path)
    return path


@pytest.fixture(scope="module")
def ddp_resumed(launches):
    runs = launches["runs"]
    return {
        "whole": runs["ddp-whole"],
        "resumed": runs["ddp-resumed"],
        "checkpoints": launches["checkpoints"]["ddp"],
        "stdout": launches["stdout"]["ddp-whole"] + launches["stdout"]["ddp-resumed"],
    }


@pytest.fixture(scope="module")
def fsdp_requeued(launches):
    runs = launches["runs"]
    return {
        "whole": runs["fsdp-whole"],
        "stopped": runs["fsdp-stopped"],
        "resumed": runs["fsdp-resumed"],
        "stopped_proc": launches["stopped_proc"],
        "checkpoints": launches["checkpoints"]["fsdp"],
    }


def _resumed_pair(launches, strategy: str) -> dict:
    runs = launches["runs"]
    return {
        "whole": runs[f"{strategy}-whole"],
        "resumed": runs[f"{strategy}-resumed"],
        "checkpoints": launches["checkpoints"][strategy],
    }


@pytest.fixture(scope="module")
def zero2_resumed(launches):
    require_package("deepspeed", "pip install 'vit-scale[deepspeed]'")
    return _resumed_pair(launches, "ZERO2")


@pytest.fixture(scope="module")
def cai_ddp_resumed(launches):
    require_package("colossalai", "see docs/strategies.md for the install that keeps your torch")
    return _resumed_pair(launches, "CAI_DDP")


# ---------------------------------------------------------------- accuracy and evaluation


def test_digits_reach_90_percent_validation_accuracy(accuracy_run, digits):
    records = accuracy_run["records"]
    end = records[-1]
    assert end["status"] == "ok" and end["replicas_agree"] is True, end
    assert end["step"] == end["total_steps"] == EPOCHS * 44
    per_epoch = evals(records)
    assert [e["epoch"] for e in per_epoch] == list(range(1, EPOCHS + 1))
    assert all(e["images"] == digits[1]["val"] for e in per_epoch)
    final = per_epoch[-1]
    assert final["top1"] >= MIN_ACCURACY, (accuracy_run["strategy"], [round(e["top1"], 3) for e in per_epoch])
    assert final["top5"] >= final["top1"] and end["eval"]["top1"] == final["top1"]
    assert per_epoch[-1]["loss"] < per_epoch[0]["loss"]
    print(
        f"\n{accuracy_run['strategy']}: top-1 {final['top1'] * 100:.1f}% top-5 {final['top5'] * 100:.1f}% "
        f"in {accuracy_run['seconds']:.0f} s"
    )


def test_step_records_say_how_long_each_step_waited_for_data(accuracy_run):
    records = accuracy_run["records"]
    steps = [r for r in records if r["event"] == "step"]
    assert len(steps) == EPOCHS * 44 and [s["step"] for s in steps] == list(range(1, EPOCHS * 44 + 1))
    assert all(s["data_time_s"] >= 0 and s["step_time_s"] > 0 and 0 < s["lr"] <= 2e-3 for s in steps)
    assert all(1 <= s["epoch"] <= EPOCHS for s in steps) and steps[44]["epoch"] == 2
    end = records[-1]
    assert 0 <= end["data_time_s"]["fraction"] < 1 and end["images_per_s"]["mean"] > 0
    assert "waiting for data" in accuracy_run["stdout"]


def test_confusion_matrix_sums_to_the_validation_set(accuracy_run, digits):
    assert_confusion_matrix(accuracy_run["records"], digits)


def assert_confusion_matrix(records, digits) -> None:
    """The run's confusion matrix and per-class accuracies: the validation set, and the end's top-1."""
    directory = run_dir(records)
    rows = list(csv.reader(open(os.path.join(directory, "confusion_matrix.csv"))))
    assert rows[0][1:] == [str(c) for c in range(10)]
    matrix = [[int(v) for v in row[1:]] for row in rows[1:]]
    assert sum(map(sum, matrix)) == digits[1]["val"]
    assert sum(matrix[i][i] for i in range(10)) / digits[1]["val"] == pytest.approx(records[-1]["eval"]["top1"])
    per_class = list(csv.DictReader(open(os.path.join(directory, "per_class_accuracy.csv"))))
    assert [r["class"] for r in per_class] == [str(c) for c in range(10)]
    assert sum(int(r["images"]) for r in per_class) == digits[1]["val"]
    for r, row in zip(per_class, matrix, strict=True):
        assert int(r["images"]) == sum(row) and float(r["accuracy"]) == pytest.approx(
            int(r["correct"]) / sum(row), abs=1e-6
        )
    assert open(os.path.join(directory, "confusion_matrix.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert records[-1]["files"]["confusion_matrix_png"] == "confusion_matrix.png"


def test_full_shard_fine_tuning_takes_ddps_steps_and_evaluations(launches, digits):
    """FULL_SHARD's uninterrupted run against DDP's: the same pretrained file, batches, augmentations,
    accumulation and clipping, so the same losses (within the reduction order's rounding) and the same
    evaluations; what DDP's 528 steps reach (test_digits_reach_90_percent_validation_accuracy), these
    numbers reach. Its evaluation runs sharded, so its confusion matrix is checked too."""
    ddp, fsdp = launches["runs"]["ddp-whole"], launches["runs"]["fsdp-whole"]
    assert fsdp[-1]["status"] == "ok" and fsdp[-1]["replicas_agree"] is True, fsdp[-1]
    reference, sharded = losses_by_step(ddp), losses_by_step(fsdp)
    assert sorted(sharded) == sorted(reference) == list(range(1, SHORT_STEPS + 1))
    for step, loss in sharded.items():
        assert loss == pytest.approx(reference[step], rel=FSDP_REL_TOL), f"FULL_SHARD step {step} against DDP's"
    assert [e["epoch"] for e in evals(fsdp)] == [e["epoch"] for e in evals(ddp)] == [1, 2]
    for mine, theirs in zip(evals(fsdp), evals(ddp), strict=True):
        assert mine["images"] == theirs["images"] == digits[1]["val"]
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=FSDP_REL_TOL), (mine, theirs)
        assert abs(mine["top1"] - theirs["top1"]) * digits[1]["val"] <= 1, (mine, theirs)  # a tie at most
    assert_confusion_matrix(fsdp, digits)


# ---------------------------------------------------------------- resuming


def test_resuming_from_a_periodic_checkpoint_gives_the_same_losses_ddp(ddp_resumed):
    whole, resumed = ddp_resumed["whole"], ddp_resumed["resumed"]
    assert whole[-1]["status"] == resumed[-1]["status"] == "ok"
    # resumed from step 5 of epoch 1's 6: across the epoch's end and its evaluation
    assert sorted(losses_by_step(resumed)) == list(range(6, SHORT_STEPS + 1))
    assert_resumed_losses_match(losses_by_step(resumed), losses_by_step(whole), "DDP resumed from step 5")
    assert [(e["epoch"], e["top1"], e["loss"]) for e in evals(resumed)] == [
        (e["epoch"], e["top1"], e["loss"]) for e in evals(whole)
    ]
    assert resumed[-1]["resumed_from"]["step"] == 5 and resumed[-1]["step"] == SHORT_STEPS
    names = sorted(os.listdir(ddp_resumed["checkpoints"]))
    assert names == ["latest"] + [f"step-{s:08d}" for s in (5, 10, SHORT_STEPS)]
    meta = json.load(open(os.path.join(ddp_resumed["checkpoints"], "step-00000005", "meta.json")))
    assert (meta["model"], meta["strategy"], meta["step"], meta["epoch"], meta["step_in_epoch"]) == (
        "vit_micro",
        "DDP",
        5,
        0,
        5,
    )
    assert meta["sampler"]["start_sample_per_rank"] == 5 * 2 * 16 and meta["checkpoint_format"] == "full"


def test_pretrained_weights_start_the_ddp_run_with_a_new_head(ddp_resumed):
    assert "classifier head replaced" in ddp_resumed["stdout"]
    assert ddp_resumed["whole"][0]["config"]["finetune"]["pretrained"].split(".")[-1] in ("safetensors", "pth")


def test_sigusr1_saves_a_sharded_checkpoint_and_exits_for_requeue(fsdp_requeued):
    stopped = fsdp_requeued["stopped"]
    codes = rank_exit_codes(fsdp_requeued["stopped_proc"])
    # torchrun stops the other ranks (SIGTERM, -15) once one has exited non-zero; under srun every
    # rank exits 7 by itself
    assert 7 in codes and set(codes) <= {7, -15}, fsdp_requeued["stopped_proc"].stderr[-3000:]
    end = stopped[-1]
    assert end["status"] == "timeout" and end["requeue"] is True and "SIGUSR1" in end["error"]
    assert end["step"] == 4 and end["checkpoint"].endswith("step-00000004")
    saved = os.path.join(fsdp_requeued["checkpoints"], "step-00000004")
    assert os.path.isfile(os.path.join(saved, "state", ".metadata"))  # torch.distributed.checkpoint
    assert len(glob.glob(os.path.join(saved, "state", "*.distcp"))) == 2  # one shard file per rank
    assert json.load(open(os.path.join(saved, "meta.json")))["reason"] == "signal"
    assert_resumed_losses_match(
        losses_by_step(stopped), losses_by_step(fsdp_requeued["whole"]), "FULL_SHARD before the signal"
    )


def test_requeued_fsdp_run_continues_the_same_loss_curve(fsdp_requeued):
    whole, resumed = fsdp_requeued["whole"], fsdp_requeued["resumed"]
    assert resumed[-1]["status"] == "ok" and resumed[-1]["resumed_from"]["step"] == 4
    assert sorted(losses_by_step(resumed)) == list(range(5, SHORT_STEPS + 1))
    assert_resumed_losses_match(
        losses_by_step(resumed), losses_by_step(whole), "FULL_SHARD resumed after SIGUSR1 at step 4"
    )
    assert [(e["epoch"], e["top1"]) for e in evals(resumed)] == [(e["epoch"], e["top1"]) for e in evals(whole)]


def test_deepspeed_zero2_resumes_from_its_engine_checkpoint_with_the_same_losses(zero2_resumed):
    whole, resumed = zero2_resumed["whole"], zero2_resumed["resumed"]
    assert whole[-1]["status"] == resumed[-1]["status"] == "ok" and whole[-1]["replicas_agree"] is True
    assert sorted(losses_by_step(whole)) == list(range(1, 9))
    assert sorted(losses_by_step(resumed)) == list(range(5, 9))
    assert_resumed_losses_match(losses_by_step(resumed), losses_by_step(whole), "ZERO2 resumed from step 4")
    assert (
        [(e["step"], e["top1"]) for e in evals(resumed)]
        == [(e["step"], e["top1"]) for e in evals(whole)]
        == [(8, evals(whole)[0]["top1"])]
    )
    saved = os.path.join(zero2_resumed["checkpoints"], "step-00000004")
    assert os.path.isdir(os.path.join(saved, "engine"))  # DeepSpeed's own save_checkpoint
    assert json.load(open(os.path.join(saved, "meta.json")))["checkpoint_format"] == "engine"
    ds_config = json.load(open(os.path.join(run_dir(whole), "deepspeed.json")))
    assert ds_config["gradient_clipping"] == 1.0 and ds_config["gradient_accumulation_steps"] == 2


def test_colossalai_ddp_resumes_from_its_checkpoint_with_the_same_losses(cai_ddp_resumed):
    whole, resumed = cai_ddp_resumed["whole"], cai_ddp_resumed["resumed"]
    assert whole[-1]["status"] == resumed[-1]["status"] == "ok" and whole[-1]["replicas_agree"] is True
    assert sorted(losses_by_step(whole)) == list(range(1, 9))
    assert sorted(losses_by_step(resumed)) == list(range(5, 9))
    assert_resumed_losses_match(losses_by_step(resumed), losses_by_step(whole), "CAI_DDP resumed from step 4")
    assert all(r["grad_norm"] > 0 for r in whole if r["event"] == "step")  # torch's clip, its norm recorded
    assert (
        [(e["step"], e["top1"]) for e in evals(resumed)]
        == [(e["step"], e["top1"]) for e in evals(whole)]
        == [(8, evals(whole)[0]["top1"])]
    )
    saved = os.path.join(cai_ddp_resumed["checkpoints"], "step-00000004")
    assert os.path.isfile(os.path.join(saved, "state.pt"))  # TorchDDPPlugin: whole state dicts, as DDP's
    assert json.load(open(os.path.join(saved, "meta.json")))["checkpoint_format"] == "full"


# ---------------------------------------------------------------- bad input, through the command line


def _main_error(args, capsys) -> str:
    from vit_scale.recipes.finetune import main

    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vit-scale: error: "), err
    return err


def test_a_checkpoint_from_another_model_or_strategy_is_refused(ddp_resumed, digits, tmp_path, capsys):
    saved = os.path.join(ddp_resumed["checkpoints"], "step-00000005")
    base = [f"data.path={digits[0]}", *SHORT, f"output.dir={tmp_path / 'runs'}", f"checkpoint.resume={saved}"]
    err = _main_error([*base, "strategy=FULL_SHARD"], capsys)
    assert os.path.join(saved, "meta.json") in err and "under DDP" in err and "under FULL_SHARD" in err
    err = _main_error([*base, "strategy=DDP", "model=vit_tiny"], capsys)
    assert "model vit_micro" in err and "vit_tiny" in err
    assert not (tmp_path / "runs").exists()


def test_a_corrupt_checkpoint_is_refused_naming_the_file(ddp_resumed, digits, tmp_path, capsys):
    copy = str(tmp_path / "step-00000005")
    shutil.copytree(os.path.join(ddp_resumed["checkpoints"], "step-00000005"), copy)
    state = os.path.join(copy, "state.pt")
    with open(state, "r+b") as f:
        f.seek(os.path.getsize(state) // 2)
        f.write(b"\x00corrupt\x00")
    base = [f"data.path={digits[0]}", *SHORT, "strategy=DDP", f"output.dir={tmp_path / 'runs'}"]
    err = _main_error([*base, f"checkpoint.resume={copy}"], capsys)
    assert state in err and "corrupt" in err


def test_bad_dataset_directories_exit_2_without_a_traceback(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "one" / "cat").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "docs", "run_record.md"), tmp_path / "one" / "cat" / "not-an-image.md")
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "one" / "cat" / "a.png")
    cases = (
        (tmp_path / "missing", "no such directory"),
        (tmp_path / "empty", "holds no images"),
        (tmp_path / "one", "1 class (cat)"),
    )
    procs = [  # side by side: each is one process, mostly imports
        subprocess.Popen(
            [PYTHON, "-m", "vit_scale", "finetune", f"data.path={path}", f"output.dir={tmp_path / 'runs'}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path, _ in cases
    ]
    for (path, words), proc in zip(cases, procs, strict=True):
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 2, stderr
        assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
        assert str(path) in stderr and words in stderr, stderr
    assert not (tmp_path / "runs").exists()


def test_a_run_the_plan_says_cannot_fit_is_skipped_as_the_benchmark_does(digits, tmp_path):
    """plan.skip_if_not_fits is the session's, so fine-tuning honours it like `vit-scale train`
    (tests/test_plan_tensors.py shows the benchmark's): exit 6, a `skipped` end record, no step."""
    proc, _ = finetune(
        [
            f"data.path={digits[0]}",
            "model=vit_micro",
            "strategy=FULL_SHARD",
            "data.workers=0",
            "plan.skip_if_not_fits=true",
            "plan.device_memory_gib=0.01",
            f"output.dir={tmp_path}",
            "output.study=skip",
        ]
    )
    assert set(rank_exit_codes(proc)) == {6}, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = read_run(tmp_path, "skip")
    assert [r["event"] for r in records] == ["start", "end"]
    assert records[-1]["status"] == "skipped" and records[-1]["error"].startswith("does not fit: predicted")
    assert "SKIPPED" in proc.stdout
