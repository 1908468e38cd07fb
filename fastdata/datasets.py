"""Datasets over converted images: map-style for LMDB, iterable for WebDataset shards.

Both give `(uint8 CHW tensor, int label)` per sample like torchvision's ImageFolder, and both can build
whole batches inside a DataLoader worker (`batch_dataset()`), which is what `fastdata.loader` uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.formats.lmdb import LmdbReader
from fastdata.formats.manifest import Manifest
from fastdata.formats.wds import iter_shard, shard_paths
from fastdata.order import epoch_order, num_batches
from fastdata.pipeline import ON_ERROR, Batch, EncodedSample, SamplePipeline


class _ImageMetaMixin:
    """What both image datasets share: the manifest's facts, the sample pipeline, the error policy, the epoch."""

    manifest: Manifest

    def _setup(self, root: Path, manifest: Manifest, augment: Any, image_size: int, seed: int,
               on_error: str) -> None:
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.root = Path(root)
        self.manifest = manifest
        self.pipeline = SamplePipeline(augment, image_size, seed, str(self.root))
        self.on_error = on_error
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return self.manifest.class_to_idx

    def __len__(self) -> int:
        return self.manifest.num_samples


class LmdbImageDataset(_ImageMetaMixin, Dataset):
    """Map-style dataset over an LMDB conversion: `ds[i]` is ImageFolder's sample i, decoded (and augmented
    with `augment` if given, reproducibly for `seed` and the epoch set by `set_epoch`)."""

    def __init__(self, root: Path, manifest: Manifest, augment: Any = None, image_size: int = 224,
                 seed: int = 0, on_error: str = "raise") -> None:
        self._setup(root, manifest, augment, image_size, seed, on_error)
        self.reader = LmdbReader(self.root, manifest.num_samples, len(manifest.classes))

    @property
    def samples(self) -> list[tuple[str, int]]:
        """(source-relative path, label) per index, as torchvision's ImageFolder.samples (built on demand)."""
        return list(zip(self.reader.all_keys(), self.reader.labels.tolist(), strict=True))

    @property
    def targets(self) -> list[int]:
        return self.reader.labels.tolist()

    def encoded(self, index: int) -> EncodedSample:
        """Sample `index` as stored (bytes and header facts), not yet decoded."""
        r = self.reader
        return EncodedSample(r.key(index), r.read(index), int(r.labels[index]), int(r.widths[index]),
                             int(r.heights[index]), int(r.codecs[index]), (index,))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index < 0:
            index += len(self)
        sample = self.encoded(index)
        return self.pipeline.to_tensor(self.pipeline.process(sample, self.epoch)), sample.label

    def get_batch(self, indices: np.ndarray, epoch: int) -> Batch:
        started = perf_counter()
        samples = [self.encoded(int(i)) for i in indices]
        read_s = perf_counter() - started
        batch = self.pipeline.batch(samples, epoch, self.on_error)
        batch.times.read += read_s
        return batch


class LmdbBatches(Dataset):
    """DataLoader adapter: item `(epoch, indices)` -> a whole decoded Batch, built inside the worker."""

    def __init__(self, dataset: LmdbImageDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, np.ndarray]) -> Batch:
        epoch, indices = item
        return self.dataset.get_batch(indices, epoch)


class EpochBatchSampler:
    """Yields `(epoch, indices)` per batch of the current epoch; runs in the main process, so the epoch set
    here reaches persistent workers with every item."""

    def __init__(self, num_samples: int, batch_size: int, shuffle: bool, seed: int, drop_last: bool) -> None:
        self.num_samples, self.batch_size = num_samples, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            if len(chunk) < self.batch_size and self.drop_last:
                return
            yield self.epoch, chunk

    def __len__(self) -> int:
        return num_batches(self.num_samples, self.batch_size, self.drop_last)


class WdsImageDataset(_ImageMetaMixin, IterableDataset):
    """Iterable dataset over WebDataset shards: yields `(uint8 CHW tensor, label)` in stored order
    (shards in manifest order, each read sequentially)."""

    def __init__(self, root: Path, manifest: Manifest, augment: Any = None, image_size: int = 224,
                 seed: int = 0, on_error: str = "raise") -> None:
        self._setup(root, manifest, augment, image_size, seed, on_error)
        self.shards = shard_paths(self.root, manifest.files)

    def encoded_samples(self, shard_ids: list[int]) -> Iterator[EncodedSample]:
        """Stream the stored samples of the given shards, in order."""
        for shard_id in shard_ids:
            for offset, (key, data, _ext, meta) in enumerate(iter_shard(self.shards[shard_id])):
                try:
                    yield EncodedSample(meta["path"], data, int(meta["label"]), int(meta["width"]),
                                        int(meta["height"]), int(meta["codec"]), (shard_id, offset),
                                        self.shards[shard_id].name)
                except (KeyError, TypeError, ValueError) as exc:
                    raise CorruptSampleError(f"{self.shards[shard_id]}: sample {key!r} has incomplete "
                                             f"metadata ({exc!r})") from exc

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        for sample in self.encoded_samples(list(range(len(self.shards)))):
            try:
                image = self.pipeline.process(sample, self.epoch)
            except CorruptSampleError:
                if self.on_error == "raise":
                    raise
                continue
            yield self.pipeline.to_tensor(image), sample.label


class WdsBatches(IterableDataset):
    """DataLoader adapter for shards: each worker takes every n-th shard of the epoch's shard order, mixes
    samples through a seeded shuffle buffer, and yields whole decoded Batches. The epoch travels through a
    shared-memory tensor so that persistent workers see it."""

    def __init__(self, dataset: WdsImageDataset, batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                 shuffle_buffer: int = 2048) -> None:
        self.dataset = dataset
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.drop_last, self.shuffle_buffer = drop_last, shuffle_buffer
        self.epoch_cell = torch.zeros(1, dtype=torch.int64).share_memory_()

    def shard_assignment(self, epoch: int, num_workers: int) -> list[list[int]]:
        """Shard ids each of `num_workers` workers reads in `epoch`."""
        order = epoch_order(len(self.dataset.shards), self.seed, epoch, self.shuffle).tolist()
        return [order[w::num_workers] for w in range(num_workers)]

    def num_batches(self, epoch: int, num_workers: int) -> int:
        """Exact batches in `epoch`: each worker batches its own shards' samples, so the count depends on
        which shards each worker gets (shards differ in size)."""
        files = self.dataset.manifest.files
        total = 0
        for shard_ids in self.shard_assignment(epoch, max(1, num_workers)):
            total += num_batches(sum(files[i].samples for i in shard_ids), self.batch_size, self.drop_last)
        return total

    def _samples(self, epoch: int, shard_ids: list[int], worker: int) -> Iterator[EncodedSample]:
        stream = self.dataset.encoded_samples(shard_ids)
        if not self.shuffle:
            yield from stream
            return
        rng = np.random.default_rng((self.seed, epoch, worker, 1))
        buffer: list[EncodedSample] = []
        for sample in stream:
            buffer.append(sample)
            if len(buffer) >= self.shuffle_buffer:
                j = int(rng.integers(len(buffer)))
                buffer[j], buffer[-1] = buffer[-1], buffer[j]
                yield buffer.pop()
        rng.shuffle(buffer)
        yield from buffer

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        epoch = int(self.epoch_cell.item())
        shard_ids = self.shard_assignment(epoch, num_workers)[worker]
        pending: list[EncodedSample] = []
        reading_since = perf_counter()  # reading = time spent pulling samples off the shards for this batch
        for sample in self._samples(epoch, shard_ids, worker):
            pending.append(sample)
            if len(pending) == self.batch_size:
                read_s = perf_counter() - reading_since
                batch = self.dataset.pipeline.batch(pending, epoch, self.dataset.on_error)
                batch.times.read += read_s
                yield batch
                pending = []
                reading_since = perf_counter()
        if pending and not self.drop_last:
            read_s = perf_counter() - reading_since
            batch = self.dataset.pipeline.batch(pending, epoch, self.dataset.on_error)
            batch.times.read += read_s
            yield batch
