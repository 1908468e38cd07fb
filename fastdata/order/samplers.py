"""Batch samplers: which samples form each batch of an epoch on one rank, as pure functions of (seed, epoch,
rank, world size) and the dataset's size (and, for length buckets, its documents' lengths). They run in the main
process, so the epoch set there reaches persistent workers with every item."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from fastdata.order.epoch import epoch_order, num_batches, split_batches
from fastdata.order.ranks import check_not_empty, check_uneven, interleaved_part, rank_count


class EpochBatchSampler:
    """Yields `(epoch, indices)` per batch of the current epoch; runs in the main process, so the epoch set
    here reaches persistent workers with every item.

    With several ranks, each takes every world_size-th sample of the epoch's order (padded by wrapping or cut,
    per `uneven`), so every rank yields the same number of batches. `start` (a position in the epoch's order)
    and `skip` (batches of this rank's epoch) say where a resumed epoch continues; both apply to `epoch` only."""

    #: Whether an epoch resumed on another world size can continue from its position in the order.
    repartitions = True
    #: Whether `rollover` may continue into the following epochs (this class's own order only: a subclass that
    #: orders its batches otherwise says False).
    can_roll_over = True

    def __init__(self, num_samples: int, batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                 rank: int = 0, world_size: int = 1, uneven: str = "pad") -> None:
        self.num_samples, self.batch_size = num_samples, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size, self.uneven = rank, world_size, check_uneven(uneven)
        check_not_empty(num_samples, world_size, uneven, "the dataset")
        self.epoch = 0
        self.start = 0
        self.skip = 0
        # with persistent workers, an iterator that goes on into epoch + 1, + 2, ... (from their start) once this
        # one's batches are given out, so that the workers build the next epoch's first batches while the last
        # ones of this epoch are used: the loader reads each pass's batches off it (fastdata.image.loader)
        self.rollover = False

    def rank_indices(self) -> np.ndarray:
        """This rank's sample indices of the current epoch, in order (from `start` on)."""
        return self.rank_indices_for(self.epoch, self.start)

    def rank_indices_for(self, epoch: int, start: int) -> np.ndarray:
        """This rank's sample indices of `epoch` from position `start` (the current pass's attributes untouched:
        another thread may be opening the next pass)."""
        order = epoch_order(self.num_samples, self.seed, epoch, self.shuffle)
        return interleaved_part(order, self.rank, self.world_size, self.uneven, start)

    def epoch_batches(self) -> Sequence[np.ndarray]:
        """This rank's batches of the current epoch (from `start` on, before skipping), made as they are asked for."""
        return self.batches_for(self.epoch, self.start)

    def batches_for(self, epoch: int, start: int) -> Sequence[np.ndarray]:
        """This rank's batches of `epoch` from position `start` (before skipping), as `epoch_batches` for that pass."""
        return split_batches(self.rank_indices_for(epoch, start), self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        epoch, start, skip, rollover = self.epoch, self.start, self.skip, self.rollover and self.can_roll_over
        for chunk in self.batches_for(epoch, start)[skip:]:
            yield epoch, chunk
        while rollover:  # the epochs after, each from its start (the attributes are the pass's, not changed here)
            epoch += 1
            yield from ((epoch, chunk) for chunk in self.batches_for(epoch, 0))

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return self.pass_length(0)

    def pass_length(self, start: int, epoch: int | None = None) -> int:
        """Batches on this rank in an epoch (every epoch has as many) that begins at position `start` of its
        order."""
        return num_batches(rank_count(self.num_samples - start, self.world_size, self.uneven), self.batch_size,
                           self.drop_last)


class BucketBatchSampler(EpochBatchSampler):
    """Like EpochBatchSampler, but batches hold documents of similar length: each window of
    `window_batches` batches of the epoch's order is sorted by length and cut into batches, and the batches
    are then shuffled (from seed and epoch). Same batches for any number of workers; same length. With several
    ranks, each buckets its own part of the epoch."""

    repartitions = False  # batches are not a prefix of the order: a mid-epoch state needs the same world size
    can_roll_over = False

    def __init__(self, lengths: np.ndarray, batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                 window_batches: int = 64, rank: int = 0, world_size: int = 1, uneven: str = "pad") -> None:
        super().__init__(len(lengths), batch_size, shuffle, seed, drop_last, rank, world_size, uneven)
        self.lengths = np.asarray(lengths)
        self.window = batch_size * window_batches

    def batches_for(self, epoch: int, start: int) -> Sequence[np.ndarray]:
        order = self.rank_indices_for(epoch, start)
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        batches: list[np.ndarray] = []
        for at in range(0, stop, self.window):
            window = order[at:min(at + self.window, stop)]
            window = window[np.argsort(self.lengths[window], kind="stable")]
            batches.extend(window[i:i + self.batch_size] for i in range(0, len(window), self.batch_size))
        if self.shuffle:
            rng = np.random.default_rng((self.seed, epoch, 2))
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches
