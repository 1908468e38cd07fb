"""RandomErasing as a preset: torchvision's `RandomErasing(p, scale, ratio, value)` (its rectangle drawn as it
draws it), run on the crop where the batch is built.

`value` is in the units of the batches the loader delivers, as torchvision's RandomErasing placed last in a
transform: grey levels (0..255) for uint8 batches; normalised units for floating batches (`OutputOptions(dtype=...)`),
where 0 is the mean colour, as in torchvision's reference recipe (RandomErasing after Normalize), and "random" is
standard normal noise. The crop is uint8 until the batch is made, so a normalised value is written as the nearest
grey level (at most half a level, 1/510 of the range, off; noise beyond the grey range is clipped to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.errors import ConfigError
from fastdata.image.output import OutputFormat


def _pair(name: str, value: Any, low: float, high: float | None) -> tuple[float, float]:
    try:
        first, last = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"RandomErasing's {name} must be a pair (low, high), got {value!r}") from None
    if not (low <= first <= last) or (high is not None and last > high) or not math.isfinite(last):
        bound = f" <= {high:g}" if high is not None else ""
        raise ConfigError(f"RandomErasing's {name} must be ({low:g} <=) low <= high{bound}, got {value!r}")
    return first, last


@dataclass(frozen=True)
class RandomErasing:
    """torchvision's `RandomErasing(p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0)`: with probability `p`, a
    rectangle of `scale` of the crop's area and aspect (height / width) in `ratio` (10 tries, else nothing) set to
    `value`: a number or three (R, G, B), or "random" (normal noise; floating batches only), in the units of the
    batches (grey levels for uint8; normalised for floating, where 0 is the mean colour)."""

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: Any = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.p, int | float) or not 0 <= self.p <= 1:
            raise ConfigError(f"RandomErasing's p must be a probability in 0..1, got {self.p!r}")
        object.__setattr__(self, "scale", _pair("scale", self.scale, 0.0, 1.0))
        object.__setattr__(self, "ratio", _pair("ratio", self.ratio, 1e-12, None))
        value = self.value
        if isinstance(value, str):
            if value != "random":
                raise ConfigError(f"RandomErasing's value must be a number, three numbers or 'random', got {value!r}")
        else:
            values = (value,) if isinstance(value, int | float) else tuple(value)
            if len(values) not in (1, 3) or not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
                raise ConfigError(f"RandomErasing's value must be a number, three numbers or 'random', got {value!r}")
            object.__setattr__(self, "value", float(values[0]) if len(values) == 1 else tuple(map(float, values)))

    def levels(self, output: OutputFormat) -> tuple[int, int, int] | None:
        """The grey levels (R, G, B) that `value` is in batches of format `output`; None for "random". A value that
        is no grey level (uint8 batches: outside 0..255) is refused."""
        if self.value == "random":
            if not output.floating:
                raise ConfigError("RandomErasing(value='random') fills with normal noise in normalised units: it "
                                  "needs floating batches (output=OutputOptions(dtype=torch.float32), or bfloat16)")
            return None
        values = (self.value,) * 3 if isinstance(self.value, float) else self.value
        if output.floating:  # normalised units -> the grey level nearest to it
            values = tuple((v * s + m) * 255 for v, m, s in zip(values, output.mean, output.std, strict=True))
        elif not all(0 <= v <= 255 for v in values):
            raise ConfigError(f"RandomErasing(value={self.value!r}): uint8 batches hold grey levels 0..255; a value "
                              "in normalised units needs floating batches (output=OutputOptions(dtype=torch.float32))")
        return tuple(min(max(round(v), 0), 255) for v in values)  # type: ignore[return-value]

    def box(self, rng: np.random.Generator, height: int, width: int) -> tuple[int, int, int, int] | None:
        """(top, left, height, width) of the rectangle to erase in a `height` x `width` crop, or None (not this
        time, or no rectangle fitted in 10 tries), drawn as torchvision draws it."""
        if not rng.random() < self.p:
            return None
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            erase_area = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            h = round(math.sqrt(erase_area * aspect))
            w = round(math.sqrt(erase_area / aspect))
            if h < height and w < width:
                return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
        return None

    def apply(self, image: np.ndarray, rng: np.random.Generator, levels: tuple[int, int, int] | None,
              output: OutputFormat, bgr: bool) -> None:
        """Erase a rectangle of `image` (H x W x 3 uint8, BGR order if `bgr`) with `levels` (from `levels()`), or
        with normal noise in `output`'s normalised units when `levels` is None."""
        drawn = self.box(rng, image.shape[0], image.shape[1])
        if drawn is None:
            return
        top, left, h, w = drawn
        region = image[top:top + h, left:left + w]
        if levels is not None:
            fill = levels[::-1] if bgr else levels
            if fill[0] == fill[1] == fill[2]:  # one level (the default 0): a fill of bytes
                region[...] = fill[0]
            elif region.size:  # numpy's assignment of a colour to each pixel costs 10x OpenCV's rectangle
                import cv2

                cv2.rectangle(image, (left, top), (left + w - 1, top + h - 1), fill, thickness=-1)
            return
        mean = np.array(output.mean, np.float32) * 255
        std = np.array(output.std, np.float32) * 255
        noise = rng.standard_normal((h, w, 3), dtype=np.float32) * std + mean
        region[...] = np.clip(np.rint(noise), 0, 255)[..., ::-1] if bgr else np.clip(np.rint(noise), 0, 255)
