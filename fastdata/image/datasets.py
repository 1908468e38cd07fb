"""Datasets over converted images: map-style for LMDB, iterable for WebDataset shards.

Both give `(uint8 CHW tensor, int label)` per sample like torchvision's ImageFolder (multi-label datasets: a
multi-hot float32 `[C]` tensor as the label; image-text pairs: the caption, `fastdata.image.targets.captions`; detection
datasets: the target dict of `fastdata.image.targets.detection`; segmentation datasets: the mask of
`fastdata.image.targets.segmentation`),
`(image, label, metadata dict)` when opened with `metadata=True`, and
both can build whole batches inside a DataLoader worker (`batch_dataset()`), which is what `fastdata.loader` uses.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from time import monotonic_ns, perf_counter
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from fastdata.config import check_epoch
from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.formats.lmdb import LmdbReader
from fastdata.formats.manifest import RECORD_TARGET_KINDS, Manifest
from fastdata.formats.registry import storage
from fastdata.formats.wds import read_shard
from fastdata.image.batch import Batch, EncodedBatch, EncodedSample, sample_metadata, worker_span
from fastdata.image.buffers import BatchBuffers
from fastdata.image.device.ship import pack_encoded
from fastdata.image.epoch_clock import EpochClock
from fastdata.image.output import OutputFormat
from fastdata.image.pipeline import ON_ERROR, SamplePipeline
from fastdata.image.recipes.recipe import Recipe
from fastdata.image.stored_lists import StoredSamples, StoredTargets
from fastdata.image.targets.codec import target_codec
from fastdata.image.targets.detection import check_targets
from fastdata.order.ranks import check_not_empty, check_uneven, contiguous_part, rank_count


def build_batch(pipeline: SamplePipeline, samples: list[EncodedSample], epoch: int, on_error: str,
                buffers: BatchBuffers | None = None, metadata: bool = False) -> Batch | EncodedBatch:
    """One batch of `samples` as a worker hands it over: decoded by the pipeline or, when the loader decodes on
    the device (`pipeline.config.ship_encoded`), an EncodedBatch (the device decodes its JPEGs; the worker the rest);
    with `metadata`, each kept sample's key and stored metadata (`sample_metadata`) in batch order."""
    if pipeline.config.ship_encoded:
        batch: Batch | EncodedBatch = pack_encoded(pipeline, samples, epoch, on_error, buffers)
    else:
        batch = pipeline.batch(samples, epoch, on_error, buffers)
    if metadata:
        skipped = {key for key, _ in batch.skipped}
        batch.metadata = [sample_metadata(s) for s in samples if s.key not in skipped]
    return batch


class _ImageMetaMixin:
    """What both image datasets share: the manifest's facts, the sample pipeline, the error policy, the epoch."""

    manifest: Manifest

    def _setup(self, root: Path | str, manifest: Manifest, augment: Any, image_size: Any, seed: int,
               on_error: str, metadata: bool, scale: Any = None, ratio: Any = None,
               max_length: int | None = None, masks: bool = False, recipe: Recipe | None = None) -> None:
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.root: Path | str = root if isinstance(root, str) and "://" in root else Path(root)  # URL: remote
        check_targets(manifest, str(self.root), masks)
        self.masks = masks  # detection: targets carry their decoded masks
        self.manifest = manifest
        self.pipeline = SamplePipeline(augment, image_size, seed, str(self.root), scale=scale, ratio=ratio,
                                       labels=target_codec(manifest, str(self.root), max_length, masks),
                                       jpeg_layout=manifest.jpeg_layout, recipe=recipe)
        if recipe is not None and recipe.batch is not None:
            if manifest.target_kind != "class":
                raise ConfigError(f"{self.root}: {recipe.batch!r} mixes class labels; this dataset holds "
                                  f"{manifest.target_kind}")
            self.pipeline.mix_classes = recipe.num_classes(len(manifest.classes), manifest.label_kind == "multi")
        self.on_error = on_error
        self.with_metadata = metadata  # samples come as (image, label, metadata dict)
        self.epoch = 0
        # what `ds[i]` (and iteration) gives its images as: uint8, or normalised floats when the loader's batches
        # are (`loader.dataset`) or `fastdata.dataset(output=...)` asked for them
        self.output = OutputFormat()
        self.clock: EpochClock | None = None  # a plain dataset's epochs (`count_epochs`); loaders pass their own

    def count_epochs(self) -> None:
        """For a dataset in the user's own DataLoader (`fastdata.dataset`): each pass draws new augmentations
        without a call, the same for the same seed (fastdata.image.epoch_clock); `set_epoch` pins them."""
        self.clock = EpochClock(self.manifest.num_samples)

    def set_epoch(self, epoch: int) -> None:
        """Augment every sample for `epoch` (each sample's randomness from `(seed, epoch, sample)`), in every
        worker, persistent ones included, until it is called again."""
        epoch = check_epoch(epoch)
        self.epoch = epoch
        if self.clock is not None:
            self.clock.set_epoch(epoch)

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def pairs(self) -> bool:
        """Whether the samples are image-text pairs (a caption per image, no classes)."""
        return self.manifest.target_kind == "pairs"

    @property
    def target_kind(self) -> str:
        """What a sample gives besides its image: "class" (a class label), "pairs" (a caption), "detection" (a
        target dict: boxes, labels, ...) or "segmentation" (a mask of class ids)."""
        return self.manifest.target_kind

    def _label(self, sample: EncodedSample) -> Any:
        """What a processed sample gives besides its image: its class label or caption, (detection) its target dict
        or (segmentation) its mask, in the output's pixels."""
        return self.pipeline.labels.one(self.pipeline.target_of(sample))

    @property
    def multi_label(self) -> bool:
        """Whether a sample's label is a set of classes (a multi-hot float32 row) rather than one class id."""
        return self.manifest.label_kind == "multi"

    @property
    def class_to_idx(self) -> dict[str, int]:
        return self.manifest.class_to_idx

    def __len__(self) -> int:
        return self.manifest.num_samples


class LmdbImageDataset(_ImageMetaMixin, Dataset):
    """Map-style dataset over an LMDB conversion: `ds[i]` is ImageFolder's sample i, decoded (and augmented
    with `augment` if given, from `(seed, epoch, i)`: new crops each pass, see `count_epochs`); with `metadata=True`,
    `(image, label, metadata)` where metadata is the sample's stored dict ({} when the source had none)."""

    def __init__(self, root: Path, manifest: Manifest, augment: Any = None, image_size: Any = None,
                 seed: int = 0, on_error: str = "raise", metadata: bool = False, *, scale: Any = None,
                 ratio: Any = None, max_length: int | None = None, masks: bool = False,
                 recipe: Recipe | None = None) -> None:
        self._setup(root, manifest, augment, image_size, seed, on_error, metadata, scale, ratio, max_length, masks,
                    recipe)
        self.reader: LmdbReader = storage("image", manifest.format, root).open_reader(Path(self.root), manifest)

    @property
    def samples(self) -> Sequence[tuple[str, Any]]:
        """(path, label) per index: torchvision's ImageFolder.samples with each path relative to the source folder
        (ImageFolder's is `os.path.join(root, path)`); a multi-label sample's label is the list of its class ids. A
        sequence read from storage as it is asked for (equal to the list)."""
        return StoredSamples(self.reader)

    @property
    def targets(self) -> Sequence[Any]:
        """Every sample's label: class ids, or (multi-label) lists of class ids. A sequence over the label arrays
        (equal to the list; `np.asarray(ds.targets)` gives a single-label dataset's labels without a Python int
        per sample)."""
        return StoredTargets(self.reader)

    def encoded(self, index: int) -> EncodedSample:
        """Sample `index` as stored (bytes and header facts), not yet decoded."""
        r = self.reader
        target = r.target(index) if self.manifest.target_kind in RECORD_TARGET_KINDS else None
        return EncodedSample(r.key(index), r.read(index), self.pipeline.labels.read(r, index),
                             int(r.widths[index]), int(r.heights[index]), int(r.codecs[index]), (index,),
                             metadata=r.metadata(index) if self.with_metadata else None, target=target)

    def metadata(self, index: int) -> dict:
        """Sample `index`'s stored metadata (its source row's other columns; {} when the source had none)."""
        if index < 0:
            index += len(self)
        return self.reader.metadata(index) or {}

    def __getitem__(self, index: int) -> tuple:
        if index < 0:
            index += len(self)
        sample = self.encoded(index)
        epoch = self.clock.read(index) if self.clock is not None else self.epoch
        image = self.output.convert(self.pipeline.to_tensor(self.pipeline.process(sample, epoch)))
        label = self._label(sample)
        if self.with_metadata:
            return image, label, self.metadata(index)
        return image, label

    def get_batch(self, indices: np.ndarray, epoch: int, buffers: BatchBuffers | None = None
                  ) -> Batch | EncodedBatch:
        started_ns = monotonic_ns()
        started = perf_counter()
        samples = [self.encoded(int(i)) for i in indices]
        self.reader.release_mapped()
        read_s = perf_counter() - started
        batch = build_batch(self.pipeline, samples, epoch, self.on_error, buffers, self.with_metadata)
        batch.times.read += read_s
        batch.span = worker_span(started_ns)
        return batch


class LmdbBatches(Dataset):
    """DataLoader adapter: item `(epoch, indices)` -> a whole decoded Batch, built inside the worker."""

    def __init__(self, dataset: LmdbImageDataset, buffers: BatchBuffers | None = None) -> None:
        self.dataset = dataset
        self.buffers = buffers  # reused shared-memory batch tensors (fastdata.image.buffers), owned by the loader

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, np.ndarray]) -> Batch | EncodedBatch:
        epoch, indices = item
        return self.dataset.get_batch(indices, epoch, self.buffers)


class WdsImageDataset(_ImageMetaMixin, IterableDataset):
    """Iterable dataset over WebDataset shards: yields `(uint8 CHW tensor, label)` (with `metadata=True`, `(image,
    label, metadata dict)`) in stored order (shards in manifest order, each read sequentially). Iterable only:
    `ds[i]` raises TypeError (LMDB gives random access).
    The shards are local files, or remote ones (`fastdata.formats.remote.RemoteShards`) given as `store`.

    Iterated by several DataLoader workers (and ranks, see `split`), each sample comes once: the stored stream
    is cut into one contiguous part per rank (as `fastdata.loader` cuts an epoch's stream), and each rank's part
    into one contiguous stretch per worker, which reads only the shards that stretch covers."""

    def __init__(self, root: Path | str, manifest: Manifest, augment: Any = None, image_size: Any = None,
                 seed: int = 0, on_error: str = "raise", store: Any = None, metadata: bool = False, *,
                 scale: Any = None, ratio: Any = None, max_length: int | None = None, masks: bool = False,
                 recipe: Recipe | None = None) -> None:
        self._setup(root, manifest, augment, image_size, seed, on_error, metadata, scale, ratio, max_length, masks,
                    recipe)
        if store is None:
            store = storage("image", manifest.format, root).open_reader(Path(root), manifest)
        self.store = store
        self.shards = self.store.locations
        self.rank, self.world_size, self.uneven = 0, 1, "pad"
        self.skipped_count = 0  # samples skipped by this process's iterations (on_error="skip"; each warned)

    def split(self, rank: int, world_size: int, uneven: str = "pad") -> WdsImageDataset:
        """Iterate only rank `rank`'s part of the stream (of `world_size`, padded or cut as `uneven` says, as the
        loader does); `len()` becomes that part's length."""
        check_not_empty(self.manifest.num_samples, world_size, check_uneven(uneven), str(self.root))
        self.rank, self.world_size, self.uneven = rank, world_size, uneven
        return self

    def __len__(self) -> int:
        return rank_count(self.manifest.num_samples, self.world_size, self.uneven)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """Not available: shards are read in order, a sample at a time. Raises TypeError saying what to use."""
        raise TypeError(f"{self.root}: a WebDataset dataset is iterable-only (its shards are read in order), so "
                        f"ds[{index!r}] is not available: iterate it (`for image, label in ds`), use "
                        "fastdata.loader(...) for shuffled batches, or convert to LMDB "
                        "(`fastdata convert imagefolder SRC OUT.lmdb`) for random access")

    def stream_part(self, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        """The stored-stream positions that worker `worker` of `num_workers` of this rank yields, in order."""
        stream = np.arange(self.manifest.num_samples, dtype=np.int64)
        mine = contiguous_part(stream, self.rank, self.world_size, self.uneven)
        return np.array_split(mine, max(1, num_workers))[worker]

    def shard_samples(self, shard_id: int, want: Callable[[int], bool] | None = None, *,
                      start: tuple[int, int] = (0, 0)) -> Generator[tuple[int, EncodedSample | None], None, None]:
        """`(offset, sample)` for every stored sample of one shard, in order; None (bytes not read) for the
        offsets `want` rejects. `start`: (byte position of a sample's first member header, that sample's offset)
        to begin there (`fastdata.formats.wds.sample_positions`) instead of at the shard's first sample."""
        name = self.manifest.files[shard_id].name
        where = self.shards[shard_id]
        position, first = start
        fileobj, seekable = self.store.open(shard_id)
        with fileobj:
            if position:
                fileobj.seek(position)
            relative = None if want is None else (lambda o: want(o + first))
            for offset, stored in read_shard(fileobj, where, relative, seekable=seekable):
                offset += first
                if stored is None:
                    yield offset, None
                    continue
                key, data, _ext, meta = stored
                target = meta.get("target")
                try:
                    sample = EncodedSample(meta["path"], data, self.pipeline.labels.from_json(meta),
                                           int(meta["width"]), int(meta["height"]), int(meta["codec"]),
                                           (shard_id, offset), name, meta.get("metadata"),
                                           target if isinstance(target, bytes) else None)
                except (KeyError, TypeError, ValueError) as exc:
                    raise CorruptSampleError(f"{where}: sample {key!r} has incomplete metadata ({exc!r})") from exc
                yield offset, sample

    def sample_at(self, shard_id: int, offset: int) -> EncodedSample:
        """One stored sample, read on its own (reads its shard up to it: for rare use, such as a borrowed sample)."""
        samples = self.shard_samples(shard_id, want=lambda o: o == offset)
        try:
            for got, sample in samples:
                if got == offset and sample is not None:
                    return sample
        finally:
            samples.close()
        raise CorruptSampleError(f"{self.shards[shard_id]}: shard has no sample {offset}")

    def encoded_samples(self, shard_ids: list[int]) -> Iterator[EncodedSample]:
        """Stream the stored samples of the given shards, in order."""
        for shard_id in shard_ids:
            for _offset, sample in self.shard_samples(shard_id):
                assert sample is not None
                yield sample

    def samples_at(self, positions: np.ndarray) -> Iterator[EncodedSample]:
        """The stored samples at the given stream positions, in the order given, reading each ascending run of
        positions in one pass over the shards it covers."""
        starts = np.concatenate([[0], np.cumsum([f.samples for f in self.manifest.files])]).astype(np.int64)
        shard_of = np.searchsorted(starts, positions, side="right") - 1
        run_start = 0
        for i in range(1, len(positions) + 1):
            if i < len(positions) and shard_of[i] == shard_of[i - 1] and positions[i] > positions[i - 1]:
                continue
            shard_id = int(shard_of[run_start])
            offsets = (positions[run_start:i] - starts[shard_id]).tolist()
            wanted, last = set(offsets), offsets[-1]
            stream = self.shard_samples(shard_id, want=wanted.__contains__)
            try:
                for offset, sample in stream:
                    if sample is not None:
                        yield sample
                    if offset >= last:
                        break
            finally:
                stream.close()
            run_start = i

    def __iter__(self) -> Iterator[tuple]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self.clock.begin_pass(worker) if self.clock is not None else self.epoch
        for sample in self.samples_at(self.stream_part(worker, num_workers)):
            try:
                image = self.pipeline.process(sample, epoch)
            except CorruptSampleError as exc:
                if self.on_error == "raise":
                    raise
                self.skipped_count += 1
                warnings.warn(f"skipped (on_error='skip'): {exc}", stacklevel=2)
                continue
            label = self._label(sample)
            if self.with_metadata:
                yield self.output.convert(self.pipeline.to_tensor(image)), label, dict(sample.metadata or {})
            else:
                yield self.output.convert(self.pipeline.to_tensor(image)), label
