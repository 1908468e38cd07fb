"""Sample order: pure functions of (seed, epoch), no IO, so that order never depends on worker count."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The sample indices of one epoch: a permutation drawn from (seed, epoch), or 0..n-1 unshuffled."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng((seed, epoch)).permutation(num_samples).astype(np.int64, copy=False)


class Batches(Sequence[np.ndarray]):
    """An epoch's indices cut into consecutive batches of `batch_size`, made one at a time (each a view of
    `indices`) when asked for: no Python object per batch is built up front, so that an epoch of millions of
    samples in small batches (text rows) starts as fast as a small one. A list of arrays in every other way:
    `len`, `batches[j]`, iteration, and `batches[j:]` (the same batches from j on, lazily too)."""

    def __init__(self, indices: np.ndarray, batch_size: int, drop_last: bool) -> None:
        self.indices, self.batch_size = indices, batch_size
        self.stop = len(indices) - len(indices) % batch_size if drop_last else len(indices)

    def __len__(self) -> int:
        return -(-self.stop // self.batch_size)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | Sequence[np.ndarray]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1 and stop == len(self):
                return Batches(self.indices[start * self.batch_size:self.stop], self.batch_size, False)
            return [self[j] for j in range(start, stop, step)]
        number = index + len(self) if index < 0 else index
        if not 0 <= number < len(self):
            raise IndexError(f"batch {index} out of range for {len(self)} batches")
        start = number * self.batch_size
        return self.indices[start:min(start + self.batch_size, self.stop)]

    def __iter__(self) -> Iterator[np.ndarray]:
        for start in range(0, self.stop, self.batch_size):
            yield self.indices[start:min(start + self.batch_size, self.stop)]


def split_batches(indices: np.ndarray, batch_size: int, drop_last: bool) -> Batches:
    """Cut an epoch's indices into consecutive batches (`Batches`, made lazily); the short tail is kept unless
    `drop_last`."""
    return Batches(indices, batch_size, drop_last)


def num_batches(num_samples: int, batch_size: int, drop_last: bool) -> int:
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


def sample_rng(seed: int, epoch: int, *position: int) -> np.random.Generator:
    """The RNG that draws one sample's augmentation: a function of (seed, epoch, sample position) alone."""
    return np.random.default_rng((seed, epoch, *position))


def sample_seed(seed: int, epoch: int, *position: int) -> int:
    """A 32-bit seed for third-party transforms (albumentations), derived like `sample_rng`."""
    return int(np.random.SeedSequence((seed, epoch, *position)).generate_state(1)[0])
