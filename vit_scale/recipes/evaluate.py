"""Validation: loss, top-1 and top-5 accuracy, and the confusion matrix they come from.

Every rank evaluates its share of the validation set (each image exactly once over all ranks,
see datasets.ShardedEvalSampler); the sums and the confusion matrix are all-reduced, so every
rank ends with the same figures. The loss is plain cross-entropy (no label smoothing), so it
is comparable across runs whatever their training settings.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass


@dataclass
class EvalResult:
    loss: float
    top1: float
    top5: float
    images: int
    confusion: list[list[int]]  # confusion[true][predicted]

    def per_class(self) -> list[tuple[int, int, float | None]]:
        """(support, correct, accuracy or None when the class has no images) for every class."""
        rows = []
        for i, row in enumerate(self.confusion):
            support = sum(row)
            rows.append((support, row[i], row[i] / support if support else None))
        return rows


def evaluate(strategy, loader, num_classes: int, device) -> EvalResult:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    k = min(5, num_classes)
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=device)
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top-1 hits, top-k hits, images
    strategy.set_training(False)
    try:
        for images, labels, valid in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            valid = valid.to(device, non_blocking=True)
            logits = strategy.eval_logits(images).float()
            losses = F.cross_entropy(logits, labels, reduction="none")
            top = logits.topk(k, dim=1).indices
            hits = top == labels[:, None]
            sums += torch.stack(
                [
                    torch.where(valid, losses, 0.0).sum().double(),
                    (hits[:, 0] & valid).sum().double(),
                    (hits.any(dim=1) & valid).sum().double(),
                    valid.sum().double(),
                ]
            )
            cells = labels[valid] * num_classes + top[valid, 0]
            confusion += torch.bincount(cells, minlength=num_classes * num_classes)
    finally:
        strategy.set_training(True)
    dist.all_reduce(sums)
    dist.all_reduce(confusion)
    loss, top1, topk, images = sums.tolist()
    images = int(images)
    matrix = confusion.view(num_classes, num_classes).tolist()
    return EvalResult(loss / max(images, 1), top1 / max(images, 1), topk / max(images, 1), images, matrix)


# ---------------------------------------------------------------- files (rank 0, at the end)


def write_confusion_csv(path: str, result: EvalResult, classes: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["true \\ predicted", *classes])
        for name, row in zip(classes, result.confusion, strict=True):
            writer.writerow([name, *row])


def write_per_class_csv(path: str, result: EvalResult, classes: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["class", "images", "correct", "accuracy"])
        for name, (support, correct, accuracy) in zip(classes, result.per_class(), strict=True):
            writer.writerow([name, support, correct, "" if accuracy is None else f"{accuracy:.6f}"])


def plot_confusion(path: str, result: EvalResult, classes: list[str], title: str) -> None:
    """Rows normalised to recall (so small classes are as visible as large ones); counts written
    in the cells when there are few enough classes to read them."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = np.asarray(result.confusion, dtype=np.int64)
    n = len(classes)
    support = counts.sum(axis=1, keepdims=True)
    recall = np.divide(counts, support, out=np.zeros(counts.shape, dtype=float), where=support > 0)
    side = min(24.0, max(5.0, 0.35 * n + 2.5))
    fig = Figure(figsize=(side, side * 0.9))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(recall, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    if n <= 50:
        ax.set_xticks(range(n), classes, rotation=90, fontsize=8)
        ax.set_yticks(range(n), classes, fontsize=8)
    if n <= 20:
        for i in range(n):
            for j in range(n):
                if counts[i, j]:
                    ax.text(
                        j,
                        i,
                        str(counts[i, j]),
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if recall[i, j] > 0.5 else "black",
                    )
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(f"{title}\n{result.images} images, top-1 {result.top1 * 100:.2f}%")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
