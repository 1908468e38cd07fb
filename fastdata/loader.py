"""Composition root for reading: `dataset()` and `loader()` over a converted dataset."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from fastdata.config import available_cores
from fastdata.datasets import EpochBatchSampler, LmdbBatches, LmdbImageDataset, WdsBatches, WdsImageDataset
from fastdata.errors import ConfigError, NotADatasetError, WorkerError
from fastdata.formats.manifest import read_manifest
from fastdata.order import epoch_order
from fastdata.stagetimes import StageTimes

if TYPE_CHECKING:
    from fastdata.text_dataset import TextDataset
    from fastdata.text_loader import TextLoader


def dataset(path: str | os.PathLike[str], augment: Any = None, *, image_size: int = 224, seed: int = 0,
            on_error: str = "raise") -> LmdbImageDataset | WdsImageDataset | TextDataset:
    """Open a converted dataset for your own DataLoader.

    LMDB gives a map-style dataset (`len`, `ds[i] -> (uint8 CHW tensor, label)`, `.classes`,
    `.class_to_idx`, `.samples` as torchvision's ImageFolder has them); WebDataset shards give an iterable
    one (`len`, `.classes`, iteration in stored order). `augment` is None (full image), "train", "val",
    an albumentations transform or a callable on an HWC uint8 array.
    A text dataset (either format) gives `len` = documents, `ds[i] -> {"input_ids": int64 tensor}`,
    `.tokenizer`, `.total_tokens` (the image arguments do not apply).
    """
    root = Path(path)
    manifest = read_manifest(root)
    if manifest.kind == "text":
        from fastdata.text_dataset import TextDataset

        return TextDataset(root, manifest)
    if manifest.kind != "image":
        raise NotADatasetError(f"{root}: holds a {manifest.kind!r} dataset, not images")
    cls = {"lmdb": LmdbImageDataset, "wds": WdsImageDataset}.get(manifest.format)
    if cls is None:
        raise NotADatasetError(f"{root}: unknown storage format {manifest.format!r} in the manifest")
    return cls(root, manifest, augment=augment, image_size=image_size, seed=seed, on_error=on_error)


def _worker_init(_worker_id: int) -> None:
    import cv2

    cv2.setNumThreads(1)  # one decode per worker process; the workers are the parallelism


class ImageLoader:
    """Iterable of `(images, labels)` batches, like a DataLoader over torchvision's ImageFolder:
    images uint8 [B, 3, S, S], labels int64 [B]. Each new pass is the next epoch (reshuffled from
    (seed, epoch)); `set_epoch(e)` sets it explicitly. Batches are built whole inside the workers."""

    def __init__(self, data: LmdbImageDataset | WdsImageDataset, *, batch_size: int, shuffle: bool, seed: int,
                 drop_last: bool, num_workers: int, pin_memory: bool, prefetch_factor: int | None,
                 persistent_workers: bool, multiprocessing_context: Any, timeout: float = 0) -> None:
        self.dataset = data
        self.seed, self.shuffle = seed, shuffle
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.skipped: list[tuple[str, str]] = []
        self.stage_times = StageTimes()  # per-stage seconds summed over workers and batches (fastdata.meter reads it)
        self._epoch = 0
        self._iterating_epoch: int | None = None
        common = dict(batch_size=None, num_workers=num_workers, pin_memory=pin_memory,
                      worker_init_fn=_worker_init if num_workers else None,
                      persistent_workers=persistent_workers and num_workers > 0,
                      prefetch_factor=prefetch_factor if num_workers else None,
                      multiprocessing_context=multiprocessing_context if num_workers else None,
                      timeout=timeout if num_workers else 0)
        if isinstance(data, LmdbImageDataset):
            self._sampler: EpochBatchSampler | None = EpochBatchSampler(len(data), batch_size, shuffle, seed,
                                                                        drop_last)
            self._batches: LmdbBatches | WdsBatches = LmdbBatches(data)
            self._loader = DataLoader(self._batches, sampler=self._sampler, **common)
        else:
            self._sampler = None
            self._batches = WdsBatches(data, batch_size, shuffle, seed, drop_last)
            self._loader = DataLoader(self._batches, **common)

    @property
    def classes(self) -> list[str]:
        return self.dataset.classes

    @property
    def epoch(self) -> int:
        """The epoch the next pass will yield."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass yield epoch `epoch` (as DistributedSampler.set_epoch does)."""
        self._epoch = int(epoch)

    def __len__(self) -> int:
        """Batches in the epoch being iterated (or, between passes, in the next one)."""
        if self._sampler is not None:
            return len(self._sampler)
        assert isinstance(self._batches, WdsBatches)
        epoch = self._epoch if self._iterating_epoch is None else self._iterating_epoch
        return self._batches.num_batches(epoch, self.num_workers)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self._epoch
        self._epoch += 1
        if self._sampler is not None:
            self._sampler.epoch = epoch
        else:
            assert isinstance(self._batches, WdsBatches)
            self._batches.epoch_cell.fill_(epoch)
        self._iterating_epoch = epoch
        received = 0
        try:
            for batch in self._loader:
                received += 1
                if batch.skipped:
                    self.skipped.extend(batch.skipped)
                self.stage_times.add(batch.times)
                self.stage_times.batches += 1
                if len(batch.labels):
                    yield batch.images, batch.labels
        except RuntimeError as exc:
            message = str(exc)
            if message.startswith("Caught ") or not ("DataLoader worker" in message or "timed out" in message):
                raise  # an exception raised inside a worker keeps its own type and traceback
            raise WorkerError(f"{self.dataset.root}: {message.strip()} — {self._waiting_for(epoch, received)}") \
                from exc
        finally:
            self._iterating_epoch = None

    def _waiting_for(self, epoch: int, batch_number: int) -> str:
        """What the loader was waiting for when a worker failed: the batch, its worker and its first keys."""
        worker = batch_number % max(1, self.num_workers)
        where = f"waiting for batch {batch_number} of epoch {epoch}, loaded by worker {worker}"
        if isinstance(self.dataset, LmdbImageDataset):
            order = epoch_order(len(self.dataset), self.seed, epoch, self.shuffle)
            indices = order[batch_number * self.batch_size:(batch_number + 1) * self.batch_size][:4]
            keys = [self.dataset.reader.key(int(i)) for i in indices]
            return f"{where} (keys {', '.join(map(repr, keys))}, ...)"
        assert isinstance(self._batches, WdsBatches)
        shards = self._batches.shard_assignment(epoch, max(1, self.num_workers))[worker]
        return f"{where} (shards {', '.join(self.dataset.manifest.files[i].name for i in shards)})"


def loader(
    path: str | os.PathLike[str],
    batch_size: int = 256,
    augment: Any = "train",
    image_size: int = 224,
    shuffle: bool = True,
    num_workers: int | None = None,
    seed: int = 0,
    drop_last: bool = False,
    *,
    pin_memory: bool | None = None,
    prefetch_factor: int = 2,
    persistent_workers: bool = True,
    multiprocessing_context: Any = None,
    on_error: str = "raise",
    timeout: float = 0,
    seq_len: int | None = None,
    packing: bool | None = None,
    max_length: int | None = None,
    bucketing: bool | None = None,
    eos_token: str | None = None,
) -> ImageLoader | TextLoader:
    """A tuned loader over a converted dataset, yielding `(images, labels)` like an ImageFolder DataLoader.

    Defaults: one worker per available core, persistent workers, pinned memory when CUDA is available,
    whole batches decoded inside workers (JPEGs at the smallest DCT scale the crop allows).
    `on_error="skip"` drops undecodable samples from their batch and lists them in `loader.skipped`.
    A worker that dies (OOM killer) raises WorkerError naming the worker and the batch it was loading; with
    `timeout` > 0, so does one that takes longer than `timeout` seconds for a batch.

    Text datasets yield dicts of int64 tensors instead: packed blocks of `seq_len` tokens (default 1024;
    `{"input_ids", "labels"}`, labels shifted by one), or with `packing=False` one document per row truncated
    to `max_length` (`{"input_ids", "attention_mask", "labels"}`, optional length `bucketing`);
    `eos_token` overrides the end-of-text token that follows each document. These apply to text only.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    workers = min(available_cores(), 16) if num_workers is None else num_workers
    if workers < 0:
        raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
    data = dataset(path, augment, image_size=image_size, seed=seed, on_error=on_error)
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    text_options = {"seq_len": seq_len, "packing": packing, "max_length": max_length, "bucketing": bucketing,
                    "eos_token": eos_token}
    if not isinstance(data, (LmdbImageDataset, WdsImageDataset)):
        from fastdata.text_loader import text_loader

        return text_loader(data, batch_size=batch_size, shuffle=shuffle, num_workers=workers, seed=seed,
                           drop_last=drop_last, pin_memory=pin, prefetch_factor=prefetch_factor,
                           persistent_workers=persistent_workers, multiprocessing_context=multiprocessing_context,
                           **text_options)
    given = [name for name, value in text_options.items() if value is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: for text datasets only; {path} holds images")
    return ImageLoader(data, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                       num_workers=workers, pin_memory=pin, prefetch_factor=prefetch_factor,
                       persistent_workers=persistent_workers, multiprocessing_context=multiprocessing_context,
                       timeout=timeout)
