"""LoRA fine-tuning (finetune.lora.rank) with peft, from a saved vit_micro checkpoint, on 2 CPU
ranks over gloo.

The checkpoint is made here as a user would make one: a `vit-scale finetune` run trains vit_micro from
scratch on the digits 0-4 only (10 epochs, about 92% on those five) and saves it. LoRA then adapts
it to all ten digits: adapters of rank 8 on every Block's qkv, proj, fc1 and fc2, a new 10-class
head, activation checkpointing, everything else frozen. One launch runs them all, one after the other:
the base run, LoRA's (5 epochs), then 12 steps under each strategy family that trains adapters, each
compared loss for loss with DDP's, and the refusals.

Measured on the 2-core machine (DDP, lr 5e-3), top-1 on the 359 validation images: 5 epochs 86.9%
(by epoch 56.3, 73.8, 81.6, 84.7, 86.9; 2026-11-27); 8 epochs 90.8% the same day and 88.0% before,
84.7% at lr 2e-3. The bar below leaves room for that spread; 8 epochs cost the suite 132 more steps.
On 2026-11-28, twice: 82.2% (by epoch 53.5, 58.5, 72.7, 78.8, 82.2). Shorter runs tried that day and not
kept: a base of 5 epochs of batches of 8 (85.6% and 66.1% on the digits 0-4 with seeds 0 and 1), then LoRA
for 3 epochs of batches of 8, 74.9% and 75.8% at lr 5e-3, 73.8% and 67.1% at lr 3e-3: under the bar.
"""

import glob
import importlib.util
import os
import types

import pytest

from conftest import assert_same_losses, require_module, require_package, run_many
from test_finetune import PROBE, read_run, run_dir, write_digits

require_module("sklearn", "the digits come with scikit-learn: pip install 'vit-scale[test]'")
require_package("peft", "pip install 'vit-scale[lora]'")

MIN_ACCURACY = 0.80
LORA_EPOCHS = 5
PRETRAIN_EPOCHS = 10
COMMON = [
    "model=vit_micro",
    "train.batch_size=16",
    "train.weight_decay=0.05",
    "train.warmup_steps=2",
    "train.print_every=1000",
    "data.augment=none",
    "data.workers=0",
    "finetune.label_smoothing=0.1",
    PROBE,
]
LORA = [
    "finetune.lora.rank=8",
    "finetune.lora.alpha=16",
    "train.activation_checkpointing=true",
    "train.lr=5e-3",
    "finetune.lr_warmup_steps=44",
    "checkpoint.keep=1",
]
# the other families, 12 steps each, against DDP's 12 steps
FAMILIES = [
    ["strategy=FULL_SHARD", "fsdp.use_orig_params=true"],
    ["strategy=FULL_SHARD", "fsdp.version=2"],
    ["strategy=ZERO2"],
    ["strategy=ZERO3"],
    ["strategy=CAI_DDP"],
]


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("digits"))
    write_digits(root)
    five = tmp_path_factory.mktemp("digits0-4")
    for split in ("train", "val"):
        os.makedirs(five / split)
        for label in "01234":
            os.symlink(os.path.join(root, split, label), five / split / label)

    out = tmp_path_factory.mktemp("runs")
    # the base checkpoint first in the one launch (each launch costs seconds of imports): its path is known
    # before it is written, the end of its 10 epochs of (images per rank // 16) steps
    images = sum(len(os.listdir(five / "train" / label)) for label in "01234")
    saved = os.path.join(str(out), "ck-pretrain", f"step-{PRETRAIN_EPOCHS * (images // 2 // 16):08d}", "state.pt")
    pretrain = [
        "@finetune",
        *COMMON,
        f"data.path={five}",
        "strategy=DDP",
        "train.lr=2e-3",
        f"finetune.epochs={PRETRAIN_EPOCHS}",
        "finetune.lr_warmup_steps=22",
        f"output.dir={out}",
        "output.study=pretrain",
        f"checkpoint.dir={out / 'ck-pretrain'}",
    ]

    full = [f"data.path={root}", f"finetune.pretrained={saved}", f"output.dir={out}", *COMMON, *LORA]
    short = [*full, "finetune.steps=12", "checkpoint.at_end=false"]
    tracking = ["tracking.backend=tensorboard"] if importlib.util.find_spec("tensorboard") else []
    checkpoints = out / "ck-short-DDP"
    runs = [
        pretrain,
        ["@finetune", *full, "strategy=DDP", f"finetune.epochs={LORA_EPOCHS}", "output.study=lora", *tracking],
        [
            "@finetune",
            *short,
            "strategy=DDP",
            "output.study=short-DDP",
            f"checkpoint.dir={checkpoints}",
            "checkpoint.every_steps=6",
        ],
        [
            "@finetune",
            *short,
            "strategy=DDP",
            "output.study=resumed-DDP",
            f"checkpoint.resume={checkpoints / 'step-00000006'}",
            f"checkpoint.dir={out / 'ck-resumed'}",
        ],
    ]
    runs += [["@finetune", *short, *family, f"output.study=short-{i}"] for i, family in enumerate(FAMILIES)]
    runs += [["@finetune", *short, "strategy=FULL_SHARD", "output.study=refused-fsdp1"]]
    proc = run_many(2, runs, tmp_path_factory.mktemp("spec"), timeout=900)
    pretrained = read_run(out, "pretrain")
    assert pretrained[-1]["status"] == "ok" and pretrained[-1]["checkpoint"] == os.path.dirname(saved), pretrained[-1]
    assert os.path.isfile(saved), pretrained[-1]
    return {"out": out, "pretrained": saved, "pretrained_run": pretrained, "stdout": proc.stdout}


def test_lora_from_a_saved_checkpoint_reaches_the_measured_accuracy(lora_runs):
    records = read_run(lora_runs["out"], "lora")
    end = records[-1]
    assert end["status"] == "ok" and end["step"] == end["total_steps"]
    top1 = [r["top1"] for r in records if r["event"] == "eval"]
    assert len(top1) == LORA_EPOCHS
    assert end["eval"]["top1"] >= MIN_ACCURACY, top1
    print(f"\nLoRA r=8 from the digits-0-4 checkpoint: top-1 by epoch {[round(t * 100, 1) for t in top1]}")


def test_tensorboard_holds_the_evaluations_of_the_fine_tuning(lora_runs):
    require_package("tensorboard", "pip install 'vit-scale[test]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = read_run(lora_runs["out"], "lora")
    events = EventAccumulator(run_dir(records))
    events.Reload()
    evals = [r for r in records if r["event"] == "eval"]
    for tag, key in (("eval/top1", "top1"), ("eval/loss", "loss")):
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == [e["step"] for e in evals]
        assert [round(s.value, 5) for s in scalars] == [round(e[key], 5) for e in evals]
    assert len(events.Scalars("train/loss")) == records[-1]["total_steps"]


def test_the_record_gives_trainable_and_total_parameters(lora_runs):
    from vit_scale.models import describe

    lora = read_run(lora_runs["out"], "lora")[-1]["lora"]
    m = describe("vit_micro", 10)
    d, h, r = m["embed_dim"], m["mlp_dim"], 8
    adapters = m["depth"] * r * ((d + 3 * d) + (d + d) + (d + h) + (h + d))  # A (r x in) and B (out x r) each
    head = d * 10 + 10
    assert lora["trainable_params"] == adapters + head
    assert lora["total_params"] == m["params"] + adapters
    assert lora["adapted_layers"] == 4 * m["depth"] and lora["targets"] == ["qkv", "proj", "fc1", "fc2"]
    assert lora["rank"] == 8 and lora["alpha"] == 16
    assert "LoRA r=8: 25,226 of 166,602 parameters trained" in lora_runs["stdout"]


def test_only_the_adapters_and_the_head_moved(lora_runs):
    """The run's final checkpoint against the file it started from: every pretrained weight but
    the head is bit for bit where it was; the adapters' B matrices (zero at the start) are not."""
    import torch

    start = torch.load(lora_runs["pretrained"], map_location="cpu", weights_only=True)["model"]
    end_record = read_run(lora_runs["out"], "lora")[-1]
    end = torch.load(os.path.join(end_record["checkpoint"], "state.pt"), map_location="cpu", weights_only=True)["model"]
    frozen = {k: v for k, v in end.items() if "lora_" not in k and not k.startswith("head.")}
    assert len(frozen) == len(start) - 2  # all but head.weight and head.bias
    for key, value in frozen.items():
        assert torch.equal(value, start[key.replace(".base_layer.", ".")]), key
    lora_b = [v for k, v in end.items() if "lora_B" in k]
    assert len(lora_b) == 16 and all(v.abs().sum() > 0 for v in lora_b)


def test_every_family_that_trains_adapters_gives_ddps_losses(lora_runs):
    from conftest import load_runs

    runs = {study: records for (study, _, _), records in load_runs(lora_runs["out"]).items()}
    reference = [r["loss"] for r in runs["short-DDP"] if r["event"] == "step"]
    for i, family in enumerate(FAMILIES):
        records = runs[f"short-{i}"]
        assert records[-1]["status"] == "ok", (family, records[-1]["error"])
        assert_same_losses(reference, [r["loss"] for r in records if r["event"] == "step"], " ".join(family), steps=12)
        assert records[-1]["lora"]["trainable_params"] == 25226


def test_a_resumed_lora_run_continues_the_same_losses(lora_runs):
    """Adapters, head and their optimizer state saved at step 6 and loaded into a freshly built
    LoRA model: steps 7-12 give the uninterrupted run's losses."""
    from conftest import load_runs

    runs = {study: records for (study, _, _), records in load_runs(lora_runs["out"]).items()}
    whole = {r["step"]: r["loss"] for r in runs["short-DDP"] if r["event"] == "step"}
    resumed = {r["step"]: r["loss"] for r in runs["resumed-DDP"] if r["event"] == "step"}
    assert sorted(resumed) == list(range(7, 13)), sorted(resumed)
    for step, loss in resumed.items():
        assert loss == pytest.approx(whole[step], rel=1e-6, abs=1e-7), step
    assert runs["resumed-DDP"][-1]["resumed_from"]["step"] == 6


def test_fsdp1_without_use_orig_params_is_refused_in_one_line_before_the_run(lora_runs):
    assert (
        "REFUSED FULL_SHARD fp32: finetune.lora.rank: FSDP1 flattens each Block's parameters into one tensor, "
        "which cannot mix LoRA's frozen and trainable ones; set fsdp.use_orig_params=true (or fsdp.version=2)"
        in lora_runs["stdout"]
    )
    assert not glob.glob(os.path.join(str(lora_runs["out"]), "refused-*"))


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["strategy=HYBRID_1GPU"], None),  # FSDP2 whatever fsdp.version says (the layout's rule)
        (["strategy=FULL_SHARD", "fsdp.version=2"], None),
        (["strategy=HYBRID_2GPU"], "finetune.lora.rank: FSDP1 flattens each Block's parameters"),
        (
            ["strategy=CAI_GEMINI", "train.precision=bf16"],
            "finetune.lora.rank: CAI_GEMINI does not train LoRA adapters (only CAI_DDP was tried with frozen "
            "parameters; Gemini and LowLevelZero need a GPU); allowed: DDP, NO_SHARD, "
            "HYBRID_<g>GPU (g divides the world size), SHARD_GRAD_OP, FULL_SHARD, ZERO1, ZERO2, ZERO3, ZEROPP, CAI_DDP",
        ),
        (
            ["strategy=DDP", "train.init=meta"],
            "finetune.lora.rank: adapters are added to a model built on the device, "
            "and train.init=meta builds vit_micro on the meta device; set train.init",
        ),
        (["strategy=FULL_SHARD", "fsdp.version=2", "model=vit_3b"], "train.init=auto builds vit_3b on the meta device"),
        (
            ["strategy=DDP", "finetune.lora.targets=qkv,head"],
            "finetune.lora.targets: 'qkv,head' is not allowed; allowed: a comma-separated list of qkv, proj, fc1, fc2",
        ),
    ],
)
def test_lora_settings_that_cannot_work_are_one_line_errors(overrides, words):
    """Checked on every rank before any process group (the GPU-only ColossalAI plugins are refused
    by this check on a GPU too; here the capability table would refuse them first)."""
    from vit_scale.config import load_config
    from vit_scale.distributed import FAMILIES, parse_strategy
    from vit_scale.errors import UserError
    from vit_scale.recipes import lora

    world = types.SimpleNamespace(world_size=2, local_world_size=2)

    def check():
        cfg = load_config(None, ["finetune.lora.rank=8", *overrides])
        lora.check(cfg, world, FAMILIES[parse_strategy(cfg.strategy).family])

    if words is None:
        check()
        return
    with pytest.raises(UserError) as exc:
        check()
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_a_lora_checkpoint_is_not_resumed_without_the_adapters(lora_runs):
    """The check every rank makes before resuming (recipes/checkpoint.verify), against a run that
    has the same model, strategy and data but no finetune.lora."""
    from vit_scale.config import load_config
    from vit_scale.errors import UserError
    from vit_scale.recipes import checkpoint as ckpt
    from vit_scale.recipes.finetune import _checkpoint_facts

    records = read_run(lora_runs["out"], "lora")
    path = records[-1]["checkpoint"]
    meta = ckpt.read_meta(path)
    assert meta["lora"] == "r=8 alpha=16 targets=qkv,proj,fc1,fc2"
    world = types.SimpleNamespace(world_size=2)
    settings = [
        f"{k}={v}"
        for k, v in (("model", "vit_micro"), ("strategy", "DDP"), ("train.batch_size", 16), ("train.num_classes", 10))
    ]
    # the same adapters, named in another order: accepted
    ckpt.verify(
        path,
        meta,
        _checkpoint_facts(
            load_config(None, [*settings, "finetune.lora.rank=8", "finetune.lora.targets=fc2,fc1,proj,qkv"]), world
        ),
    )
    with pytest.raises(
        UserError,
        match=r"holds LoRA adapters r=8 alpha=16 targets=qkv,proj,fc1,fc2; this run has "
        r"none \(finetune.lora\); resume with the same adapters",
    ):
        ckpt.verify(path, meta, _checkpoint_facts(load_config(None, settings), world))
