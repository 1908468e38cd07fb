"""torchvision's automatic augmentation policies as presets (`fastdata.presets`): TrivialAugmentWide, RandAugment
and AutoAugment (ImageNet policy), with torchvision's operations, magnitude bins (computed by torch as
torchvision computes them), signs, interpolation and fill. Each draws its operations from the sample's RNG (seeded
from `(seed, epoch, sample)`, after the crop's draw) and applies them to the crop in place (`fastdata.image.
recipes.ops`); the same crop and the same draw give torchvision's pixels within the tolerances docs/images.md
states."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdata.errors import ConfigError
from fastdata.image.recipes.ops import INTERPOLATIONS, OPERATIONS, OpContext, warm

#: an operation's magnitudes: (first, last) of a linspace over the bins, "posterize" (8 - bins / ((n - 1) / span)
#: rounded), or None (no magnitude); and whether the magnitude is signed (negated with probability 1/2)
Space = dict[str, tuple[Any, bool]]

_WIDE: Space = {
    "Identity": (None, False), "ShearX": ((0.0, 0.99), True), "ShearY": ((0.0, 0.99), True),
    "TranslateX": ((0.0, 32.0), True), "TranslateY": ((0.0, 32.0), True), "Rotate": ((0.0, 135.0), True),
    "Brightness": ((0.0, 0.99), True), "Color": ((0.0, 0.99), True), "Contrast": ((0.0, 0.99), True),
    "Sharpness": ((0.0, 0.99), True), "Posterize": (("posterize", 6), False), "Solarize": ((1.0, 0.0), False),
    "AutoContrast": (None, False), "Equalize": (None, False),
}
#: RandAugment's and AutoAugment's: translations are a share of the side (150 / 331 of it at the last bin)
_STANDARD: Space = {
    "Identity": (None, False), "ShearX": ((0.0, 0.3), True), "ShearY": ((0.0, 0.3), True),
    "TranslateX": (("width", 150.0 / 331.0), True), "TranslateY": (("height", 150.0 / 331.0), True),
    "Rotate": ((0.0, 30.0), True), "Brightness": ((0.0, 0.9), True), "Color": ((0.0, 0.9), True),
    "Contrast": ((0.0, 0.9), True), "Sharpness": ((0.0, 0.9), True), "Posterize": (("posterize", 4), False),
    "Solarize": ((1.0, 0.0), False), "AutoContrast": (None, False), "Equalize": (None, False),
    "Invert": (None, False),
}
_RAND_OPS = tuple(name for name in _STANDARD if name != "Invert")
_WIDE_OPS = tuple(_WIDE)


def space(wide: bool) -> Space:
    """The operations and magnitude ranges of TrivialAugmentWide (`wide`) or of RandAugment and AutoAugment:
    operation name -> (its magnitudes, whether they are signed)."""
    return dict(_WIDE if wide else _STANDARD)

#: AutoAugment's ImageNet policy: 25 sub-policies of two (operation, probability, magnitude bin of 10)
IMAGENET_POLICY: tuple[tuple[tuple[str, float, int | None], ...], ...] = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)


@functools.lru_cache(maxsize=1024)
def magnitudes(wide: bool, name: str, bins: int, height: int, width: int) -> tuple[float, ...] | None:
    """The magnitude of each bin of operation `name` for a `height` x `width` image, as torchvision computes it
    (torch's float32 linspace / arange, then `float()`), or None for an operation without one."""
    import torch

    spec, _ = (_WIDE if wide else _STANDARD)[name]
    if spec is None:
        return None
    if spec[0] == "posterize":
        values = (8 - (torch.arange(bins) / ((bins - 1) / spec[1]))).round().int()
    elif spec[0] in ("width", "height"):
        values = torch.linspace(0.0, spec[1] * (width if spec[0] == "width" else height), bins)
    else:
        values = torch.linspace(spec[0], spec[1], bins)
    return tuple(float(v) for v in values)


def _signed(wide: bool, name: str) -> bool:
    return (_WIDE if wide else _STANDARD)[name][1]


def _check_common(interpolation: str, fill: Any) -> tuple[float, float, float] | None:
    if interpolation not in INTERPOLATIONS:
        raise ConfigError(f"interpolation must be one of {INTERPOLATIONS} (torchvision's modes for tensors), got "
                          f"{interpolation!r}")
    if fill is None:
        return None
    values = (fill,) * 3 if isinstance(fill, int | float) else tuple(fill)
    if len(values) != 3 or not all(isinstance(v, int | float) and 0 <= v <= 255 for v in values):
        raise ConfigError(f"fill must be a grey level or three (R, G, B) in 0..255, got {fill!r}")
    return tuple(float(v) for v in values)  # type: ignore[return-value]


def _interpolation_name(value: Any) -> str:
    """torchvision's InterpolationMode or its name, as the name ("nearest", "bilinear")."""
    return str(getattr(value, "value", value)).lower()


@dataclass(frozen=True)
class _Policy:
    """What the policies share: interpolation of the geometric operations ("nearest", torchvision's default, or
    "bilinear", its reference recipes'), and the fill outside the image (None: 0)."""

    interpolation: str = field(default="nearest", kw_only=True)
    fill: Any = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "interpolation", _interpolation_name(self.interpolation))
        object.__setattr__(self, "_levels", _check_common(self.interpolation, self.fill) or (0.0, 0.0, 0.0))

    def context(self, bgr: bool) -> OpContext:
        """A context for this policy's operations on a crop in BGR order if `bgr` (its fill as three levels)."""
        return OpContext(bgr, self.interpolation, self.levels)

    @property
    def levels(self) -> tuple[float, float, float]:
        """The fill as three grey levels (R, G, B)."""
        return self._levels  # type: ignore[attr-defined]

    def draw(self, rng: np.random.Generator, height: int, width: int) -> list[tuple[str, float]]:
        """The operations (name, signed magnitude) for one crop."""
        raise NotImplementedError

    def warm(self, height: int, width: int) -> None:
        """Work out the magnitudes and tables of every operation at every bin and sign for `height` x `width` crops
        now (see `ops.warm`)."""
        wide, bins = self._space()
        for name, (_, signed) in (_WIDE if wide else _STANDARD).items():
            for value in magnitudes(wide, name, bins, height, width) or ():
                for sign in (1, -1) if signed else (1,):
                    warm(name, sign * value)

    def _space(self) -> tuple[bool, int]:
        """Whether the policy draws from TrivialAugmentWide's space, and its number of magnitude bins."""
        raise NotImplementedError

    def apply(self, image: np.ndarray, rng: np.random.Generator, context: OpContext) -> None:
        """Draw and apply the operations to `image` (H x W x 3 uint8) in place."""
        for name, magnitude in self.draw(rng, image.shape[0], image.shape[1]):
            OPERATIONS[name](image, magnitude, context)


def _magnitude(wide: bool, name: str, bins: int, index: int, rng: np.random.Generator, height: int,
               width: int) -> float:
    """Bin `index`'s magnitude, negated with probability 1/2 for a signed operation (0 for one without)."""
    values = magnitudes(wide, name, bins, height, width)
    if values is None:
        return 0.0
    value = values[index]
    return -value if _signed(wide, name) and rng.random() < 0.5 else value


@dataclass(frozen=True)
class TrivialAugmentWide(_Policy):
    """torchvision's `TrivialAugmentWide(num_magnitude_bins=31, interpolation="nearest", fill=None)`: one of its
    14 operations, chosen uniformly, at a magnitude bin chosen uniformly."""

    num_magnitude_bins: int = 31

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.num_magnitude_bins, int) or self.num_magnitude_bins < 2:
            raise ConfigError(f"num_magnitude_bins must be an int >= 2, got {self.num_magnitude_bins!r}")

    def _space(self) -> tuple[bool, int]:
        return True, self.num_magnitude_bins

    def draw(self, rng: np.random.Generator, height: int, width: int) -> list[tuple[str, float]]:
        name = _WIDE_OPS[int(rng.integers(len(_WIDE_OPS)))]
        index = int(rng.integers(self.num_magnitude_bins))
        return [(name, _magnitude(True, name, self.num_magnitude_bins, index, rng, height, width))]


@dataclass(frozen=True)
class RandAugment(_Policy):
    """torchvision's `RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=31, interpolation="nearest",
    fill=None)`: `num_ops` operations in turn, each chosen uniformly of 14, all at bin `magnitude`."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.num_ops, int) or self.num_ops < 0:
            raise ConfigError(f"num_ops must be a non-negative int, got {self.num_ops!r}")
        if not isinstance(self.num_magnitude_bins, int) or self.num_magnitude_bins < 2:
            raise ConfigError(f"num_magnitude_bins must be an int >= 2, got {self.num_magnitude_bins!r}")
        if not isinstance(self.magnitude, int) or not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ConfigError(f"magnitude must be a bin in 0..{self.num_magnitude_bins - 1}, got "
                              f"{self.magnitude!r}")

    def _space(self) -> tuple[bool, int]:
        return False, self.num_magnitude_bins

    def draw(self, rng: np.random.Generator, height: int, width: int) -> list[tuple[str, float]]:
        drawn = []
        for _ in range(self.num_ops):
            name = _RAND_OPS[int(rng.integers(len(_RAND_OPS)))]
            drawn.append((name, _magnitude(False, name, self.num_magnitude_bins, self.magnitude, rng, height,
                                           width)))
        return drawn


@dataclass(frozen=True)
class AutoAugment(_Policy):
    """torchvision's `AutoAugment(policy=AutoAugmentPolicy.IMAGENET, interpolation="nearest", fill=None)`: one
    of the ImageNet policy's 25 sub-policies, chosen uniformly, each of its two operations applied with its
    probability at its magnitude bin (of 10). `policy` is "imagenet" (or torchvision's enum for it)."""

    policy: Any = "imagenet"

    def __post_init__(self) -> None:
        super().__post_init__()
        name = str(getattr(self.policy, "value", self.policy)).lower()
        if name != "imagenet":
            raise ConfigError(f"AutoAugment's preset has torchvision's ImageNet policy only, got {self.policy!r}")
        object.__setattr__(self, "policy", name)

    def _space(self) -> tuple[bool, int]:
        return False, 10

    def draw(self, rng: np.random.Generator, height: int, width: int) -> list[tuple[str, float]]:
        drawn = []
        for name, probability, index in IMAGENET_POLICY[int(rng.integers(len(IMAGENET_POLICY)))]:
            if not rng.random() < probability:
                continue
            drawn.append((name, 0.0 if index is None else _magnitude(False, name, 10, index, rng, height, width)))
        return drawn


Policy = TrivialAugmentWide | RandAugment | AutoAugment

