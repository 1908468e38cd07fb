"""The epoch plan of a sharded (WebDataset) dataset, as pure functions of the manifest's per-shard counts and
(seed, epoch): no IO, so that the order never depends on the number of workers.

An epoch is one *stream*: the shards in an order drawn from (seed, epoch), concatenated. Stream position p is
sample `p - start(shard)` of the shard that covers it. The epoch's sample order shuffles the stream inside
consecutive windows of `window` positions (what a shuffle buffer does, but reproducibly); each rank takes one
contiguous part of that order (so it reads about 1/world_size of the shards, split inside shards where the
boundaries fall) and cuts it into batches. Batch j of a rank is built by worker `j % num_workers`, which is
the order a DataLoader collects the batches of iterable workers in; so the batches are the same for any
number of workers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from fastdata.order.epoch import epoch_order, num_batches, split_batches
from fastdata.order.ranks import contiguous_part, rank_count

DEFAULT_WINDOW = 2048


@dataclass(frozen=True)
class EpochPlan:
    """One epoch of one rank: the shard order, where each shard starts in the stream, and the rank's batches
    as stream positions."""

    shard_order: np.ndarray  # shard ids in stream order
    starts: np.ndarray  # stream position of each stream shard's first sample, plus the stream length at the end
    batches: Sequence[np.ndarray]  # made one at a time as they are asked for (`fastdata.order.epoch.Batches`)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into `shard_order`, offset inside that shard) of each stream position."""
        slot = np.searchsorted(self.starts, positions, side="right") - 1
        return slot, positions - self.starts[slot]

    def worker_batches(self, skip: int, worker: int, num_workers: int) -> Iterator[tuple[int, np.ndarray]]:
        """(batch number, stream positions) of the batches worker `worker` builds when the epoch starts after
        `skip` batches (a resumed epoch), dealt round-robin in the order the DataLoader collects them."""
        for number in range(skip + worker, len(self.batches), max(1, num_workers)):
            yield number, self.batches[number]


def window_order(total: int, seed: int, epoch: int, shuffle: bool, window: int) -> np.ndarray:
    """The epoch's sample order over stream positions 0..total-1: shuffled inside consecutive windows of
    `window` positions (or the stream order itself, unshuffled)."""
    order = np.arange(total, dtype=np.int64)
    if not shuffle or window <= 1:
        return order
    rng = np.random.default_rng((seed, epoch, 3))
    for start in range(0, total, window):
        rng.shuffle(order[start:start + window])
    return order


class StreamPlanner:
    """Plans epochs over shards of the given sample counts for one rank."""

    def __init__(self, counts: Sequence[int], *, batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                 rank: int = 0, world_size: int = 1, uneven: str = "pad", window: int = DEFAULT_WINDOW) -> None:
        self.counts = np.asarray(counts, dtype=np.int64)
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.rank, self.world_size, self.uneven, self.window = rank, world_size, uneven, window

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def num_batches(self) -> int:
        """Batches every rank yields per epoch (the same on every rank, whatever the shard sizes)."""
        return num_batches(rank_count(self.total, self.world_size, self.uneven), self.batch_size, self.drop_last)

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The shard order, where each stream shard starts, and this rank's stream positions of `epoch`."""
        shard_order = epoch_order(len(self.counts), self.seed, epoch, self.shuffle)
        starts = np.concatenate([[0], np.cumsum(self.counts[shard_order])]).astype(np.int64)
        order = window_order(self.total, self.seed, epoch, self.shuffle, self.window)
        return shard_order, starts, contiguous_part(order, self.rank, self.world_size, self.uneven)

    def plan(self, epoch: int) -> EpochPlan:
        shard_order, starts, mine = self._epoch(epoch)
        return EpochPlan(shard_order, starts, split_batches(mine, self.batch_size, self.drop_last))

    def rank_order(self, epoch: int) -> np.ndarray:
        """This rank's samples of `epoch` in order (before batching), as positions in the stored order (the
        shards in manifest order, one after the other)."""
        shard_order, starts, mine = self._epoch(epoch)
        slot = np.searchsorted(starts, mine, side="right") - 1
        stored = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        return stored[shard_order[slot]] + (mine - starts[slot])
