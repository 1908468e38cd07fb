"""The image loader: `(images, labels)` batches built whole in DataLoader workers (or decoded on the device),
in an order drawn from (seed, epoch) and split between ranks, with exact resume."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastdata.config import LoaderOptions, check_bool, ctrl_c_held, failed_pass, worker_ignores_ctrl_c
from fastdata.errors import ConfigError, WorkerError
from fastdata.image.augment import describe_augment
from fastdata.image.batch import EncodedSample
from fastdata.image.buffers import BatchBuffers
from fastdata.image.datasets import LmdbBatches, LmdbImageDataset, WdsImageDataset
from fastdata.image.decode import opencv_single_threaded
from fastdata.image.device import (
    DECODE_MODES,
    DeviceDecoder,
    DevicePrefetcher,
    decode_jpegs_torchvision,
    device_decode_usable,
)
from fastdata.image.device_restart import sub_jpeg_failure, warn_whole_files
from fastdata.image.output import IMAGENET_MEAN, IMAGENET_STD, OutputFormat
from fastdata.image.wds_batches import WdsBatches
from fastdata.meter.stages import StageTimes
from fastdata.order.borrow import borrow
from fastdata.order.ranks import check_not_empty
from fastdata.order.samplers import EpochBatchSampler
from fastdata.order.state import ResumableLoader, dataset_fingerprint


@dataclass(frozen=True)
class ImageOptions:
    """Where image batches are delivered and decoded, and in what dtype: `device` (None: as the workers made
    them, on the CPU), `decode` ("auto", "worker" or "device"), `dtype` (None: uint8; floating: normalised with
    `mean` and `std`, three numbers each in 0..1 units, ImageNet's when not given) and on a device the memory
    format (`channels_last`)."""

    device: torch.device | None = None
    decode: str = "auto"
    dtype: torch.dtype | None = None
    channels_last: bool = False
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None

    def __post_init__(self) -> None:
        if self.decode not in DECODE_MODES:
            raise ConfigError(f"decode must be one of {DECODE_MODES}, got {self.decode!r}")
        check_bool("channels_last", self.channels_last)
        if self.device is not None and not isinstance(self.device, torch.device):
            try:
                object.__setattr__(self, "device", torch.device(self.device))
            except (RuntimeError, TypeError) as exc:
                raise ConfigError(f"device must be a torch.device or a name such as 'cuda' or 'cuda:1', got "
                                  f"{self.device!r} ({exc})") from None
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            raise ConfigError(f"dtype must be a torch.dtype (e.g. torch.bfloat16), got {self.dtype!r}")
        output = self.output_format()  # checks dtype, mean and std
        if (self.mean is not None or self.std is not None) and not output.floating:
            raise ConfigError("mean and std normalise floating batches: pass dtype=torch.float32 (or "
                              "torch.bfloat16, torch.float16) as well")
        object.__setattr__(self, "mean", None if self.mean is None else output.mean)
        object.__setattr__(self, "std", None if self.std is None else output.std)

    def output_format(self) -> OutputFormat:
        """The batches' dtype and normalisation."""
        return OutputFormat(self.dtype, IMAGENET_MEAN if self.mean is None else self.mean,
                            IMAGENET_STD if self.std is None else self.std)

    @staticmethod
    def given_in(options: dict[str, Any]) -> list[str]:
        """The names of the options in `options` (as `ImageOptions` takes them) that are set, i.e. differ from
        their defaults: looked at before they are validated, for the error when the dataset holds text."""
        defaults = {name: field.default for name, field in ImageOptions.__dataclass_fields__.items()}
        return [name for name, value in options.items()
                if (value is not None if defaults[name] is None else value != defaults[name])]


def _device_takes_sub_jpegs(device: torch.device) -> bool:
    """Whether `device`'s JPEG decoder decodes a restart-layout crop's sub-JPEG to exactly the whole image's pixels
    (checked on probes, once per loader; a few ms); when not, the workers ship whole files, with one warning."""
    def decode(data: bytes) -> torch.Tensor:
        return decode_jpegs_torchvision([torch.frombuffer(bytearray(data), dtype=torch.uint8)], device)[0]

    failure = sub_jpeg_failure(decode)
    if failure:
        warn_whole_files(str(device), failure)
    return not failure


def _worker_init(_worker_id: int) -> None:
    worker_ignores_ctrl_c()
    opencv_single_threaded()  # one decode per worker process; the workers are the parallelism


class ImageLoader(ResumableLoader):
    """Iterable of `(images, labels)` batches, like a DataLoader over torchvision's ImageFolder:
    images [B, 3, H, W] (uint8, or normalised floats with a floating `dtype`; a custom transform's own CHW output),
    labels int64 [B] (multi-label datasets: multi-hot float32 [B, C]; semantic segmentation datasets: masks
    `[B, H, W]` of class ids, `fastdata.image.segmentation`). Each new pass is the next epoch
    (reshuffled from (seed, epoch)); `set_epoch(e)` sets it explicitly. Batches are built whole inside the workers.
    Rank `rank` of `world_size` gets its own part of every epoch; `state_dict()` / `load_state_dict()` resume
    exactly in the middle of an epoch."""

    def __init__(self, data: LmdbImageDataset | WdsImageDataset, options: LoaderOptions,
                 image: ImageOptions | None = None, sampler: EpochBatchSampler | None = None) -> None:
        """`sampler` (LMDB only) replaces the epoch's batch order drawn from `options` (a mixture's schedule)."""
        image = image or ImageOptions()
        self.dataset = data
        self.options = options
        self.device = image.device
        dtype, channels_last = image.dtype, image.channels_last
        self.decode = _resolve_decode(image.decode, self.device, data)
        if self.decode == "device" and self.device is None:
            self.device = torch.device("cpu")
        self._device_decoder = None
        self._output = output = image.output_format()
        custom = data.pipeline.preset is None
        if custom and (image.mean is not None or image.std is not None):
            raise ConfigError("mean and std apply to augment='train'/'val'; a custom transform normalises its own "
                              "output (A.Normalize, v2.Normalize): leave them out")
        if self.device is not None:
            self._device_decoder = DeviceDecoder(self.device, data.pipeline.output_size, str(data.root), dtype=dtype,
                                                 mean=output.mean, std=output.std, channels_last=channels_last,
                                                 on_error=data.on_error, max_pixels=data.pipeline.max_pixels)
        elif channels_last:
            raise ConfigError("channels_last applies to batches on a device: pass device= as well")
        elif output.floating and custom:
            raise ConfigError(f"dtype={dtype}: a custom transform sets its batches' dtype itself (A.Normalize, "
                              "ToTensorV2, v2.ToDtype); dtype applies to augment='train'/'val', or with device= "
                              "to a transform's uint8 batches")
        else:
            data.pipeline.output = output  # the workers make the floats, image by image
        data.pipeline.ship_encoded = self.decode == "device"
        if data.pipeline.ship_encoded and data.pipeline.jpeg_layout == "restart" and data.pipeline.preset is not None:
            data.pipeline.ship_sub_jpegs = _device_takes_sub_jpegs(self.device)
        if data.pipeline.preset is not None:
            # load (and self-check) the region decoder here, so that a fallback to OpenCV is warned about once, in
            # this process, before the workers fork (they inherit the warned state)
            data.pipeline.region_decoder_for_presets()
        self.seed, self.shuffle = options.seed, options.shuffle
        self.batch_size = batch_size = options.batch_size
        self.num_workers = num_workers = options.num_workers
        self.pin_memory = options.pin_memory
        self._skipped: dict[str, str] = {}  # key -> reason, each bad sample once however many epochs meet it
        self.borrowed: list[tuple[int, int, str]] = []  # (epoch, batch, key lent to it): see fastdata.borrow
        self.stage_times = StageTimes()  # per-stage seconds summed over workers and batches (fastdata.meter reads it)
        self.trace_sink: Any = None  # fastdata.meter's trace sets it: called with each batch's (span, stage times)
        self.drop_last, self.uneven = options.drop_last, options.uneven
        self.rank, self.world_size = options.rank, options.world_size
        self._init_progress()
        self._pass_skip = 0
        self._iterating_epoch: int | None = None
        common = options.dataloader_kwargs(worker_init_fn=_worker_init)
        # workers reuse their shared-memory batch tensors once this process has let go of them
        # (fastdata.batch_buffers): slots for the batches in flight, those waiting here and the user's
        self._buffers = (BatchBuffers(num_workers, options.prefetch_factor + 4)
                         if num_workers and data.pipeline.output_size and not data.pipeline.ship_encoded else None)
        if isinstance(data, LmdbImageDataset):
            self._sampler: EpochBatchSampler | None = sampler or EpochBatchSampler(
                len(data), batch_size, options.shuffle, options.seed, options.drop_last, options.rank,
                options.world_size, options.uneven)
            self._batches: LmdbBatches | WdsBatches = LmdbBatches(data, self._buffers)
            self._loader = DataLoader(self._batches, sampler=self._sampler, **common)
        else:
            check_not_empty(len(data), options.world_size, options.uneven, str(data.root))
            self._sampler = None
            self._batches = WdsBatches(data, batch_size, options.shuffle, options.seed, options.drop_last,
                                       options.rank, options.world_size, options.uneven, buffers=self._buffers)
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
        config["augment"] = describe_augment(pipeline.preset if pipeline.preset is not None else pipeline.augment)
        if pipeline.preset is not None:
            size = pipeline.image_size  # an int for a square, as states before rectangles had it
            config["image_size"] = size if isinstance(size, int) else list(size)
        config["output"] = self._output.describe()
        if isinstance(self._batches, WdsBatches):
            config["window"] = self._batches.planner.window
        targets = pipeline.labels.describe()
        if targets:  # captions (image-text pairs): the rows' length; detection: whether masks come; segmentation:
            # the masks' dtype and padding
            kind = self.dataset.target_kind
            config[kind if kind in ("detection", "segmentation") else "captions"] = targets
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
        with ctrl_c_held():  # workers start here (the first pass of persistent ones)
            batches = iter(self._loader)
        try:
            yield from self._batches_on_device(self._from_workers(batches, received), epoch)
        except GeneratorExit:
            raise  # the caller stopped early: persistent workers stay for the next pass
        except BaseException as exc:
            original = failed_pass(self._loader, batches, exc)
            if original is not exc:
                raise original from exc  # our own message first, the worker's traceback as the cause
            message = str(exc)
            if not isinstance(exc, RuntimeError) or message.startswith("Caught ") or \
                    not ("DataLoader worker" in message or "timed out" in message):
                raise  # an exception raised inside a worker keeps its own type and traceback
            raise WorkerError(f"{self.dataset.root}: {message.strip()} — {self._waiting_for(epoch, received[0])}") \
                from exc
        finally:
            self._iterating_epoch = None

    def _from_workers(self, batches: Iterator[Any], received: list[int]) -> Iterator[Any]:
        """The workers' batches (decoded Batch, or EncodedBatch on the device path), with their bookkeeping."""
        for batch in batches:
            received[0] += 1
            if self._buffers is not None:  # None on the device path (EncodedBatch)
                self._buffers.received(batch.slot, batch.images)
            if batch.skipped:
                self._note_skipped(batch.skipped)
            self.stage_times.add(batch.times)
            self.stage_times.batches += 1
            if self.trace_sink is not None:
                self.trace_sink(batch.span, batch.times)
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
        if pipeline.output.floating:  # as the workers make the batches of the CPU path
            image = pipeline.output.normalise(image)
        self.borrowed.append((epoch, number, sample.key))
        if len(self.borrowed) == 1:
            warnings.warn(f"{self.dataset.root}: every sample of batch {number} of epoch {epoch} was skipped; it "
                          f"is replaced by one sample borrowed from later in the epoch ({sample.key!r}) so that "
                          f"every rank yields {len(self)} batches (loader.borrowed lists each; warned once)",
                          stacklevel=3)
        return image[None], pipeline.labels.batch([pipeline.target_of(sample)])

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


class PairLoader(ImageLoader):
    """Iterable of dicts over an image-text pair dataset: `{"images", "captions"}` (images as `ImageLoader` makes
    them, captions a list of str in batch order), or when the dataset stores token ids `{"images", "input_ids",
    "attention_mask", "captions"}` (int64 `[B, max_length]`). Everything else is `ImageLoader`'s: the order,
    the rank split, exact resume, skipped images (whose captions go with them) and borrowed samples."""

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        for images, captions in super().__iter__():
            yield {"images": images, **captions.as_dict()}


class DetectionLoader(ImageLoader):
    """Iterable of `(images, targets)` over a detection dataset: images as `ImageLoader` makes them (the presets:
    uint8 `[B, 3, S, S]` canvases, each image at the top-left, padded with 0), targets a list of B dicts
    (`DetectionBatch.as_list`: `boxes` float32 `[N, 4]` xyxy in the canvas' pixels, `labels`, `iscrowd`,
    `annotation_ids` int64 `[N]`, `area` float32 `[N]`, `image_id`, and with `masks=True` `masks` uint8
    `[N, S, S]`). Everything else is `ImageLoader`'s: the order, the rank split, exact resume, skipped images (whose
    targets go with them) and borrowed samples. Decoded in the workers only (decode="device" is refused)."""

    def __init__(self, data: LmdbImageDataset | WdsImageDataset, options: LoaderOptions,
                 image: ImageOptions | None = None) -> None:
        if data.pipeline.preset is None and data.pipeline.augment is None:
            raise ConfigError(f"{data.root}: augment=None gives whole images of different sizes, which do not "
                              "stack: use augment='train' or 'val' (a padded canvas), or fastdata.dataset(PATH) for "
                              "whole images with their targets")
        super().__init__(data, options, image)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, list[dict[str, Any]]]]:  # type: ignore[override]
        for images, targets in super().__iter__():
            yield images, targets.as_list()


def _resolve_decode(decode: str, device: torch.device | None, data: Any) -> str:
    """"auto" -> "device" when the target is a CUDA device whose nvjpeg works and the augment is a preset."""
    if decode not in DECODE_MODES:
        raise ConfigError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
    if data.target_kind in ("detection", "segmentation"):
        if decode == "device":
            raise ConfigError(f"decode='device' supports class labels and image-text pairs; {data.target_kind} "
                              "datasets decode in the workers (decode='worker' or 'auto')")
        return "worker"
    if decode == "device" and data.pipeline.preset is None:
        raise ConfigError("decode='device' needs augment='train' or 'val'; custom transforms run on the CPU "
                          "(decode='worker')")
    if decode != "auto":
        return decode
    usable = (device is not None and device.type == "cuda" and data.pipeline.preset is not None
              and device_decode_usable(device))
    return "device" if usable else "worker"
