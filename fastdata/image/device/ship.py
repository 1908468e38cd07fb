"""Worker side of `decode="device"`: what a worker hands over for the device to decode.

For the JPEGs the device decoder takes (`device_takes`, from the codec and the frame header), the worker reads the
bytes and draws the crop box and flip from the same seeded RNG the `"worker"` path uses; the other samples (PNG,
CMYK, ...) it decodes right there through the worker path. It hands over one uint8 tensor of concatenated bytes and
one of finished pixels (shared memory, pinned for the copy): an `EncodedBatch`.

Over a restart-layout dataset a worker may ship each rewritten JPEG's crop as the sub-JPEG of the MCUs it covers
(fastdata.image.jpeg.restart) instead of the whole file, so that the device decodes (and the bus carries) about the
crop's share of the image: only once the main process has proved, on its own decoder, that sub-JPEGs decode to
exactly the rewritten whole file's pixels (fastdata.image.device.auto). The main process says so through a
`SubJpegSwitch` in shared memory, after the workers have started: the proof needs the device, and the device is
not touched before the workers fork.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np
import torch

from fastdata.errors import ConfigError, UnsupportedJpegError
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.batch import EncodedBatch, EncodedSample
from fastdata.image.buffers import BatchBuffers, Slot, batch_tensor
from fastdata.image.geometry import CropParams, pixel_box
from fastdata.image.jpeg.header import gpu_kind, read_frame
from fastdata.image.jpeg.region import Region
from fastdata.image.jpeg.restart import build_index, sub_jpeg_for
from fastdata.meter.stages import StageTimes
from fastdata.order.epoch import sample_rng

if TYPE_CHECKING:
    from fastdata.image.pipeline import SamplePipeline

DECODE_MODES = ("auto", "worker", "device")


#: What a sub-JPEG replaces: (bytes, the crop box in its pixels (left, top, width, height), its (width, height)).
Shipped = tuple[bytes, tuple[float, float, float, float], tuple[int, int]]


class SubJpegSwitch:
    """Whether workers ship restart-layout crops as sub-JPEGs: one byte of shared memory, off until the main
    process turns it on (`enable`), read by the workers for each batch. Survives fork and spawn (a shared-memory
    tensor)."""

    def __init__(self) -> None:
        self._flag = torch.zeros(1, dtype=torch.uint8).share_memory_()

    def enable(self, on: bool = True) -> None:
        self._flag[0] = int(on)

    def __bool__(self) -> bool:
        return bool(self._flag[0])


def device_takes(sample: EncodedSample, max_pixels: int | None = None, progressive: bool = True) -> bool:
    """Whether the device decoder takes `sample`: a JPEG of codec CODEC_CV_JPEG (greyscale or YCbCr) that is
    8-bit baseline or (with `progressive`) progressive Huffman-coded with a chroma subsampling nvjpeg knows (read
    from its frame header), whose header says no more than `max_pixels` pixels, and which is `complete`. Everything
    else (PNG, CMYK, arithmetic-coded or lossless JPEGs, unusual subsampling, a damaged header, a header over the
    limit, which the worker then refuses before decoding; a truncated file, which the worker's decoder reports)
    goes to the worker."""
    if sample.codec != CODEC_CV_JPEG:
        return False
    frame = read_frame(sample.data)
    if frame is None or gpu_kind(frame) not in (("baseline", "progressive") if progressive else ("baseline",)):
        return False
    if max_pixels is not None and frame.width * frame.height > max_pixels:
        return False
    return complete(sample.data)


#: How far from a JPEG's end `complete` first looks for its end marker.
TAIL_BYTES = 1024


def complete(data: bytes) -> bool:
    """Whether the JPEG's last scan is followed by its end marker (EOI): a file cut short is not. GPU decoders
    conceal a truncated scan (the missing rows come out grey) where libjpeg reports it, so such files go to the
    worker, whose decode follows on_error as on the worker path. (An EXIF thumbnail's own scan and EOI come before
    the image's scan, so they do not count.) The usual file ends with its EOI: found in the last TAIL_BYTES with
    no scan after it, that settles it without searching the whole file backwards for its last scan (about a sixth
    of a device-path worker's time per JPEG); otherwise the whole file is searched."""
    eoi = data.rfind(b"\xff\xd9", max(0, len(data) - TAIL_BYTES))
    if eoi >= 0 and data.find(b"\xff\xda", eoi) < 0:
        return 0 <= data.find(b"\xff\xda") < eoi
    return data.rfind(b"\xff\xd9") > data.rfind(b"\xff\xda") >= 0


def ship_sub_jpeg(sample: EncodedSample, params: CropParams) -> Shipped | None:
    """The sub-JPEG of a rewritten JPEG that holds every pixel the device's crop of `params` reads (the box's
    covering pixels), the box moved into its pixels, and its size; None for a JPEG the conversion kept as it was
    (no restart marker per MCU), which goes whole."""
    try:
        index = build_index(sample.data, name=sample.key)
    except UnsupportedJpegError:
        return None
    x0, y0, x1, y1 = pixel_box(params.left, params.top, params.width, params.height, sample.width, sample.height,
                               cover=True)
    sub = sub_jpeg_for(sample.data, index, Region(8, x0, y0, x1 - x0, y1 - y0))
    box = (params.left - sub.left, params.top - sub.top, params.width, params.height)
    return sub.data, box, (sub.width, sub.height)


def encoded_buffer(payloads: Sequence[bytes | np.ndarray], pixels: torch.Tensor, buffers: BatchBuffers | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, Slot | None]:
    """`payloads` (the batch's JPEGs, concatenated in order) and `pixels` (the worker-decoded images) copied into
    one uint8 storage, each straight to its place, as views, and its slot: what `EncodedBatch` hands over in one
    piece. In a DataLoader worker the
    storage is shared memory from the start, a reused slot of `buffers` when one is free (a fresh segment costs
    its page faults on every batch), so that handing it over copies nothing more (torch's pickler would otherwise
    copy it into shared memory on the worker's queue thread, holding the worker's GIL, which the main process's
    handshake for the previous batch then waits for)."""
    length = sum(len(payload) for payload in payloads)
    size = length + pixels.numel()
    buffer, slot = batch_tensor((size,), buffers)
    flat, at = buffer.numpy(), 0
    for payload in payloads:  # no joined copy of them all first
        flat[at:at + len(payload)] = np.frombuffer(payload, np.uint8)
        at += len(payload)
    images = buffer[length:size].view(pixels.shape)
    images.copy_(pixels)
    return buffer[:length], images, slot


def pack_encoded(pipeline: SamplePipeline, samples: list[EncodedSample], epoch: int,
                 on_error: str = "raise", buffers: BatchBuffers | None = None) -> EncodedBatch:
    """The worker's batch on the `"device"` path: the bytes and crop parameters of the JPEGs the device takes
    (`device_takes`); the other samples decoded and augmented here, exactly as on the `"worker"` path (an
    undecodable one follows `on_error`), so that the main process decodes nothing on the CPU. In a worker the batch
    lies in shared memory, in a reused slot of `buffers` when given (`encoded_buffer`)."""
    if pipeline.preset is None:
        raise ConfigError("decode='device' needs augment='train' or 'val' (custom transforms run on the CPU "
                          "path: decode='worker')")
    preset = pipeline.preset_for(epoch)  # at the epoch's size (progressive resizing)
    takes = [device_takes(s, pipeline.max_pixels, pipeline.config.ship_progressive) for s in samples]
    elsewhere = [s for s, t in zip(samples, takes, strict=True) if not t]
    if elsewhere:
        decoded = pipeline.batch(elsewhere, epoch, on_error)
        pixels, skipped, times = decoded.images, decoded.skipped, decoded.times
    else:
        size = pipeline.output_size_for(epoch)
        assert size is not None  # a preset's (checked above)
        pixels, skipped, times = torch.empty((0, 3, *size), dtype=torch.uint8), [], StageTimes()
    lost = {key for key, _ in skipped}
    kept = [(s, t) for s, t in zip(samples, takes, strict=True) if t or s.key not in lost]
    started = perf_counter()
    boxes = np.zeros((len(kept), 4), np.float64)
    flips = np.zeros(len(kept), bool)
    sizes = np.array([(s.width, s.height) for s, _ in kept], np.int64).reshape(-1, 2)
    payloads: list[bytes] = []
    sub_jpegs = pipeline.jpeg_layout == "restart" and bool(pipeline.config.sub_jpegs)
    for i, (sample, take) in enumerate(kept):
        if take:
            params = preset.params(sample.width, sample.height, sample_rng(pipeline.seed, epoch, *sample.position))
            boxes[i] = (params.left, params.top, params.width, params.height)
            flips[i] = params.flip
            shipped = ship_sub_jpeg(sample, params) if sub_jpegs else None
            if shipped is not None:  # only the MCUs the crop reads
                payload, boxes[i], sizes[i] = shipped
            else:
                payload = sample.data
            payloads.append(payload)
    lengths = np.zeros(len(kept), np.int64)
    lengths[[i for i, (_, take) in enumerate(kept) if take]] = [len(payload) for payload in payloads]
    offsets = np.zeros(len(kept) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data, pixels, slot = encoded_buffer(payloads, pixels, buffers)  # type: ignore[arg-type]  # a preset's: stacked
    batch = EncodedBatch(
        data, torch.from_numpy(offsets), torch.from_numpy(boxes), torch.from_numpy(flips),
        torch.from_numpy(sizes),
        pipeline.labels.batch([s.label for s, _ in kept]),
        torch.tensor([not t for _, t in kept], dtype=torch.bool), pixels, [s.key for s, _ in kept], skipped, times,
        slot=slot)
    batch.times.collate += perf_counter() - started
    return batch
