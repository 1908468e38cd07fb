"""Composition root for reading: `dataset()` and `loader()` over a converted dataset."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastdata.config import available_cores, parse_size
from fastdata.errors import ConfigError, NotADatasetError, WorkerError
from fastdata.formats.manifest import read_manifest
from fastdata.formats.registry import storage
from fastdata.formats.remote import RemoteShards, is_url
from fastdata.image.augment import describe_augment
from fastdata.image.batch import EncodedSample
from fastdata.image.buffers import BatchBuffers
from fastdata.image.datasets import LmdbBatches, LmdbImageDataset, WdsImageDataset
from fastdata.image.decode import opencv_single_threaded
from fastdata.image.device import DECODE_MODES, DeviceDecoder, DevicePrefetcher, device_decode_usable
from fastdata.image.wds_batches import WdsBatches
from fastdata.meter.stages import StageTimes
from fastdata.order.borrow import borrow
from fastdata.order.ranks import check_not_empty, check_uneven, resolve_world
from fastdata.order.samplers import EpochBatchSampler
from fastdata.order.state import ResumableLoader, dataset_fingerprint

if TYPE_CHECKING:
    from fastdata.text.dataset import TextDataset
    from fastdata.text.loader import TextLoader


def dataset(path: str | os.PathLike[str], augment: Any = None, *, image_size: int = 224, seed: int = 0,
            on_error: str = "raise", cache_dir: str | os.PathLike[str] | None = None,
            cache_max_bytes: int | str | None = None, storage_options: dict[str, Any] | None = None,
            rank: int | None = None, world_size: int | None = None, uneven: str = "pad"
            ) -> LmdbImageDataset | WdsImageDataset | TextDataset:
    """Open a converted dataset for your own DataLoader.

    LMDB gives a map-style dataset (`len`, `ds[i] -> (uint8 CHW tensor, label)`, `.classes`,
    `.class_to_idx`, `.samples` as torchvision's ImageFolder has them); WebDataset shards give an iterable
    one (`len`, `.classes`, iteration in stored order). `augment` is None (full image), "train", "val",
    an albumentations transform or a callable on an HWC uint8 array.
    The iterable WebDataset dataset splits its stream between the DataLoader workers that iterate it and between
    ranks (`rank`/`world_size`, else torch.distributed's when initialised; `uneven` as for `loader`), so every
    sample comes once per pass; `len()` is this rank's count. (A map-style LMDB dataset takes your sampler, e.g.
    DistributedSampler, instead.)
    A text dataset (either format) gives `len` = documents, `ds[i] -> {"input_ids": int64 tensor}`,
    `.tokenizer`, `.total_tokens` (the image arguments do not apply).
    An http(s):// or s3:// URL of a WebDataset image conversion opens it remotely (shards verified against
    the manifest as they stream in; `cache_dir` keeps them, bounded by `cache_max_bytes`; `storage_options`
    go to fsspec).
    """
    explicit_world = rank is not None or world_size is not None
    rank, world_size = resolve_world(rank, world_size)
    check_uneven(uneven)
    data = _open_dataset(path, augment, image_size=image_size, seed=seed, on_error=on_error, cache_dir=cache_dir,
                         cache_max_bytes=cache_max_bytes, storage_options=storage_options)
    if isinstance(data, WdsImageDataset):
        return data.split(rank, world_size, uneven)
    if explicit_world:
        raise ConfigError(f"{path}: rank and world_size split iterable (WebDataset) datasets; this dataset is "
                          "map-style: give your DataLoader a DistributedSampler, or use fastdata.loader")
    return data


def _open_dataset(path: str | os.PathLike[str], augment: Any = None, *, image_size: int = 224, seed: int = 0,
                  on_error: str = "raise", cache_dir: str | os.PathLike[str] | None = None,
                  cache_max_bytes: int | str | None = None, storage_options: dict[str, Any] | None = None
                  ) -> LmdbImageDataset | WdsImageDataset | TextDataset:
    """The dataset at `path`, whole (the loader splits epochs between ranks itself)."""
    if is_url(path):
        store = RemoteShards(str(path), storage_options, cache_dir,
                             None if cache_max_bytes is None else parse_size(cache_max_bytes))
        return WdsImageDataset(store.url, store.manifest, augment=augment, image_size=image_size, seed=seed,
                               on_error=on_error, store=store)
    if cache_dir is not None or cache_max_bytes is not None or storage_options is not None:
        raise ConfigError(f"cache_dir, cache_max_bytes and storage_options apply to remote URLs; {path} is local")
    root = Path(path)
    manifest = read_manifest(root)
    if manifest.kind == "text":
        from fastdata.text.dataset import TextDataset

        return TextDataset(root, manifest)
    if manifest.kind != "image":
        raise NotADatasetError(f"{root}: holds a {manifest.kind!r} dataset, not images")
    cls = LmdbImageDataset if storage("image", manifest.format, root).random_access else WdsImageDataset
    return cls(root, manifest, augment=augment, image_size=image_size, seed=seed, on_error=on_error)


def _worker_init(_worker_id: int) -> None:
    opencv_single_threaded()  # one decode per worker process; the workers are the parallelism


class ImageLoader(ResumableLoader):
    """Iterable of `(images, labels)` batches, like a DataLoader over torchvision's ImageFolder:
    images uint8 [B, 3, S, S], labels int64 [B]. Each new pass is the next epoch (reshuffled from
    (seed, epoch)); `set_epoch(e)` sets it explicitly. Batches are built whole inside the workers.
    Rank `rank` of `world_size` gets its own part of every epoch; `state_dict()` / `load_state_dict()` resume
    exactly in the middle of an epoch."""

    def __init__(self, data: LmdbImageDataset | WdsImageDataset, *, batch_size: int, shuffle: bool, seed: int,
                 rank: int = 0, world_size: int = 1, uneven: str = "pad",
                 drop_last: bool, num_workers: int, pin_memory: bool, prefetch_factor: int | None,
                 persistent_workers: bool, multiprocessing_context: Any, timeout: float = 0,
                 device: torch.device | str | None = None, decode: str = "auto", dtype: torch.dtype | None = None,
                 channels_last: bool = False) -> None:
        self.dataset = data
        self.device = torch.device(device) if device is not None else None
        self.decode = _resolve_decode(decode, self.device, data)
        if self.decode == "device" and self.device is None:
            self.device = torch.device("cpu")
        self._device_decoder = None
        if self.device is not None:
            self._device_decoder = DeviceDecoder(self.device, data.pipeline.image_size, str(data.root), dtype=dtype,
                                                 channels_last=channels_last, on_error=data.on_error,
                                                 max_pixels=data.pipeline.max_pixels)
        elif dtype is not None or channels_last:
            raise ConfigError("dtype and channels_last apply to batches on a device: pass device= as well")
        data.pipeline.ship_encoded = self.decode == "device"
        if data.pipeline.preset is not None:
            # load (and self-check) the region decoder here, so that a fallback to OpenCV is warned about once, in
            # this process, before the workers fork (they inherit the warned state)
            data.pipeline.region_decoder_for_presets()
        self.seed, self.shuffle = seed, shuffle
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self._skipped: dict[str, str] = {}  # key -> reason, each bad sample once however many epochs meet it
        self.borrowed: list[tuple[int, int, str]] = []  # (epoch, batch, key lent to it): see fastdata.borrow
        self.stage_times = StageTimes()  # per-stage seconds summed over workers and batches (fastdata.meter reads it)
        self.drop_last, self.uneven = drop_last, check_uneven(uneven)
        self.rank, self.world_size = rank, world_size
        self._init_progress()
        self._pass_skip = 0
        self._iterating_epoch: int | None = None
        common = dict(batch_size=None, num_workers=num_workers, pin_memory=pin_memory,
                      worker_init_fn=_worker_init if num_workers else None,
                      persistent_workers=persistent_workers and num_workers > 0,
                      prefetch_factor=prefetch_factor if num_workers else None,
                      multiprocessing_context=multiprocessing_context if num_workers else None,
                      timeout=timeout if num_workers else 0)
        # workers reuse their shared-memory batch tensors once this process has let go of them
        # (fastdata.batch_buffers): slots for the batches in flight, those waiting here and the user's
        self._buffers = (BatchBuffers(num_workers, (prefetch_factor or 2) + 4)
                         if num_workers and data.pipeline.output_size and not data.pipeline.ship_encoded else None)
        if isinstance(data, LmdbImageDataset):
            self._sampler: EpochBatchSampler | None = EpochBatchSampler(len(data), batch_size, shuffle, seed,
                                                                        drop_last, rank, world_size, uneven)
            self._batches: LmdbBatches | WdsBatches = LmdbBatches(data, self._buffers)
            self._loader = DataLoader(self._batches, sampler=self._sampler, **common)
        else:
            check_not_empty(len(data), world_size, uneven, str(data.root))
            self._sampler = None
            self._batches = WdsBatches(data, batch_size, shuffle, seed, drop_last, rank, world_size, uneven,
                                       buffers=self._buffers)
            self._loader = DataLoader(self._batches, **common)
        self._repartitions = self._sampler is not None  # shard streams are split in contiguous parts per rank

    @property
    def classes(self) -> list[str]:
        return self.dataset.classes

    @property
    def skipped(self) -> list[tuple[str, str]]:
        """`(key, reason)` of every sample skipped so far (on_error="skip"), each listed once, in the order first
        met, however many epochs meet it again."""
        return list(self._skipped.items())

    def _note_skipped(self, skipped: list[tuple[str, str]]) -> None:
        for key, reason in skipped:
            self._skipped.setdefault(key, reason)

    def _resume_config(self) -> dict[str, Any]:
        config = {"format": self.dataset.manifest.format, "dataset": dataset_fingerprint(self.dataset.manifest),
                  "samples": len(self.dataset), "batch_size": self.batch_size, "shuffle": self.shuffle,
                  "seed": self.seed, "drop_last": self.drop_last, "uneven": self.uneven}
        pipeline = self.dataset.pipeline
        config["augment"] = describe_augment(pipeline.augment, pipeline.image_size)
        if pipeline.preset is not None:
            config["image_size"] = pipeline.image_size
        if isinstance(self._batches, WdsBatches):
            config["window"] = self._batches.planner.window
        return config

    def _pass_length(self, start: int) -> int:
        if self._sampler is not None:
            return self._sampler.pass_length(start)
        return len(self)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank, for any number of workers)."""
        if self._sampler is not None:
            return len(self._sampler)
        assert isinstance(self._batches, WdsBatches)
        return self._batches.num_batches()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        here = self._begin_pass()
        if here.complete:  # restored after the last batch of its epoch: nothing of it is left
            self._end_pass()
            return
        if self._sampler is not None:
            self._sampler.epoch, self._sampler.start, self._sampler.skip = here.epoch, here.start, here.skip
        else:
            assert isinstance(self._batches, WdsBatches)
            self._batches.start(here.epoch, here.skip)
        self._pass_skip = here.skip
        if self._buffers is not None:
            self._buffers.reset(new_workers=not self._loader.persistent_workers)
        for images, labels in self._pass(here.epoch):
            self._count_batch()
            yield images, labels
        self._end_pass()

    def _pass(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The batches of one pass as the workers deliver them, with worker failures named."""
        self._iterating_epoch = epoch
        received = [0]
        try:
            yield from self._batches_on_device(self._from_workers(received), epoch)
        except RuntimeError as exc:
            message = str(exc)
            if message.startswith("Caught ") or not ("DataLoader worker" in message or "timed out" in message):
                raise  # an exception raised inside a worker keeps its own type and traceback
            raise WorkerError(f"{self.dataset.root}: {message.strip()} — {self._waiting_for(epoch, received[0])}") \
                from exc
        finally:
            self._iterating_epoch = None

    def _from_workers(self, received: list[int]) -> Iterator[Any]:
        """The workers' batches (decoded Batch, or EncodedBatch on the device path), with their bookkeeping."""
        for batch in self._loader:
            received[0] += 1
            if self._buffers is not None:  # None on the device path (EncodedBatch)
                self._buffers.received(batch.slot, batch.images)
            if batch.skipped:
                self._note_skipped(batch.skipped)
            self.stage_times.add(batch.times)
            self.stage_times.batches += 1
            yield batch

    def _batches_on_device(self, batches: Iterator[Any], epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """decode="device": decode + augment each batch on the device (next batch prepared on a side stream);
        "worker" with a device: move the finished batch there and convert it; no device: as the workers made it.
        A batch whose samples were all skipped borrows one (fastdata.borrow), so every rank yields len(self)."""
        if self.decode == "device":
            prefetched = DevicePrefetcher(batches, self._device_decoder)
            for number, (images, labels, skipped) in enumerate(prefetched, start=self._pass_skip):
                self._note_skipped(skipped)
                if not len(labels):
                    images, labels = self._borrow(epoch, number)
                    images = self._device_decoder.finish(images.to(self.device))
                    labels = labels.to(self.device)
                yield images, labels
            return
        for number, batch in enumerate(batches, start=self._pass_skip):
            images, labels = batch.images, batch.labels
            if not len(labels):
                images, labels = self._borrow(epoch, number)
            if self.device is None:
                yield images, labels
            else:
                images = images.to(self.device, non_blocking=True)
                yield self._device_decoder.finish(images), labels.to(self.device, non_blocking=True)

    def _borrow(self, epoch: int, number: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of one for batch `number` of `epoch`, whose samples were all skipped: the first later sample of
        this rank's epoch that decodes (fastdata.borrow), made here, in the main process (a rare event)."""
        pipeline = self.dataset.pipeline
        if self._sampler is not None:
            assert isinstance(self.dataset, LmdbImageDataset)
            batches = self._sampler.epoch_batches()
            read = self.dataset.encoded
        else:
            assert isinstance(self._batches, WdsBatches) and isinstance(self.dataset, WdsImageDataset)
            plan = self._batches.plan(epoch)
            batches = plan.batches

            def read(position: int) -> EncodedSample:
                slot, offset = (int(v[0]) for v in plan.locate(np.array([position])))
                return self.dataset.sample_at(int(plan.shard_order[slot]), offset)

        def make(position: int) -> tuple[EncodedSample, torch.Tensor]:
            sample = read(position)
            return sample, pipeline.to_tensor(pipeline.process(sample, epoch))

        where = f"{self.dataset.root}: epoch {epoch}, rank {self.rank}"
        sample, image = borrow(batches, number, make, where)
        self.borrowed.append((epoch, number, sample.key))
        if len(self.borrowed) == 1:
            warnings.warn(f"{self.dataset.root}: every sample of batch {number} of epoch {epoch} was skipped; it "
                          f"is replaced by one sample borrowed from later in the epoch ({sample.key!r}) so that "
                          f"every rank yields {len(self)} batches (loader.borrowed lists each; warned once)",
                          stacklevel=3)
        return image[None], torch.tensor([sample.label], dtype=torch.int64)

    @property
    def device_fallbacks(self) -> int:
        """decode="device": samples the device decoder does not take (PNG, CMYK and other non-baseline/progressive
        JPEGs), decoded in the workers instead; expected, not an error."""
        return self._device_decoder.fallbacks if self._device_decoder is not None else 0

    @property
    def device_errors(self) -> int:
        """decode="device": failures of the device decoder on bytes the CPU decodes (each failing sample, decoded
        on the CPU in the main process instead; or a failed batched call whose samples then decode alone).
        The first warns; out of memory, or errors in MAX_CONSECUTIVE_DEVICE_ERRORS batches in a row, raise
        DeviceDecodeError."""
        return self._device_decoder.errors if self._device_decoder is not None else 0

    def _waiting_for(self, epoch: int, batch_number: int) -> str:
        """What the loader was waiting for when a worker failed: the batch, its worker and its first keys."""
        worker = batch_number % max(1, self.num_workers)
        batch_number += self._pass_skip
        where = f"waiting for batch {batch_number} of epoch {epoch}, loaded by worker {worker}"
        if self._sampler is not None:
            assert isinstance(self.dataset, LmdbImageDataset)
            batches = self._sampler.epoch_batches()
            indices = batches[batch_number][:4] if batch_number < len(batches) else []
            keys = [self.dataset.reader.key(int(i)) for i in indices]
            return f"{where} (keys {', '.join(map(repr, keys))}, ...)"
        assert isinstance(self._batches, WdsBatches)
        return f"{where} (shards {', '.join(self._batches.batch_shards(epoch, batch_number))})"


def _resolve_decode(decode: str, device: torch.device | None, data: Any) -> str:
    """"auto" -> "device" when the target is a CUDA device whose nvjpeg works and the augment is a preset."""
    if decode not in DECODE_MODES:
        raise ConfigError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
    if decode == "device" and data.pipeline.preset is None:
        raise ConfigError("decode='device' needs augment='train' or 'val'; custom transforms run on the CPU "
                          "(decode='worker')")
    if decode != "auto":
        return decode
    usable = (device is not None and device.type == "cuda" and data.pipeline.preset is not None
              and device_decode_usable(device))
    return "device" if usable else "worker"


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
    rank: int | None = None,
    world_size: int | None = None,
    uneven: str = "pad",
    cache_dir: str | os.PathLike[str] | None = None,
    cache_max_bytes: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    device: torch.device | str | None = None,
    decode: str = "auto",
    dtype: torch.dtype | None = None,
    channels_last: bool = False,
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

    With `device` (e.g. "cuda"), batches arrive on that device, as uint8 or, with a floating `dtype`, normalised
    with the ImageNet mean/std (`channels_last` on request). `decode="device"` has the workers ship only the
    JPEGs' compressed bytes and crop parameters (other images are decoded in the workers) and decodes whole batches
    on the device (nvjpeg on CUDA), overlapped with the training step; `loader.device_fallbacks` and
    `loader.device_errors` count what the device did not decode. `"worker"` decodes in the workers; `"auto"` picks
    "device" for CUDA when nvjpeg works.

    Distributed: each rank gets its own part of every epoch and every rank yields the same number of batches;
    `rank` and `world_size` come from torch.distributed when it is initialised, or are given. `uneven="pad"`
    repeats the first samples of the epoch's order to even it out (as DistributedSampler does), `"drop"`
    leaves its last `n % world_size` samples out. `loader.state_dict()` / `load_state_dict()` resume exactly.

    `path` may be the http(s):// or s3:// URL of a converted WebDataset directory: shards stream through
    fsspec (`storage_options` go to the file system), are checked against the manifest's sha256 before use,
    and are kept in `cache_dir` (at most `cache_max_bytes`, e.g. "20GB") when it is given.

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
    rank, world_size = resolve_world(rank, world_size)
    check_uneven(uneven)
    data = _open_dataset(path, augment, image_size=image_size, seed=seed, on_error=on_error, cache_dir=cache_dir,
                         cache_max_bytes=cache_max_bytes, storage_options=storage_options)
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    text_options = {"seq_len": seq_len, "packing": packing, "max_length": max_length, "bucketing": bucketing,
                    "eos_token": eos_token}
    if not isinstance(data, (LmdbImageDataset, WdsImageDataset)):
        from fastdata.text.loader import text_loader

        return text_loader(data, batch_size=batch_size, shuffle=shuffle, num_workers=workers, seed=seed,
                           rank=rank, world_size=world_size, uneven=uneven,
                           drop_last=drop_last, pin_memory=pin, prefetch_factor=prefetch_factor,
                           persistent_workers=persistent_workers, multiprocessing_context=multiprocessing_context,
                           **text_options)
    given = [name for name, value in text_options.items() if value is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: for text datasets only; {path} holds images")
    return ImageLoader(data, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                       rank=rank, world_size=world_size, uneven=uneven,
                       num_workers=workers, pin_memory=pin, prefetch_factor=prefetch_factor,
                       persistent_workers=persistent_workers, multiprocessing_context=multiprocessing_context,
                       timeout=timeout, device=device, decode=decode, dtype=dtype, channels_last=channels_last)
