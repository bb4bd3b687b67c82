"""Fine-tuning parts one at a time, in this process: config keys, schedule, datasets and samplers,
pretrained weights, checkpoints (a real one-rank gloo process group), evaluation files, CLI."""

import csv
import itertools
import json
import os
import pickle
import random
import weakref

import numpy as np
import pytest
import torch

from conftest import end_one_rank_group, init_one_rank_group
from vit_scale.config import DataConfig, load_config
from vit_scale.errors import UserError
from vit_scale.recipes import checkpoint as ckpt
from vit_scale.recipes import datasets
from vit_scale.recipes.finetune import learning_rate


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text, text
    return text


# ---------------------------------------------------------------- config and schedule


def test_finetune_sections_load_and_round_trip(tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text(
        "data:\n  path: /data/pets\n  augment: crop\nfinetune:\n  epochs: 3\n  label_smoothing: 0.2\n"
        "checkpoint:\n  every_steps: 100\n  resume: auto\n  dir: /scratch/ck\n"
    )
    cfg = load_config(str(path), ["finetune.accumulation_steps=4", "data.workers=0"])
    assert (cfg.data.path, cfg.data.augment, cfg.finetune.epochs, cfg.finetune.label_smoothing) == (
        "/data/pets",
        "crop",
        3,
        0.2,
    )
    assert (cfg.checkpoint.every_steps, cfg.checkpoint.resume, cfg.finetune.accumulation_steps) == (100, "auto", 4)
    from vit_scale.config import to_yaml

    dumped = tmp_path / "resolved.yaml"
    dumped.write_text(to_yaml(cfg))
    assert load_config(str(dumped)).to_dict() == cfg.to_dict()


@pytest.mark.parametrize(
    "override, words",
    [
        ("data.format=zip", ["data.format", "imagefolder", "cifar100", "hf"]),
        ("data.augment=heavy", ["data.augment", "standard, crop, none"]),
        ("finetune.label_smoothing=1.5", ["finetune.label_smoothing", "between 0 and 1"]),
        ("finetune.accumulation_steps=0", ["finetune.accumulation_steps", "at least 1"]),
        ("checkpoint.every_steps=-5", ["checkpoint.every_steps", "negative"]),
        ("data.val_fraction=2", ["data.val_fraction", "between 0 and 1"]),
        ("finetune.epoch=3", ["finetune.epoch", "unknown key", "epochs"]),
    ],
)
def test_bad_finetune_keys_are_one_line_errors(override, words):
    with pytest.raises(UserError) as info:
        load_config(None, [override])
    text = _one_line(info)
    for word in words:
        assert word in text, text


def test_schedule_warms_up_linearly_then_follows_a_cosine():
    lrs = [learning_rate(s, 100, 1e-3, 10, 1e-5) for s in range(1, 101)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert lrs[10] == pytest.approx(1e-3)  # first step after warm-up: the full rate
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert 1e-5 < lrs[-1] < 2e-5
    assert learning_rate(56, 100, 1e-3, 10, 0.0) == pytest.approx(0.5e-3)  # half way through the decay: half


# ---------------------------------------------------------------- datasets


def _image_folder(root, classes, per_class, size=12):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        os.makedirs(root / c, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(root / c / f"{i}.png")


def test_image_folder_without_validation_holds_out_a_stratified_seeded_share(tmp_path):
    _image_folder(tmp_path, ["cat", "dog", "emu"], 10)
    data = DataConfig(path=str(tmp_path), val_fraction=0.2)
    splits = datasets.load_splits(data, seed=3)
    assert splits.classes == ["cat", "dog", "emu"] and splits.format == "imagefolder"
    assert (len(splits.train), len(splits.val)) == (24, 6)
    assert sorted(splits.val.labels()) == [0, 0, 1, 1, 2, 2]
    assert not set(splits.train.indices) & set(splits.val.indices)
    again = datasets.load_splits(data, seed=3)
    assert again.val.indices == splits.val.indices  # the same on every rank and every run
    assert datasets.load_splits(data, seed=4).val.indices != splits.val.indices


def test_image_folder_with_train_and_val_folders(tmp_path):
    _image_folder(tmp_path / "train", ["a", "b"], 4)
    _image_folder(tmp_path / "validation", ["a", "b"], 2)
    splits = datasets.load_splits(DataConfig(path=str(tmp_path)), seed=0)
    assert (len(splits.train), len(splits.val)) == (8, 4) and splits.val.where.endswith("validation")


@pytest.mark.parametrize(
    "case, words",
    [
        ("missing", ["data.path", "no such directory", "nothing is downloaded"]),
        ("empty", ["data.path", "holds no images", "one folder per class"]),
        ("one_class", ["data.path", "1 class", "only_cat", "at least 2"]),
        ("val_extra_class", ["has classes that", "zebra"]),
        ("unset", ["data.path", "no dataset given"]),
    ],
)
def test_unusable_datasets_are_one_line_errors_naming_the_path(tmp_path, case, words):
    path = tmp_path / "ds"
    if case == "empty":
        (path / "cat").mkdir(parents=True)
    elif case == "one_class":
        _image_folder(path, ["only_cat"], 3)
    elif case == "val_extra_class":
        _image_folder(path / "train", ["cat", "dog"], 2)
        _image_folder(path / "val", ["cat", "zebra"], 2)
    with pytest.raises(UserError) as info:
        datasets.load_splits(DataConfig(path="" if case == "unset" else str(path)), seed=0)
    text = _one_line(info)
    for word in words:
        assert word in text, text
    if case != "unset":
        assert str(path) in text


def _write_cifar(root, kind):
    rng = np.random.default_rng(1)

    def batch(n, key):
        return {b"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8), key: [i % 3 for i in range(n)]}

    root.mkdir(parents=True)
    if kind == "cifar10":
        for i in range(1, 6):
            pickle.dump(batch(4, b"labels"), open(root / f"data_batch_{i}", "wb"))
        pickle.dump(batch(6, b"labels"), open(root / "test_batch", "wb"))
        pickle.dump({b"label_names": [b"plane", b"car", b"bird"]}, open(root / "batches.meta", "wb"))
    else:
        pickle.dump(batch(9, b"fine_labels"), open(root / "train", "wb"))
        pickle.dump(batch(3, b"fine_labels"), open(root / "test", "wb"))
        pickle.dump({b"fine_label_names": [b"apple", b"bee", b"cup"]}, open(root / "meta", "wb"))


@pytest.mark.parametrize(
    "kind, folder, sizes, names",
    [
        ("cifar10", "cifar-10-batches-py", (20, 6), ["plane", "car", "bird"]),
        ("cifar100", "cifar-100-python", (9, 3), ["apple", "bee", "cup"]),
    ],
)
def test_cifar_python_files_are_found_and_read(tmp_path, kind, folder, sizes, names):
    _write_cifar(tmp_path / folder, kind)
    splits = datasets.load_splits(DataConfig(path=str(tmp_path)), seed=0)  # auto-detected, in its sub-folder
    assert splits.format == kind and splits.classes == names
    assert (len(splits.train), len(splits.val)) == sizes
    image = splits.train.source.image(0)
    assert image.size == (32, 32) and image.mode == "RGB"
    os.remove(tmp_path / folder / ("data_batch_3" if kind == "cifar10" else "test"))
    with pytest.raises(UserError) as info:
        datasets.load_splits(DataConfig(path=str(tmp_path), format=kind), seed=0)
    assert "is missing" in _one_line(info) and "nothing is downloaded" in str(info.value)


def test_hugging_face_format_without_the_package_says_so(tmp_path):
    import importlib.util

    if importlib.util.find_spec("datasets") is not None:
        pytest.skip("the datasets package is installed here")
    with pytest.raises(UserError) as info:
        datasets.load_splits(DataConfig(path=str(tmp_path), format="hf"), seed=0)
    assert "datasets package" in _one_line(info)


# ---------------------------------------------------------------- samplers and augmentation


def test_resumable_sampler_continues_the_same_order_and_ranks_share_it():
    full = [list(datasets.ResumableDistributedSampler(103, r, 2, seed=7)) for r in range(2)]
    for sampler_rank in range(2):
        sampler = datasets.ResumableDistributedSampler(103, sampler_rank, 2, seed=7)
        sampler.set_position(0, 10)
        assert list(sampler) == full[sampler_rank][10:] and len(sampler) == len(full[sampler_rank]) - 10
    indices = [i for share in full for (_, i, _) in share]
    assert len(indices) == len(set(indices)) == 102  # drop_last: equal shares, no image twice
    epoch1 = datasets.ResumableDistributedSampler(103, 0, 2, seed=7)
    epoch1.set_position(1)
    assert [i for _, i, _ in epoch1] != [i for _, i, _ in full[0]] and all(e == 1 for e, _, _ in epoch1)


@pytest.mark.parametrize("size, world", [(10, 3), (2, 4), (9, 1)])
def test_eval_sampler_sees_every_image_once_with_equal_batches(size, world):
    shares = [list(datasets.ShardedEvalSampler(size, r, world)) for r in range(world)]
    assert len({len(s) for s in shares}) == 1  # FSDP needs the same number of forwards on every rank
    seen = sorted(i for s in shares for (_, i, valid) in s if valid)
    assert seen == list(range(size))


def test_augmentation_depends_on_seed_epoch_and_image_only(tmp_path):
    _image_folder(tmp_path, ["a", "b"], 3, size=40)
    splits = datasets.load_splits(DataConfig(path=str(tmp_path), val_fraction=0.34), seed=0)
    transform = datasets.build_transform(DataConfig(augment="standard"), 32, train=True)
    data = datasets.ImageDataset(splits.train, transform, seed=5, train=True)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    x, label, valid = data[(2, 1, True)]
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is left alone
    assert x.shape == (3, 32, 32) and valid is True and label == splits.train.labels()[1]
    assert torch.equal(data[(2, 1, True)][0], x)
    assert not torch.equal(data[(3, 1, True)][0], x)
    # the crop the seed (5, epoch 2, this image) gives, as torch.manual_seed would draw it: only the CPU
    # generator is seeded (a GPU's is left alone), and the transforms draw from it
    index = splits.train.indices[1]
    torch.manual_seed(datasets.sample_seed(5, 2, index))
    assert torch.equal(transform(splits.train.source.image(index)), x)
    evaluation = datasets.ImageDataset(splits.val, datasets.build_transform(DataConfig(), 32, train=False), 5, False)
    assert evaluation[(-1, 0, False)][0].shape == (3, 32, 32)


def test_training_images_without_augmentation_are_the_same_unseeded(tmp_path):
    """augment=none draws no random numbers, so fine-tuning reads its training images without a seed
    per image (recipes/finetune.py): the same tensors as seeded, and the caller's RNG left alone."""
    _image_folder(tmp_path, ["a", "b"], 3, size=40)
    splits = datasets.load_splits(DataConfig(path=str(tmp_path), val_fraction=0.34), seed=0)
    transform = datasets.build_transform(DataConfig(augment="none"), 32, train=True)
    seeded = datasets.ImageDataset(splits.train, transform, seed=5, train=True)
    unseeded = datasets.ImageDataset(splits.train, transform, seed=5, train=False)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    for position in range(len(splits.train)):
        assert torch.equal(unseeded[(2, position, True)][0], seeded[(2, position, True)][0])
    assert torch.equal(torch.get_rng_state(), before)


# ---------------------------------------------------------------- pretrained weights


def _vit_micro(num_classes, seed=0, img_size=32):
    from vit_scale.models import build_model, get_spec

    torch.manual_seed(seed)
    spec = get_spec("vit_micro")
    if img_size != spec.img_size:
        import dataclasses

        spec = dataclasses.replace(spec, img_size=img_size)
    return build_model(spec, num_classes)


@pytest.mark.parametrize("fmt", ["pth", "safetensors"])
def test_pretrained_file_loads_and_the_head_is_replaced(tmp_path, fmt):
    from vit_scale.distributed.base import ModelFactory
    from vit_scale.models import get_spec
    from vit_scale.recipes import pretrained

    source = _vit_micro(5, seed=1)
    saved = {k: v.clone() for k, v in source.state_dict().items()}
    path = str(tmp_path / f"w.{fmt}")
    if fmt == "pth":  # as timm's training script and DDP leave it: wrapped and prefixed
        torch.save({"state_dict": {f"module.{k}": v for k, v in saved.items()}, "epoch": 3}, path)
    else:
        pytest.importorskip("safetensors")
        from safetensors.torch import save_file

        save_file(saved, path)
    state, replaced = pretrained.prepare(path, _vit_micro(10).to("meta"))
    assert replaced and not any(k.startswith("head.") for k in state)
    factory = pretrained.PretrainedFactory(get_spec("vit_micro"), 10, 0, "device", 1, state)
    model = factory.on_device("cpu")
    for key, value in model.state_dict().items():
        if key.startswith("head."):
            assert value.shape[0] == 10
        else:
            assert torch.equal(value, saved[key]), key
    fresh = ModelFactory(get_spec("vit_micro"), 10, 0, "device", 1).on_device("cpu")
    assert torch.equal(model.head.weight, fresh.head.weight)  # the seed's head, the same on every rank
    kept_state, kept = pretrained.prepare(path, _vit_micro(5).to("meta"))  # same classes: head kept
    assert not kept and torch.equal(kept_state["head.weight"], saved["head.weight"])


def test_pretrained_at_another_image_size_has_its_position_embedding_resampled(tmp_path):
    from vit_scale.recipes import pretrained

    path = str(tmp_path / "w64.pth")
    torch.save(_vit_micro(10, img_size=64).state_dict(), path)  # 16x16 patches + class token
    state, _ = pretrained.prepare(path, _vit_micro(10).to("meta"))
    assert tuple(state["pos_embed"].shape) == (1, 65, 64)


@pytest.mark.parametrize(
    "case, words",
    [
        ("missing", ["finetune.pretrained", "no such file"]),
        ("garbage", ["finetune.pretrained", "cannot read"]),
        ("other_model", ["finetune.pretrained", "does not fit", "of another shape"]),
    ],
)
def test_unusable_pretrained_files_are_one_line_errors(tmp_path, case, words):
    from vit_scale.models import build_model, get_spec
    from vit_scale.recipes import pretrained

    path = tmp_path / "w.pth"
    if case == "garbage":
        path.write_bytes(b"not a checkpoint at all" * 10)
    elif case == "other_model":
        torch.save(build_model(get_spec("vit_tiny"), 10, device="meta").to_empty(device="cpu").state_dict(), path)
    with pytest.raises(UserError) as info:
        pretrained.prepare(str(path), _vit_micro(10).to("meta"))
    text = _one_line(info)
    for word in words:
        assert word in text, text
    assert str(path) in text


# ---------------------------------------------------------------- checkpoints (one-rank gloo group)


def _trained_ddp_strategy():
    """A DDP strategy over vit_micro in the one-rank group, one step trained (optimizer state to save)."""
    from vit_scale.distributed import parse_strategy, strategy_class
    from vit_scale.distributed.base import ModelFactory
    from vit_scale.launch.world import choose_device, detect_world
    from vit_scale.models import get_spec

    cfg = load_config(None, ["train.num_classes=10"])
    world = choose_device(detect_world("single"), "cpu")
    strategy = strategy_class("ddp")(cfg, parse_strategy("DDP"), world)
    strategy.setup(ModelFactory(get_spec("vit_micro"), 10, 0, "device", 1))
    strategy.train_step(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    return strategy


@pytest.fixture
def ddp_strategy():
    init_one_rank_group()
    strategy = None
    try:
        strategy = _trained_ddp_strategy()
        yield strategy
    finally:
        # pytest still holds the strategy here (and a failed test's traceback its frames): its DDP model and
        # optimizer are dropped from it, then collected, before the group goes (see end_one_rank_group)
        end_one_rank_group(strategy)


def test_the_ddp_model_is_gone_when_its_one_rank_group_ends():
    """The fixture's teardown order. Without it the DDP model (in reference cycles) outlived the group, its Reducer
    kept the group's gloo threads, and both died in whatever later test the cyclic collector ran: the suite hung
    there twice."""
    import torch.distributed as dist

    init_one_rank_group()
    strategy = None
    try:
        strategy = _trained_ddp_strategy()
        model = weakref.ref(strategy.model)
        test_locals_hold_it = strategy  # as pytest holds a fixture's value through its teardown
    finally:
        end_one_rank_group(strategy)
    assert model() is None, "the DDP model outlived its process group"
    assert not dist.is_initialized()
    assert vars(test_locals_hold_it) == {}


FACTS = {
    "model": "vit_micro",
    "strategy": "DDP",
    "world_size": 1,
    "batch_size": 32,
    "accumulation_steps": 1,
    "seed": 0,
    "num_classes": 10,
}


def test_checkpoint_round_trip_restores_model_optimizer_and_rng(ddp_strategy, tmp_path):
    directory = str(tmp_path / "ck")
    random.seed(11)
    torch.manual_seed(12)
    path = ckpt.save(ddp_strategy, directory, ckpt.Position(5, 1, 2), FACTS, keep=2)
    expected_draw = (random.random(), torch.rand(1).item())
    params = [p.detach().clone() for p in ddp_strategy.model.parameters()]
    with torch.no_grad():
        for p in ddp_strategy.model.parameters():
            p.zero_()
    meta = ckpt.read_meta(path)
    ckpt.verify(path, meta, FACTS)
    assert ckpt.load(ddp_strategy, path, meta) == ckpt.Position(5, 1, 2)
    assert all(torch.equal(a, b) for a, b in zip(params, ddp_strategy.model.parameters(), strict=True))
    assert (random.random(), torch.rand(1).item()) == expected_draw
    assert ddp_strategy.optimizer.state_dict()["state"][0]["step"].item() == 1
    assert ckpt.resolve_resume("auto", directory) == path == ckpt.resolve_resume(directory, "")


def test_a_failed_save_leaves_the_existing_checkpoint_untouched(ddp_strategy, tmp_path, monkeypatch):
    directory = str(tmp_path / "ck")
    good = ckpt.save(ddp_strategy, directory, ckpt.Position(5, 0, 5), FACTS, keep=0)
    before = {name: open(os.path.join(good, name), "rb").read() for name in os.listdir(good) if name != "state"}
    real_save = torch.save

    def disk_full(obj, file, *args, **kwargs):
        if str(file).endswith("state.pt"):
            real_save(obj, file, *args, **kwargs)
            with open(file, "r+b") as f:
                f.truncate(100)  # half written...
            raise OSError(28, "No space left on device")  # ...then the disk filled up
        return real_save(obj, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", disk_full)
    for step in (5, 6):  # the same step again, and a new one
        with pytest.raises(RuntimeError, match="No space left on device.*earlier checkpoints are untouched"):
            ckpt.save(ddp_strategy, directory, ckpt.Position(step, 0, step), FACTS, keep=0)
    assert sorted(os.listdir(directory)) == ["latest", "step-00000005"]  # no temporary left, no step 6
    assert {name: open(os.path.join(good, name), "rb").read() for name in before} == before
    ckpt.verify(good, ckpt.read_meta(good), FACTS)
    monkeypatch.setattr(torch, "save", real_save)
    again = ckpt.save(ddp_strategy, directory, ckpt.Position(5, 0, 5), FACTS, keep=0)  # replaced only when complete
    assert again == good and ckpt.latest(directory) == good


def test_only_the_newest_checkpoints_are_kept(ddp_strategy, tmp_path):
    directory = str(tmp_path / "ck")
    for step in (2, 4, 6, 8):
        ckpt.save(ddp_strategy, directory, ckpt.Position(step, 0, step), FACTS, keep=2)
    assert [os.path.basename(p) for p in ckpt.complete_checkpoints(directory)] == ["step-00000006", "step-00000008"]
    assert open(os.path.join(directory, "latest")).read().strip() == "step-00000008"


@pytest.mark.parametrize(
    "case, words",
    [
        ("other_model", ["meta.json", "vit_micro under DDP", "vit_tiny under DDP"]),
        ("other_strategy", ["meta.json", "vit_micro under DDP", "FULL_SHARD"]),
        ("other_world", ["meta.json", "1 ranks", "4"]),
        ("flipped_byte", ["state.pt", "corrupt", "sha256"]),
        ("truncated", ["rank-00000.pt", "corrupt", "bytes"]),
        ("missing_file", ["state.pt", "missing"]),
        ("bad_meta", ["meta.json", "corrupt"]),
    ],
)
def test_unusable_checkpoints_are_one_line_errors_naming_the_file(ddp_strategy, tmp_path, case, words):
    path = ckpt.save(ddp_strategy, str(tmp_path / "ck"), ckpt.Position(3, 0, 3), FACTS, keep=0)
    expected = dict(FACTS)
    if case == "other_model":
        expected["model"] = "vit_tiny"
    elif case == "other_strategy":
        expected["strategy"] = "FULL_SHARD"
    elif case == "other_world":
        expected["world_size"] = 4
    elif case == "flipped_byte":
        with open(os.path.join(path, "state.pt"), "r+b") as f:
            f.seek(os.path.getsize(os.path.join(path, "state.pt")) // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif case == "truncated":
        with open(os.path.join(path, "rank-00000.pt"), "r+b") as f:
            f.truncate(50)
    elif case == "missing_file":
        os.remove(os.path.join(path, "state.pt"))
    elif case == "bad_meta":
        with open(os.path.join(path, "meta.json"), "w") as f:
            f.write('{"model": "vit_mic')
    with pytest.raises(UserError) as info:
        ckpt.verify(path, ckpt.read_meta(path), expected)
    text = _one_line(info)
    for word in words:
        assert word in text, text


def test_a_checkpoint_that_fails_to_load_names_its_file(ddp_strategy, tmp_path):
    """Past verification (a file too big to hash, say), a load failure is still one line naming the file."""
    path = ckpt.save(ddp_strategy, str(tmp_path / "ck"), ckpt.Position(3, 0, 3), FACTS, keep=0)
    with open(os.path.join(path, "state.pt"), "wb") as f:
        f.write(b"PK\x03\x04 garbage")
    with pytest.raises(UserError) as info:
        ckpt.load(ddp_strategy, path, ckpt.read_meta(path))
    assert os.path.join(path, "state.pt") in _one_line(info)


def test_resume_paths(tmp_path):
    assert ckpt.resolve_resume("", "x") is None
    assert ckpt.resolve_resume("auto", str(tmp_path)) is None  # first run of a requeued job: a fresh start
    with pytest.raises(UserError, match="checkpoint.dir"):
        ckpt.resolve_resume("auto", "")
    with pytest.raises(UserError, match="no such checkpoint"):
        ckpt.resolve_resume(str(tmp_path / "nope"), "")
    with pytest.raises(UserError, match="holds no checkpoint"):
        ckpt.resolve_resume(str(tmp_path), "")


# ---------------------------------------------------------------- evaluation files, CLI


def test_confusion_matrix_files(tmp_path):
    from vit_scale.recipes.evaluate import EvalResult, plot_confusion, write_confusion_csv, write_per_class_csv

    result = EvalResult(loss=0.5, top1=0.75, top5=1.0, images=8, confusion=[[3, 1, 0], [0, 2, 0], [1, 0, 1]])
    classes = ["a", "b", "c"]
    write_confusion_csv(tmp_path / "cm.csv", result, classes)
    write_per_class_csv(tmp_path / "pc.csv", result, classes)
    plot_confusion(str(tmp_path / "cm.png"), result, classes, "test")
    rows = list(csv.reader(open(tmp_path / "cm.csv")))
    assert rows[0][1:] == classes and sum(int(v) for r in rows[1:] for v in r[1:]) == 8
    per_class = list(csv.DictReader(open(tmp_path / "pc.csv")))
    assert [(r["class"], r["images"], r["correct"]) for r in per_class] == [
        ("a", "4", "3"),
        ("b", "2", "2"),
        ("c", "2", "1"),
    ]
    assert float(per_class[0]["accuracy"]) == 0.75
    assert open(tmp_path / "cm.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_knows_finetune(capsys, tmp_path):
    from vit_scale import cli

    assert cli.main(["--help"]) == 0 and "finetune" in capsys.readouterr().out
    assert cli.main(["finetune", f"data.path={tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such directory" in err


def test_metadata_is_json(ddp_strategy, tmp_path):
    path = ckpt.save(ddp_strategy, str(tmp_path / "ck"), ckpt.Position(1, 0, 1), {**FACTS, "reason": "test"}, 0)
    meta = json.load(open(os.path.join(path, "meta.json")))
    assert meta["reason"] == "test" and meta["checkpoint_format"] == "full" and "state.pt" in meta["files"]
