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


@dataclass(frozen=True)
class CropParams:
    """A crop box in source-pixel coordinates, and whether to mirror the result."""

    left: float
    top: float
    width: float
    height: float
    flip: bool = False


def _resize_into(src: np.ndarray, out: np.ndarray, size: int) -> None:
    import cv2

    h, w = src.shape[:2]
    # Bilinear is exact enough below a 2x shrink (the decoder's DCT scaling did the rest) and 3-4x faster
    # than area averaging; larger shrinks (PNGs, no DCT scaling) average to avoid aliasing.
    interp = cv2.INTER_AREA if (w >= 2 * size and h >= 2 * size) else cv2.INTER_LINEAR
    cv2.resize(src, (size, size), dst=out, interpolation=interp)


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


def crop_box(params: CropParams, width: int, height: int, scale: float = 1.0) -> tuple[int, int, int, int]:
    """The crop `params` (source pixels) as integer (x0, y0, x1, y1) in an image of `width` x `height` that is
    the source at 1/`scale`; never empty, never outside the image."""
    x0 = min(max(int(params.left / scale), 0), width - 1)
    y0 = min(max(int(params.top / scale), 0), height - 1)
    x1 = min(max(round((params.left + params.width) / scale), x0 + 1), width)
    y1 = min(max(round((params.top + params.height) / scale), y0 + 1), height)
    return x0, y0, x1, y1


def resize_into(crop: np.ndarray, out: np.ndarray, flip: bool) -> None:
    """Resize the already-cropped `crop` into `out` (size x size x 3, uint8), mirrored if `flip`: one OpenCV
    resize (and an in-place flip), no float conversion."""
    import cv2

    _resize_into(crop, out, out.shape[0])
    if flip:
        cv2.flip(out, 1, dst=out)


def apply_crop(image: np.ndarray, params: CropParams, out: np.ndarray, scale: float = 1.0) -> None:
    """Crop `params` (given in source pixels; `image` is the source at 1/`scale`) and resize into `out`
    (size x size x 3, uint8), mirrored if asked."""
    x0, y0, x1, y1 = crop_box(params, image.shape[1], image.shape[0], scale)
    resize_into(image[y0:y1, x0:x1], out, params.flip)


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


def wrap_custom(transform: Any) -> Callable[[np.ndarray, int], np.ndarray]:
    """Adapt an albumentations transform (called as `t(image=...)["image"]`, reseeded per sample for
    reproducibility) or a plain callable `f(hwc_uint8) -> hwc_uint8` to `fn(image, sample_seed) -> image`."""
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
    return lambda image, seed: transform(image)
