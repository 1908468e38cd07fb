"""The image loader: `(images, labels)` batches built whole in DataLoader workers (or decoded on the device),
in an order drawn from (seed, epoch) and split between ranks, with exact resume."""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastdata.config import LoaderOptions, check_bool
from fastdata.errors import ConfigError, FastdataError, WorkerError
from fastdata.image.augment import describe_augment
from fastdata.image.batch import EncodedBatch, EncodedSample, sample_metadata
from fastdata.image.buffers import BatchBuffers
from fastdata.image.datasets import LmdbBatches, LmdbImageDataset, WdsImageDataset
from fastdata.image.decode import opencv_single_threaded
from fastdata.image.device import DevicePath, PassKey
from fastdata.image.device.auto import device_for, placement
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.device.ship import DECODE_MODES
from fastdata.image.device.stage import finish
from fastdata.image.output import IMAGENET_MEAN, IMAGENET_STD, OutputFormat
from fastdata.image.pipeline import PipelineConfig
from fastdata.image.recipes.sizes import ImageSizes, ResizableLoader
from fastdata.image.wds_batches import WdsBatches
from fastdata.meter.stages import StageTimes
from fastdata.order.borrow import borrow
from fastdata.order.ranks import check_not_empty
from fastdata.order.samplers import EpochBatchSampler
from fastdata.order.state import ResumableLoader, dataset_fingerprint
from fastdata.workers import ClosesWorkers, WorkerPass, prepare_worker


@dataclass(frozen=True)
class ImageOptions:
    """Where image batches are delivered and decoded, and in what dtype: `device` (None: as the workers made
    them, on the CPU), `decode` ("auto", "worker" or "device", or a `DeviceDecodeOptions`: the device path with
    its decoder's options), `dtype` (None: uint8; floating: normalised with `mean` and `std`, three numbers each
    in 0..1 units, ImageNet's when not given) and on a device the memory format (`channels_last`)."""

    device: torch.device | None = None
    decode: str | DeviceDecodeOptions = "auto"
    dtype: torch.dtype | None = None
    channels_last: bool = False
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.decode, DeviceDecodeOptions) and self.decode not in DECODE_MODES:
            raise ConfigError(f"decode must be one of {DECODE_MODES} or a fastdata.options.DeviceDecodeOptions, got "
                              f"{self.decode!r}")
        check_bool("channels_last", self.channels_last)
        if self.device is not None and not isinstance(self.device, torch.device):
            try:  # type: ignore[unreachable]  # a device's name, made a torch.device here
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

    def checked_output(self, custom: bool, on_device: bool) -> OutputFormat:
        """The batches' dtype and normalisation, refused (ConfigError) where they do not apply: `custom` (a
        transform of the user's, which makes its own output) and `on_device` (batches delivered on a device)."""
        output = self.output_format()
        if custom and (self.mean is not None or self.std is not None):
            raise ConfigError("mean and std apply to augment='train'/'val'; a custom transform normalises its own "
                              "output (A.Normalize, v2.Normalize): leave them out")
        if not on_device and self.channels_last:
            raise ConfigError("channels_last applies to batches on a device: pass device= as well")
        if not on_device and output.floating and custom:
            raise ConfigError(f"dtype={self.dtype}: a custom transform sets its batches' dtype itself (A.Normalize, "
                              "ToTensorV2, v2.ToDtype); dtype applies to augment='train'/'val', or with device= "
                              "to a transform's uint8 batches")
        return output

    @property
    def placement(self) -> str:
        """"auto", "worker" or "device" (a `DeviceDecodeOptions` is the device path)."""
        return "device" if isinstance(self.decode, DeviceDecodeOptions) else self.decode

    @property
    def device_options(self) -> DeviceDecodeOptions:
        """The device path's decoder options (the defaults unless `decode` is a `DeviceDecodeOptions`)."""
        return self.decode if isinstance(self.decode, DeviceDecodeOptions) else DeviceDecodeOptions()

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


@dataclass
class Receipts:
    """Where a loader books the workers' batches as they arrive: the samples they skipped (key -> reason, each
    once), the stages' times, the batches received in the current pass, and the meter's trace sink."""

    skipped: dict[str, str] = field(default_factory=dict)
    stage_times: StageTimes = field(default_factory=StageTimes)
    received: int = 0
    trace_sink: Any = None

    def book(self, batches: Iterator[Any], buffers: BatchBuffers | None) -> Iterator[Any]:
        """The workers' batches (decoded Batch, or EncodedBatch on the device path), each booked here (`received`
        counts those of the current pass: the loader sets it to 0 as each pass opens)."""
        for batch in batches:
            self.received += 1
            if buffers is not None:  # the storage the batch's slot holds: its images, or (device path) its bytes
                buffers.received(batch.slot, batch.data if isinstance(batch, EncodedBatch) else batch.images)
            for key, reason in batch.skipped:
                self.skipped.setdefault(key, reason)
            self.stage_times.add(batch.times)
            self.stage_times.batches += 1
            if self.trace_sink is not None:
                self.trace_sink(batch.span, batch.times)
            yield batch


class Rolled:
    """The workers' rolling iterator (EpochBatchSampler.rollover) between passes: `share` gives one pass's batches
    off it and, once all are read, keeps it for the next pass, whose key it then holds; `take` hands it over (or
    None) and forgets it; `drop` forgets it and what any pass under way would keep (the workers' next epoch would
    be made otherwise: a new image size). It holds no reference to the loader, so that a feeder thread reading a
    pass's batches does not keep a loader its user dropped alive."""

    def __init__(self) -> None:
        self._kept: tuple[PassKey, Iterator[Any]] | None = None
        self._generation = 0  # counts `drop`s: a pass shared before the last one keeps nothing

    def take(self) -> tuple[PassKey, Iterator[Any]] | None:
        kept, self._kept = self._kept, None
        return kept

    def drop(self) -> None:
        self._kept = None
        self._generation += 1

    def share(self, key: PassKey, count: int, batches: Iterator[Any]) -> Iterator[Any]:
        """Pass `key`'s `count` batches off `batches`; then `batches` (at the next epoch's start) is kept for pass
        `key.epoch + 1`, unless `drop` was called meanwhile. A pass left early keeps nothing."""
        generation = self._generation

        def passing() -> Iterator[Any]:
            yield from itertools.islice(batches, count)
            if generation == self._generation:
                self._kept = (PassKey(key.epoch + 1), batches)

        return passing()


def _worker_init(_worker_id: int) -> None:
    prepare_worker()
    opencv_single_threaded()  # one decode per worker process; the workers are the parallelism


class ImageLoader(ClosesWorkers, ResizableLoader, ResumableLoader):
    """Iterable of batches over an image dataset of any target kind, shaped by its target codec
    (`fastdata.image.targets.codec`, `deliver`):
    - class labels: `(images, labels)`, like a DataLoader over torchvision's ImageFolder: images [B, 3, H, W]
      (uint8, or normalised floats with a floating `dtype`; a custom transform's own CHW output), labels int64 [B]
      (multi-label datasets: multi-hot float32 [B, C]);
    - semantic segmentation: `(images, masks)`, masks `[B, H, W]` of class ids
      (`fastdata.image.targets.segmentation`);
    - detection: `(images, targets)`: the presets' uint8 `[B, 3, S, S]` canvases, each image at the top-left,
      padded with 0 (augment=None: a list of B uint8 `[3, H, W]` images in their stored geometry, what
      torchvision's detection models take), targets a list of B dicts (`DetectionBatch.as_list`: `boxes` float32
      `[N, 4]` xyxy in the canvas' pixels, `labels`, `iscrowd`, `annotation_ids` int64 `[N]`, `area` float32
      `[N]`, `image_id`, and with `masks=True` `masks` uint8 `[N, S, S]`); decoded in the workers only;
    - image-text pairs: `{"images", "captions"}` (captions a list of str in batch order), or when the dataset
      stores token ids `{"images", "input_ids", "attention_mask", "captions"}` (int64 `[B, max_length]`).
    With `metadata=True` the metadata ride along (a third item, or `"metadata"`). Each new pass is the next epoch
    (reshuffled from (seed, epoch)); `set_epoch(e)` sets it explicitly. Batches are built whole inside the workers.
    Rank `rank` of `world_size` gets its own part of every epoch; `state_dict()` / `load_state_dict()` resume
    exactly in the middle of an epoch (`state_dict(pending=n)` for a loop holding n batches not trained on yet);
    a skipped image's target goes with it. As a DataLoader has them: `loader.dataset` (`len`: the whole dataset;
    `dataset[i]`: sample i as the batches hold it, the loader's dtype and normalisation included, on the CPU) and
    `loader.sampler` (`len`: this rank's samples per epoch). `close()` (or `with`) ends the worker processes and
    the device path's feeder thread."""

    def __init__(self, data: LmdbImageDataset | WdsImageDataset, options: LoaderOptions,
                 image: ImageOptions | None = None, sampler: EpochBatchSampler | None = None) -> None:
        """`sampler` (LMDB only) replaces the epoch's batch order drawn from `options` (a mixture's schedule)."""
        image = image or ImageOptions()
        pipeline = data.pipeline
        self._shape = pipeline.labels.deliver  # (images, targets[, metadata]) -> the batch as this kind gives it
        self.dataset = data
        self.options = options
        self.decode = placement(image.placement, data.target_kind, pipeline.preset, pipeline.recipe.per_sample)
        self.device = device_for(self.decode, image.device)  # decode="device" without one: the GPU, if any
        self._output = image.checked_output(custom=pipeline.preset is None, on_device=self.device is not None)
        self._channels_last = image.channels_last
        data.output = self._output  # loader.dataset[i] gives its image as the batches hold it (on the CPU)
        self._device: DevicePath | None = None  # decode="device": fastdata.image.device
        if self.decode == "device":
            assert self.device is not None
            self._device = DevicePath(self.device, pipeline, str(data.root), options.batch_size, output=self._output,
                                      channels_last=image.channels_last, on_error=data.on_error,
                                      options=image.device_options, gpu_kinds=data.manifest.stats.get("gpu_kinds"),
                                      sizes=_stored_sizes(data))
        self._sizes = self._configure_workers()  # progressive resizing (`set_image_size`): shared with the workers
        self.seed, self.shuffle = options.seed, options.shuffle
        self.batch_size, self.num_workers = options.batch_size, options.num_workers
        self.pin_memory = options.pin_memory
        # what the workers' batches are booked into (the device path's feeder thread books them too): the skipped
        # samples (key -> reason, each once however many epochs meet it), stage times, the meter's trace sink
        self._receipts = Receipts()
        self._skipped = self._receipts.skipped
        self.borrowed: list[tuple[int, int, str]] = []  # (epoch, batch, key lent to it): see fastdata.order.borrow
        self.stage_times = self._receipts.stage_times  # per-stage seconds over workers and batches (fastdata.meter)
        self.drop_last, self.uneven = options.drop_last, options.uneven
        self.rank, self.world_size = options.rank, options.world_size
        self._init_progress()
        self._pass_skip = 0
        self._iterating_epoch: int | None = None
        # the workers' batches left running into the pass after the last one that ended (`_rolls_over`)
        self._rolled = Rolled()
        self._open_workers(sampler)

    def _open_workers(self, sampler: EpochBatchSampler | None) -> None:
        """The DataLoader whose workers build the batches, over the epoch's batch order (`sampler`, or the one
        drawn from the options) or the WebDataset shards' plan; the shared-memory slots they build them in."""
        data, options = self.dataset, self.options
        common = options.dataloader_kwargs(worker_init_fn=_worker_init)
        # workers reuse their shared-memory batch tensors once this process has let go of them
        # (fastdata.image.buffers): slots for the batches in flight, those waiting here and the user's
        self._buffers = (BatchBuffers(options.num_workers, options.prefetch_factor + 4)
                         if options.num_workers and data.pipeline.output_size else None)
        if isinstance(data, LmdbImageDataset):
            self._sampler: EpochBatchSampler | None = sampler or EpochBatchSampler(
                len(data), options.batch_size, options.shuffle, options.seed, options.drop_last, options.rank,
                options.world_size, options.uneven)
            self._batches: LmdbBatches | WdsBatches = LmdbBatches(data, self._buffers)
            self._loader = DataLoader(self._batches, sampler=self._sampler, **common)
        else:
            check_not_empty(len(data), options.world_size, options.uneven, str(data.root))
            self._sampler = None
            self._batches = WdsBatches(data, options.batch_size, options.shuffle, options.seed, options.drop_last,
                                       options.rank, options.world_size, options.uneven, buffers=self._buffers)
            self._loader = DataLoader(self._batches, **common)
        self._workers = WorkerPass(self._loader)
        self._repartitions = self._sampler is not None  # shard streams are split in contiguous parts per rank

    def _configure_workers(self) -> ImageSizes | None:
        """Give the worker pipeline its one configuration (`PipelineConfig`) before the workers fork; return the
        schedule of each epoch's image size it shares (progressive resizing; None without a classification
        preset)."""
        pipeline, output = self.dataset.pipeline, self._output
        pipeline.recipe.check_output(output)
        sizes = None
        if pipeline.preset is not None and pipeline.spatial is None:
            sizes = ImageSizes(pipeline.preset.out_size)
        config = PipelineConfig(
            output=output if self.device is None else OutputFormat(),  # no device: the workers make the floats
            delivered=output,  # (RandomErasing's value is in the delivered batches' units)
            unstacked=(pipeline.labels.whole_images_as_lists and pipeline.preset is None
                       and pipeline.augment is None),  # whole images of different sizes: a list per batch
            sizes=sizes)
        pipeline.configure(config if self._device is None else self._device.shipping(config))
        if pipeline.preset is not None:
            # load (and self-check) the region decoder here, so that a fallback to OpenCV is warned about once, in
            # this process, before the workers fork (they inherit the warned state)
            pipeline.region_decoder_for_presets()
        return sizes

    @property
    def classes(self) -> list[str]:
        return self.dataset.classes

    @property
    def trace_sink(self) -> Any:
        """fastdata.meter's trace sets it: called with each batch's (span, stage times) as it arrives."""
        return self._receipts.trace_sink

    @trace_sink.setter
    def trace_sink(self, sink: Any) -> None:
        self._receipts.trace_sink = sink

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
        if pipeline.recipe:
            config["recipe"] = pipeline.recipe.describe()
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

    def _sizes_changed(self) -> None:
        self._rolled.drop()  # what the workers made ahead is at the size before

    def _sampling(self) -> tuple[int, bool, int, str]:
        total = self._sampler.num_samples if self._sampler is not None else self.dataset.manifest.num_samples
        return total, self.shuffle, self.seed, self.uneven

    def _rank_order(self, epoch: int) -> np.ndarray:
        if self._sampler is not None:
            return self._sampler.rank_indices_for(epoch, 0)
        assert isinstance(self._batches, WdsBatches)
        return self._batches.planner.rank_order(epoch)

    def __iter__(self) -> Iterator[Any]:
        here = self._begin_pass()
        if here.complete:  # restored after the last batch of its epoch: nothing of it is left
            self._end_pass()
            return
        self._pass_skip = here.skip
        shape = self._shape
        for batch in self._pass(PassKey(here.epoch, here.start, here.skip)):
            self._count_batch()
            yield shape(batch)
        self._end_pass()

    def _pass(self, key: PassKey) -> Iterator[tuple[Any, ...]]:
        """The batches of one pass, delivered as this loader does (`_deliver`), with worker failures named."""
        self._iterating_epoch = key.epoch
        try:
            with self._workers.running(cleanup=self.close_feeder):  # a failure stops the workers, named
                if self._device is not None:
                    yield from self._device_pass(key)
                else:
                    yield from self._deliver(self._open_pass(key), key)
        except GeneratorExit:  # (alone: a generator finalised at interpreter exit may find the module's globals
            raise              # already None, and `except (GeneratorExit, None)` would raise a TypeError)
        except FastdataError:
            raise
        except BaseException as exc:
            message = str(exc)
            if not isinstance(exc, RuntimeError) or message.startswith("Caught ") or \
                    not ("DataLoader worker" in message or "timed out" in message):
                raise  # an exception raised inside a worker keeps its own type and traceback
            raise WorkerError(f"{self.dataset.root}: {message.strip()} — "
                              f"{self._waiting_for(key, self._receipts.received)}") from exc
        finally:
            self._iterating_epoch = None

    def _rolls_over(self) -> bool:
        """Whether the workers go on from one epoch into the next without waiting for the next pass (the sampler's
        `rollover`): over LMDB with persistent workers, so that the workers build the next epoch's first batches
        while the last ones of this epoch are used (on the device path, while the feeder makes them), and an epoch
        never starts with the loop waiting for a whole batch to be built."""
        return (self._sampler is not None and self._sampler.can_roll_over and self.num_workers > 0
                and bool(self._loader.persistent_workers))

    def _open_pass(self, key: PassKey) -> Iterator[Any]:
        """Set the workers' order to pass `key`, start them on it (`iter` of the DataLoader: the first pass of
        persistent workers forks them) and return their batches, booked as they come (`Receipts.book`: the
        iterator holds no reference to this loader, so that a feeder thread reading it does not keep it alive).
        The workers already on pass `key` (rolled over from the pass before) are taken as they are; if they are
        on another pass (set_epoch, load_state_dict, a pass left early), `iter` drops what they made of it."""
        rolled = self._rolled.take()
        self._receipts.received = 0
        if self._sampler is not None:
            self._sampler.epoch, self._sampler.start, self._sampler.skip = key.epoch, key.start, key.skip
            count = self._pass_length(key.start) - key.skip
            if rolled is not None and rolled[0] == key:
                return self._rolled.share(key, count, rolled[1])
            self._sampler.rollover = self._rolls_over()
        else:
            assert isinstance(self._batches, WdsBatches)
            self._batches.start(key.epoch, key.skip)
        if self._buffers is not None:
            self._buffers.reset(new_workers=not self._loader.persistent_workers)
        batches = self._receipts.book(self._workers.start(), self._buffers)
        if self._sampler is not None and self._sampler.rollover:
            return self._rolled.share(key, count, batches)
        return batches

    def _deliver(self, batches: Iterator[Any], key: PassKey) -> Iterator[tuple[Any, ...]]:
        """The workers' finished batches as they made them, or with a device moved there and converted.
        A batch whose samples were all skipped borrows one (fastdata.order.borrow), so every rank yields len(self)."""
        for number, batch in enumerate(batches, start=self._pass_skip):
            images, labels, metadata = batch.images, batch.labels, batch.metadata
            if not len(labels):
                images, labels, metadata = self._borrow(key, number)
            if self.device is not None:
                if isinstance(images, list):  # whole images of their own sizes (detection, augment=None)
                    images = [finish(image.to(self.device, non_blocking=True)[None], self._output, False,
                                     str(self.dataset.root))[0] for image in images]
                else:
                    images = finish(images.to(self.device, non_blocking=True), self._output, self._channels_last,
                                    str(self.dataset.root))
                labels = labels.to(self.device, non_blocking=True)
            yield (images, labels) if metadata is None else (images, labels, metadata)

    def _device_pass(self, key: PassKey) -> Iterator[tuple[Any, ...]]:
        """decode="device": the batches its feeder makes beside the training step (fastdata.image.device), at the
        epoch's image size (progressive resizing: a new size gets slots of its own, and the feeder prepares the next
        epoch ahead only when it is made at the same size)."""
        assert self._device is not None
        device, sizes = self._device, self._sizes  # (the feeder must not hold this loader)
        if sizes is not None:
            device.set_image_size(sizes.size_for(key.epoch))

        def follow(done: PassKey) -> PassKey | None:  # the next epoch ahead, unless it is made at another size
            same = sizes is None or sizes.size_for(done.epoch + 1) == device.stage.image_size
            return PassKey(done.epoch + 1) if same else None

        timings = device.timings
        for number, made in enumerate(device.batches(key, weakref.WeakMethod(self._open_pass), self, follow),
                                      start=key.skip):
            self._note_skipped(made.skipped)
            self.stage_times.device += made.seconds
            self.stage_times.parts = dict(timings)  # the feeder's threads and streams, so far (the meter's)
            images, labels, metadata = made.images, made.labels, made.metadata
            if not len(labels):
                images, labels, metadata = self._borrow(key, number)  # type: ignore[assignment]  # a preset's: stacked
                images = finish(images.to(self.device), self._output, self._channels_last, str(self.dataset.root))
                labels = labels.to(self.device)
            elif self.dataset.pipeline.recipe.batch is not None:  # mixed here, on the device
                labels = self.dataset.pipeline.mix(images, labels, key.epoch, (number,))
            yield (images, labels) if metadata is None else (images, labels, metadata)

    def close(self) -> None:
        """End the worker processes and the device path's feeder thread now (also `with fastdata.loader(...) as
        loader:`); the next pass, if any, starts them again."""
        self.close_feeder()
        self._rolled.take()
        super().close()

    def close_feeder(self) -> None:
        """Stop the device path's feeder threads, if they run (the next pass starts them again)."""
        if self._device is not None:
            self._device.close()

    @property
    def device_decoder(self) -> str | None:
        """decode="device": the decoder in use (e.g. "nvimgcodec 0.9.0 (hardware, hybrid; 4 CPU threads)"), once
        the first pass has made it; None otherwise."""
        return self._device.decoder_name if self._device is not None else None

    def _borrow(self, key: PassKey, number: int) -> tuple[torch.Tensor | list[torch.Tensor], Any, list[dict] | None]:
        """A batch of one for batch `number` of pass `key`, whose samples were all skipped: the first later sample
        of this rank's epoch that decodes (fastdata.order.borrow), made here, in the main process (a rare event).
        The pass's batches come from `key`, not from the sampler's attributes, which the device path's feeder may
        already have set for the next pass."""
        pipeline = self.dataset.pipeline
        epoch = key.epoch
        read: Callable[[int], EncodedSample]
        if self._sampler is not None:
            assert isinstance(self.dataset, LmdbImageDataset)
            batches = self._sampler.batches_for(key.epoch, key.start)
            read = self.dataset.encoded
        else:
            assert isinstance(self._batches, WdsBatches) and isinstance(self.dataset, WdsImageDataset)
            plan, shards = self._batches.plan(epoch), self.dataset
            batches = plan.batches

            def read_shards(position: int) -> EncodedSample:
                slot, offset = (int(v[0]) for v in plan.locate(np.array([position])))
                return shards.sample_at(int(plan.shard_order[slot]), offset)

            read = read_shards

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
        metadata = [sample_metadata(sample)] if self.dataset.with_metadata else None
        images = [image] if pipeline.config.unstacked else image[None]
        labels = pipeline.labels.batch([pipeline.target_of(sample)])
        if pipeline.recipe.batch is not None:  # labels as the batch preset makes them (one row: not mixed)
            labels = pipeline.mix(images, labels, epoch, sample.position)  # type: ignore[arg-type]  # a preset's
        return images, labels, metadata

    @property
    def device_fallbacks(self) -> int:
        """decode="device": samples the device decoder does not take (PNG, CMYK and other non-baseline/progressive
        JPEGs), decoded in the workers instead; expected, not an error."""
        return self._device.fallbacks if self._device is not None else 0

    @property
    def device_errors(self) -> int:
        """decode="device": batches in which the device decoder failed as a whole on bytes that decode (a failed
        batched call whose samples then decode alone, or none of two or more JPEGs decoded while the CPU decodes
        them; fastdata.image.device.failures). The first warns; out of memory, or errors in
        MAX_CONSECUTIVE_DEVICE_ERRORS batches in a row, raise DeviceDecodeError."""
        return self._device.errors if self._device is not None else 0

    @property
    def device_whole(self) -> int:
        """decode="device": JPEGs the device decoder could not decode by region, decoded whole there instead."""
        return self._device.whole if self._device is not None else 0

    @property
    def device_rejected(self) -> int:
        """decode="device": samples whose bytes the device decoder refused but the CPU decodes (decoded on the CPU
        in the main process, beside the feeder; said once). Bytes neither decodes follow on_error."""
        return self._device.rejected if self._device is not None else 0

    def _waiting_for(self, key: PassKey, batch_number: int) -> str:
        """What the loader was waiting for when a worker failed: the batch, its worker and its first keys."""
        worker = batch_number % max(1, self.num_workers)
        batch_number += self._pass_skip
        epoch = key.epoch
        where = f"waiting for batch {batch_number} of epoch {epoch}, loaded by worker {worker}"
        if self._sampler is not None:
            assert isinstance(self.dataset, LmdbImageDataset)
            batches = self._sampler.batches_for(key.epoch, key.start)
            indices = batches[batch_number][:4] if batch_number < len(batches) else np.empty(0, np.int64)
            keys = [self.dataset.reader.key(int(i)) for i in indices]
            return f"{where} (keys {', '.join(map(repr, keys))}, ...)"
        assert isinstance(self._batches, WdsBatches)
        return f"{where} (shards {', '.join(self._batches.batch_shards(epoch, batch_number))})"


#: The names of the loaders of image-text pairs and of detection datasets before one `ImageLoader` served every
#: target kind, kept for code that names them
PairLoader = DetectionLoader = ImageLoader


def _stored_sizes(data: Any) -> Any:
    """For the device decoder's preallocation: the stored widths and heights, where the dataset records them
    (LMDB), read when called (on the feeder's thread, after the workers forked)."""
    if not isinstance(data, LmdbImageDataset):
        return None
    return lambda: (data.reader.widths, data.reader.heights)
