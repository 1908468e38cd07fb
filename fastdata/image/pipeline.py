"""Per-sample read side: encoded bytes -> (decode at the scale the crop needs) -> augment -> pixels, and whole
batches written straight into one preallocated buffer: uint8, or with a preset and a floating `output` format
normalised floats made from each image's uint8 planes (fastdata.image.output); a custom transform's results
(HWC arrays, CHW tensors, any dtype) are stacked as they come."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, cast

import numpy as np
import torch

from fastdata.errors import ConfigError, CorruptSampleError, UnsupportedJpegError
from fastdata.formats.records import CODEC_CV_JPEG, DEFAULT_MAX_PIXELS, Label
from fastdata.image.augment import apply_crop, check_custom, crop_resize_flip, make_preset, wrap_custom
from fastdata.image.batch import Batch, EncodedSample
from fastdata.image.buffers import BatchBuffers, Slot, batch_tensor
from fastdata.image.decode import decode_rgb
from fastdata.image.detection_presets import is_detection_preset, make_detection_preset
from fastdata.image.geometry import reduce_factor
from fastdata.image.jpeg.region import (
    Region,
    RegionDecoder,
    box_in_region,
    plan_region,
    region_decoder,
    unavailable_reason,
    warn_fallback,
)
from fastdata.image.jpeg.restart import RestartIndex, build_index, decode_region, restart_failure, warn_restart_fallback
from fastdata.image.output import OutputFormat
from fastdata.image.recipes.ops import OpContext
from fastdata.image.recipes.recipe import Recipe
from fastdata.image.recipes.sizes import ImageSizes
from fastdata.image.targets.codec import SpatialCodec, TargetCodec, wrap_spatial_custom
from fastdata.image.targets.labels import LabelCodec
from fastdata.meter.stages import StageTimes
from fastdata.order.epoch import sample_rng, sample_seed

ON_ERROR = ("raise", "skip")
#: how many bytes of crops wait for a recipe's per-sample presets at most (the batch's rows are filled in such
#: chunks; ~10 MB per worker thread: 66 crops of 224 x 224, at least one crop)
RECIPE_CHUNK_BYTES = 10 << 20


@dataclass(frozen=True)
class PipelineConfig:
    """What the loader tells the worker pipeline, in one value given once (`SamplePipeline.configure`) when it
    builds, before the workers fork; the workers read it, never write it:
    `output`: the format the workers make their batches in (uint8, or a preset's floats made image by image when
    no device normalises them); `delivered`: the format of the batches the loader delivers, made here or on its
    device (the units of RandomErasing's value); `unstacked`: whole images of different sizes (detection with
    augment=None), a list of CHW tensors per batch; `sizes`: progressive resizing's shared schedule of each
    epoch's output size (None: the preset's size throughout); `ship_encoded` (decode="device"): ship JPEG bytes and
    crop parameters, the rest as pixels; `ship_progressive`: progressive JPEGs to the device too (False: decoded
    in the workers); `sub_jpegs`: over the restart layout, the device path's shared switch that turns on shipping
    each crop's sub-JPEG once its decoder proved it takes them (fastdata.image.device.ship.SubJpegSwitch; None:
    whole files)."""

    output: OutputFormat = field(default_factory=OutputFormat)
    delivered: OutputFormat = field(default_factory=OutputFormat)
    unstacked: bool = False
    sizes: ImageSizes | None = None
    ship_encoded: bool = False
    ship_progressive: bool = True
    sub_jpegs: Any = None


class SamplePipeline:
    """Decode + augment for one sample. Picklable (spawn-safe); custom transforms are wrapped lazily.
    `image_size`, `scale` and `ratio` are the presets' (None: their defaults) and refused with a custom
    transform, which sets its own size."""

    def __init__(self, augment: Any, image_size: Any, seed: int, source: str,
                 max_pixels: int = DEFAULT_MAX_PIXELS, jpeg_libraries: tuple[str, ...] | None = None, *,
                 scale: Any = None, ratio: Any = None,
                 labels: TargetCodec | None = None,
                 jpeg_layout: str = "original", recipe: Recipe | None = None) -> None:
        self.max_pixels = max_pixels
        # "restart" (the manifest's jpeg_layout): a rewritten JPEG's crop region is decoded from the sub-JPEG of the
        # MCUs it covers (fastdata.image.jpeg.restart); any other layout, or a JPEG the conversion kept as it was, by
        # region from the whole file (same pixels)
        self.jpeg_layout = jpeg_layout
        # how a batch's labels become a tensor (class ids or multi-hot)
        self.labels: TargetCodec = labels or LabelCodec()
        # JPEGs with a preset: decode only the crop's region (fastdata.image.jpeg.region) where the extension is usable;
        # False decodes whole images with OpenCV (same pixels; kept for comparison and as the fallback).
        self.region_decode = True
        self.jpeg_libraries = jpeg_libraries  # libjpeg-turbo builds to try (None: Pillow's, then the system's)
        # what the loader tells the workers, set once by `configure` when the loader is built
        self.config = PipelineConfig()
        # what follows the crop (fastdata.image.recipes): per-sample presets on each crop, a batch preset on each
        # batch over `mix_classes` classes (the dataset sets them)
        self.recipe = recipe or Recipe()
        self.mix_classes = 0
        self._sized: dict[tuple[int, int], Any] = {}  # the preset at another epoch's size, made once
        self.augment = augment
        self.seed = seed
        self.source = source
        # detection and segmentation: targets follow the pixels' geometry (fastdata.image.targets.detection,
        # fastdata.image.targets.segmentation); None for other targets
        self.spatial = cast(SpatialCodec, self.labels) if self.labels.spatial else None
        self.preset: Any
        if self.spatial is not None and (isinstance(augment, str) or is_detection_preset(augment)):
            self.preset = make_detection_preset(augment, image_size, scale, ratio)
            self.image_size = self.preset.size
        elif isinstance(augment, str):
            self.preset = make_preset(augment, image_size, scale, ratio)
            self.image_size = self.preset.size
        elif is_detection_preset(augment):
            raise ConfigError(f"{source}: {type(augment).__name__} is a detection and segmentation preset; this "
                              "dataset holds neither boxes nor masks")
        else:
            check_custom(augment, image_size, scale, ratio)
            if self.spatial is not None and augment is not None:
                self._wrap_spatial_custom()  # ConfigError now for a transform the targets cannot follow
            self.preset, self.image_size = None, None
        if self.recipe and (self.preset is None or self.spatial is not None):
            raise ConfigError(f"{source}: {self.recipe.describe()} follow the classification presets "
                              "(augment=[RandomResizedCrop(...), ...]); detection and segmentation datasets and "
                              "custom transforms take none")
        self._custom: Callable[..., Any] | None = None
        self._local: threading.local | None = None  # per-thread scratch buffers (see _scratch)
        if self.recipe.per_sample:  # the policies' tables now, before the workers fork
            self.recipe.warm(*self.preset.out_size)

    def configure(self, config: PipelineConfig) -> None:
        """Take the loader's configuration (before the workers fork: they get it with the pipeline)."""
        self.config = config

    @property
    def output(self) -> OutputFormat:
        """The format the workers make batches in (`PipelineConfig.output`)."""
        return self.config.output

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_custom": None, "_local": None, "_sized": {}}

    def _scratch(self, size: tuple[int, int], name: str = "image") -> np.ndarray:
        """The H x W x 3 image each sample of a batch is resized into before its planes go to the batch tensor
        ("image"), or the 3 x H x W uint8 planes floats are made from ("planes"), kept between batches (one per
        thread)."""
        if self._local is None:
            self._local = threading.local()
        shape = (*size, 3) if name == "image" else (3, *size)
        buffer = getattr(self._local, name, None)
        if buffer is None or buffer.shape != shape:
            buffer = np.empty(shape, np.uint8)
            setattr(self._local, name, buffer)
        return buffer

    def _crops(self, count: int, size: tuple[int, int]) -> np.ndarray:
        """`count` H x W x 3 images, a batch's crops before the recipe's per-sample presets, kept between batches
        (one per thread; grown, never shrunk)."""
        if self._local is None:
            self._local = threading.local()
        buffer = getattr(self._local, "crops", None)
        if buffer is None or buffer.shape[1:3] != size or len(buffer) < count:
            buffer = np.empty((count, *size, 3), np.uint8)
            self._local.crops = buffer
        return buffer[:count]

    @property
    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of the output, when every sample has the same known size (a preset), as built."""
        return self.preset.out_size if self.preset is not None else None

    def preset_for(self, epoch: int) -> Any:
        """The preset epoch `epoch` is made with: the one built, at the epoch's size (`sizes`, progressive
        resizing)."""
        sizes = self.config.sizes
        if sizes is None or self.preset is None:
            return self.preset
        size = sizes.size_for(epoch)
        if size == self.preset.out_size:
            return self.preset
        if size not in self._sized:
            self._sized[size] = dataclasses.replace(self.preset, size=size)
        return self._sized[size]

    def output_size_for(self, epoch: int) -> tuple[int, int] | None:
        """(height, width) of epoch `epoch`'s output, when known (a preset)."""
        preset = self.preset_for(epoch)
        return preset.out_size if preset is not None else None

    def _op_context(self) -> OpContext:
        """This thread's context for the recipe's operations (its scratch image kept between samples)."""
        if self._local is None:
            self._local = threading.local()
        context = getattr(self._local, "ops", None)
        if context is None:
            context = self._local.ops = OpContext()
        context.bgr = self.bgr
        return context

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

    def _wrap_spatial_custom(self) -> Any:
        """The custom transform, adapted to carry the sample's boxes or mask with its pixels."""
        assert self.spatial is not None
        return wrap_spatial_custom(self.spatial, self.augment)

    def _where(self, sample: EncodedSample) -> str:
        return f"{self.source}/{sample.origin}" if sample.origin else self.source

    def target_of(self, sample: EncodedSample) -> Any:
        """What a processed sample's batch row carries besides its image: its label or caption, or (detection)
        the target `process` made with the pixels' geometry; (segmentation) the mask."""
        return sample.made if self.spatial is not None else sample.label

    def _name(self, sample: EncodedSample) -> str:
        return f"{self._where(sample)}: sample {sample.key!r}"

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

    def _restart_index(self, decoder: RegionDecoder, sample: EncodedSample) -> RestartIndex | None:
        """The restart index of a restart-layout dataset's rewritten JPEG (rebuilt from its bytes, ~20 us), or None:
        another layout, a JPEG the conversion kept as it was (counted in its manifest), or a library that failed
        the restart self-check (warned once per process)."""
        if self.jpeg_layout != "restart":
            return None
        failure = restart_failure(decoder)
        if failure:
            warn_restart_fallback(decoder.library, failure)
            return None
        try:
            return build_index(sample.data, name=sample.key)
        except UnsupportedJpegError:
            return None

    def _decode_region(self, decoder: RegionDecoder, sample: EncodedSample, region: Region) -> np.ndarray:
        self._check_pixels(sample)
        try:
            index = self._restart_index(decoder, sample)
            if index is not None:  # only the MCUs the region covers are decoded
                return decode_region(decoder, sample.data, index, region, bgr=self.bgr, max_pixels=self.max_pixels)
            return decoder.decode(sample.data, region, bgr=self.bgr, max_pixels=self.max_pixels)
        except ValueError as exc:
            raise CorruptSampleError(f"{self._where(sample)}: sample {sample.key!r}: {exc}") from exc

    def process(self, sample: EncodedSample, epoch: int, out: np.ndarray | None = None,
                times: StageTimes | None = None,
                deferred: list[np.random.Generator] | None = None) -> np.ndarray | torch.Tensor:
        """Decode and augment `sample` for `epoch`: with a preset or none, a uint8 HWC array (BGR order when
        `self.bgr`; with a preset, written into `out` (H x W x 3) if given); with a custom transform, its result
        as a CHW tensor (`as_chw`). Adds the decode and augment seconds to `times` if given. `deferred`: the
        recipe's per-sample presets are left to the caller, who gets the sample's RNG (after the crop's draw)
        appended to it (`batch` applies them to the whole batch's crops at once)."""
        started = perf_counter()
        result: np.ndarray | torch.Tensor
        record = self.spatial.record(sample, self._name(sample)) if self.spatial is not None else None
        preset = self.preset_for(epoch)
        if preset is not None:
            rng = sample_rng(self.seed, epoch, *sample.position)
            canvas = preset.out_size
            if out is None:
                out = np.empty((*canvas, 3), np.uint8)
            # boxes, masks: the crop goes to the canvas' top-left, the rest padded with 0
            if self.spatial is not None and record is not None:
                placement = preset.place(sample.width, sample.height, rng, self.spatial.boxes_of(record))
                params, size = placement.crop, placement.size
                result = out
                out = pad_around(out, size)
            else:
                params, size = preset.params(sample.width, sample.height, rng), canvas
                result = out
            decoder = self.region_decoder_for_presets() if sample.codec == CODEC_CV_JPEG else None
            decode_started = perf_counter()
            if decoder is not None:  # only the crop's rows/columns, at the smallest DCT scale that suffices
                region = plan_region(sample.width, sample.height, params, size)
                pixels = self._decode_region(decoder, sample, region)
                decode_s = perf_counter() - decode_started
                crop_resize_flip(pixels, box_in_region(params, region), out, params.flip)
            else:
                reduce = reduce_factor(params, size) if sample.codec == CODEC_CV_JPEG else 1
                image = self._decode(sample, reduce)
                decode_s = perf_counter() - decode_started
                apply_crop(image, params, out, scale=reduce)  # DCT scaling maps source pixel x to x / reduce
            if deferred is not None:
                deferred.append(rng)
            elif self.recipe.per_sample:  # policies, erasing: on the crop, drawn after it from the sample's RNG
                self.recipe.apply(out, rng, self._op_context(), self.config.delivered)
            if self.spatial is not None and record is not None:
                sample.made = self.spatial.placed(record, placement, canvas)
        else:
            image = self._decode(sample)
            decode_s = perf_counter() - started
            if self.augment is None:
                result = image
                if self.spatial is not None and record is not None:
                    sample.made = self.spatial.whole(record)
            elif self.spatial is not None and record is not None:
                if self._custom is None:
                    self._custom = self._wrap_spatial_custom()
                given = self.spatial.custom_input(record)
                custom, sample.made = self._custom(image, given, sample_seed(self.seed, epoch, *sample.position))
                result = as_chw(custom, self._name(sample))
            else:
                if self._custom is None:
                    self._custom = wrap_custom(self.augment)
                result = as_chw(self._custom(image, sample_seed(self.seed, epoch, *sample.position)),
                                self._name(sample))
        if times is not None:
            times.decode += decode_s
            times.augment += perf_counter() - started - decode_s
        return result

    def to_tensor(self, image: np.ndarray | torch.Tensor) -> torch.Tensor:
        """What `process` returned -> RGB CHW tensor (contiguous)."""
        if isinstance(image, torch.Tensor):
            return image.contiguous()
        if self.bgr:
            image = image[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))

    def batch(self, samples: list[EncodedSample], epoch: int, on_error: str,
              buffers: BatchBuffers | None = None) -> Batch:
        """Decode and augment `samples` into one batch. With a preset every image is resized into a scratch
        image whose planes go straight into the batch's preallocated NCHW tensor (in a reused shared-memory slot
        of `buffers` when one is free), as uint8 or normalised into the `output` dtype; a custom transform's
        results are stacked (one shape and dtype throughout)."""
        skipped: list[tuple[str, str]] = []
        labels: list[Label] = []
        size = self.output_size_for(epoch)
        times = StageTimes()
        tensor: torch.Tensor | list[torch.Tensor]
        rngs: list[np.random.Generator] = []
        if size:  # every image resized into one scratch image, its planes then copied into the batch tensor
            import cv2

            floating = self.output.floating
            tensor, slot = batch_tensor((len(samples), 3, *size), buffers, self.output.batch_dtype)
            image = self._scratch(size)
            # a recipe's per-sample presets run on a chunk of crops at a time (RECIPE_CHUNK_BYTES), each operation on
            # every crop that drew it in turn (`Recipe.apply_batch`), not between one sample's decode and the next:
            # their code and tables stay in cache; the crops wait in `crops` with their samples' RNGs in `rngs`
            chunk = max(1, min(len(samples), RECIPE_CHUNK_BYTES // (size[0] * size[1] * 3)))
            crops = self._crops(chunk, size) if self.recipe.per_sample else None
            order = (2, 1, 0) if self.bgr else (0, 1, 2)
            if floating:  # uint8 planes of one image, then normalised into its row of the batch
                planes = self._scratch(size, "planes")
                uint8_planes = torch.from_numpy(planes)
            else:
                planes = tensor.numpy()
        else:
            images: list[torch.Tensor] = []
            kept: list[EncodedSample] = []  # the samples behind `images` (skipped ones left out)
            slot = crops = None

        def to_row(pixels: np.ndarray, row: int) -> None:
            """HWC -> the three planes of batch row `row` (and BGR -> RGB for free): OpenCV's SIMD split, measured
            5x faster than numpy's strided copy of the whole batch."""
            started = perf_counter()
            if floating:
                cv2.split(pixels, [planes[channel] for channel in order])
                self.output.normalise(uint8_planes, out=tensor[row])
            else:
                cv2.split(pixels, [planes[row, channel] for channel in order])
            times.collate += perf_counter() - started

        def finish_crops() -> None:
            """The recipe on the crops waiting in `crops`, then each into its row (the last rows so far)."""
            assert crops is not None
            started, first = perf_counter(), len(labels) - len(rngs)
            self.recipe.apply_batch(crops[:len(rngs)], rngs, self._op_context(), self.config.delivered)
            times.augment += perf_counter() - started
            for offset in range(len(rngs)):
                to_row(crops[offset], first + offset)
            rngs.clear()

        for sample in samples:
            try:
                if crops is not None:
                    self.process(sample, epoch, crops[len(rngs)], times, deferred=rngs)
                elif size:
                    self.process(sample, epoch, image, times=times)
                else:
                    images.append(self.to_chw_view(self.process(sample, epoch, times=times)))
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
            if size and crops is None:
                to_row(image, len(labels))
            labels.append(self.target_of(sample))
            if crops is not None and len(rngs) == len(crops):
                finish_crops()
        if rngs:
            finish_crops()
        collate_started = perf_counter()
        if size:
            tensor = tensor[: len(labels)]
        elif self.config.unstacked:  # each image as stored, in its own (shared-memory, in a worker) tensor
            tensor = [image.contiguous() for image in images]
        else:
            tensor, slot = _stack(images, kept, self.source, buffers)
        label_tensor = self.labels.batch(labels)
        times.collate += perf_counter() - collate_started
        if self.recipe.batch is not None and samples:
            started = perf_counter()
            label_tensor = self.mix(tensor, label_tensor, epoch,  # type: ignore[arg-type]  # a preset's: stacked
                                    samples[0].position)
            times.augment += perf_counter() - started
        return Batch(tensor, label_tensor, skipped, times, slot)

    def mix(self, images: torch.Tensor, labels: torch.Tensor, epoch: int, key: tuple[int, ...]) -> torch.Tensor:
        """The recipe's batch preset on one batch: `images` mixed in place, the labels returned as float rows
        over `mix_classes` classes, drawn from (seed, epoch, `key`: the batch's first sample's position)."""
        return self.recipe.mix(images, labels, self.seed, epoch, key, self.mix_classes)

    def to_chw_view(self, image: np.ndarray | torch.Tensor) -> torch.Tensor:
        """What `process` returned as CHW, without copying (an HWC array: a transposed view)."""
        if isinstance(image, torch.Tensor):
            return image
        return torch.from_numpy(image).permute(2, 0, 1)


def pad_around(canvas: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The top-left `size` (height, width) of `canvas` (H x W x 3), the rest of it set to 0 (detection's padding)."""
    height, width = size
    canvas[height:] = 0
    canvas[:height, width:] = 0
    return canvas[:height, :width]


def as_chw(result: Any, where: str) -> torch.Tensor:
    """A custom transform's result as a CHW tensor of its own dtype: a tensor is CHW already (torchvision's and
    albumentations' ToTensorV2 convention; a 2-D one is one channel), an array or PIL image is HWC (numpy's,
    OpenCV's and albumentations' convention; 2-D: one channel) and is viewed transposed, not copied."""
    if isinstance(result, torch.Tensor):
        tensor = result.as_subclass(torch.Tensor)  # a torchvision tv_tensors.Image -> a plain tensor
        if tensor.ndim == 2:
            tensor = tensor[None]
        if tensor.ndim != 3:
            raise ConfigError(f"{where}: augment returned a tensor of shape {tuple(tensor.shape)}; expected C x H x W")
        if tensor.shape[2] in (1, 3, 4) and tensor.shape[0] not in (1, 3, 4):
            raise ConfigError(f"{where}: augment returned a tensor of shape {tuple(tensor.shape)}, which looks H x "
                              "W x C; tensors are read as C x H x W (torchvision's convention): return a numpy "
                              "array for H x W x C")
        return tensor
    array = np.asarray(result)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3:
        raise ConfigError(f"{where}: augment returned an array of shape {array.shape}; expected H x W x C")
    if not array.flags.writeable or min(array.strides) < 0:  # torch takes neither: copy (e.g. a flipped view)
        array = array.copy()
    return torch.from_numpy(array).permute(2, 0, 1)


def _stack(images: list[torch.Tensor], samples: list[EncodedSample], source: str, buffers: BatchBuffers | None
           ) -> tuple[torch.Tensor, Slot | None]:
    """The CHW images of a batch stacked into one NCHW tensor (in shared memory in a worker), which needs them
    all of one shape and dtype."""
    if not images:
        return torch.empty((0, 3, 0, 0), dtype=torch.uint8), None
    first = images[0]
    for image, sample in zip(images, samples, strict=True):
        if image.shape != first.shape or image.dtype != first.dtype:
            raise ConfigError(
                f"{source}: cannot batch sample {sample.key!r} ({image.dtype}, C x H x W {tuple(image.shape)}) "
                f"with ({first.dtype}, {tuple(first.shape)}): images in a batch must have one size and dtype; use "
                "augment='train'/'val' (or a transform that ends in a fixed-size crop or resize)")
    tensor, slot = batch_tensor((len(images), *first.shape), buffers, first.dtype)
    torch.stack(images, out=tensor)
    return tensor, slot
