"""The augmentation policies' operations (torchvision's `_AutoAugmentBase._apply_image_or_video_transform`) on an
H x W x 3 uint8 crop, in place, each one or two OpenCV calls:

- point operations (Brightness, Contrast, Posterize, Solarize, AutoContrast, Equalize, Invert) are a lookup table
  (`cv2.LUT`) computed with torchvision's own arithmetic on the 256 grey levels: the same pixels as torchvision;
- Color (saturation) and Sharpness blend with the grey image or the 3x3 blur (`cv2.transform`, `cv2.filter2D`,
  `cv2.scaleAdd`) in torch's float32 arithmetic (its fused multiply-add), truncated as torchvision truncates: the
  same pixels too;
- ShearX/Y, TranslateX/Y and Rotate are one `cv2.warpAffine` with torchvision's inverse matrix mapped to pixel
  indices (nearest or bilinear, filled outside the image).

docs/images.md gives the measured agreement with torchvision for every operation and magnitude. The crop may be in
BGR order (`bgr`: the presets' whole-image OpenCV decode), which only the grey weights and the fill depend on.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

#: torchvision's grey (`_rgb_to_grayscale_image`): R, G, B weights
GREY_WEIGHTS = (0.2989, 0.587, 0.114)
INTERPOLATIONS = ("nearest", "bilinear")


@dataclass
class OpContext:
    """What an operation needs besides the crop and its magnitude: the crop's channel order, the interpolation of
    the geometric operations and their fill (per channel of the crop, RGB order given), and a scratch image of the
    crop's shape for the operations that cannot write in place."""

    bgr: bool = False
    interpolation: str = "nearest"
    fill: tuple[float, float, float] = (0.0, 0.0, 0.0)
    scratch: np.ndarray | None = None

    def spare(self, image: np.ndarray) -> np.ndarray:
        """A scratch array of `image`'s shape (kept between calls)."""
        if self.scratch is None or self.scratch.shape != image.shape:
            self.scratch = np.empty_like(image)
        return self.scratch

    @property
    def weights(self) -> tuple[float, float, float]:
        """The grey weights in the crop's channel order."""
        return GREY_WEIGHTS[::-1] if self.bgr else GREY_WEIGHTS

    @property
    def border(self) -> tuple[float, float, float]:
        """The fill in the crop's channel order."""
        return self.fill[::-1] if self.bgr else self.fill


@functools.cache
def _ramp() -> torch.Tensor:
    """The 256 grey levels, uint8: what a lookup table is computed from (never written to)."""
    return torch.arange(256, dtype=torch.uint8)


#: the 256 grey levels as float32 (never written to)
_LEVELS = np.arange(256, dtype=np.float32)


def _fma32(x: np.ndarray | float, y: float, z: np.ndarray) -> np.ndarray:
    """float32 `x * y + z` rounded once, as torch's `z.add_(x, alpha=y)` computes it (a fused multiply-add): the
    float64 product of two float32 is exact."""
    return (np.float64(np.float32(y)) * np.asarray(x, np.float32).astype(np.float64) + z).astype(np.float32)


def _table(values: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(values.to(torch.uint8).numpy())


@functools.lru_cache(maxsize=256)
def brightness_lut(factor: float) -> np.ndarray:
    """torchvision's adjust_brightness on a uint8 image: `x * factor`, clamped, truncated."""
    return _table(_ramp().mul(factor).clamp_(0, 255))


@functools.lru_cache(maxsize=64)
def posterize_lut(bits: int) -> np.ndarray:
    """torchvision's posterize: the `bits` high bits kept."""
    levels = _ramp()
    return _table(levels if bits >= 8 else levels & (((1 << bits) - 1) << (8 - bits)))


@functools.lru_cache(maxsize=64)
def solarize_lut(threshold: float) -> np.ndarray:
    """torchvision's solarize: levels at or above `threshold` inverted."""
    levels = _ramp()
    return _table(torch.where(levels >= threshold, levels.bitwise_not(), levels))


def contrast_lut(factor: float, mean: float) -> np.ndarray:
    """torchvision's adjust_contrast for an image whose (floored) grey mean is `mean`: `x * factor + mean * (1 -
    factor)` in float32, clamped, truncated."""
    blended = _fma32(mean, 1.0 - factor, _LEVELS * np.float32(factor))
    return np.clip(blended, 0, 255).astype(np.uint8)


def _lut(image: np.ndarray, table: np.ndarray) -> None:
    import cv2

    cv2.LUT(image, table, dst=image)


def _grey(image: np.ndarray, context: OpContext, pixels: np.ndarray | None = None) -> np.ndarray:
    """torchvision's grey of a uint8 image (`pixels`: it as float32, if made already), floored (H x W float32 of
    whole numbers): `cv2.transform` in float32 gives torchvision's value bit for bit, where its uint8 path (fixed
    point) is a level off for 1 pixel in 200."""
    import cv2

    source = image.astype(np.float32) if pixels is None else pixels
    grey = cv2.transform(source, np.array([context.weights], np.float32))
    return np.floor(grey, out=grey)


def brightness(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    _lut(image, brightness_lut(1.0 + magnitude))


def color(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """torchvision's adjust_saturation: blended with its floored grey in float32 (`x * factor`, then the grey
    times `1 - factor` added in one fused step, as torch adds), clamped, truncated."""
    import cv2

    factor = 1.0 + magnitude
    pixels = image.astype(np.float32)
    grey = _grey(image, context, pixels)
    pixels *= np.float32(factor)
    blended = cv2.scaleAdd(cv2.merge([grey, grey, grey]), 1.0 - factor, pixels)
    np.copyto(image, np.clip(blended, 0, 255, out=blended), casting="unsafe")


def contrast(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    import cv2

    mean = float(np.float32(cv2.mean(_grey(image, context))[0]))
    _lut(image, contrast_lut(1.0 + magnitude, mean))


#: torchvision's adjust_sharpness blur: 1 around a 5, over 13
_SHARPNESS_KERNEL = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / 13


def sharpness(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """torchvision's adjust_sharpness: blended with the 3x3 blur (rounded) in float32 (`x + (blur - x) * (1 -
    factor)` in one fused step, as torch adds), clamped, truncated; the outermost rows and columns left as they
    are."""
    import cv2

    if image.shape[0] <= 2 or image.shape[1] <= 2:
        return
    factor = 1.0 + magnitude
    blurred = cv2.filter2D(image, -1, _SHARPNESS_KERNEL, dst=context.spare(image))
    inner = image[1:-1, 1:-1]
    pixels = inner.astype(np.float32)
    change = blurred[1:-1, 1:-1].astype(np.float32)
    change -= pixels
    blended = cv2.scaleAdd(change, 1.0 - factor, pixels)
    np.copyto(inner, np.clip(blended, 0, 255, out=blended), casting="unsafe")


def posterize(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    _lut(image, posterize_lut(int(magnitude)))


def solarize(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    _lut(image, solarize_lut(255.0 * magnitude))


def invert(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    import cv2

    cv2.bitwise_not(image, dst=image)


def autocontrast(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """Each channel stretched from its min..max to 0..255 (torchvision's float32 arithmetic, as a table)."""
    import cv2

    limits = np.array([cv2.minMaxLoc(channel)[:2] for channel in cv2.split(image)], np.float32)
    low, high = limits[:, 0], limits[:, 1]
    same = high == low
    scale = (high - low) * np.float32(1.0 / 255)
    low[same], scale[same] = 0.0, 1.0
    table = np.clip((_LEVELS[:, None] - low) / scale, 0, 255)
    _lut(image, table.astype(np.uint8).reshape(256, 1, 3))


def equalize(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """Each channel's histogram equalised with torchvision's (Pillow's) table, in integers."""
    import cv2

    tables = np.empty((256, 1, 3), np.uint8)
    pixels = image.shape[0] * image.shape[1]
    for channel in range(3):
        hist = cv2.calcHist([image], [channel], None, [256], [0, 256]).reshape(256).astype(np.int64)
        cumulative = np.cumsum(hist)
        step = (pixels - int(hist[int(np.argmax(cumulative))])) // 255
        if step == 0:
            tables[:, 0, channel] = np.arange(256)
            continue
        tables[0, 0, channel] = 0
        tables[1:, 0, channel] = np.clip((cumulative[:-1] + step // 2) // step, 0, 255)
    _lut(image, tables)


def inverse_affine(center: tuple[float, float], angle: float, translate: tuple[float, float],
                   shear: tuple[float, float]) -> list[float]:
    """torchvision's `_get_inverse_affine_matrix` (scale 1): output -> input, about `center` (pixels from the
    image's centre)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    (cx, cy), (tx, ty) = center, translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = math.cos(rot) - c * math.tan(sx)
    matrix = [d, -b, 0.0, -c, a, 0.0]
    matrix[2] += cx - matrix[0] * (cx + tx) - matrix[1] * (cy + ty)
    matrix[5] += cy - matrix[3] * (cx + tx) - matrix[4] * (cy + ty)
    return matrix


def _warp(image: np.ndarray, matrix: list[float], context: OpContext) -> None:
    """torchvision's affine grid for `matrix` (centred coordinates, pixel centres at half-pixel offsets, sampled
    with align_corners=False) as one inverse-mapped `cv2.warpAffine` over pixel indices."""
    import cv2

    height, width = image.shape[:2]
    cx, cy = (width - 1) / 2, (height - 1) / 2
    m0, m1, m2, m3, m4, m5 = matrix
    pixels = np.array([[m0, m1, m2 + cx - m0 * cx - m1 * cy], [m3, m4, m5 + cy - m3 * cx - m4 * cy]])
    source = context.spare(image)
    np.copyto(source, image)
    flags = (cv2.INTER_NEAREST if context.interpolation == "nearest" else cv2.INTER_LINEAR) | cv2.WARP_INVERSE_MAP
    cv2.warpAffine(source, pixels, (width, height), dst=image, flags=flags, borderMode=cv2.BORDER_CONSTANT,
                   borderValue=context.border)


def _corner(image: np.ndarray) -> tuple[float, float]:
    """center=[0, 0] (the top-left corner) in torchvision's centred coordinates."""
    return -image.shape[1] * 0.5, -image.shape[0] * 0.5


def shear_x(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    _warp(image, inverse_affine(_corner(image), 0.0, (0.0, 0.0), (math.degrees(math.atan(magnitude)), 0.0)), context)


def shear_y(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    _warp(image, inverse_affine(_corner(image), 0.0, (0.0, 0.0), (0.0, math.degrees(math.atan(magnitude)))), context)


def translate_x(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    _warp(image, inverse_affine((0.0, 0.0), 0.0, (float(int(magnitude)), 0.0), (0.0, 0.0)), context)


def translate_y(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    _warp(image, inverse_affine((0.0, 0.0), 0.0, (0.0, float(int(magnitude))), (0.0, 0.0)), context)


def rotate(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """torchvision's rotate (counter-clockwise by `magnitude` degrees about the centre, same size)."""
    angle = magnitude % 360
    if angle == 0:
        return
    if angle == 180 or (angle in (90, 270) and image.shape[0] == image.shape[1]):  # torchvision's exact rot90
        turned, spare = np.rot90(image, k=int(angle // 90)), context.spare(image)
        np.copyto(spare, turned)
        np.copyto(image, spare)
        return
    _warp(image, inverse_affine((0.0, 0.0), -angle, (0.0, 0.0), (0.0, 0.0)), context)


def identity(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    return None


Operation = Callable[[np.ndarray, float, OpContext], None]

#: every operation of the policies, by torchvision's name
OPERATIONS: dict[str, Operation] = {
    "Identity": identity, "ShearX": shear_x, "ShearY": shear_y, "TranslateX": translate_x,
    "TranslateY": translate_y, "Rotate": rotate, "Brightness": brightness, "Color": color, "Contrast": contrast,
    "Sharpness": sharpness, "Posterize": posterize, "Solarize": solarize, "AutoContrast": autocontrast,
    "Equalize": equalize, "Invert": invert,
}
