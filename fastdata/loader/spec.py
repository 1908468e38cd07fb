"""The first of `fastdata.loader`'s three steps: `LoaderSpec`, what the user asked for, frozen, in one spelling.

`fastdata.loader(...)` is `build(resolve(LoaderSpec.asked(...)))`: the spec holds the call's arguments with the
older keywords folded into their option objects (fastdata.loader.options) and the checks that need nothing but
the arguments made (a value of the wrong type, options that contradict each other, a mixture's options without a
list of paths); every "auto" and None that stands for a choice (workers, prefetch, pinning, persistence, decode
placement, device, rank) is left as asked, for `fastdata.loader.resolve` to settle in one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from fastdata.config import AUTO, check_int_or_auto
from fastdata.errors import ConfigError
from fastdata.formats.remote import RemoteOptions
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.recipes.recipe import Recipe
from fastdata.loader.options import (
    MixOptions,
    OutputOptions,
    RandomResizedCrop,
    ResizeCenterCrop,
    refuse_preset,
    resolve_spelling,
)
from fastdata.order.mixing import check_weights
from fastdata.text.loader import TextOptions

Where = str | os.PathLike[str]


@dataclass(frozen=True)
class LoaderSpec:
    """What one call of `fastdata.loader` asked for (its docstring says what each option means), checked but not
    resolved: `num_workers` None or "auto", `prefetch_factor` "auto", `pin_memory` and `persistent_workers` None,
    `decode` "auto", `device` None and `rank`/`world_size` None are choices `fastdata.loader.resolve` makes.
    `path` is one dataset, or a tuple of them for a mixture (a list of one is that dataset); `augment`,
    `image_size`, `scale`, `ratio` and `recipe` are the augmentation as the image loaders take it (a preset
    object unpacked, fastdata.loader.options.Spelled)."""

    path: Where | tuple[Where, ...]
    batch_size: int = 256
    augment: Any = "train"
    image_size: int | tuple[int, int] | None = None
    shuffle: bool = True
    num_workers: int | str | None = None
    seed: int = 0
    drop_last: bool = False
    pin_memory: bool | None = None
    prefetch_factor: int | str = 2
    persistent_workers: bool | None = None
    multiprocessing_context: Any = None
    on_error: str = "raise"
    timeout: float = 0
    rank: int | None = None
    world_size: int | None = None
    uneven: str = "pad"
    remote: RemoteOptions = field(default_factory=RemoteOptions)
    device: Any = None
    decode: str | DeviceDecodeOptions = "auto"
    output: OutputOptions = field(default_factory=OutputOptions)
    text: TextOptions = field(default_factory=TextOptions)
    masks: bool = False
    metadata: bool = False
    tune_dir: Where | None = None
    weights: tuple[float, ...] | None = None
    mixing: MixOptions = field(default_factory=MixOptions)
    scale: Any = None
    ratio: Any = None
    recipe: Recipe | None = None
    preset: RandomResizedCrop | ResizeCenterCrop | None = None  # the classification preset object given, if one

    def __post_init__(self) -> None:
        """The checks that need only the arguments (one-line ConfigError naming the option)."""
        if self.num_workers is not None:
            object.__setattr__(self, "num_workers", check_int_or_auto("num_workers", self.num_workers, 0))
        object.__setattr__(self, "prefetch_factor", check_int_or_auto("prefetch_factor", self.prefetch_factor, 1))
        if self.tune_dir is not None and not self.asks_tuning:
            raise ConfigError("tune_dir applies to num_workers='auto' or prefetch_factor='auto'")
        if not isinstance(self.decode, (str, DeviceDecodeOptions)):
            raise ConfigError(f"decode must be 'auto', 'worker', 'device' or a fastdata.options.DeviceDecodeOptions, "
                              f"got {self.decode!r} ({type(self.decode).__name__})")
        if self.is_mixture:
            if self.metadata:
                raise ConfigError("metadata=True applies to one dataset's loader; a mixture's batches do not carry "
                                  "it")
            if self.recipe:
                raise ConfigError("a recipe (presets after the crop in an augment list) applies to one dataset's "
                                  "loader; a mixture takes the crop alone")
        elif self.weights is not None or self.mixing != MixOptions():
            raise ConfigError("weights, samples_per_epoch, epoch_end, exhausted and classes apply to a mixture: pass "
                              "a list of dataset paths")

    @classmethod
    def asked(cls, path: Where | list[Where] | tuple[Where, ...], keywords: dict[str, Any], *, augment: Any,
              image_size: Any, output: OutputOptions | None, text: TextOptions | None, remote: RemoteOptions | None,
              mixing: MixOptions | None, weights: Any, **given: Any) -> LoaderSpec:
        """The spec of a call of `fastdata.loader`: its arguments, with `keywords` (the older flat spellings, each
        said deprecated) folded into the option objects, and a list of one path (with no mixture options) as that
        path."""
        spelled = resolve_spelling("loader", keywords, ("output", "text", "remote", "mixing", "augment"),
                                   output=output, text=text, remote=remote, mixing=mixing, augment=augment,
                                   image_size=image_size)
        mix = spelled.mixing
        if isinstance(path, (list, tuple)):
            if len(path) == 1 and mix.samples_per_epoch is None:
                check_weights(weights, 1)  # one positive number (or None): the plain loader over that dataset
                path, weights, mix = path[0], None, MixOptions()
            else:
                path = tuple(path)
        return cls(path=path, augment=spelled.augment, image_size=spelled.image_size, output=spelled.output,
                   text=spelled.text, remote=spelled.remote, mixing=mix,
                   weights=_frozen(weights), scale=spelled.scale, ratio=spelled.ratio,
                   recipe=spelled.recipe, preset=spelled.preset, **given)

    @property
    def is_mixture(self) -> bool:
        return isinstance(self.path, tuple)

    @property
    def asks_tuning(self) -> bool:
        """Whether num_workers or prefetch_factor is "auto" (the stored `fastdata tune` result)."""
        return AUTO in (self.num_workers, self.prefetch_factor)

    def image_fields(self) -> dict[str, Any]:
        """The image delivery options as asked (`fastdata.image.loader.ImageOptions`' fields)."""
        out = self.output
        return {"device": self.device, "decode": self.decode, "dtype": out.dtype, "channels_last": out.channels_last,
                "mean": out.mean, "std": out.std}

    def check_preset(self, target_kind: str | None) -> None:
        """Refuse a classification preset over a detection or segmentation dataset."""
        refuse_preset(self.preset, self.path, target_kind)


def _frozen(weights: Any) -> Any:
    """A mixture's weights as a tuple (a list, an array, ...), anything else as given (checked by the mixture)."""
    try:
        return None if weights is None or isinstance(weights, str) else tuple(weights)
    except TypeError:
        return weights
