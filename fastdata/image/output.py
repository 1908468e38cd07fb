"""The dtype image batches are delivered in: uint8 as decoded, or floats normalised with a mean and std in 0..1
units (torchvision's `ToDtype(scale=True)` + `Normalize(mean, std)`: `(x / 255 - mean) / std`).

One implementation (`OutputFormat.normalise`) serves both paths: the workers apply it to each image of a batch
(the preset path on the CPU, `device=None`), the device path to whole batches on the device; both compute
`(x - 255 * mean) / (255 * std)` in float32 and then cast, so they give the same values bit for bit."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fastdata.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _three(name: str, values: Any, positive: bool = False) -> tuple[float, float, float]:
    """`values` as three finite floats (one per RGB channel), or a ConfigError naming `name`."""
    try:
        floats = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be three numbers (one per RGB channel, 0..1 units), got {values!r}") from None
    if len(floats) != 3 or not all(math.isfinite(v) for v in floats):
        raise ConfigError(f"{name} must be three finite numbers (one per RGB channel, 0..1 units), got {values!r}")
    if positive and min(floats) <= 0:
        raise ConfigError(f"{name} must be positive, got {values!r}")
    return floats


@dataclass(frozen=True)
class OutputFormat:
    """`dtype` None or torch.uint8: batches as decoded (0..255); a floating dtype (float32, bfloat16, float16):
    normalised with `mean` and `std` (three numbers each in 0..1 units, torchvision's; ImageNet's by default)."""

    dtype: torch.dtype | None = None
    mean: Sequence[float] = IMAGENET_MEAN
    std: Sequence[float] = IMAGENET_STD

    def __post_init__(self) -> None:
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            raise ConfigError(f"dtype must be a torch.dtype (e.g. torch.bfloat16), got {self.dtype!r}")
        if self.dtype is not None and self.dtype != torch.uint8 and not self.dtype.is_floating_point:
            raise ConfigError(f"dtype must be torch.uint8 or a floating dtype (torch.float32, torch.bfloat16, "
                              f"torch.float16), got {self.dtype}")
        object.__setattr__(self, "mean", _three("mean", self.mean))
        object.__setattr__(self, "std", _three("std", self.std, positive=True))
        if max(self.mean) > 1 or max(self.std) > 1:  # only 0..255 units have such values
            raise ConfigError(f"mean={self.mean} std={self.std} look like 0..255 units; fastdata takes them in 0..1 "
                              f"units, as torchvision's Normalize after ToDtype(scale=True): divide by 255 (e.g. "
                              f"mean={tuple(round(v / 255, 3) for v in self.mean)})")

    @property
    def floating(self) -> bool:
        """Whether batches are normalised floats (else uint8)."""
        return self.dtype is not None and self.dtype.is_floating_point

    @property
    def batch_dtype(self) -> torch.dtype:
        return self.dtype if self.floating else torch.uint8  # type: ignore[return-value]

    def describe(self) -> str | None:
        """The format as stable text for resume checks (None: uint8)."""
        if not self.floating:
            return None
        return f"{self.dtype}, mean={self.mean}, std={self.std}"

    def convert(self, images: torch.Tensor) -> torch.Tensor:
        """Images as this format gives them: uint8 ones normalised into a floating `dtype` (a transform's floating
        output, normalised by the transform, only cast to it); unchanged when the format is uint8."""
        if not self.floating:
            return images
        return self.normalise(images) if images.dtype == torch.uint8 else images.to(self.dtype)

    def normalise(self, images: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 images (..., 3, H, W) -> `dtype`, `(x - 255 mean) / (255 std)` computed in float32 (into `out`
        if given: a tensor of `dtype` and the same shape)."""
        mean, std = _constants(self.mean, self.std, images.device)
        direct = out is not None and out.dtype == torch.float32
        values = torch.sub(images, mean, out=out) if direct else torch.sub(images, mean)
        values.div_(std)
        if out is None:
            return values.to(self.dtype)
        if not direct:
            out.copy_(values)
        return out


@functools.cache
def _constants(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """255 * mean and 255 * std as float32 (3, 1, 1) tensors on `device` (made once per process and device)."""
    return (torch.tensor(mean, device=device).view(3, 1, 1) * 255,
            torch.tensor(std, device=device).view(3, 1, 1) * 255)
