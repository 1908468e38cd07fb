"""The device stage: one `EncodedBatch` from the workers -> one batch of images on the device, written into the
output tensor it is given (a ring slot: fastdata.image.device.ring). Two halves, which the feeder runs on two
threads and two streams (fastdata.image.device.feeder):

`decode` (the decode thread, on the decode stream):
1. images over the pixel limit are refused from their stored size before anything is allocated on the device;
2. the JPEGs are decoded in one call of the decoder (fastdata.image.device.decoders), by region where it can:
   only each crop's covering pixels;
3. bytes the decoder refuses go to a small pool of CPU threads beside the feeder; a decoder failing as a whole
   counts as a device error (fastdata.image.device.failures).

`finish` (the resize thread, on the resize stream, after the decode's event):
4. the CPU-decoded images are taken from the pool (a damaged one follows `on_error`);
5. every crop is resized and flipped in one batched operation (fastdata.image.device.kernels), rounded to whole
   grey levels like the worker path's uint8 pixels, then normalised (`OutputFormat.normalise`, the worker path's
   arithmetic) when the batches are floating;
6. the samples the workers decoded (`worker_decoded`) take their rows as they are; the labels go where `place`
   puts them (the slot's own labels tensor).

`release` then hands the decoder's buffers back and keeps the decoded batch alive until an event behind the crop
has completed (fastdata.image.device.streams). Nothing waits for the device (the host-side copies go through
pinned memory). The same code runs with `device="cpu"`, which is how CI tests it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np
import torch

from fastdata.errors import ConfigError
from fastdata.formats.records import CODEC_CV_JPEG, DEFAULT_MAX_PIXELS
from fastdata.image.batch import EncodedBatch
from fastdata.image.decode import decode_rgb
from fastdata.image.device.decoders import BatchDecoder, out_of_memory
from fastdata.image.device.failures import DevicePolicy
from fastdata.image.device.kernels import CropBatch, cover, crop_resize_flip
from fastdata.image.device.streams import CudaStreams, GpuTimes, Retired, streams_for
from fastdata.image.geometry import ImageSize, output_size
from fastdata.image.output import OutputFormat

#: CPU threads that decode the JPEGs the device decoder refused (OpenCV, which releases the GIL)
CPU_THREADS = 2

#: Parts of `DeviceStage.timings`, host seconds summed over batches (each written by one thread): the decode
#: thread's decoder calls ("decode") and bookkeeping ("other"), its waits for the workers' next batch ("workers")
#: and for room in the queue of decoded batches ("decoded_full"); the resize thread's crop-resize-normalise
#: ("resize"), its waits for a decoded batch ("decode_wait") and for a free slot ("slot_wait"); the training
#: thread's waits for a finished batch ("starved"); with CUDA, the GPU seconds of the decode and resize streams
#: ("decode_gpu", "resize_gpu": events around each batch's work on them); and the batches made.
TIMING_PARTS = ("decode", "other", "workers", "decoded_full", "resize", "decode_wait", "slot_wait", "starved",
                "decode_gpu", "resize_gpu")


@dataclass
class DeviceBatch:
    """A batch made on the device: images (a view of the slot it was written into), labels on the device (a view
    of the slot's labels, or the captions), the samples skipped, and the host seconds the stage took."""

    images: torch.Tensor
    labels: Any
    skipped: list[tuple[str, str]]
    seconds: float = 0.0
    metadata: list[dict] | None = None  # with metadata=True: the kept samples' keys and metadata


@dataclass
class DecodedBatch:
    """A worker batch after `DeviceStage.decode`: the decoded images (on the device, any sizes; None where the
    CPU pool decodes the bytes: `pending`), each one's crop box and expected (height, width) in them, the rows
    they are, the samples the workers decoded, those skipped, the decoder's lease on its buffers (None: nothing
    to hand back), whether refused bytes are the bytes' fault (`blame_bytes`: False after a device error), the
    host seconds so far, and `event`: recorded on the decode stream behind the decode (the crop waits for it)."""

    batch: EncodedBatch
    from_worker: np.ndarray
    images: list[torch.Tensor | None]
    boxes: np.ndarray
    stored: np.ndarray
    rows: list[int]
    skipped: list[tuple[str, str]]
    lease: Any
    seconds: float
    pending: dict[int, concurrent.futures.Future] = field(default_factory=dict)
    blame_bytes: bool = True
    event: Any = None


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without the host waiting: pinned first when it is not (CUDA only)."""
    if device.type != "cuda":
        return tensor.to(device)
    if not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def cpu_decode(payload: np.ndarray, pin: bool) -> torch.Tensor:
    """JPEG bytes the device refused, decoded on the CPU as the worker path decodes them: CHW uint8, pinned when
    `pin` (for a non-blocking copy); ValueError when the CPU cannot decode them either."""
    array = decode_rgb(payload.tobytes(), CODEC_CV_JPEG)
    image = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
    return image.pin_memory() if pin else image


class DeviceStage:
    """EncodedBatch -> `[B, 3, H, W]` on `device` as uint8 or normalised floats (`output`), channels-last on
    request; see the module's docstring. `decoder` may be given later (`self.decoder = ...`): the feeder makes it
    on its decode thread, after the workers have started."""

    def __init__(self, device: torch.device | str, image_size: ImageSize, source: str, *,
                 output: OutputFormat | None = None, channels_last: bool = False, on_error: str = "raise",
                 max_pixels: int = DEFAULT_MAX_PIXELS, decoder: BatchDecoder | None = None,
                 regions: bool = True, policy: DevicePolicy | None = None,
                 streams: CudaStreams | None = None) -> None:
        self.device = torch.device(device)
        self.image_size = output_size(image_size)  # (height, width)
        self.source = source
        self.output = output or OutputFormat()
        self.channels_last = channels_last
        self.max_pixels = max_pixels
        self.decoder = decoder
        self.regions = regions
        self.policy = policy or DevicePolicy(source, str(self.device), on_error)
        self.streams = streams or streams_for(self.device)
        self.retired = Retired(self.streams)  # decoded batches kept until the crop that read them ran
        self.timings: dict[str, float] = {part: 0.0 for part in TIMING_PARTS}  # see TIMING_PARTS
        self.timings["batches"] = 0
        self._decode_gpu = GpuTimes(self.streams, self.timings, "decode_gpu")  # the decode thread's
        self._resize_gpu = GpuTimes(self.streams, self.timings, "resize_gpu")  # the resize thread's
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def new_output(self, rows: int) -> torch.Tensor:
        """An output tensor for `rows` images in this stage's dtype and memory format."""
        images = torch.empty((rows, 3, *self.image_size), dtype=self.output.batch_dtype, device=self.device)
        return images.contiguous(memory_format=torch.channels_last) if self.channels_last else images

    def __call__(self, batch: EncodedBatch, out: torch.Tensor | None = None) -> DeviceBatch:
        """Decode, crop, resize, flip and normalise one batch into `out` (rows >= len(batch); a new tensor when
        None) on the current stream; returns a view of its first rows, one per sample kept."""
        decoded = self.decode(batch)
        try:
            return self.finish(decoded, out)
        finally:
            self.release(decoded, self.streams.record())

    def decode(self, batch: EncodedBatch) -> DecodedBatch:
        """Steps 1-3 of the module's docstring: the batch's JPEGs decoded on the device (queued on the current
        stream), the bytes it refused given to the CPU pool. `finish` does the rest, in batch order."""
        started = perf_counter()
        skipped: list[tuple[str, str]] = []
        from_worker = batch.worker_decoded.numpy()
        self.policy.fallbacks += int(from_worker.sum())
        device_rows = self._within_limits(batch, np.flatnonzero(~from_worker), skipped)
        decode_started = perf_counter()
        gpu = self._decode_gpu.start()
        decoded = self._decode(batch, device_rows, skipped, from_worker)
        self._decode_gpu.stop(gpu)
        lease_of = getattr(self.decoder, "batch_decoded", None)  # a leasing decoder's buffers
        decoded.lease = lease_of() if lease_of is not None else None
        ended = perf_counter()
        self.timings["other"] += decode_started - started
        self.timings["decode"] += ended - decode_started
        decoded.seconds = ended - started
        return decoded

    def finish(self, decoded: DecodedBatch, out: torch.Tensor | None = None,
               place: Callable[[Any], Any] | None = None) -> DeviceBatch:
        """Steps 4-6 of the module's docstring for a `decode`d batch, into `out` (as `__call__`), the labels put
        where `place` puts them (None: a new tensor on the device). The caller then calls `release`."""
        started = perf_counter()
        gpu = self._resize_gpu.start()
        batch, from_worker = decoded.batch, decoded.from_worker
        images, boxes, stored = list(decoded.images), decoded.boxes.copy(), decoded.stored.copy()
        for n, future in decoded.pending.items():
            image = self._from_the_cpu(decoded, n, future)
            if image is not None:
                images[n] = to_device(image, self.device)
        present = [n for n, image in enumerate(images) if image is not None]
        decoded_images = [image for image in images if image is not None]
        shapes = np.array([image.shape[-2:] for image in decoded_images], np.int64).reshape(-1, 2)
        boxes, stored = boxes[present], stored[present]
        differs = (shapes != stored).any(axis=1)
        if differs.any():  # stored smaller than its header said: the box scaled to the decoded pixels
            boxes[differs] *= np.tile(shapes[differs, ::-1] / stored[differs, ::-1], 2)
        decoded_rows = [decoded.rows[n] for n in present]
        kept = from_worker.copy()
        kept[decoded_rows] = True
        keep = np.flatnonzero(kept).tolist()
        if out is None:
            out = self.new_output(len(keep))
        out = out[:len(keep)]
        position = np.cumsum(kept) - 1  # each kept row's row in `out`
        if decoded_images:
            crops = CropBatch(boxes.astype(np.float64), shapes, batch.flips.numpy()[decoded_rows])
            resized = crop_resize_flip(decoded_images, crops, self.image_size)
            self._write(out, position[decoded_rows].tolist(), resized.round_().clamp_(0, 255), rounded=True)
        worker_rows = position[from_worker].tolist()
        if worker_rows:  # every worker-decoded sample is kept: its pixels are the next row of `pixels`
            self._write(out, worker_rows, to_device(batch.pixels, self.device), rounded=False)
        labels = batch.labels if len(keep) == len(batch) else batch.labels[keep]
        labels = place(labels) if place is not None else labels.to(self.device,
                                                                     non_blocking=self.device.type == "cuda")
        self._resize_gpu.stop(gpu)
        ended = perf_counter()
        self.timings["resize"] += ended - started
        self.timings["batches"] += 1
        metadata = None if batch.metadata is None else [batch.metadata[i] for i in keep]
        return DeviceBatch(out, labels, decoded.skipped, decoded.seconds + ended - started, metadata)

    def release(self, decoded: DecodedBatch, guard: Any) -> None:
        """The batch's device work is queued up to `guard` (an event behind the crop that read the decoded images;
        None: done): the decoder may decode into its buffers again once `guard` has completed, and the decoded
        batch (its images, the pinned bytes they came from) is kept alive until then."""
        if decoded.lease is not None:
            self.decoder.release(decoded.lease, guard)  # type: ignore[union-attr]
            decoded.lease = None
        self.retired.add(guard, decoded)

    def close(self) -> None:
        """Stop the CPU pool's threads (a later batch starts it again)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _from_the_cpu(self, decoded: DecodedBatch, n: int, future: concurrent.futures.Future
                      ) -> torch.Tensor | None:
        """The CPU pool's decode of refused bytes (said once as rejected when they are the bytes' fault); None for
        a damaged sample (on_error)."""
        assert self.decoder is not None
        key = decoded.batch.keys[decoded.rows[n]]
        try:
            image = future.result()
        except ValueError as exc:
            self.policy.damaged(key, f"{exc} (and {self.decoder.name} could not decode it)", decoded.skipped)
            return None
        if decoded.blame_bytes:
            self.policy.rejected_by_device(key, self.decoder.name, getattr(self.decoder, "refused_hint", ""))
        return image

    def _cpu(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(CPU_THREADS, thread_name_prefix="fastdata-device-cpu")
        return self._pool

    def _within_limits(self, batch: EncodedBatch, rows: np.ndarray, skipped: list[tuple[str, str]]) -> np.ndarray:
        """The rows whose stored size is within the pixel limit; the others follow on_error."""
        sizes = batch.sizes.numpy()[rows]
        over = sizes[:, 0] * sizes[:, 1] > self.max_pixels
        for row, (width, height) in zip(rows[over].tolist(), sizes[over].tolist(), strict=True):
            self.policy.damaged(batch.keys[row], f"refused: {width}x{height} pixels exceeds the limit of "
                                                 f"{self.max_pixels:,}", skipped)
        return rows[~over]

    def _decode(self, batch: EncodedBatch, rows: np.ndarray, skipped: list[tuple[str, str]],
                from_worker: np.ndarray) -> DecodedBatch:
        """The JPEGs of `rows` decoded on the device (the ones it refused given to the CPU pool), with each one's
        crop box in its decoded pixels and its expected (height, width). Per-image Python is kept to what the
        decoder's API needs (the feeder shares the GIL with the training thread)."""
        if not len(rows):
            return DecodedBatch(batch, from_worker, [], np.zeros((0, 4)), np.zeros((0, 2), np.int64), [], skipped,
                                None, 0.0)
        assert self.decoder is not None, "the feeder sets the decoder before the first batch"
        data, offsets = batch.data.numpy(), batch.offsets.numpy()
        payloads = [data[start:end] for start, end in zip(offsets[rows].tolist(), offsets[rows + 1].tolist(),
                                                          strict=True)]
        row_list = rows.tolist()
        keys = [batch.keys[row] for row in row_list]
        whole_boxes = batch.boxes.numpy()[rows]  # a copy (an index array)
        whole_stored = batch.sizes.numpy()[rows][:, ::-1].copy()  # (height, width)
        boxes, stored, regions = whole_boxes.copy(), whole_stored.copy(), None
        if self.regions and self.decoder.regions:
            covered = cover(boxes, stored)
            regions = [tuple(box) for box in covered.tolist()]
            boxes[:, :2] -= covered[:, :2]
            stored = np.stack([covered[:, 3] - covered[:, 1], covered[:, 2] - covered[:, 0]], axis=1)
        decoded, call_error = self._decode_call(keys, payloads, regions)
        if regions is not None and any(image is None for image in decoded):
            # the decoder could not decode these by region: whole, on the device, before the CPU
            again = [n for n, image in enumerate(decoded) if image is None]
            whole, _ = self._decode_call([keys[n] for n in again], [payloads[n] for n in again], None)
            for n, image in zip(again, whole, strict=True):
                if image is not None:
                    decoded[n], boxes[n], stored[n] = image, whole_boxes[n], whole_stored[n]
                    self.policy.whole_instead(keys[n], self.decoder.name)
        refused = [n for n, image in enumerate(decoded) if image is None]
        failure, pending = self._failure(decoded, refused, payloads, call_error)
        self.policy.batch_done(failure, keys)  # a device error counts; too many in a row raise
        for n in refused:  # the whole payload, decoded as it is: its box is the shipped one
            boxes[n], stored[n] = whole_boxes[n], whole_stored[n]
            if n not in pending:
                pending[n] = self._cpu().submit(cpu_decode, payloads[n], self.device.type == "cuda")
        return DecodedBatch(batch, from_worker, decoded, boxes, stored, row_list, skipped, None, 0.0, pending,
                            blame_bytes=failure is None)

    def _failure(self, decoded: list[torch.Tensor | None], refused: list[int], payloads: list[np.ndarray],
                 call_error: BaseException | None
                 ) -> tuple[tuple[str, BaseException | None] | None, dict[int, concurrent.futures.Future]]:
        """Whether this batch is a device error (fastdata.image.device.failures: what failed, the exception), and
        the CPU decodes made here to tell (refused index -> a done future)."""
        done: dict[int, concurrent.futures.Future] = {}
        count = len(payloads)
        if call_error is not None and not refused:
            return (f"the batched call on the {count} JPEGs of a batch raised although each then decoded alone "
                    "(decoded one at a time instead)", call_error), done
        if count < 2 or len(refused) < count:
            return None, done  # it decodes the rest: the refused ones are about their bytes
        for n in refused:  # it decoded none of them: broken, if the CPU decodes any (the first that does tells)
            future: concurrent.futures.Future = concurrent.futures.Future()
            done[n] = future
            try:
                future.set_result(cpu_decode(payloads[n], self.device.type == "cuda"))
            except ValueError as exc:
                future.set_exception(exc)
                continue
            return (f"it decoded none of the {count} JPEGs of a batch, which the CPU decodes (decoded on the CPU "
                    "instead)", call_error), done
        return None, done  # none decodes anywhere: damaged samples

    def _decode_call(self, keys: list[str], payloads: list[np.ndarray],
                     regions: list[tuple[int, int, int, int]] | None
                     ) -> tuple[list[torch.Tensor | None], BaseException | None]:
        """One batched decoder call; when it raises, each JPEG alone (None for those that fail alone too), and the
        batched call's exception. Out of memory raises DeviceDecodeError."""
        assert self.decoder is not None
        try:
            return list(self.decoder.decode(payloads, regions)), None
        except Exception as exc:  # whatever the decoder raises: a bad stream, nvjpeg, CUDA
            if out_of_memory(exc):
                raise self.policy.out_of_memory(exc, keys, len(payloads)) from exc
            call_error = exc
        decoded: list[torch.Tensor | None] = []
        for n, payload in enumerate(payloads):
            try:
                decoded.extend(self.decoder.decode([payload], None if regions is None else [regions[n]]))
            except Exception as exc:
                if out_of_memory(exc):
                    raise self.policy.out_of_memory(exc, keys, len(payloads)) from exc
                decoded.append(None)
        return decoded, call_error

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
