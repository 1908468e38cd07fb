"""The batch types a worker hands over, shared by the worker pipeline (decoded batches) and the device path
(encoded batches): one module that both import, so neither imports the other."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from time import monotonic_ns, perf_counter
from typing import Any

import torch

from fastdata.formats.records import Label
from fastdata.image.buffers import Slot
from fastdata.image.handover import fields_by_value, rebuilt
from fastdata.image.targets.captions import Caption, CaptionBatch
from fastdata.meter.stages import StageTimes


@dataclass
class EncodedSample:
    """One stored sample as read from storage, before decoding."""

    key: str
    data: bytes
    label: Label | Caption  # a class id, (multi-label) the tuple of the sample's class ids, or (pairs) its caption
    width: int
    height: int
    codec: int
    position: tuple[int, ...]  # what seeds its augmentation (index, or shard and offset), with the epoch
    origin: str = ""  # the data file it was read from, when the dataset has several (a shard's name)
    metadata: dict | None = None  # its stored metadata, where the format reads it with the sample (WebDataset)
    target: bytes | None = None  # its stored target record (detection), read with the sample
    made: Any = None  # detection: its target as the pipeline made it, in the output's pixels (DetectionTarget)


@dataclass
class Batch:
    """A decoded batch as a worker hands it over: NCHW uint8 images (detection with augment=None: a list of CHW
    images of their stored sizes), labels (int64 `[B]`, or multi-hot float32 `[B, C]`:
    `fastdata.image.targets.labels`; image-text pairs: the captions, `fastdata.image.targets.captions`), skipped
    samples, and the time each stage took."""

    images: torch.Tensor | list[torch.Tensor]
    labels: torch.Tensor | CaptionBatch
    skipped: list[tuple[str, str]] = field(default_factory=list)
    times: StageTimes = field(default_factory=StageTimes)
    slot: Slot | None = None  # the worker's reused shared-memory slot holding `images` (fastdata.image.buffers)
    span: tuple[int, int, int] | None = None  # (worker, started ns, ended ns): `worker_span`, for traces
    metadata: list[dict] | None = None  # with metadata=True: {"key": ..., **stored metadata} per sample kept

    def pin_memory(self) -> Batch:
        """Called by DataLoader's pin-memory thread; the pinning counts as the transfer stage."""
        started = perf_counter()
        images = ([image.pin_memory() for image in self.images] if isinstance(self.images, list)
                  else self.images.pin_memory())
        labels = self.labels.pin_memory()
        times = replace(self.times, transfer=self.times.transfer + perf_counter() - started)
        return replace(self, images=images, labels=labels, times=times)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """How a batch crosses from a worker to the main process: the images as shared memory (a worker's reused
        slot: fastdata.image.buffers), a small labels tensor by value (fastdata.image.handover; masks stay shared
        memory). Each shared tensor costs the main process a file-descriptor handshake with the worker, which waits
        for the worker's GIL while it makes its next batch (benchmarks/device_handover.py)."""
        return rebuilt, (Batch, fields_by_value(self, shared=("images",)))


@dataclass
class EncodedBatch:
    """What a worker hands over on the `"device"` path, one row per sample in batch order: compressed bytes and
    crop parameters for the JPEGs the device decodes, finished pixels for the samples the worker decoded."""

    data: torch.Tensor  # uint8, the device-decoded samples' bytes concatenated
    offsets: torch.Tensor  # int64 [B + 1]: sample i is data[offsets[i]:offsets[i + 1]] (empty if worker-decoded)
    boxes: torch.Tensor  # float64 [B, 4]: left, top, width, height of the crop in source pixels
    flips: torch.Tensor  # bool [B]: flip on the device (False for worker-decoded rows, flipped already)
    sizes: torch.Tensor  # int64 [B, 2]: stored width, height
    labels: torch.Tensor | CaptionBatch  # int64 [B], multi-hot float32 [B, C], or (pairs) the captions
    worker_decoded: torch.Tensor  # bool [B]: decoded, cropped, resized and flipped in the worker
    pixels: torch.Tensor  # uint8 [sum(worker_decoded), 3, S, S]: those samples' images, in batch order
    keys: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    times: StageTimes = field(default_factory=StageTimes)
    span: tuple[int, int, int] | None = None  # (worker, started ns, ended ns): `worker_span`, for traces
    metadata: list[dict] | None = None  # with metadata=True: {"key": ..., **stored metadata}, in batch order
    slot: Slot | None = None  # the worker's reused shared-memory slot holding `data` and `pixels` (buffers.py)

    def __len__(self) -> int:
        return len(self.labels)

    def pin_memory(self) -> EncodedBatch:
        """Called by DataLoader's pin-memory thread: pinned bytes, pixels and labels copy to the GPU
        asynchronously (and nvImageCodec reads the bytes straight from pinned memory)."""
        return replace(self, data=self.data.pin_memory(), pixels=self.pixels.pin_memory(),
                       labels=self.labels.pin_memory())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """How a batch crosses from a worker to the main process (DataLoader's queue, torch's pickler): the bytes
        and the worker's pixels as one shared-memory tensor when they share one storage
        (`fastdata.image.device.ship.encoded_buffer` makes them so), the small fields (offsets, boxes, flips,
        sizes, flags, labels) by value (fastdata.image.handover). Each shared tensor costs the main process a
        file-descriptor handshake with the worker (on the thread that also feeds the GPU), and a batch had eight.
        Never written to disk (no pickle there)."""
        state = fields_by_value(self, shared=("data", "pixels"))
        whole = _one_storage(self.data, self.pixels)
        if whole is None:
            return rebuilt, (EncodedBatch, state)
        del state["data"], state["pixels"]
        return _rebuild_encoded, (whole, self.data.numel(), tuple(self.pixels.shape), state)


def _one_storage(data: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor | None:
    """The whole storage behind `data` and `pixels` as one flat tensor, when they are its first two consecutive
    contiguous parts (as `fastdata.image.device.ship.encoded_buffer` makes them; a reused slot may be larger than
    the batch); None otherwise."""
    storage = data.untyped_storage()
    if (data.dtype != torch.uint8 or pixels.dtype != torch.uint8 or data.storage_offset() != 0
            or not data.is_contiguous() or not pixels.is_contiguous() or pixels.untyped_storage().data_ptr()
            != storage.data_ptr() or pixels.storage_offset() != data.numel()
            or storage.nbytes() < data.numel() + pixels.numel()):
        return None
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _rebuild_encoded(whole: torch.Tensor, data_size: int, pixels_shape: tuple[int, ...],
                     state: dict[str, Any]) -> EncodedBatch:
    """`EncodedBatch.__reduce__`'s other half when its bytes and pixels came as one storage."""
    pixels = whole[data_size:data_size + math.prod(pixels_shape)].view(pixels_shape)
    return rebuilt(EncodedBatch, {**state, "data": whole[:data_size], "pixels": pixels})


def sample_metadata(sample: EncodedSample) -> dict:
    """What a batch carries of a sample with metadata=True: its key, then its stored metadata."""
    return {"key": sample.key, **(sample.metadata or {})}


def worker_span(started_ns: int) -> tuple[int, int, int]:
    """(worker id, or -1 in the main process; `started_ns`; now) on CLOCK_MONOTONIC (`time.monotonic_ns`, one
    clock for every process on Linux): when a batch was made, for `fastdata.meter`'s trace. Two clock reads
    and three ints a batch, so it is always recorded."""
    info = torch.utils.data.get_worker_info()
    return (-1 if info is None else info.id, started_ns, monotonic_ns())
