"""The batch types a worker hands over, shared by the worker pipeline (decoded batches) and the device path
(encoded batches): one module that both import, so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from time import monotonic_ns, perf_counter
from typing import Any

import torch

from fastdata.formats.records import Label
from fastdata.image.buffers import Slot
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

    def __len__(self) -> int:
        return len(self.labels)

    def pin_memory(self) -> EncodedBatch:
        """Called by DataLoader's pin-memory thread: pinned bytes, pixels and labels copy to the GPU
        asynchronously (and nvImageCodec reads the bytes straight from pinned memory)."""
        return replace(self, data=self.data.pin_memory(), pixels=self.pixels.pin_memory(),
                       labels=self.labels.pin_memory())


def sample_metadata(sample: EncodedSample) -> dict:
    """What a batch carries of a sample with metadata=True: its key, then its stored metadata."""
    return {"key": sample.key, **(sample.metadata or {})}


def worker_span(started_ns: int) -> tuple[int, int, int]:
    """(worker id, or -1 in the main process; `started_ns`; now) on CLOCK_MONOTONIC (`time.monotonic_ns`, one
    clock for every process on Linux): when a batch was made, for `fastdata.meter`'s trace. Two clock reads
    and three ints a batch, so it is always recorded."""
    info = torch.utils.data.get_worker_info()
    return (-1 if info is None else info.id, started_ns, monotonic_ns())
