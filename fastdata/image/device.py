"""`decode="device"`: workers ship compressed bytes and crop parameters; the batch is decoded on the device in one
batched call (torchvision's `decode_jpeg`, nvjpeg on CUDA) and cropped, resized, flipped and normalised there.

Worker side (`pack_encoded`): for the JPEGs the device decoder takes (`device_takes`, from the codec and the frame
header), read the bytes and draw the crop box and flip from the same seeded RNG the `"worker"` path uses; decode the
other samples (PNG, CMYK, ...) right there through the worker path. Hand over one uint8 tensor of concatenated bytes
and one of finished pixels (shared memory, pinned for the copy).
Main-process side (`DeviceDecoder`): refuse oversized images from their stored header sizes before any device
allocation, decode the JPEGs in one call, resize each crop on the device into one output batch beside the
worker-decoded rows; flip and normalise are batched ops. Device errors are counted, warned about once and raise
when they persist (see DeviceDecoder). The same code runs with `device="cpu"` (torchvision's CPU decoder), which
is how CI exercises it."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np
import torch

from fastdata.errors import ConfigError, CorruptSampleError, DeviceDecodeError
from fastdata.formats.records import CODEC_CV_JPEG, DEFAULT_MAX_PIXELS
from fastdata.image.augment import ImageSize, output_size, pixel_box
from fastdata.image.batch import EncodedBatch, EncodedSample
from fastdata.image.decode import decode_rgb
from fastdata.image.device_restart import ship_sub_jpeg
from fastdata.image.jpeg_header import read_frame
from fastdata.image.output import IMAGENET_MEAN, IMAGENET_STD, OutputFormat
from fastdata.meter.stages import StageTimes
from fastdata.order.epoch import sample_rng

if TYPE_CHECKING:
    from fastdata.image.pipeline import SamplePipeline

DECODE_MODES = ("auto", "worker", "device")

#: Batches in a row in which the device decoder fails on bytes the CPU decodes (device errors) before the loader
#: stops with DeviceDecodeError: one failed batch is tolerated and warned about, a decoder that keeps failing is
#: broken and would have the training thread decode on the CPU for the rest of the run.
MAX_CONSECUTIVE_DEVICE_ERRORS = 3

# nvjpeg's chroma subsamplings of a 3-component JPEG: luma (horizontal, vertical) sampling factors with both chroma
# components at (1, 1): 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, 4:1:0
_NVJPEG_LUMA_SAMPLING = frozenset({(1, 1), (2, 1), (2, 2), (1, 2), (4, 1), (4, 2)})
_BASELINE, _PROGRESSIVE = 0xC0, 0xC2

BatchDecode = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


def device_takes(sample: EncodedSample, max_pixels: int | None = None) -> bool:
    """Whether the device decoder takes `sample`: a JPEG of codec CODEC_CV_JPEG (greyscale or YCbCr) that is
    8-bit baseline or progressive Huffman-coded with a chroma subsampling nvjpeg knows (read from its frame
    header), and whose header says no more than `max_pixels` pixels. Everything else (PNG, CMYK, arithmetic-coded
    or lossless JPEGs, unusual subsampling, a damaged header, a header over the limit, which the worker then
    refuses before decoding) goes to the worker."""
    if sample.codec != CODEC_CV_JPEG:
        return False
    frame = read_frame(sample.data)
    if frame is None or frame.marker not in (_BASELINE, _PROGRESSIVE) or frame.precision != 8:
        return False
    if max_pixels is not None and frame.width * frame.height > max_pixels:
        return False
    if len(frame.sampling) == 1:
        return True
    return (len(frame.sampling) == 3 and frame.sampling[1] == frame.sampling[2] == (1, 1)
            and frame.sampling[0] in _NVJPEG_LUMA_SAMPLING)


def pack_encoded(pipeline: SamplePipeline, samples: list[EncodedSample], epoch: int,
                 on_error: str = "raise") -> EncodedBatch:
    """Worker side of the `"device"` path: the bytes and crop parameters of the JPEGs the device takes
    (`device_takes`); the other samples decoded and augmented here, exactly as on the `"worker"` path (an
    undecodable one follows `on_error`), so that the training thread decodes nothing on the CPU."""
    if pipeline.preset is None:
        raise ConfigError("decode='device' needs augment='train' or 'val' (custom transforms run on the CPU "
                          "path: decode='worker')")
    takes = [device_takes(s, pipeline.max_pixels) for s in samples]
    elsewhere = [s for s, t in zip(samples, takes, strict=True) if not t]
    if elsewhere:
        decoded = pipeline.batch(elsewhere, epoch, on_error)
        pixels, skipped, times = decoded.images, decoded.skipped, decoded.times
    else:
        pixels, skipped, times = torch.empty((0, 3, *pipeline.output_size), dtype=torch.uint8), [], StageTimes()
    lost = {key for key, _ in skipped}
    kept = [(s, t) for s, t in zip(samples, takes, strict=True) if t or s.key not in lost]
    started = perf_counter()
    boxes = np.zeros((len(kept), 4), np.float64)
    flips = np.zeros(len(kept), bool)
    sizes = np.array([(s.width, s.height) for s, _ in kept], np.int64).reshape(-1, 2)
    payloads: list[bytes] = []
    sub_jpegs = pipeline.ship_sub_jpegs and pipeline.jpeg_layout == "restart"
    for i, (sample, take) in enumerate(kept):
        if take:
            params = pipeline.preset.params(sample.width, sample.height,
                                            sample_rng(pipeline.seed, epoch, *sample.position))
            boxes[i] = (params.left, params.top, params.width, params.height)
            flips[i] = params.flip
            shipped = ship_sub_jpeg(sample, params) if sub_jpegs else None
            if shipped is not None:  # only the MCUs the crop reads (fastdata.image.device_restart)
                payload, boxes[i], sizes[i] = shipped
            else:
                payload = sample.data
            payloads.append(payload)
    lengths = np.zeros(len(kept), np.int64)
    lengths[[i for i, (_, take) in enumerate(kept) if take]] = [len(payload) for payload in payloads]
    offsets = np.zeros(len(kept) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(payloads), np.uint8)
    batch = EncodedBatch(
        torch.from_numpy(data.copy()), torch.from_numpy(offsets), torch.from_numpy(boxes), torch.from_numpy(flips),
        torch.from_numpy(sizes),
        pipeline.labels.batch([s.label for s, _ in kept]),
        torch.tensor([not t for _, t in kept], dtype=torch.bool), pixels, [s.key for s, _ in kept], skipped, times)
    batch.times.collate += perf_counter() - started
    return batch


def decode_jpegs_torchvision(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """One batched torchvision `decode_jpeg` call (nvjpeg on CUDA): RGB CHW uint8 images on `device`."""
    from torchvision.io import ImageReadMode, decode_jpeg

    return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


def device_decode_usable(device: torch.device) -> bool:
    """Whether torchvision can decode JPEGs on `device` (CPU always; CUDA when nvjpeg works there)."""
    if device.type == "cpu":
        return True
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        decode_jpegs_torchvision([_tiny_jpeg()], device)
        return True
    except Exception:  # no nvjpeg in this torchvision build, or the device cannot run it
        return False


def _tiny_jpeg() -> torch.Tensor:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (120, 30, 200)).save(buffer, "JPEG")
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _some_keys(keys: list[str]) -> str:
    shown = ", ".join(map(repr, keys[:4]))
    return f"keys {shown}, ... ({len(keys)} samples)" if len(keys) > 4 else f"keys {shown}"


class DeviceDecoder:
    """Main-process side: EncodedBatch -> `[B, 3, H, W]` on `device`, as uint8 or normalised floats
    (`image_size`: a side or (height, width), None with a custom transform, whose batches only `finish`;
    `dtype`, `mean`, `std`: fastdata.image.output.OutputFormat).

    The JPEGs the device takes are decoded in one call of `decode_jpegs` (torchvision's batched `decode_jpeg`;
    tests pass a decoder that fails on purpose); the samples the workers decoded are counted in `fallbacks`.
    When the batched call fails, each JPEG is decoded alone to find the culprits: one the CPU cannot decode
    either is corrupt and follows `on_error`; one the CPU decodes is a device error, decoded on the CPU here,
    counted in `errors` and warned about once (a failed call whose samples all decode alone counts once too).
    Out-of-memory, or device errors in `max_consecutive_errors` batches in a row, raise DeviceDecodeError naming
    the batch. Images over `max_pixels` (from their stored size) are refused before any device allocation.
    """

    def __init__(self, device: torch.device | str, image_size: ImageSize | None, source: str, *,
                 dtype: torch.dtype | None = None, mean: tuple[float, ...] = IMAGENET_MEAN,
                 std: tuple[float, ...] = IMAGENET_STD,
                 channels_last: bool = False, on_error: str = "raise", max_pixels: int = DEFAULT_MAX_PIXELS,
                 decode_jpegs: BatchDecode = decode_jpegs_torchvision,
                 max_consecutive_errors: int = MAX_CONSECUTIVE_DEVICE_ERRORS) -> None:
        self.device = torch.device(device)
        self.image_size = None if image_size is None else output_size(image_size)  # (height, width)
        self.source = source
        self.output = OutputFormat(dtype, mean, std)
        self.dtype = dtype
        self.channels_last = channels_last
        self.on_error = on_error
        self.max_pixels = max_pixels
        self.decode_jpegs = decode_jpegs
        self.max_consecutive_errors = max_consecutive_errors
        self.fallbacks = 0  # samples the device does not take, decoded in the workers
        self.errors = 0  # device decoder failures on bytes the CPU decodes
        self._failing_batches = 0  # batches in a row with device errors
        self._warned = False

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, str]]]:
        """Decode, crop, resize, flip and normalise one batch; returns (images, labels, skipped)."""
        decoded, skipped = self._decode_jpegs(batch)
        from_worker = batch.worker_decoded.tolist()
        self.fallbacks += sum(from_worker)
        keep = [i for i in range(len(batch)) if from_worker[i] or i in decoded]
        size = self.image_size
        assert size is not None, "decode='device' is for the presets, which have a size"
        out = torch.empty((len(keep), 3, *size), dtype=torch.uint8, device=self.device)
        for row, i in enumerate(keep):
            if not from_worker[i]:
                out[row] = _crop_resize(decoded[i], batch.boxes[i].tolist(), batch.sizes[i].tolist(), size)
        worker_rows = [row for row, i in enumerate(keep) if from_worker[i]]
        if worker_rows:  # every worker-decoded sample is kept: its pixels are the next row of `pixels`
            out[worker_rows] = batch.pixels.to(self.device, non_blocking=True)
        flips = batch.flips[keep].to(self.device, non_blocking=True)
        out = torch.where(flips.view(-1, 1, 1, 1), out.flip(-1), out)
        labels = batch.labels[keep].to(self.device, non_blocking=True)
        return self.finish(out), labels, skipped

    def finish(self, images: torch.Tensor) -> torch.Tensor:
        """NCHW on the device -> the requested dtype and memory format: uint8 batches normalised
        (`OutputFormat.normalise`, the worker path's arithmetic) when the dtype is floating; a custom
        transform's floating batch (normalised by the transform) only cast to it."""
        if self.output.floating:
            images = self.output.normalise(images) if images.dtype == torch.uint8 else images.to(self.dtype)
        elif self.dtype == torch.uint8 and images.dtype != torch.uint8:
            raise ConfigError(f"{self.source}: dtype=torch.uint8 asked for, but the transform returns "
                              f"{images.dtype} batches: leave dtype out or ask for a floating one")
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def _decode_jpegs(self, batch: EncodedBatch) -> tuple[dict[int, torch.Tensor], list[tuple[str, str]]]:
        """The batch's JPEGs decoded on the device (CHW uint8, by row) and the samples skipped."""
        skipped: list[tuple[str, str]] = []
        rows = []
        for i in np.flatnonzero(~batch.worker_decoded.numpy()).tolist():
            width, height = batch.sizes[i].tolist()
            if width * height > self.max_pixels:
                self._fail(batch.keys[i], f"refused: {width}x{height} pixels exceeds the limit of "
                                          f"{self.max_pixels:,}", skipped)
            else:
                rows.append(i)
        if not rows:
            return {}, skipped
        chunks = {i: batch.data[batch.offsets[i]:batch.offsets[i + 1]] for i in rows}
        try:  # one batched call; torchvision takes the bytes from host memory for any device
            decoded = dict(zip(rows, self.decode_jpegs([chunks[i] for i in rows], self.device), strict=True))
        except Exception as exc:  # whatever the decoder raises: a bad stream, nvjpeg, CUDA
            self._check_memory(exc, batch, chunks)
            decoded = self._decode_one_by_one(batch, chunks, exc, skipped)
        else:
            self._failing_batches = 0
        return decoded, skipped

    def _decode_one_by_one(self, batch: EncodedBatch, chunks: dict[int, torch.Tensor], batch_error: Exception,
                           skipped: list[tuple[str, str]]) -> dict[int, torch.Tensor]:
        """After a failed batched call: each JPEG alone on the device; one that fails there is decoded on the CPU
        (a device error) or, if the CPU fails too, follows on_error (corrupt)."""
        decoded: dict[int, torch.Tensor] = {}
        errors: list[tuple[str, Exception, str]] = []  # what failed, the error, what was done instead
        corrupt = 0
        for i, chunk in chunks.items():
            try:
                decoded[i] = self.decode_jpegs([chunk], self.device)[0]
                continue
            except Exception as exc:
                self._check_memory(exc, batch, chunks)
                device_error = exc
            try:
                array = decode_rgb(chunk.numpy().tobytes(), CODEC_CV_JPEG)
            except ValueError as exc:
                corrupt += 1
                self._fail(batch.keys[i], f"{exc} (the device decoder: {device_error})", skipped)
                continue
            errors.append((f"sample {batch.keys[i]!r}", device_error, "decoded on the CPU in the main process"))
            decoded[i] = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1))).to(self.device)
        if not errors and not corrupt:  # the batched call failed although every sample decodes alone
            errors.append((f"the batched call on the {len(chunks)} JPEGs of a batch ({_some_keys(batch.keys)})",
                           batch_error, "decoded on the device one at a time"))
        self._count(errors, batch.keys)
        return decoded

    def _check_memory(self, exc: Exception, batch: EncodedBatch, chunks: dict[int, torch.Tensor]) -> None:
        if _out_of_memory(exc):
            raise DeviceDecodeError(
                f"{self.source}: the device decoder ran out of memory on {self.device} decoding the {len(chunks)} "
                f"JPEGs of a batch ({_some_keys(batch.keys)}): {exc}. Lower batch_size, leave the loader more "
                "device memory, or decode in the workers: decode='worker'") from exc

    def _count(self, errors: list[tuple[str, Exception, str]], keys: list[str]) -> None:
        """Count this batch's device errors; warn on the first, raise after too many failing batches in a row."""
        if not errors:
            self._failing_batches = 0
            return
        self.errors += len(errors)
        self._failing_batches += 1
        what, exc, instead = errors[-1]
        if self._failing_batches >= self.max_consecutive_errors:
            raise DeviceDecodeError(
                f"{self.source}: the device decoder on {self.device} failed in {self._failing_batches} batches in a "
                f"row (the last: {_some_keys(keys)}; on {what}: {exc}); it is not working: decode in the "
                "workers with decode='worker'") from exc
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.source}: the device decoder on {self.device} failed on {what}: {exc}; {instead} instead. "
                "Device errors are counted in loader.device_errors (this warning is shown once); "
                f"{self.max_consecutive_errors} batches in a row with device errors raise DeviceDecodeError",
                RuntimeWarning, stacklevel=2)

    def _fail(self, key: str, reason: str, skipped: list[tuple[str, str]]) -> None:
        message = f"{self.source}: sample {key!r}: {reason}"
        if self.on_error == "raise":
            raise CorruptSampleError(message)
        skipped.append((key, message))


def _crop_resize(image: torch.Tensor, box: list[float], stored_size: list[int], size: tuple[int, int]
                 ) -> torch.Tensor:
    """Crop `box` (source pixels, fractional allowed) out of a CHW uint8 image and resize it to `size` (height,
    width) on its
    device, as the worker path does: bilinear with sub-pixel box edges (an affine sampling grid) below a 2x
    shrink, area averaging over whole pixels at 2x or more."""
    import torch.nn.functional as F

    height, width = image.shape[-2:]
    scale = stored_size[0] / width  # 1 unless the image was stored smaller than its header said
    left, top, box_w, box_h = (v / scale for v in box)
    out_h, out_w = size
    if box_w >= 2 * out_w or box_h >= 2 * out_h:
        x0, y0, x1, y1 = pixel_box(left, top, box_w, box_h, width, height)
        resized = F.interpolate(image[:, y0:y1, x0:x1].unsqueeze(0).float(), size=size, mode="area")
    else:
        x0, y0, x1, y1 = pixel_box(left, top, box_w, box_h, width, height, cover=True)
        crop_w, crop_h = x1 - x0, y1 - y0
        # normalised output coordinates (align_corners=False) -> normalised coordinates in the crop
        theta = torch.tensor([[box_w / crop_w, 0.0, (2 * (left - x0) + box_w) / crop_w - 1],
                              [0.0, box_h / crop_h, (2 * (top - y0) + box_h) / crop_h - 1]],
                             dtype=torch.float32, device=image.device)
        grid = F.affine_grid(theta[None], [1, image.shape[0], out_h, out_w], align_corners=False)
        resized = F.grid_sample(image[:, y0:y1, x0:x1].unsqueeze(0).float(), grid, mode="bilinear",
                                padding_mode="border", align_corners=False)
    return resized.round_().clamp_(0, 255).to(torch.uint8)[0]


class DevicePrefetcher:
    """Iterate decoded device batches, preparing batch n+1 on a side CUDA stream while batch n is used (timm's
    PrefetchLoader pattern); on the CPU it simply decodes in turn."""

    def __init__(self, batches: Iterable[EncodedBatch], decoder: DeviceDecoder) -> None:
        self.batches = batches
        self.decoder = decoder

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[tuple[str, str]]]]:
        if self.decoder.device.type != "cuda":
            for batch in self.batches:
                yield self.decoder(batch)
            return
        stream = torch.cuda.Stream(device=self.decoder.device)
        pending = None
        for batch in self.batches:
            with torch.cuda.stream(stream):
                ready = self.decoder(batch)
            if pending is not None:
                yield pending
            torch.cuda.current_stream(self.decoder.device).wait_stream(stream)
            for tensor in ready[:2]:
                tensor.record_stream(torch.cuda.current_stream(self.decoder.device))
            pending = ready
        if pending is not None:
            yield pending
