"""Synthetic images and labels, made once on the device.

The study measures compute and communication, not input pipelines: a few seeded batches are
created up front and cycled, so no step waits for data and the same seed gives the same losses.
Each rank draws its own batches (seed + rank), as a distributed sampler would.
"""

from __future__ import annotations


class SyntheticBatches:
    def __init__(self, batch_size: int, img_size: int, num_classes: int, device, seed: int, rank: int, count: int = 4):
        import torch

        gen = torch.Generator(device="cpu").manual_seed(seed * 100_003 + rank)
        # made on the CPU generator and then moved, so CPU and GPU runs see the same data
        self.batches = [
            (
                torch.randn(batch_size, 3, img_size, img_size, generator=gen).to(device),
                torch.randint(0, num_classes, (batch_size,), generator=gen).to(device),
            )
            for _ in range(count)
        ]

    def __getitem__(self, step: int):
        return self.batches[step % len(self.batches)]
