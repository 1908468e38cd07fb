"""`decode="device"`: workers ship compressed bytes and crop parameters; the batch is decoded on the device in one
batched call (torchvision's `decode_jpeg`, nvjpeg on CUDA) and cropped, resized, flipped and normalised there.

Worker side (`pack_encoded`): read the bytes, draw the crop box and flip from the same seeded RNG the
`"worker"` path uses, and hand over one uint8 tensor of concatenated bytes (shared memory, pinned for the copy).
Main-process side (`DeviceDecoder`): refuse oversized images from their stored header sizes before any device
allocation, decode the JPEGs the device decoder takes in one call, decode the rest (PNG, CMYK, ...) on the
CPU one by one and move them over, then resize each crop on the device into one output batch; flip and
normalise are batched ops. The same code runs with `device="cpu"` (torchvision's CPU decoder), which is how CI
exercises it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from fastdata.augment import pixel_box
from fastdata.decode import CODEC_CV_JPEG, decode_rgb
from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.order import sample_rng
from fastdata.stagetimes import StageTimes

if TYPE_CHECKING:
    from fastdata.pipeline import EncodedSample, SamplePipeline

DECODE_MODES = ("auto", "worker", "device")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class EncodedBatch:
    """What a worker hands over on the `"device"` path: compressed bytes and per-sample crop parameters."""

    data: torch.Tensor  # uint8, every sample's bytes concatenated
    offsets: torch.Tensor  # int64 [B + 1]: sample i is data[offsets[i]:offsets[i + 1]]
    boxes: torch.Tensor  # float64 [B, 4]: left, top, width, height of the crop in source pixels
    flips: torch.Tensor  # bool [B]
    sizes: torch.Tensor  # int64 [B, 2]: stored width, height
    codecs: torch.Tensor  # uint8 [B]
    labels: torch.Tensor  # int64 [B]
    keys: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    times: StageTimes = field(default_factory=StageTimes)

    def __len__(self) -> int:
        return len(self.labels)

    def pin_memory(self) -> EncodedBatch:
        """Called by DataLoader's pin-memory thread: pinned bytes copy to the GPU asynchronously."""
        return EncodedBatch(self.data.pin_memory(), self.offsets, self.boxes, self.flips, self.sizes,
                            self.codecs, self.labels, self.keys, self.skipped, self.times)


def pack_encoded(pipeline: SamplePipeline, samples: list[EncodedSample], epoch: int) -> EncodedBatch:
    """Worker side of the `"device"` path: no decoding, only the bytes and the crop parameters."""
    if pipeline.preset is None:
        raise ConfigError("decode='device' needs augment='train' or 'val' (custom transforms run on the CPU "
                          "path: decode='worker')")
    boxes = np.empty((len(samples), 4), np.float64)
    flips = np.empty(len(samples), bool)
    for i, sample in enumerate(samples):
        params = pipeline.preset.params(sample.width, sample.height,
                                        sample_rng(pipeline.seed, epoch, *sample.position))
        boxes[i] = (params.left, params.top, params.width, params.height)
        flips[i] = params.flip
    lengths = np.fromiter((len(s.data) for s in samples), np.int64, len(samples))
    offsets = np.zeros(len(samples) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(s.data for s in samples), np.uint8)
    return EncodedBatch(
        torch.from_numpy(data.copy()), torch.from_numpy(offsets), torch.from_numpy(boxes), torch.from_numpy(flips),
        torch.tensor([(s.width, s.height) for s in samples], dtype=torch.int64).reshape(-1, 2),
        torch.tensor([s.codec for s in samples], dtype=torch.uint8),
        torch.tensor([s.label for s in samples], dtype=torch.int64), [s.key for s in samples])


def device_decode_usable(device: torch.device) -> bool:
    """Whether torchvision can decode JPEGs on `device` (CPU always; CUDA when nvjpeg works there)."""
    if device.type == "cpu":
        return True
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        from torchvision.io import decode_jpeg

        probe = _tiny_jpeg()
        decode_jpeg([probe], device=device)
        return True
    except Exception:  # no nvjpeg in this torchvision build, or the device cannot run it
        return False


def _tiny_jpeg() -> torch.Tensor:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (120, 30, 200)).save(buffer, "JPEG")
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


class DeviceDecoder:
    """Main-process side: EncodedBatch -> `[B, 3, S, S]` on `device`, as uint8 or normalised floats.

    Samples the device decoder cannot take (PNG, CMYK and other non-RGB/L JPEGs, or bytes it rejects) fall back
    to the CPU decoder one by one and are counted in `fallbacks`; a sample nothing can decode follows
    `on_error`. Images over `max_pixels` (from their stored size) are refused before any device allocation.
    """

    def __init__(self, device: torch.device | str, image_size: int, source: str, *, dtype: torch.dtype | None = None,
                 mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD,
                 channels_last: bool = False, on_error: str = "raise", max_pixels: int = 89_478_485) -> None:
        self.device = torch.device(device)
        self.image_size = image_size
        self.source = source
        self.dtype = dtype
        self.channels_last = channels_last
        self.on_error = on_error
        self.max_pixels = max_pixels
        self.fallbacks = 0
        if dtype is not None and dtype.is_floating_point:
            self._mean = torch.tensor(mean, device=self.device).view(1, 3, 1, 1) * 255
            self._std = torch.tensor(std, device=self.device).view(1, 3, 1, 1) * 255

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor, list[tuple[str, str]]]:
        """Decode, crop, resize, flip and normalise one batch; returns (images, labels, skipped)."""
        images, keep, skipped = self._decode_all(batch)
        size = self.image_size
        out = torch.empty((len(keep), 3, size, size), dtype=torch.uint8, device=self.device)
        for row, (i, image) in enumerate(zip(keep, images, strict=True)):
            out[row] = _crop_resize(image, batch.boxes[i].tolist(), batch.sizes[i].tolist(), size)
        flips = batch.flips[keep].to(self.device, non_blocking=True)
        out = torch.where(flips.view(-1, 1, 1, 1), out.flip(-1), out)
        labels = batch.labels[keep].to(self.device, non_blocking=True)
        return self.finish(out), labels, skipped

    def finish(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 NCHW on the device -> the requested dtype (normalised if floating) and memory format."""
        if self.dtype is not None and self.dtype.is_floating_point:
            images = images.float().sub_(self._mean).div_(self._std).to(self.dtype)
        elif self.dtype is not None and self.dtype != torch.uint8:
            raise ConfigError(f"dtype must be torch.uint8 or a floating dtype, got {self.dtype}")
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images

    def _decode_all(self, batch: EncodedBatch) -> tuple[list[torch.Tensor], list[int], list[tuple[str, str]]]:
        from torchvision.io import ImageReadMode, decode_jpeg

        skipped: list[tuple[str, str]] = []
        decoded: dict[int, torch.Tensor] = {}
        on_device, on_cpu = [], []
        for i in range(len(batch)):
            width, height = batch.sizes[i].tolist()
            if width * height > self.max_pixels:
                self._fail(batch.keys[i], f"refused: {width}x{height} pixels exceeds the limit of "
                                          f"{self.max_pixels:,}", skipped)
            elif int(batch.codecs[i]) == CODEC_CV_JPEG:
                on_device.append(i)
            else:
                on_cpu.append(i)
        chunks = [batch.data[batch.offsets[i]:batch.offsets[i + 1]] for i in range(len(batch))]
        if on_device:  # one batched call; torchvision takes the bytes from host memory for any device
            try:
                results = decode_jpeg([chunks[i] for i in on_device], mode=ImageReadMode.RGB, device=self.device)
                decoded.update(zip(on_device, results, strict=True))
            except RuntimeError:  # one bad stream fails the batched call: find it by decoding one at a time
                for i in on_device:
                    try:
                        decoded[i] = decode_jpeg(chunks[i], mode=ImageReadMode.RGB, device=self.device)
                    except RuntimeError:
                        on_cpu.append(i)
        for i in sorted(on_cpu):
            try:
                array = decode_rgb(chunks[i].numpy().tobytes(), int(batch.codecs[i]))
            except ValueError as exc:
                self._fail(batch.keys[i], str(exc), skipped)
                continue
            self.fallbacks += 1
            decoded[i] = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1))).to(self.device)
        keep = sorted(decoded)
        return [decoded[i] for i in keep], keep, skipped

    def _fail(self, key: str, reason: str, skipped: list[tuple[str, str]]) -> None:
        message = f"{self.source}: sample {key!r}: {reason}"
        if self.on_error == "raise":
            raise CorruptSampleError(message)
        skipped.append((key, message))


def _crop_resize(image: torch.Tensor, box: list[float], stored_size: list[int], size: int) -> torch.Tensor:
    """Crop `box` (source pixels, fractional allowed) out of a CHW uint8 image and resize it to size x size on its
    device, as the worker path does: bilinear with sub-pixel box edges (an affine sampling grid) below a 2x
    shrink, area averaging over whole pixels at 2x or more."""
    import torch.nn.functional as F

    height, width = image.shape[-2:]
    scale = stored_size[0] / width  # 1 unless the image was stored smaller than its header said
    left, top, box_w, box_h = (v / scale for v in box)
    if box_w >= 2 * size or box_h >= 2 * size:
        x0, y0, x1, y1 = pixel_box(left, top, box_w, box_h, width, height)
        resized = F.interpolate(image[:, y0:y1, x0:x1].unsqueeze(0).float(), size=(size, size), mode="area")
    else:
        x0, y0, x1, y1 = pixel_box(left, top, box_w, box_h, width, height, cover=True)
        crop_w, crop_h = x1 - x0, y1 - y0
        # normalised output coordinates (align_corners=False) -> normalised coordinates in the crop
        theta = torch.tensor([[box_w / crop_w, 0.0, (2 * (left - x0) + box_w) / crop_w - 1],
                              [0.0, box_h / crop_h, (2 * (top - y0) + box_h) / crop_h - 1]],
                             dtype=torch.float32, device=image.device)
        grid = F.affine_grid(theta[None], [1, image.shape[0], size, size], align_corners=False)
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
