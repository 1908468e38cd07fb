"""DataLoader adapter for WebDataset shards: each worker builds its batches of the epoch plan
(`fastdata.order.stream`), reading the stretches of the shards they need and decoding only its own samples."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from time import monotonic_ns, perf_counter
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastdata.errors import CorruptSampleError
from fastdata.image.batch import Batch, EncodedBatch, EncodedSample, worker_span
from fastdata.image.buffers import BatchBuffers
from fastdata.image.datasets import build_batch
from fastdata.order.stream import DEFAULT_WINDOW, EpochPlan, StreamPlanner

if TYPE_CHECKING:
    from fastdata.image.datasets import WdsImageDataset


class WdsBatches(IterableDataset):
    """Yields the decoded Batches of one rank's epoch, batch j from worker j % num_workers. The epoch and the
    batches to skip (a resumed epoch) travel through a shared-memory tensor so that persistent workers see
    them."""

    def __init__(self, dataset: WdsImageDataset, batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                 rank: int = 0, world_size: int = 1, uneven: str = "pad", window: int = DEFAULT_WINDOW,
                 buffers: BatchBuffers | None = None) -> None:
        self.dataset = dataset
        self.buffers = buffers  # reused shared-memory batch tensors (fastdata.image.buffers), owned by the loader
        self.batch_size = batch_size
        self.planner = StreamPlanner([f.samples for f in dataset.manifest.files], batch_size=batch_size,
                                     shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
                                     world_size=world_size, uneven=uneven, window=window)
        self.cell = torch.zeros(2, dtype=torch.int64).share_memory_()  # [epoch, batches to skip]

    def start(self, epoch: int, skip: int = 0) -> None:
        """Make the next pass yield `epoch`, from batch `skip` on."""
        self.cell[0], self.cell[1] = epoch, skip

    def num_batches(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return self.planner.num_batches()

    def plan(self, epoch: int) -> EpochPlan:
        return self.planner.plan(epoch)

    def batch_shards(self, epoch: int, batch_number: int) -> list[str]:
        """Names of the shards that batch `batch_number` of `epoch` is read from (for error messages)."""
        plan = self.plan(epoch)
        if not 0 <= batch_number < len(plan.batches):
            return []
        slots, _ = plan.locate(np.sort(plan.batches[batch_number]))
        files = self.dataset.manifest.files
        return [files[int(plan.shard_order[s])].name for s in dict.fromkeys(slots.tolist())]

    def __iter__(self) -> Iterator[Batch | EncodedBatch]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        epoch, skip = (int(v) for v in self.cell.tolist())
        plan = self.plan(epoch)
        reader = _WorkerReader(self.dataset, plan, epoch, self.buffers)
        yield from reader.batches(plan.worker_batches(skip, worker, num_workers))


class _WorkerReader:
    """Reads the samples of one worker's batches forward through the stream, keeping (undecoded) only those
    its batches need; samples of other workers' batches are skipped without decoding them."""

    def __init__(self, dataset: WdsImageDataset, plan: EpochPlan, epoch: int,
                 buffers: BatchBuffers | None = None) -> None:
        self.dataset, self.plan, self.epoch, self.buffers = dataset, plan, epoch, buffers
        # how many of this worker's batches still want each stream position: an int32 per position rather than a
        # dict entry per wanted sample, which at millions of samples held a worker's start-up and memory
        self.wanted = np.zeros(int(plan.starts[-1]), np.int32)
        self.kept: dict[int, EncodedSample] = {}
        self._slot = -1  # the stream shard being read, and its samples from the next offset on
        self._samples: Iterator[tuple[int, EncodedSample | None]] | None = None
        self._next_offset = 0

    def batches(self, batches: Iterable[tuple[int, np.ndarray]]) -> Iterator[Batch | EncodedBatch]:
        batches = list(batches)  # one (number, view) pair per batch of this worker
        if batches:
            counts = np.bincount(np.concatenate([positions for _, positions in batches]), minlength=len(self.wanted))
            self.wanted += counts.astype(np.int32)
        try:
            for _, positions in batches:
                started_ns = monotonic_ns()
                started = perf_counter()
                for position in np.unique(positions).tolist():  # in stream order: each shard is read once
                    if position not in self.kept:
                        self._read_until(position)
                samples = [self._take(int(p)) for p in positions]
                read_s = perf_counter() - started
                batch = build_batch(self.dataset.pipeline, samples, self.epoch, self.dataset.on_error, self.buffers,
                                    self.dataset.with_metadata)
                batch.times.read += read_s
                batch.span = worker_span(started_ns)
                yield batch
        finally:
            self._close()

    def _take(self, position: int) -> EncodedSample:
        if position not in self.kept:
            self._read_until(position)
        sample = self.kept[position]
        self.wanted[position] -= 1
        if self.wanted[position] <= 0:
            del self.kept[position]
        return sample

    def _read_until(self, position: int) -> None:
        """Read forward to `position` (reopening its shard when it lies behind the reader), keeping the wanted
        samples passed on the way."""
        slot, offset = (int(v[0]) for v in self.plan.locate(np.array([position])))
        if slot != self._slot or offset < self._next_offset:
            self._open(slot)
        base = int(self.plan.starts[slot])
        assert self._samples is not None
        for got, sample in self._samples:
            self._next_offset = got + 1
            if sample is not None:
                self.kept[base + got] = sample
            if got == offset:
                return
        shard_id = int(self.plan.shard_order[slot])
        entry = self.dataset.manifest.files[shard_id]
        raise CorruptSampleError(f"{self.dataset.shards[shard_id]}: shard ended after {self._next_offset} "
                                 f"samples, but the manifest says it holds {entry.samples}")

    def _open(self, slot: int) -> None:
        self._close()
        base = int(self.plan.starts[slot])
        shard_id = int(self.plan.shard_order[slot])
        self._slot, self._next_offset = slot, 0
        self._samples = self.dataset.shard_samples(shard_id, want=lambda offset: self.wanted[base + offset] > 0
                                                   and base + offset not in self.kept)

    def _close(self) -> None:
        if self._samples is not None:
            close: Any = getattr(self._samples, "close", None)
            if close is not None:
                close()
        self._samples, self._slot = None, -1
