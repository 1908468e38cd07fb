"""Augmentation: the train/val presets (crop box drawn from the image size before decoding, then one OpenCV
resize), and an adapter for any albumentations transform or plain callable.

The presets are split into `params()` (pure: image size + RNG -> crop box and flip) and `apply()` (pixels),
so that the decoder can decode only at the scale the crop needs, and so that a later GPU path can draw the
same parameters on the CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.errors import ConfigError
from fastdata.image.decode import opencv_single_threaded


@dataclass(frozen=True)
class CropParams:
    """A crop box in source-pixel coordinates, and whether to mirror the result."""

    left: float
    top: float
    width: float
    height: float
    flip: bool = False


@dataclass(frozen=True)
class RandomResizedCropFlip:
    """torchvision's RandomResizedCrop (same sampling of area and log-aspect, 10 tries, central fallback)
    followed by a horizontal flip with probability `flip_p`."""

    size: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5

    def params(self, width: int, height: int, rng: np.random.Generator) -> CropParams:
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return CropParams(left, top, w, h, bool(rng.random() < self.flip_p))
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, round(width / min(self.ratio))
        elif in_ratio > max(self.ratio):
            h, w = height, round(height * max(self.ratio))
        else:
            w, h = width, height
        return CropParams((width - w) // 2, (height - h) // 2, w, h, bool(rng.random() < self.flip_p))


@dataclass(frozen=True)
class ResizeCenterCrop:
    """Validation preset: resize the shorter side to size/crop_fraction, then take the central size x size."""

    size: int
    crop_fraction: float = 0.875

    def params(self, width: int, height: int, rng: np.random.Generator | None = None) -> CropParams:
        side = min(width, height) * self.crop_fraction  # the source extent that becomes `size` pixels
        return CropParams((width - side) / 2, (height - side) / 2, side, side, False)


Preset = RandomResizedCropFlip | ResizeCenterCrop


def reduce_factor(params: CropParams, size: int, allowed: tuple[int, ...] = (8, 4, 2)) -> int:
    """The largest JPEG DCT scale-down that still leaves the crop at least `size` pixels on each side."""
    for factor in allowed:
        if params.width / factor >= size and params.height / factor >= size:
            return factor
    return 1


def pixel_box(left: float, top: float, width: float, height: float, image_w: int, image_h: int,
              cover: bool = False) -> tuple[int, int, int, int]:
    """The box (left, top, width, height), fractional, as whole pixels (x0, y0, x1, y1) of an image_w x image_h
    image: never empty, never outside. `cover` takes every pixel the box touches (floor / ceil); otherwise the
    start is truncated and the end rounded."""
    start, end = (math.floor, math.ceil) if cover else (int, round)
    x0 = min(max(start(left), 0), image_w - 1)
    y0 = min(max(start(top), 0), image_h - 1)
    x1 = min(max(end(left + width), x0 + 1), image_w)
    y1 = min(max(end(top + height), y0 + 1), image_h)
    return x0, y0, x1, y1


def crop_resize_flip(image: np.ndarray, box: tuple[float, float, float, float], out: np.ndarray,
                     flip: bool) -> None:
    """Resize the box (left, top, width, height) of `image` (image pixels, fractional allowed) into `out`
    (S x S x 3, uint8), mirrored if `flip`: crop, resize and flip in one OpenCV call, no float conversion.

    Bilinear, with sub-pixel box edges (an affine warp: pixel centres map exactly as in torchvision's
    resized_crop), is accurate below a 2x shrink, which is where the decoder's DCT scaling leaves most JPEG crops;
    an axis shrunk 2x or more is first halved (pairs of pixels averaged) until it is not, so as not to alias
    (as Pillow's reducing_gap does), then warped."""
    import cv2

    opencv_single_threaded()  # any process that crops: warpAffine would use OpenCV's pool (see its docstring)
    left, top, width, height = box
    out_h, out_w = out.shape[:2]
    sx, sy = width / out_w, height / out_h
    while max(sx, sy) >= 2:
        image, (left, top, width, height) = _halve(image, (left, top, width, height), sx >= 2, sy >= 2)
        sx, sy = width / out_w, height / out_h
    # inverse map, output pixel centre -> source position: x_src = left + (x + 0.5) * sx - 0.5 (mirrored: x -> W-1-x)
    row_x = (-sx, 0.0, left + (out_w - 0.5) * sx - 0.5) if flip else (sx, 0.0, left + 0.5 * sx - 0.5)
    matrix = np.array([row_x, (0.0, sy, top + 0.5 * sy - 0.5)])
    cv2.warpAffine(image, matrix, (out_w, out_h), dst=out, flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                   borderMode=cv2.BORDER_REPLICATE)


def _halve(image: np.ndarray, box: tuple[float, float, float, float], along_x: bool, along_y: bool
           ) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """The pixels under `box`, with each pair of pixels averaged along x and/or y (a bilinear resize to exactly
    half a side samples midway between two pixels: a 2-pixel box filter, OpenCV's fast path; INTER_AREA at a
    ratio other than 2x2 measured 5-10x slower), and `box` in the result. Only pixels the box touches are read
    (an odd count gets its last pixel repeated), so a region decode and a whole-image decode give the same
    result. Pixel i of a halved axis averages pixels x0 + 2i and x0 + 2i + 1: edge coordinate e -> (e - x0) / 2."""
    import cv2

    left, top, width, height = box
    x0, y0, x1, y1 = pixel_box(left, top, width, height, image.shape[1], image.shape[0], cover=True)
    pixels = image[y0:y1, x0:x1]
    pad_x, pad_y = (x1 - x0) % 2 if along_x else 0, (y1 - y0) % 2 if along_y else 0
    if pad_x or pad_y:
        pixels = cv2.copyMakeBorder(pixels, 0, pad_y, 0, pad_x, cv2.BORDER_REPLICATE)
    kx, ky = (2 if along_x else 1), (2 if along_y else 1)
    halved = cv2.resize(pixels, (pixels.shape[1] // kx, pixels.shape[0] // ky), interpolation=cv2.INTER_LINEAR)
    return halved, ((left - x0) / kx, (top - y0) / ky, width / kx, height / ky)


def apply_crop(image: np.ndarray, params: CropParams, out: np.ndarray, scale: float = 1.0) -> None:
    """Crop `params` (given in source pixels; `image` is the source at 1/`scale`, e.g. a JPEG decoded at
    1/`scale` by DCT scaling) and resize into `out` (size x size x 3, uint8), mirrored if asked."""
    box = (params.left / scale, params.top / scale, params.width / scale, params.height / scale)
    crop_resize_flip(image, box, out, params.flip)


def make_preset(name: str, image_size: int) -> Preset:
    """The named preset ("train" or "val") for output size `image_size`."""
    if image_size < 1:
        raise ConfigError(f"image_size must be a positive number of pixels, got {image_size}")
    if name == "train":
        return RandomResizedCropFlip(image_size)
    if name == "val":
        return ResizeCenterCrop(image_size)
    raise ConfigError(f"unknown augment preset {name!r}: use 'train', 'val', an albumentations transform, "
                      "a callable on an HWC uint8 array, or None")


def describe_augment(augment: Any, image_size: int) -> str | None:
    """What a transform does, as stable text, so that a loader state taken with one transform is refused by a
    loader with another: presets with every parameter (crop scale and ratio, flip, size); albumentations
    pipelines as albumentations serialises them; other callables by their qualified name."""
    if augment is None:
        return None
    if isinstance(augment, str):
        return repr(make_preset(augment, image_size))
    try:
        import json

        import albumentations as A

        if isinstance(augment, A.BasicTransform | A.BaseCompose):
            described = {k: v for k, v in A.to_dict(augment).items() if k != "__version__"}
            return json.dumps(described, sort_keys=True, default=repr)
    except (ImportError, NotImplementedError, TypeError, ValueError):  # not serialisable: fall back to its name
        pass
    kind = augment if callable(augment) and hasattr(augment, "__qualname__") else type(augment)
    module = getattr(kind, "__module__", None) or type(augment).__module__
    return f"{module}.{getattr(kind, '__qualname__', repr(kind))}"


def wrap_custom(transform: Any) -> Callable[[np.ndarray, int], np.ndarray]:
    """Adapt an albumentations transform (called as `t(image=...)["image"]`, reseeded per sample for
    reproducibility) or a plain callable `f(hwc_uint8) -> hwc_uint8` to `fn(image, sample_seed) -> image`. A callable
    with an `rng` parameter is called as `f(image, rng=np.random.Generator)` seeded for the sample; any other runs
    with the global RNGs (random, numpy, torch) seeded for the sample (`SeededGlobalRngs`)."""
    try:
        import albumentations as A

        is_album = isinstance(transform, A.BasicTransform | A.BaseCompose)
    except ImportError:  # pragma: no cover - albumentations is a dependency
        is_album = False
    if is_album:
        compose = transform if hasattr(transform, "set_random_seed") else A.Compose([transform])

        def run_album(image: np.ndarray, seed: int) -> np.ndarray:
            compose.set_random_seed(seed)
            return compose(image=image)["image"]

        return run_album
    if not callable(transform):
        raise ConfigError(f"augment must be 'train', 'val', None, an albumentations transform or a callable, "
                          f"got {type(transform).__name__}")
    if _takes_rng(transform):
        return lambda image, seed: transform(image, rng=np.random.default_rng(seed))

    def run_seeded(image: np.ndarray, seed: int) -> np.ndarray:
        with SeededGlobalRngs(seed):
            return transform(image)

    return run_seeded


def _takes_rng(transform: Callable) -> bool:
    """Whether `transform` accepts an `rng` keyword (then it gets the sample's numpy Generator)."""
    import inspect

    try:
        parameters = inspect.signature(transform).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return "rng" in parameters


class SeededGlobalRngs:
    """Seed Python's `random`, numpy's global RNG and torch's CPU RNG from one sample's seed for the duration of a
    transform call, so that a plain callable drawing from the global RNGs gives the same result for the same
    (seed, epoch, sample) whatever process runs it. Outside DataLoader workers (num_workers=0: the training
    process) the states they had are put back afterwards, so the caller's own random streams are left as they
    were (about 0.2 ms, mostly numpy's state copy; workers skip it: their global RNGs are theirs)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._saved: tuple[Any, Any, Any] | None = None

    def __enter__(self) -> None:
        import random

        import torch

        if torch.utils.data.get_worker_info() is None:
            self._saved = (random.getstate(), np.random.get_state(), torch.default_generator.get_state())
        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.default_generator.manual_seed(self.seed)  # CPU only: torch.manual_seed also starts CUDA's RNGs

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            return
        import random

        import torch

        python_state, numpy_state, torch_state = self._saved
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.default_generator.set_state(torch_state)
        self._saved = None
