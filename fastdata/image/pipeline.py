"""Per-sample read side: encoded bytes -> (decode at the scale the crop needs) -> augment -> uint8 pixels,
and whole batches written straight into one preallocated buffer."""

from __future__ import annotations

import threading
from time import perf_counter
from typing import Any

import numpy as np
import torch

from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.formats.records import CODEC_CV_JPEG, DEFAULT_MAX_PIXELS, Label
from fastdata.image.augment import apply_crop, crop_resize_flip, make_preset, reduce_factor, wrap_custom
from fastdata.image.batch import Batch, EncodedSample
from fastdata.image.buffers import BatchBuffers, Slot, new_shared
from fastdata.image.decode import decode_rgb
from fastdata.image.labels import LabelCodec
from fastdata.image.region import (
    Region,
    RegionDecoder,
    box_in_region,
    plan_region,
    region_decoder,
    unavailable_reason,
    warn_fallback,
)
from fastdata.meter.stages import StageTimes
from fastdata.order.epoch import sample_rng, sample_seed

ON_ERROR = ("raise", "skip")


class SamplePipeline:
    """Decode + augment for one sample. Picklable (spawn-safe); custom transforms are wrapped lazily."""

    def __init__(self, augment: Any, image_size: int, seed: int, source: str,
                 max_pixels: int = DEFAULT_MAX_PIXELS, jpeg_libraries: tuple[str, ...] | None = None,
                 labels: LabelCodec | None = None) -> None:
        self.max_pixels = max_pixels
        self.labels = labels or LabelCodec()  # how a batch's labels become a tensor (class ids or multi-hot)
        # JPEGs with a preset: decode only the crop's region (fastdata.jpeg_region) where the extension is usable;
        # False decodes whole images with OpenCV (same pixels; kept for comparison and as the fallback).
        self.region_decode = True
        self.jpeg_libraries = jpeg_libraries  # libjpeg-turbo builds to try (None: Pillow's, then the system's)
        self.ship_encoded = False  # decode="device": JPEG bytes + crop parameters (the rest as pixels)
        self.augment = augment
        self.image_size = image_size
        self.seed = seed
        self.source = source
        self.preset = make_preset(augment, image_size) if isinstance(augment, str) else None
        self._custom = None
        self._local: threading.local | None = None  # per-thread scratch buffer (see _scratch)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_custom": None, "_local": None}

    def _scratch(self, size: int) -> np.ndarray:
        """The S x S x 3 image each sample of a batch is resized into before its planes go to the batch tensor,
        kept between batches (one per thread)."""
        if self._local is None:
            self._local = threading.local()
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or buffer.shape[0] != size:
            buffer = self._local.buffer = np.empty((size, size, 3), np.uint8)
        return buffer

    @property
    def output_size(self) -> int | None:
        """Side of the square output, when every sample has the same known size."""
        return self.image_size if self.preset is not None else None

    @property
    def bgr(self) -> bool:
        """Presets decoding whole images with OpenCV work in its BGR order (cheaper decode) and reorder once when
        building tensors; the region decoder writes RGB directly; custom transforms see RGB."""
        by_region = self.region_decode and region_decoder(self.jpeg_libraries) is not None
        return self.preset is not None and not by_region

    def region_decoder_for_presets(self) -> RegionDecoder | None:
        """The region decoder for a JPEG with a preset, or None: whole-image OpenCV decode, with a warning (once per
        process) when it is because no region decoder is available."""
        if self.preset is None or not self.region_decode:
            return None
        decoder = region_decoder(self.jpeg_libraries)
        if decoder is None:
            warn_fallback(unavailable_reason(self.jpeg_libraries))
        return decoder

    def _where(self, sample: EncodedSample) -> str:
        return f"{self.source}/{sample.origin}" if sample.origin else self.source

    def _check_pixels(self, sample: EncodedSample) -> None:
        # from the stored header facts, before decoding; both decoders check the bytes' own header too
        if sample.width * sample.height > self.max_pixels:
            raise CorruptSampleError(f"{self._where(sample)}: sample {sample.key!r}: refused: {sample.width}x"
                                     f"{sample.height} pixels exceeds the limit of {self.max_pixels:,}")

    def _decode(self, sample: EncodedSample, reduce: int = 1) -> np.ndarray:
        self._check_pixels(sample)
        try:
            return decode_rgb(sample.data, sample.codec, reduce, bgr=self.bgr, max_pixels=self.max_pixels)
        except ValueError as exc:
            raise CorruptSampleError(f"{self._where(sample)}: sample {sample.key!r}: {exc}") from exc

    def _decode_region(self, decoder: RegionDecoder, sample: EncodedSample, region: Region) -> np.ndarray:
        self._check_pixels(sample)
        try:
            return decoder.decode(sample.data, region, bgr=self.bgr, max_pixels=self.max_pixels)
        except ValueError as exc:
            raise CorruptSampleError(f"{self._where(sample)}: sample {sample.key!r}: {exc}") from exc

    def process(self, sample: EncodedSample, epoch: int, out: np.ndarray | None = None,
                times: StageTimes | None = None) -> np.ndarray:
        """Decode and augment `sample` for `epoch` (HWC, BGR order when `self.bgr`); with a preset, write
        into `out` (S x S x 3) if given. Adds the decode and augment seconds to `times` if given."""
        started = perf_counter()
        if self.preset is not None:
            params = self.preset.params(sample.width, sample.height, sample_rng(self.seed, epoch, *sample.position))
            if out is None:
                out = np.empty((self.image_size, self.image_size, 3), np.uint8)
            decoder = self.region_decoder_for_presets() if sample.codec == CODEC_CV_JPEG else None
            decode_started = perf_counter()
            if decoder is not None:  # only the crop's rows/columns, at the smallest DCT scale that suffices
                region = plan_region(sample.width, sample.height, params, self.image_size)
                pixels = self._decode_region(decoder, sample, region)
                decode_s = perf_counter() - decode_started
                crop_resize_flip(pixels, box_in_region(params, region), out, params.flip)
            else:
                reduce = reduce_factor(params, self.image_size) if sample.codec == CODEC_CV_JPEG else 1
                image = self._decode(sample, reduce)
                decode_s = perf_counter() - decode_started
                apply_crop(image, params, out, scale=reduce)  # DCT scaling maps source pixel x to x / reduce
            result = out
        else:
            image = self._decode(sample)
            decode_s = perf_counter() - started
            if self.augment is None:
                result = image
            else:
                if self._custom is None:
                    self._custom = wrap_custom(self.augment)
                result = _as_hwc(self._custom(image, sample_seed(self.seed, epoch, *sample.position)), sample.key)
        if times is not None:
            times.decode += decode_s
            times.augment += perf_counter() - started - decode_s
        return result

    def to_tensor(self, image: np.ndarray) -> torch.Tensor:
        """HWC array from `process` -> RGB CHW tensor (contiguous)."""
        if self.bgr:
            image = image[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))

    def batch(self, samples: list[EncodedSample], epoch: int, on_error: str,
              buffers: BatchBuffers | None = None) -> Batch:
        """Decode and augment `samples` into one batch. With a preset every image is resized into a scratch
        image whose planes go straight into the batch's preallocated NCHW tensor (in a reused shared-memory slot
        of `buffers` when one is free)."""
        skipped: list[tuple[str, str]] = []
        labels: list[Label] = []
        size = self.output_size
        times = StageTimes()
        if size:  # every image resized into one scratch image, its planes then copied into the batch tensor
            import cv2

            tensor, slot = _output_tensor((len(samples), 3, size, size), buffers)
            planes = tensor.numpy()
            image = self._scratch(size)
            order = (2, 1, 0) if self.bgr else (0, 1, 2)
        else:
            images: list[np.ndarray] = []
            kept: list[EncodedSample] = []  # the samples behind `images` (skipped ones left out)
            slot = None
        for sample in samples:
            try:
                if size:
                    self.process(sample, epoch, image, times=times)
                else:
                    images.append(self.process(sample, epoch, times=times))
                    kept.append(sample)
            except CorruptSampleError as exc:
                if on_error == "raise":
                    raise
                skipped.append((sample.key, str(exc)))
                continue
            except Exception as exc:  # a bug or an exhausted resource: keep its type, say which sample
                if hasattr(exc, "add_note"):  # Python 3.11+
                    exc.add_note(f"fastdata: while decoding sample {sample.key!r} of {self.source}")
                raise
            if size:
                started = perf_counter()
                # HWC -> the three planes of this image's slot (and BGR -> RGB for free): OpenCV's SIMD split,
                # measured 5x faster than numpy's strided copy of the whole batch
                cv2.split(image, [planes[len(labels), channel] for channel in order])
                times.collate += perf_counter() - started
            labels.append(sample.label)
        collate_started = perf_counter()
        if size:
            tensor = tensor[: len(labels)]
        else:
            stacked = _stack(images, kept, self.source)
            if not labels:
                stacked = np.empty((0, *stacked.shape[1:]), np.uint8)
            tensor, slot = _output_tensor((stacked.shape[0], stacked.shape[3], stacked.shape[1], stacked.shape[2]),
                                          buffers)
            np.copyto(tensor.numpy(), stacked.transpose(0, 3, 1, 2))
        label_tensor = self.labels.batch(labels)
        times.collate += perf_counter() - collate_started
        return Batch(tensor, label_tensor, skipped, times, slot)


def _output_tensor(shape: tuple[int, ...], buffers: BatchBuffers | None) -> tuple[torch.Tensor, Slot | None]:
    """An uninitialised uint8 tensor for a batch, and its slot. In a DataLoader worker it is in shared memory from
    the start, as torch's default_collate does (handing a batch to the main process otherwise copies it into
    shared memory: about a fifth of a worker's time at 3,000 images/s), in a reused slot of `buffers` if given."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8), None
    if buffers is not None:
        return buffers.acquire(shape)
    return new_shared(shape), None


def _as_hwc(result: Any, key: str) -> np.ndarray:
    if isinstance(result, torch.Tensor):
        result = result.numpy()
        if result.ndim == 3 and result.shape[0] in (1, 3) and result.shape[2] not in (1, 3):
            result = result.transpose(1, 2, 0)
    result = np.asarray(result)
    if result.ndim == 2:
        result = result[:, :, None]
    if result.ndim != 3:
        raise ConfigError(f"augment returned an array of shape {result.shape} for {key!r}; expected H x W x C")
    return result


def _stack(images: list[np.ndarray], samples: list[EncodedSample], source: str) -> np.ndarray:
    if not images:
        return np.empty((0, 0, 0, 3), np.uint8)
    first = images[0].shape
    for image, sample in zip(images, samples, strict=True):
        if image.shape != first:
            raise ConfigError(
                f"{source}: cannot batch sample {sample.key!r} of shape {image.shape} with shape {first}: "
                "images in a batch must have one size; use augment='train'/'val' (or a transform that ends "
                "in a fixed-size crop or resize)")
    return np.stack(images)
