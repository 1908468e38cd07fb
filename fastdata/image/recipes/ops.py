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
from dataclasses import dataclass, field

import numpy as np
import torch

#: torchvision's grey (`_rgb_to_grayscale_image`): R, G, B weights
GREY_WEIGHTS = (0.2989, 0.587, 0.114)
INTERPOLATIONS = ("nearest", "bilinear")


@dataclass
class OpContext:
    """What an operation needs besides the crop and its magnitude: the crop's channel order, the interpolation of
    the geometric operations and their fill (per channel of the crop, RGB order given), and a scratch image of the
    crop's shape for the operations that cannot write in place, and the float images they compute in (kept between
    samples: a fresh array of a crop's size per operation costs more than the operation, in page faults)."""

    bgr: bool = False
    interpolation: str = "nearest"
    fill: tuple[float, float, float] = (0.0, 0.0, 0.0)
    buffers: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def buffer(self, name: str, shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
        """The scratch array `name` of `shape` and `dtype` (kept between calls; its contents are left over)."""
        found = self.buffers.get(name)
        if found is None or found.shape != shape or found.dtype != dtype:
            found = self.buffers[name] = np.empty(shape, dtype)
        return found

    def spare(self, image: np.ndarray) -> np.ndarray:
        """A scratch array of `image`'s shape and dtype (kept between calls)."""
        return self.buffer("spare", image.shape, image.dtype.type)

    def floats(self, image: np.ndarray, name: str = "pixels") -> np.ndarray:
        """`image` as float32, in the scratch array `name`."""
        pixels = self.buffer(name, image.shape)
        np.copyto(pixels, image)
        return pixels

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


@functools.lru_cache(maxsize=256)
def solarize_lut(threshold: float) -> np.ndarray:
    """torchvision's solarize: levels at or above `threshold` inverted."""
    levels = _ramp()
    return _table(torch.where(levels >= threshold, levels.bitwise_not(), levels))


@functools.lru_cache(maxsize=256)
def solarize_first(threshold: float) -> int:
    """The lowest level solarize inverts at `threshold` (256: none), as torch compares the levels with it."""
    inverted = solarize_lut(threshold) != _ramp().numpy()
    return int(np.argmax(inverted)) if inverted.any() else 256


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
    whole numbers): `cv2.transform` in float32 gives torchvision's value but for rare colours, where its sum (not
    torch's chain of fused multiply-adds) floors one level off; its uint8 path (fixed point) is a level off for 1
    pixel in 200. The exact chain (float64, or OpenCV's general transform path) costs several times as much."""
    import cv2

    source = context.floats(image) if pixels is None else pixels
    grey = cv2.transform(source, _weights(context.bgr), dst=context.buffer("grey", image.shape[:2]))
    return np.floor(grey, out=grey)


@functools.cache
def _weights(bgr: bool) -> np.ndarray:
    """The grey weights in a crop's channel order, as `cv2.transform`'s 1 x 3 matrix (never written to)."""
    return np.array([GREY_WEIGHTS[::-1] if bgr else GREY_WEIGHTS], np.float32)


def _to_levels(pixels: np.ndarray, image: np.ndarray, clamp: bool = True) -> None:
    """float32 `pixels` clamped to 0..255 and truncated into the uint8 `image` (torchvision's `.to(uint8)`).
    `clamp=False`: the pixels are known to lie in 0..255 already (a blend with a weight in 0..1 of two images in
    0..255 stays between them, and rounds no further than to 0 or 255)."""
    if clamp:
        np.clip(pixels, 0, 255, out=pixels)
    np.copyto(image, pixels, casting="unsafe")


def brightness(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    if magnitude != 0:  # (x * 1: the image as it is)
        _lut(image, brightness_lut(1.0 + magnitude))


def color(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """torchvision's adjust_saturation: blended with its floored grey in float32 (`x * factor`, then the grey
    times `1 - factor` added in one fused step, as torch adds), clamped, truncated."""
    import cv2

    factor = 1.0 + magnitude
    if factor == 1.0:  # x * 1 + grey * 0: the image as it is
        return
    pixels = context.floats(image)
    grey = _grey(image, context, pixels)
    np.multiply(pixels, np.float32(factor), out=pixels)
    greys = cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR, dst=context.buffer("greys", image.shape))  # (half merge's cost)
    _to_levels(cv2.scaleAdd(greys, 1.0 - factor, pixels, dst=pixels), image, clamp=factor > 1)


def contrast(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    import cv2

    if magnitude == 0:  # x * 1 + mean * 0: the image as it is
        return
    mean = float(np.float32(cv2.mean(_grey(image, context))[0]))
    _lut(image, contrast_lut(1.0 + magnitude, mean))


#: torchvision's adjust_sharpness blur: 1 around a 5, over 13
_SHARPNESS_KERNEL = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / 13


def sharpness(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """torchvision's adjust_sharpness: blended with the 3x3 blur (rounded) in float32 (`x + (blur - x) * (1 -
    factor)` in one fused step, as torch adds), clamped, truncated; the outermost rows and columns left as they
    are."""
    import cv2

    if image.shape[0] <= 2 or image.shape[1] <= 2 or magnitude == 0:
        return
    factor = 1.0 + magnitude
    blurred = _blur(image, context)[1:-1, 1:-1]
    inner = image[1:-1, 1:-1]
    pixels = context.floats(inner, "inner")  # (not "pixels": a buffer of another shape is not reallocated)
    change = cv2.subtract(blurred, inner, dst=context.buffer("change", inner.shape), dtype=cv2.CV_32F)
    _to_levels(cv2.scaleAdd(change, 1.0 - factor, pixels, dst=pixels), inner, clamp=factor > 1)


def _blur(image: np.ndarray, context: OpContext) -> np.ndarray:
    """torchvision's sharpness blur (the 3 x 3 kernel, rounded), in the scratch image: the kernel's sum in integers
    (the 3 x 3 box sum plus 4 times the centre) divided by 13 and rounded, in one weighted sum (`sum / 13 + x * 4 /
    13`: its float error is far below the 1/26 by which a thirteenth misses a tie), the same levels as torch's
    float32 convolution rounded, at two thirds of `filter2D`'s cost (edges: not used)."""
    import cv2

    sums = cv2.boxFilter(image, cv2.CV_16U, (3, 3), dst=context.buffer("sums", image.shape, np.uint16),
                         normalize=False, borderType=cv2.BORDER_REPLICATE)
    blurred = context.spare(image)
    cv2.addWeighted(_flat(sums), 1.0 / 13, _flat(image), 4.0 / 13, 0.0, dst=_flat(blurred), dtype=cv2.CV_8U)
    return blurred


def _flat(image: np.ndarray) -> np.ndarray:
    """`image` (H x W x 3, contiguous) as one channel of H x 3W: a scalar then applies to every channel alike."""
    return image.reshape(image.shape[0], -1)


def posterize(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """torchvision's posterize (`x & mask`) as one SIMD `bitwise_and`."""
    import cv2

    bits = int(magnitude)
    if bits < 8:
        flat = _flat(image)  # (a number is OpenCV's scalar operand; its stubs only know arrays)
        cv2.bitwise_and(flat, (((1 << bits) - 1) << (8 - bits)) & 0xFF, dst=flat)  # type: ignore[call-overload]


def solarize(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """torchvision's solarize (levels at or above the threshold inverted) as a comparison and an exclusive or with
    its mask (255: inverted, 0: kept), two SIMD passes instead of a table lookup."""
    import cv2

    first = solarize_first(255.0 * magnitude)
    if first > 255:
        return
    flat = _flat(image)
    if first <= 0:
        cv2.bitwise_not(flat, dst=flat)
        return
    mask = context.buffer("mask", flat.shape, np.uint8)
    cv2.compare(flat, first, cv2.CMP_GE, dst=mask)  # type: ignore[call-overload]  # (as in posterize)
    cv2.bitwise_xor(flat, mask, dst=flat)


def invert(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    import cv2

    cv2.bitwise_not(image, dst=image)


def autocontrast(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """Each channel stretched from its min..max to 0..255 (torchvision's float32 arithmetic, as a table)."""
    import cv2

    planes = _planes(image, context)
    limits = np.array([cv2.minMaxLoc(plane)[:2] for plane in planes], np.float32)
    low, high = limits[:, 0], limits[:, 1]
    same = high == low
    scale = (high - low) * np.float32(1.0 / 255)
    low[same], scale[same] = 0.0, 1.0
    table = np.clip((_LEVELS[:, None] - low) / scale, 0, 255)
    _lut_planes(image, planes, table.astype(np.uint8).T)


def equalize(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """Each channel's histogram equalised with torchvision's (Pillow's) table: `(cumulative count + step // 2) //
    step`, with step the count of all levels but the highest present over 255 (exact in float64: the counts are
    whole numbers far below 2**53, and a quotient misses a whole number by more than float64 rounds)."""
    import cv2

    planes = _planes(image, context)
    hist = context.buffer("hist", (3, 256, 1))
    for plane, row in zip(planes, hist, strict=True):
        cv2.calcHist([plane], [0], None, [256], [0, 256], hist=row)
    counts = hist.reshape(3, 256)
    cumulative = np.cumsum(counts, axis=1, dtype=np.float64)
    last = counts[_CHANNELS, np.argmax(cumulative, axis=1)]  # the count of each channel's highest level
    step = np.floor((cumulative[:, -1] - last) / 255)
    levels = np.floor((cumulative[:, :-1] + np.floor(step / 2)[:, None]) / np.maximum(step, 1)[:, None])
    tables = context.buffer("tables", (3, 256), np.uint8)
    tables[:, 0] = 0
    np.copyto(tables[:, 1:], np.minimum(levels, 255, out=levels), casting="unsafe")
    tables[step == 0] = _RAMP8
    _lut_planes(image, planes, tables)


#: the channel indices, and the 256 levels as uint8 (never written to)
_CHANNELS = np.arange(3)
_RAMP8 = np.arange(256, dtype=np.uint8)


def _planes(image: np.ndarray, context: OpContext) -> list[np.ndarray]:
    """The three channels of `image` split into scratch planes."""
    import cv2

    planes = [context.buffer(f"plane{channel}", image.shape[:2], np.uint8) for channel in range(3)]
    cv2.split(image, planes)
    return planes


def _lut_planes(image: np.ndarray, planes: list[np.ndarray], tables: np.ndarray) -> None:
    """Each of `planes` (`image`'s channels) through its row of `tables` (3 x 256), merged back into `image`: a
    one-channel lookup per plane, twice as fast as OpenCV's lookup with a table per channel."""
    import cv2

    for plane, table in zip(planes, tables, strict=True):
        cv2.LUT(plane, table, dst=plane)
    cv2.merge(planes, dst=image)


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
    if magnitude != 0:  # (the identity map: the image as it is)
        shear = (math.degrees(math.atan(magnitude)), 0.0)
        _warp(image, inverse_affine(_corner(image), 0.0, (0.0, 0.0), shear), context)


def shear_y(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    if magnitude != 0:
        shear = (0.0, math.degrees(math.atan(magnitude)))
        _warp(image, inverse_affine(_corner(image), 0.0, (0.0, 0.0), shear), context)


def translate_x(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    if int(magnitude) != 0:
        _warp(image, inverse_affine((0.0, 0.0), 0.0, (float(int(magnitude)), 0.0), (0.0, 0.0)), context)


def translate_y(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    if int(magnitude) != 0:
        _warp(image, inverse_affine((0.0, 0.0), 0.0, (0.0, float(int(magnitude))), (0.0, 0.0)), context)


def rotate(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    """torchvision's rotate (counter-clockwise by `magnitude` degrees about the centre, same size)."""
    angle = magnitude % 360
    if angle == 0:
        return
    if angle == 180 or (angle in (90, 270) and image.shape[0] == image.shape[1]):  # torchvision's exact rot90
        import cv2

        turn = {90: cv2.ROTATE_90_COUNTERCLOCKWISE, 180: cv2.ROTATE_180, 270: cv2.ROTATE_90_CLOCKWISE}[int(angle)]
        np.copyto(image, cv2.rotate(image, turn, dst=context.spare(image)))
        return
    _warp(image, inverse_affine((0.0, 0.0), -angle, (0.0, 0.0), (0.0, 0.0)), context)


def identity(image: np.ndarray, magnitude: float, context: OpContext) -> None:
    return None


def warm(name: str, magnitude: float) -> None:
    """Work out the tables operation `name` keeps for `magnitude` (torch computes them: ~50 us each) now, so that a
    worker forked later has them instead of computing them in its first epoch."""
    if name == "Brightness" and magnitude != 0:
        brightness_lut(1.0 + magnitude)
    elif name == "Solarize":
        solarize_first(255.0 * magnitude)


Operation = Callable[[np.ndarray, float, OpContext], None]

#: every operation of the policies, by torchvision's name
OPERATIONS: dict[str, Operation] = {
    "Identity": identity, "ShearX": shear_x, "ShearY": shear_y, "TranslateX": translate_x,
    "TranslateY": translate_y, "Rotate": rotate, "Brightness": brightness, "Color": color, "Contrast": contrast,
    "Sharpness": sharpness, "Posterize": posterize, "Solarize": solarize, "AutoContrast": autocontrast,
    "Equalize": equalize, "Invert": invert,
}
