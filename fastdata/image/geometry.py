"""The geometry every augmentation shares, below the presets: a crop box in source pixels (`CropParams`), output
sizes (`output_size`, `stable_size`), (low, high) ranges (`bounds`), the DCT scale a crop allows
(`reduce_factor`) and a fractional box as whole pixels (`pixel_box`). The classification presets
(`fastdata.image.augment`), the detection presets (`fastdata.image.detection_presets`), the region decoder and the
device path all build on it, so none borrows another's private helpers."""

from __future__ import annotations

import math
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


ImageSize = int | tuple[int, int]  # a square side, or (height, width) as torchvision's size arguments


def output_size(image_size: Any) -> tuple[int, int]:
    """`image_size` (a side, or (height, width)) as (height, width) of positive whole pixels."""
    if isinstance(image_size, int | np.integer) and not isinstance(image_size, bool):
        sides = (int(image_size), int(image_size))
    elif (isinstance(image_size, tuple | list) and len(image_size) == 2
          and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in image_size)):
        sides = (int(image_size[0]), int(image_size[1]))
    else:
        raise ConfigError(f"image_size must be an int or (height, width) of ints, got {image_size!r} "
                          f"({type(image_size).__name__})")
    if min(sides) < 1:
        raise ConfigError(f"image_size must be a positive number of pixels, got {image_size!r}")
    return sides


def stable_size(image_size: Any) -> ImageSize:
    """The size as a preset keeps it: an int for a square (so that its repr, which resume states record, is the
    same however it was given), else (height, width)."""
    height, width = output_size(image_size)
    return height if height == width else (height, width)


def bounds(name: str, value: Any, upper: float | None = None) -> tuple[float, float]:
    """A (low, high) pair of positive numbers, low <= high (<= upper when given), as floats."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a pair of numbers (low, high), got {value!r}") from None
    if not (0 < low <= high) or (upper is not None and high > upper) or not math.isfinite(high):
        most = f" and at most {upper:g}" if upper is not None else ""
        raise ConfigError(f"{name} must be (low, high) with 0 < low <= high{most}, got {value!r}")
    return low, high


def reduce_factor(params: CropParams, size: ImageSize, allowed: tuple[int, ...] = (8, 4, 2)) -> int:
    """The largest JPEG DCT scale-down that still leaves the crop at least the output's `size` (a side, or
    (height, width)) in pixels."""
    out_h, out_w = output_size(size)
    for factor in allowed:
        if params.width / factor >= out_w and params.height / factor >= out_h:
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
