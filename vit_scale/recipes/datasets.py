"""Real images for fine-tuning: where they come from, how they are transformed, who reads which.

Sources (nothing is ever downloaded; a missing dataset is an error naming the path):
- an image folder, one sub-folder per class (`<path>/<class>/<image>`), optionally split into
  `<path>/train/...` and `<path>/val|validation|test/...`;
- CIFAR-10 and CIFAR-100 as their standard python-pickle files (`cifar-10-batches-py/`,
  `cifar-100-python/`, or the files themselves in `<path>`);
- a Hugging Face `datasets` dataset written with `save_to_disk` (needs the `datasets` package).
Without a validation split, `data.val_fraction` of each class is held out of train (seeded).

Data order is a function of (seed, epoch, position) alone, so a resumed run sees the same
batches as an uninterrupted one: the training sampler is torch's DistributedSampler (one seeded
permutation per epoch, each rank a strided share) started part-way through an epoch, and every
random augmentation is seeded per sample from (seed, epoch, image index), whichever loader worker
happens to decode it.
"""

from __future__ import annotations

import math
import os
import pickle
import random
from dataclasses import dataclass

from torch.utils.data import DistributedSampler

from vit_scale.errors import UserError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
VAL_SPLIT_NAMES = ("val", "validation", "test")
NORMALIZATION = {
    "inception": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # timm's ViT weights (augreg, in21k)
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


# ---------------------------------------------------------------- sources: index -> PIL image, label


class FolderSource:
    def __init__(self, paths: list[str], labels: list[int]):
        self.paths, self.labels = paths, labels

    def __len__(self) -> int:
        return len(self.paths)

    def image(self, index: int):
        from PIL import Image

        with Image.open(self.paths[index]) as img:
            return img.convert("RGB")  # grayscale and palette images become 3 channels, as the model wants


class ArraySource:
    """CIFAR: uint8 images (N, 32, 32, 3) held in memory."""

    def __init__(self, images, labels: list[int]):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def image(self, index: int):
        from PIL import Image

        return Image.fromarray(self.images[index])


class HFSource:
    def __init__(self, dataset, image_key: str, labels: list[int]):
        self.dataset, self.image_key, self.labels = dataset, image_key, labels

    def __len__(self) -> int:
        return len(self.labels)

    def image(self, index: int):
        import numpy as np
        from PIL import Image

        img = self.dataset[index][self.image_key]
        if not isinstance(img, Image.Image):  # an array column rather than an Image feature
            img = Image.fromarray(np.asarray(img, dtype=np.uint8))
        return img.convert("RGB")


@dataclass
class Split:
    source: object
    indices: list[int]  # positions in source that belong to this split
    where: str  # for messages and the run record

    def __len__(self) -> int:
        return len(self.indices)

    def labels(self) -> list[int]:
        return [self.source.labels[i] for i in self.indices]


@dataclass
class Splits:
    train: Split
    val: Split
    classes: list[str]
    format: str

    def describe(self) -> dict:
        return {
            "format": self.format,
            "classes": len(self.classes),
            "train_images": len(self.train),
            "val_images": len(self.val),
            "train": self.train.where,
            "val": self.val.where,
        }


# ---------------------------------------------------------------- finding a dataset


def load_splits(data, seed: int) -> Splits:
    """The train and validation splits `data` (a DataConfig) names; UserError for anything unusable."""
    path = data.path
    if not path:
        raise UserError(
            "data.path: no dataset given; set data.path to an image folder, CIFAR-10/100 python "
            "files or a Hugging Face dataset saved with save_to_disk"
        )
    if not os.path.exists(path):
        raise UserError(f"data.path: no such directory: {path} (nothing is downloaded at run time)")
    if not os.path.isdir(path):
        raise UserError(f"data.path: {path} is a file, not a directory")
    fmt = data.format if data.format != "auto" else detect_format(path)
    loader = {"imagefolder": _image_folder, "cifar10": _cifar10, "cifar100": _cifar100, "hf": _hugging_face}[fmt]
    splits = loader(data, path, seed)
    if len(splits.classes) < 2:
        raise UserError(
            f"data.path: {splits.train.where} has {len(splits.classes)} class"
            f"{'' if len(splits.classes) == 1 else 'es'} ({', '.join(splits.classes)}); "
            f"fine-tuning needs at least 2"
        )
    return splits


def detect_format(path: str) -> str:
    names = set(os.listdir(path))
    if "data_batch_1" in names or "cifar-10-batches-py" in names:
        return "cifar10"
    if {"train", "test", "meta"} <= names and os.path.isfile(os.path.join(path, "meta")) or "cifar-100-python" in names:
        return "cifar100"
    if "dataset_dict.json" in names or "state.json" in names:
        return "hf"
    return "imagefolder"


def _carve(source, where: str, data, seed: int) -> tuple[Split, Split]:
    """Hold `val_fraction` of every class out of train, the same images on every rank and run."""
    if data.val_fraction <= 0:
        raise UserError(
            f"data.val_split: {where} has no validation split and data.val_fraction is 0; "
            f"set data.val_fraction (e.g. 0.1) or add a validation split ({', '.join(VAL_SPLIT_NAMES)})"
        )
    by_class: dict[int, list[int]] = {}
    for i, label in enumerate(source.labels):
        by_class.setdefault(label, []).append(i)
    rng = random.Random(seed)
    train, val = [], []
    for label in sorted(by_class):
        members = by_class[label]
        rng.shuffle(members)
        n_val = min(len(members) - 1, max(1, round(data.val_fraction * len(members))))
        val += members[:n_val]
        train += members[n_val:]
    return (
        Split(source, sorted(train), f"{where} (train part)"),
        Split(source, sorted(val), f"{where} (val_fraction {data.val_fraction} held out)"),
    )


def _val_name(data, available: list[str], where: str) -> str | None:
    """The validation split to use: the named one, the first usual one present, or None (carve)."""
    if data.val_split == "none":
        return None
    if data.val_split != "auto":
        if data.val_split not in available:
            raise UserError(
                f"data.val_split: {where} has no split '{data.val_split}'; it has: "
                f"{', '.join(available) or 'none'} (or use auto / none)"
            )
        return data.val_split
    return next((name for name in VAL_SPLIT_NAMES if name in available and name != data.train_split), None)


# ---------------------------------------------------------------- image folder


def _scan_classes(root: str) -> dict[str, list[str]]:
    """{class: sorted image paths} for every sub-folder of root that holds images."""
    found: dict[str, list[str]] = {}
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise UserError(f"data.path: cannot read {root}: {exc.strerror}") from None
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        images = sorted(
            f.path
            for f in os.scandir(entry.path)
            if f.is_file() and not f.name.startswith(".") and f.name.lower().endswith(IMAGE_EXTENSIONS)
        )
        if images:
            found[entry.name] = images
    return found


def _folder_source(per_class: dict[str, list[str]], classes: list[str]) -> FolderSource:
    index = {name: i for i, name in enumerate(classes)}
    paths, labels = [], []
    for name, images in per_class.items():
        paths += images
        labels += [index[name]] * len(images)
    return FolderSource(paths, labels)


def _no_images(where: str) -> UserError:
    return UserError(
        f"data.path: {where} holds no images in class folders (expected {where}/<class>/<image>, "
        f"one folder per class; image types: {' '.join(IMAGE_EXTENSIONS)})"
    )


def _image_folder(data, path: str, seed: int) -> Splits:
    subdirs = sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
    train_dir = os.path.join(path, data.train_split)
    if not os.path.isdir(train_dir):
        if data.train_split != "train":
            raise UserError(f"data.train_split: no folder {train_dir}; {path} has: {', '.join(subdirs) or 'nothing'}")
        train_dir = path  # the class folders sit directly under path; there is no separate validation split
    train_classes = _scan_classes(train_dir)
    if not train_classes:
        raise _no_images(train_dir)
    classes = sorted(train_classes)
    if len(classes) < 2:
        raise UserError(
            f"data.path: {train_dir} has 1 class ({classes[0]}); fine-tuning needs at least 2 class folders"
        )
    train_source = _folder_source(train_classes, classes)
    val_name = None if train_dir == path else _val_name(data, [d for d in subdirs if d != data.train_split], path)
    if train_dir == path and data.val_split not in ("auto", "none"):
        raise UserError(f"data.val_split: {path} has no train/ and {data.val_split}/ folders, only class folders")
    if val_name is None:
        train, val = _carve(train_source, train_dir, data, seed)
        return Splits(train, val, classes, "imagefolder")
    val_dir = os.path.join(path, val_name)
    val_classes = _scan_classes(val_dir)
    if not val_classes:
        raise _no_images(val_dir)
    unknown = sorted(set(val_classes) - set(classes))
    if unknown:
        raise UserError(
            f"data.path: {val_dir} has classes that {train_dir} lacks: {', '.join(unknown[:5])}"
            f"{' ...' if len(unknown) > 5 else ''}"
        )
    val_source = _folder_source(val_classes, classes)
    return Splits(
        Split(train_source, list(range(len(train_source))), train_dir),
        Split(val_source, list(range(len(val_source))), val_dir),
        classes,
        "imagefolder",
    )


# ---------------------------------------------------------------- CIFAR (python version)


def _unpickle(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="bytes")
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise UserError(f"data.path: cannot read {path}: {' '.join(str(exc).split())}") from None


def _cifar_arrays(batches: list[str], label_key: bytes):
    import numpy as np

    images, labels = [], []
    for path in batches:
        batch = _unpickle(path)
        if b"data" not in batch or label_key not in batch:
            raise UserError(f"data.path: {path} is not a CIFAR batch (no {b'data'!r} / {label_key!r} entries)")
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels += [int(v) for v in batch[label_key]]
    return np.ascontiguousarray(np.concatenate(images)), labels


def _cifar(
    data,
    path: str,
    seed: int,
    name: str,
    folder: str,
    train_files: list[str],
    test_file: str,
    meta_file: str,
    label_key: bytes,
    names_key: bytes,
) -> Splits:
    root = os.path.join(path, folder) if os.path.isdir(os.path.join(path, folder)) else path
    for file in [*train_files, test_file, meta_file]:
        if not os.path.isfile(os.path.join(root, file)):
            raise UserError(
                f"data.path: {root} is not {name}'s python version: {file} is missing (extract "
                f"{folder.split('-batches')[0].replace('-python', '')}-python.tar.gz there; nothing is "
                f"downloaded at run time)"
            )
    meta = _unpickle(os.path.join(root, meta_file))
    classes = [n.decode() if isinstance(n, bytes) else str(n) for n in meta.get(names_key, [])]
    images, labels = _cifar_arrays([os.path.join(root, f) for f in train_files], label_key)
    train_source = ArraySource(images, labels)
    if not classes:
        classes = [str(i) for i in range(max(labels) + 1)]
    val_name = _val_name(data, ["test"], root)
    if val_name is None:
        train, val = _carve(train_source, root, data, seed)
        return Splits(train, val, classes, name.lower().replace("-", ""))
    test_images, test_labels = _cifar_arrays([os.path.join(root, test_file)], label_key)
    return Splits(
        Split(train_source, list(range(len(labels))), os.path.join(root, "train")),
        Split(ArraySource(test_images, test_labels), list(range(len(test_labels))), os.path.join(root, test_file)),
        classes,
        name.lower().replace("-", ""),
    )


def _cifar10(data, path, seed):
    return _cifar(
        data,
        path,
        seed,
        "CIFAR-10",
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        "test_batch",
        "batches.meta",
        b"labels",
        b"label_names",
    )


def _cifar100(data, path, seed):
    return _cifar(
        data,
        path,
        seed,
        "CIFAR-100",
        "cifar-100-python",
        ["train"],
        "test",
        "meta",
        b"fine_labels",
        b"fine_label_names",
    )


# ---------------------------------------------------------------- Hugging Face datasets (save_to_disk)


def _hugging_face(data, path: str, seed: int) -> Splits:
    try:
        import datasets
    except ImportError:
        raise UserError(
            "data.format: hf needs the datasets package, which is not installed "
            "(pip install datasets, with a constraints file pinning torch)"
        ) from None
    try:
        loaded = datasets.load_from_disk(path)
    except Exception as exc:
        raise UserError(
            f"data.path: {path} is not a Hugging Face dataset saved with save_to_disk: "
            f"{' '.join(str(exc).split())[:300]}"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        available = list(loaded)
        if data.train_split not in loaded:
            raise UserError(
                f"data.train_split: {path} has no split '{data.train_split}'; it has: {', '.join(available)}"
            )
        train_ds = loaded[data.train_split]
        val_name = _val_name(data, [s for s in available if s != data.train_split], path)
        val_ds = loaded[val_name] if val_name else None
    else:
        train_ds, val_name, val_ds = loaded, None, None
    image_key, label_key = _hf_columns(data, train_ds, path)
    names = getattr(train_ds.features[label_key], "names", None)
    labels = [int(v) for v in train_ds[label_key]]
    classes = list(names) if names else [str(i) for i in range(max(labels) + 1)]
    train_source = HFSource(train_ds, image_key, labels)
    if val_ds is None:
        train, val = _carve(train_source, path, data, seed)
        return Splits(train, val, classes, "hf")
    for key in (image_key, label_key):
        if key not in val_ds.column_names:
            raise UserError(f"data.path: split '{val_name}' of {path} has no column '{key}'")
    val_labels = [int(v) for v in val_ds[label_key]]
    return Splits(
        Split(train_source, list(range(len(labels))), f"{path} [{data.train_split}]"),
        Split(HFSource(val_ds, image_key, val_labels), list(range(len(val_labels))), f"{path} [{val_name}]"),
        classes,
        "hf",
    )


def _hf_columns(data, ds, path: str) -> tuple[str, str]:
    import datasets

    columns = ds.column_names

    def pick(key: str, setting: str, feature_type, usual: tuple[str, ...]) -> str:
        if setting != "auto":
            if setting not in columns:
                raise UserError(f"data.{key}: {path} has no column '{setting}'; it has: {', '.join(columns)}")
            return setting
        typed = [c for c in columns if isinstance(ds.features[c], feature_type)]
        named = [c for c in usual if c in columns]
        if typed or named:
            return (typed or named)[0]
        raise UserError(
            f"data.{key}: cannot tell which column of {path} holds the "
            f"{key.split('_')[0]}s among {', '.join(columns)}; set data.{key}"
        )

    return (
        pick("image_key", data.image_key, datasets.Image, ("image", "img")),
        pick("label_key", data.label_key, datasets.ClassLabel, ("label", "labels", "fine_label")),
    )


# ---------------------------------------------------------------- transforms


class _ToRGB:
    """A named callable rather than a lambda, so transforms pickle into spawned loader workers."""

    def __call__(self, img):
        return img.convert("RGB") if img.mode != "RGB" else img


def random_augmentation(data, train: bool) -> bool:
    """Whether build_transform's transform draws random numbers (a random crop, and a flip for "standard")."""
    return train and data.augment != "none"


def build_transform(data, img_size: int, train: bool):
    from vit_scale.compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from torchvision import transforms as T

    bicubic = T.InterpolationMode.BICUBIC
    ops = [_ToRGB()]
    if random_augmentation(data, train):
        ops.append(
            T.RandomResizedCrop(img_size, scale=(data.crop_scale_min, 1.0), interpolation=bicubic, antialias=True)
        )
        if data.augment == "standard":
            ops.append(T.RandomHorizontalFlip())
    else:
        # the whole image at the model's size: these datasets are mostly small images upscaled
        ops.append(T.Resize((img_size, img_size), interpolation=bicubic, antialias=True))
    ops.append(T.ToTensor())
    if data.normalize != "none":
        mean, std = NORMALIZATION[data.normalize]
        ops.append(T.Normalize(mean, std))
    return T.Compose(ops)


# ---------------------------------------------------------------- datasets and samplers


def sample_seed(seed: int, epoch: int, index: int) -> int:
    return ((seed * 1_000_003 + epoch) * 10_000_019 + index) % (2**63)


class ImageDataset:
    """Keys are (epoch, position, valid) from the samplers below; items (image, label, valid). With `train`,
    each item's transform draws its random numbers from a seed of its own (random augmentations)."""

    def __init__(self, split: Split, transform, seed: int, train: bool):
        self.split, self.transform, self.seed, self.train = split, transform, seed, train

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, key):
        import torch

        epoch, position, valid = key
        index = self.split.indices[position]
        image = self.split.source.image(index)
        if self.train:
            # augmentation drawn from (seed, epoch, image) alone: the same crops whichever worker,
            # whatever the worker count, and after a resume; fork_rng leaves the caller's RNG alone. Only the
            # CPU generator, which the transforms draw from: torch.manual_seed would also reseed every GPU's
            # (which fork_rng(devices=[]) does not restore) and, on a machine without one, queue that call
            # with its stack each time (torch.cuda._lazy_call: about 0.13 ms an image)
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(sample_seed(self.seed, epoch, index))
                tensor = self.transform(image)
        else:
            tensor = self.transform(image)
        return tensor, self.split.source.labels[index], valid


class ResumableDistributedSampler(DistributedSampler):
    """torch's DistributedSampler (drop_last, so every rank takes the same number of steps) that can
    start part-way through an epoch: a resumed run skips what the checkpointed run already used."""

    def __init__(self, size: int, rank: int, world_size: int, seed: int, shuffle: bool = True):
        super().__init__(range(size), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
        self.start = 0

    def set_position(self, epoch: int, start: int = 0) -> None:
        """Epoch (0-based) and how many of this rank's samples of it are already done."""
        self.set_epoch(epoch)
        self.start = start

    def __iter__(self):
        for index in list(super().__iter__())[self.start :]:
            yield (self.epoch, index, True)

    def __len__(self) -> int:
        return self.num_samples - self.start


class ShardedEvalSampler:
    """Each rank a strided share of the validation set, every image exactly once over all ranks.
    Shares are padded (marked not valid) to equal length: FSDP's forward is a collective, so every
    rank must run the same number of batches."""

    def __init__(self, size: int, rank: int, world_size: int):
        own = list(range(rank, size, world_size))
        per_rank = math.ceil(size / world_size)
        self.keys = [(-1, i, True) for i in own] + [(-1, own[0] if own else 0, False)] * (per_rank - len(own))

    def __iter__(self):
        return iter(self.keys)

    def __len__(self) -> int:
        return len(self.keys)


def _quiet_worker(_worker_id: int) -> None:
    """Loader workers leave Slurm's end-of-time signals to the training process, which finishes its
    step and saves a checkpoint: `--signal` without B: and scancel signal every process of the
    step, and a worker killed by SIGUSR1 or SIGTERM makes torch's loader raise in the training
    process. Workers end when their iterator is done (they are not persistent, see make_loader),
    when the training process is gone (torch's watchdog), or by SIGKILL."""
    import signal

    # a forked worker also inherits the training process's wakeup fd: its signals must not reach
    # the training process's signal watcher as if they were the training process's own
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def make_loader(dataset: ImageDataset, sampler, batch_size: int, workers: int, pin_memory: bool, drop_last: bool):
    from torch.utils.data import DataLoader

    # Not persistent: workers start with each epoch's iterator and stop with it. Persistent ones
    # would outlive the loop, and at exit multiprocessing stops them with SIGTERM, which they
    # ignore (above). Workers come from a fork server, not a fork of this multi-threaded process
    # (vit_scale/recipes/loader_worker.py says why); a worker's start costs a fraction of a second and
    # the pickled dataset, seen in the first step's data_time_s.
    context = None
    if workers > 0:
        import multiprocessing

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["vit_scale.recipes.loader_worker"])
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        drop_last=drop_last,
        persistent_workers=False,
        worker_init_fn=_quiet_worker if workers > 0 else None,
        multiprocessing_context=context,
    )
