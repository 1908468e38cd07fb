"""MixUp and CutMix as batch presets (torchvision v2's `MixUp`, `CutMix`, and `RandomChoice` of them as its
reference recipes use): one batch's images mixed with the batch rolled by one, its labels made float
`[B, num_classes]` rows mixed the same way (rows summing to 1 for class labels), torchvision's shapes and
arithmetic. Drawn once per batch from `batch_rng` (the seed, the epoch and what identifies the batch), so a
resumed run and any number of workers mix alike.

The workers mix a batch where they build it, row by row in place (OpenCV for uint8 and float32 rows, torch for
the others); on the device path (`decode="device"`) the loader mixes the device batch with torch, on its device.
uint8 images are mixed in float and rounded to the nearest grey level (torchvision's MixUp takes float images).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastdata.errors import ConfigError

#: what tells a batch's random stream from any sample's (`fastdata.order.epoch.sample_rng`: (seed, epoch, sample))
BATCH_STREAM = 0x6D6978


def batch_rng(seed: int, epoch: int, *key: int) -> np.random.Generator:
    """The RNG that draws one batch's mixing: a function of (seed, epoch, the batch's key) alone."""
    return np.random.default_rng((seed, epoch, BATCH_STREAM, *key))


def _check(name: str, alpha: Any, num_classes: Any) -> None:
    if not isinstance(alpha, int | float) or not alpha > 0 or not math.isfinite(alpha):
        raise ConfigError(f"{name}'s alpha must be a positive number, got {alpha!r}")
    if num_classes is not None and (not isinstance(num_classes, int) or isinstance(num_classes, bool)
                                    or num_classes < 1):
        raise ConfigError(f"{name}'s num_classes must be a positive int (or None: the dataset's classes), got "
                          f"{num_classes!r}")


@dataclass(frozen=True)
class Mixed:
    """One batch's draw: "mixup" (each row `lam` of itself and `1 - lam` of the row before) or "cutmix" (the
    box (x1, y1, x2, y2) taken from the row before); `lam` is each row's own label's weight."""

    kind: str
    lam: float
    box: tuple[int, int, int, int] | None = None


@dataclass(frozen=True)
class MixUp:
    """torchvision's `MixUp(alpha=1.0, num_classes=None)`: lam ~ Beta(alpha, alpha) per batch; `num_classes` None
    takes the dataset's."""

    alpha: float = 1.0
    num_classes: int | None = None

    def __post_init__(self) -> None:
        _check("MixUp", self.alpha, self.num_classes)

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Mixed:
        return Mixed("mixup", float(rng.beta(self.alpha, self.alpha)))


@dataclass(frozen=True)
class CutMix:
    """torchvision's `CutMix(alpha=1.0, num_classes=None)`: lam ~ Beta(alpha, alpha), a box of sides
    sqrt(1 - lam) of the image's around a uniform centre (clipped to the image), the labels weighted by the
    area it leaves."""

    alpha: float = 1.0
    num_classes: int | None = None

    def __post_init__(self) -> None:
        _check("CutMix", self.alpha, self.num_classes)

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Mixed:
        lam = float(rng.beta(self.alpha, self.alpha))
        centre_x, centre_y = int(rng.integers(width)), int(rng.integers(height))
        r = 0.5 * math.sqrt(1.0 - lam)
        half_w, half_h = int(r * width), int(r * height)
        x1, y1 = max(centre_x - half_w, 0), max(centre_y - half_h, 0)
        x2, y2 = min(centre_x + half_w, width), min(centre_y + half_h, height)
        return Mixed("cutmix", float(1.0 - (x2 - x1) * (y2 - y1) / (width * height)), (x1, y1, x2, y2))


@dataclass(frozen=True)
class RandomChoice:
    """torchvision's `RandomChoice(transforms, p=None)` of batch presets: one of `transforms` (MixUp, CutMix) per
    batch, with probabilities `p` (None: equal), as torchvision's reference recipes pick MixUp or CutMix."""

    transforms: tuple[MixUp | CutMix, ...]
    p: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        transforms = tuple(self.transforms)
        if not transforms or not all(isinstance(t, MixUp | CutMix) for t in transforms):
            raise ConfigError(f"RandomChoice takes a list of MixUp / CutMix presets, got {self.transforms!r}")
        object.__setattr__(self, "transforms", transforms)
        if self.p is not None:
            p = tuple(float(v) for v in self.p)
            if len(p) != len(transforms) or min(p) < 0 or not sum(p) > 0:
                raise ConfigError(f"RandomChoice's p must be {len(transforms)} non-negative weights, got {self.p!r}")
            object.__setattr__(self, "p", p)

    @property
    def num_classes(self) -> int | None:
        given = {n for t in self.transforms if (n := t.num_classes) is not None}
        if len(given) > 1:
            raise ConfigError(f"RandomChoice's presets name different num_classes: {sorted(given)}")
        return next(iter(given), None)

    def draw(self, rng: np.random.Generator, height: int, width: int) -> Mixed:
        weights = np.full(len(self.transforms), 1.0) if self.p is None else np.array(self.p)
        chosen = self.transforms[int(rng.choice(len(self.transforms), p=weights / weights.sum()))]
        return chosen.draw(rng, height, width)


BatchPreset = MixUp | CutMix | RandomChoice


def mix_labels(labels: torch.Tensor, mixed: Mixed, num_classes: int) -> torch.Tensor:
    """torchvision's `_mixup_label`: class ids one-hot over `num_classes` (multi-hot rows as they are), float32,
    each row `lam` of its own and `1 - lam` of the row before's."""
    if labels.ndim == 1:
        labels = torch.nn.functional.one_hot(labels.long(), num_classes)
    labels = labels.float()
    return labels.roll(1, 0).mul_(1.0 - mixed.lam).add_(labels.mul(mixed.lam))


def mix_images(images: torch.Tensor, mixed: Mixed) -> None:
    """Mix a batch of images [B, C, H, W] in place: MixUp row by row from the last (the last row kept aside for
    the first), uint8 rounded to the nearest level; CutMix the box of the rolled batch copied in."""
    if not len(images):
        return
    if mixed.kind == "cutmix":
        assert mixed.box is not None
        x1, y1, x2, y2 = mixed.box
        region = images[:, :, y1:y2, x1:x2]
        region.copy_(region.roll(1, 0))
        return
    if images.device.type == "cpu" and images.dtype in (torch.uint8, torch.float32) and images.is_contiguous():
        _mixup_opencv(images.numpy(), mixed.lam)
        return
    rolled = images.roll(1, 0)
    if images.dtype.is_floating_point:
        images.mul_(mixed.lam).add_(rolled, alpha=1.0 - mixed.lam)
    else:
        images.copy_(images.float().mul_(mixed.lam).add_(rolled.float(), alpha=1.0 - mixed.lam).round_())


def _mixup_opencv(array: np.ndarray, lam: float) -> None:
    """MixUp of a contiguous [B, C, H, W] uint8 or float32 array in place, one `cv2.addWeighted` a row."""
    import cv2

    rows = array.reshape(len(array), -1, array.shape[-1])  # each row one 2-D (C*H) x W plane
    last = rows[-1].copy()
    for i in range(len(rows) - 1, 0, -1):
        cv2.addWeighted(rows[i], lam, rows[i - 1], 1.0 - lam, 0.0, dst=rows[i])
    cv2.addWeighted(rows[0], lam, last, 1.0 - lam, 0.0, dst=rows[0])
