"""The device stage: one `EncodedBatch` from the workers -> one batch of images on the device, written into the
output tensor it is given (a ring slot: fastdata.image.device.ring).

1. images over the pixel limit are refused from their stored size before anything is allocated on the device;
2. the JPEGs are decoded in one call of the decoder (fastdata.image.device.decoders), by region where it can:
   only each crop's covering pixels;
3. what the decoder could not decode is decoded on the CPU, or follows `on_error` (fastdata.image.device.policy);
4. every crop is resized and flipped in one batched operation (fastdata.image.device.kernels), rounded to whole
   grey levels like the worker path's uint8 pixels, then normalised (`OutputFormat.normalise`, the worker path's
   arithmetic) when the batches are floating;
5. the samples the workers decoded (`worker_decoded`) take their rows as they are.
All device work is queued on the current stream; nothing waits for the device (the host-side copies go through
pinned memory). The same code runs with `device="cpu"`, which is how CI tests it.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Any, cast

import numpy as np
import torch

from fastdata.errors import ConfigError
from fastdata.formats.records import CODEC_CV_JPEG, DEFAULT_MAX_PIXELS
from fastdata.image.batch import EncodedBatch
from fastdata.image.decode import decode_rgb
from fastdata.image.device.decoders import BatchDecoder, LeasingDecoder, out_of_memory
from fastdata.image.device.kernels import CropBatch, cover, crop_resize_flip
from fastdata.image.device.policy import DevicePolicy
from fastdata.image.geometry import ImageSize, output_size
from fastdata.image.output import OutputFormat


@dataclass
class DeviceBatch:
    """A batch made on the device: images (a view of the slot it was written into), labels on the device (or the
    captions), the samples skipped, and the host seconds the stage took."""

    images: torch.Tensor
    labels: Any
    skipped: list[tuple[str, str]]
    seconds: float = 0.0
    metadata: list[dict] | None = None  # with metadata=True: the kept samples' keys and metadata


@dataclass
class DecodedBatch:
    """A worker batch after `DeviceStage.decode`: its decoded images (on the device, any sizes) with where each
    crop is, the rows they are, the samples the workers decoded, those skipped, the decoder's lease on its buffers
    (None: nothing to hand back) and the host seconds so far."""

    batch: EncodedBatch
    from_worker: np.ndarray
    images: list[torch.Tensor]
    crops: CropBatch
    rows: list[int]
    skipped: list[tuple[str, str]]
    lease: Any
    seconds: float


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without the host waiting: pinned first when it is not (CUDA only)."""
    if device.type != "cuda":
        return tensor.to(device)
    if not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


class DeviceStage:
    """EncodedBatch -> `[B, 3, H, W]` on `device` as uint8 or normalised floats (`output`), channels-last on
    request; see the module's docstring. `decoder` may be given later (`self.decoder = ...`): the feeder makes it
    on its own thread, after the workers have started."""

    def __init__(self, device: torch.device | str, image_size: ImageSize, source: str, *,
                 output: OutputFormat | None = None, channels_last: bool = False, on_error: str = "raise",
                 max_pixels: int = DEFAULT_MAX_PIXELS, decoder: BatchDecoder | None = None,
                 regions: bool = True, policy: DevicePolicy | None = None) -> None:
        self.device = torch.device(device)
        self.image_size = output_size(image_size)  # (height, width)
        self.source = source
        self.output = output or OutputFormat()
        self.channels_last = channels_last
        self.max_pixels = max_pixels
        self.decoder = decoder
        self.regions = regions
        self.policy = policy or DevicePolicy(source, str(self.device), on_error)
        # host seconds by part, summed over batches (benchmarks/gpu_train_feed.py prints them): the decoder's
        # calls (and any CPU decode), the batched crop-resize-flip with its normalisation, the rest; and, written
        # by the feeder (fastdata.image.device.feeder), the seconds it waited for the workers' next batch
        # ("workers") and those the training thread waited for a finished batch ("starved"). Each part is
        # written by one thread only (`decode` and `finish` may run on two).
        self.timings = {"decode": 0.0, "resize": 0.0, "other": 0.0, "workers": 0.0, "starved": 0.0, "batches": 0}

    def new_output(self, rows: int) -> torch.Tensor:
        """An output tensor for `rows` images in this stage's dtype and memory format."""
        images = torch.empty((rows, 3, *self.image_size), dtype=self.output.batch_dtype, device=self.device)
        return images.contiguous(memory_format=torch.channels_last) if self.channels_last else images

    def __call__(self, batch: EncodedBatch, out: torch.Tensor | None = None) -> DeviceBatch:
        """Decode, crop, resize, flip and normalise one batch into `out` (rows >= len(batch); a new tensor when
        None); returns a view of its first rows, one per sample kept."""
        return self.finish(self.decode(batch), out)

    def decode(self, batch: EncodedBatch) -> DecodedBatch:
        """Steps 1-3 of the module's docstring: the batch's JPEGs decoded on the device (queued on the current
        stream), the rest decided. `finish` does the rest; the feeder may run the two on two threads (the decode of
        batch n+1 beside the crop of batch n: `DeviceDecode(decode_ahead=True)`), in batch order."""
        started = perf_counter()
        skipped: list[tuple[str, str]] = []
        from_worker = batch.worker_decoded.numpy()
        self.policy.fallbacks += int(from_worker.sum())
        device_rows = self._within_limits(batch, np.flatnonzero(~from_worker), skipped)
        decode_started = perf_counter()
        images, boxes, shapes, flips, decoded_rows = self._decode(batch, device_rows, skipped)
        lease = self.decoder.batch_decoded() if isinstance(self.decoder, LeasingDecoder) else None
        ended = perf_counter()
        self.timings["other"] += decode_started - started
        self.timings["decode"] += ended - decode_started
        return DecodedBatch(batch, from_worker, images, CropBatch(boxes, shapes, flips), decoded_rows, skipped,
                            lease, ended - started)

    def finish(self, decoded: DecodedBatch, out: torch.Tensor | None = None) -> DeviceBatch:
        """Steps 4-5 of the module's docstring for a `decode`d batch, into `out` (as `__call__`); the decoder's
        buffers are handed back to it once the crop that reads them is queued."""
        started = perf_counter()
        batch, from_worker, decoded_rows = decoded.batch, decoded.from_worker, decoded.rows
        kept = from_worker.copy()
        kept[decoded_rows] = True
        keep = np.flatnonzero(kept).tolist()
        if out is None:
            out = self.new_output(len(keep))
        out = out[:len(keep)]
        position = np.cumsum(kept) - 1  # each kept row's row in `out`
        if decoded.images:
            resized = crop_resize_flip(decoded.images, decoded.crops, self.image_size)
            self._write(out, position[decoded_rows].tolist(), resized.round_().clamp_(0, 255), rounded=True)
        if decoded.lease is not None:  # from a LeasingDecoder
            cast(LeasingDecoder, self.decoder).release(decoded.lease)
        worker_rows = position[from_worker].tolist()
        if worker_rows:  # every worker-decoded sample is kept: its pixels are the next row of `pixels`
            self._write(out, worker_rows, to_device(batch.pixels, self.device), rounded=False)
        labels = batch.labels if len(keep) == len(batch) else batch.labels[keep]
        labels = labels.to(self.device, non_blocking=self.device.type == "cuda")
        ended = perf_counter()
        self.timings["resize"] += ended - started
        self.timings["batches"] += 1
        metadata = None if batch.metadata is None else [batch.metadata[i] for i in keep]
        return DeviceBatch(out, labels, decoded.skipped, decoded.seconds + ended - started, metadata)

    def _within_limits(self, batch: EncodedBatch, rows: np.ndarray, skipped: list[tuple[str, str]]) -> np.ndarray:
        """The rows whose stored size is within the pixel limit; the others follow on_error."""
        sizes = batch.sizes.numpy()[rows]
        over = sizes[:, 0] * sizes[:, 1] > self.max_pixels
        for row, (width, height) in zip(rows[over].tolist(), sizes[over].tolist(), strict=True):
            self.policy.damaged(batch.keys[row], f"refused: {width}x{height} pixels exceeds the limit of "
                                                 f"{self.max_pixels:,}", skipped)
        return rows[~over]

    def _decode(self, batch: EncodedBatch, rows: np.ndarray, skipped: list[tuple[str, str]]
                ) -> tuple[list[torch.Tensor], np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """The JPEGs of `rows` decoded on the device (CPU-decoded where the device decoder could not), with each
        one's crop box in its decoded pixels, its decoded (height, width) and flip, and the rows decoded. Per-image
        Python is kept to what the decoder's API needs (the feeder shares the GIL with the training thread)."""
        if not len(rows):
            return [], np.zeros((0, 4)), np.zeros((0, 2), np.int64), np.zeros(0, bool), []
        assert self.decoder is not None, "the feeder sets the decoder before the first batch"
        data, offsets = batch.data.numpy(), batch.offsets.numpy()
        payloads = [data[start:end] for start, end in zip(offsets[rows].tolist(), offsets[rows + 1].tolist(),
                                                          strict=True)]
        row_list = rows.tolist()
        boxes = batch.boxes.numpy()[rows]  # a copy (an index array)
        stored = batch.sizes.numpy()[rows][:, ::-1].copy()  # (height, width)
        regions = None
        if self.regions and self.decoder.regions:
            covered = cover(boxes, stored)
            regions = [(x0, y0, x1, y1) for x0, y0, x1, y1 in covered.tolist()]
            whole_boxes, whole_stored = boxes.copy(), stored.copy()
            boxes[:, :2] -= covered[:, :2]
            stored = np.stack([covered[:, 3] - covered[:, 1], covered[:, 2] - covered[:, 0]], axis=1)
        decoded = self._decode_call(batch, row_list, payloads, regions)
        if regions is not None and any(image is None for image in decoded):
            # the decoder could not decode these by region: whole, on the device, before the CPU
            again = [n for n, image in enumerate(decoded) if image is None]
            for n, image in zip(again, self._decode_call(batch, [row_list[n] for n in again],
                                                         [payloads[n] for n in again], None), strict=True):
                if image is not None:
                    decoded[n], boxes[n], stored[n] = image, whole_boxes[n], whole_stored[n]
                    self.policy.whole_instead(batch.keys[row_list[n]], self.decoder.name)
        for n in [n for n, image in enumerate(decoded) if image is None]:
            image, box = self._on_the_cpu(batch, row_list[n], payloads[n], skipped)
            if image is not None:  # the whole payload, decoded as it is: its box is the shipped one
                decoded[n], boxes[n], stored[n] = image, box, image.shape[-2:]
        kept = [n for n, image in enumerate(decoded) if image is not None]
        images = [image for image in decoded if image is not None]  # decoded[n] for n in kept
        shapes = np.array([image.shape[-2:] for image in images], np.int64).reshape(-1, 2)
        boxes, stored = boxes[kept], stored[kept]
        differs = (shapes != stored).any(axis=1)
        if differs.any():  # stored smaller than its header said: the box scaled to the decoded pixels
            boxes[differs] *= np.tile(shapes[differs, ::-1] / stored[differs, ::-1], 2)
        kept_rows = rows[kept]
        return images, boxes.astype(np.float64), shapes, batch.flips.numpy()[kept_rows], kept_rows.tolist()

    def _decode_call(self, batch: EncodedBatch, rows: list[int], payloads: list[np.ndarray],
                     regions: list[tuple[int, int, int, int]] | None) -> list[torch.Tensor | None]:
        """One batched decoder call; when it raises, each JPEG alone. A failed call whose JPEGs all decode alone is
        a device error (DevicePolicy.batch_done); out of memory raises DeviceDecodeError."""
        assert self.decoder is not None
        keys = [batch.keys[i] for i in rows]
        try:
            decoded = self.decoder.decode(payloads, regions)
        except Exception as exc:  # whatever the decoder raises: a bad stream, nvjpeg, CUDA
            if out_of_memory(exc):
                raise self.policy.out_of_memory(exc, keys, len(payloads)) from exc
            call_error: BaseException = exc
        else:
            self.policy.batch_done(None, keys)
            return decoded
        decoded = []
        for n, payload in enumerate(payloads):
            try:
                decoded.extend(self.decoder.decode([payload], None if regions is None else [regions[n]]))
            except Exception as exc:
                if out_of_memory(exc):
                    raise self.policy.out_of_memory(exc, keys, len(payloads)) from exc
                decoded.append(None)
        failed = None if any(image is None for image in decoded) else (
            f"the batched call on the {len(payloads)} JPEGs of a batch", call_error)
        self.policy.batch_done(failed, keys)
        return decoded

    def _on_the_cpu(self, batch: EncodedBatch, row: int, payload: np.ndarray, skipped: list[tuple[str, str]]
                    ) -> tuple[torch.Tensor | None, np.ndarray]:
        """Bytes the device decoder could not decode, decoded on the CPU (the whole payload, so the box is the
        shipped one); None when the CPU cannot either: a damaged sample (on_error)."""
        key = batch.keys[row]
        try:
            array = decode_rgb(payload.tobytes(), CODEC_CV_JPEG)
        except ValueError as exc:
            assert self.decoder is not None
            self.policy.damaged(key, f"{exc} (and {self.decoder.name} could not decode it)", skipped)
            return None, batch.boxes.numpy()[row]
        assert self.decoder is not None
        self.policy.rejected_by_device(key, self.decoder.name, getattr(self.decoder, "refused_hint", ""))
        image = to_device(torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1))), self.device)
        return image, batch.boxes.numpy()[row].copy()

    def _write(self, out: torch.Tensor, rows: list[int], images: torch.Tensor, rounded: bool) -> None:
        """Put `images` (0..255: the kernel's rounded floats, or the workers' uint8) into rows `rows` of `out`,
        normalised when the output is floating."""
        if self.output.floating:
            values = self.output.normalise(images)
        else:
            values = images.to(torch.uint8) if rounded else images
        if rows == list(range(rows[0], rows[0] + len(rows))):
            out[rows[0]:rows[0] + len(rows)].copy_(values)
        else:
            index = to_device(torch.tensor(rows, dtype=torch.long), self.device)
            out.index_copy_(0, index, values.to(out.dtype))


def finish(images: torch.Tensor, output: OutputFormat, channels_last: bool, source: str) -> torch.Tensor:
    """NCHW batches on the device (the worker path's, or a borrowed sample) -> the requested dtype and memory
    format: uint8 batches normalised (`OutputFormat.normalise`) when the dtype is floating; a custom transform's
    floating batch (normalised by the transform) only cast to it."""
    if output.floating:
        images = output.normalise(images) if images.dtype == torch.uint8 else images.to(output.dtype)
    elif output.dtype == torch.uint8 and images.dtype != torch.uint8:
        raise ConfigError(f"{source}: dtype=torch.uint8 asked for, but the transform returns {images.dtype} "
                          "batches: leave dtype out or ask for a floating one")
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images
