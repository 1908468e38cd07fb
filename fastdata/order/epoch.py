"""Sample order: pure functions of (seed, epoch), no IO, so that order never depends on worker count."""

from __future__ import annotations

import numpy as np


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The sample indices of one epoch: a permutation drawn from (seed, epoch), or 0..n-1 unshuffled."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng((seed, epoch)).permutation(num_samples).astype(np.int64)


def split_batches(indices: np.ndarray, batch_size: int, drop_last: bool) -> list[np.ndarray]:
    """Cut an epoch's indices into consecutive batches; the short tail is kept unless `drop_last`."""
    stop = len(indices) - len(indices) % batch_size if drop_last else len(indices)
    return [indices[i:i + batch_size] for i in range(0, stop, batch_size)]


def num_batches(num_samples: int, batch_size: int, drop_last: bool) -> int:
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


def sample_rng(seed: int, epoch: int, *position: int) -> np.random.Generator:
    """The RNG that draws one sample's augmentation: a function of (seed, epoch, sample position) alone."""
    return np.random.default_rng((seed, epoch, *position))


def sample_seed(seed: int, epoch: int, *position: int) -> int:
    """A 32-bit seed for third-party transforms (albumentations), derived like `sample_rng`."""
    return int(np.random.SeedSequence((seed, epoch, *position)).generate_state(1)[0])
