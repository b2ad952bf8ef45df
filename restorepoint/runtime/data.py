"""Data order: each epoch a permutation seeded with ``seed + epoch``, and the effective batches
already committed in the epoch being resumed skipped, never replayed (replaying one would step
the optimizer and the scheduler twice)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

__all__ = ["EpochSampler", "effective_batches"]


class EpochSampler(Sampler[int]):
    """The indices of one epoch: a permutation seeded with ``seed + epoch`` (or the identity
    order), from ``skip`` on. The same for every run with the same seed, so a resumed epoch
    sees exactly the order the interrupted one saw."""

    def __init__(self, length: int, seed: int, epoch: int, skip: int = 0, shuffle: bool = True):
        self.length = length
        self.seed = seed
        self.epoch = epoch
        self.skip = max(0, min(skip, length))
        self.shuffle = shuffle

    def order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order()[self.skip :])

    def __len__(self) -> int:
        return self.length - self.skip


def effective_batches(loader: Iterable[Any], accumulate: int = 1) -> Iterator[list[Any]]:
    """Group micro-batches into effective batches of ``accumulate`` (the last may be shorter)."""
    group: list[Any] = []
    for item in loader:
        group.append(item)
        if len(group) == accumulate:
            yield group
            group = []
    if group:
        yield group
