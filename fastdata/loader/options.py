"""Option objects for `fastdata.loader`, `fastdata.dataset` and `fastdata.mix`: options that apply to some datasets
only travel as one object each instead of a row of keywords, so the three functions share them and each has one
docs entry:

- `OutputOptions(dtype, mean, std, channels_last)`: what image batches are made of;
- `TextOptions(seq_len, packing, max_length, bucketing, eos_token, boundaries, mask_cross_document)`: how text is
  cut into rows
  (`fastdata.text.loader`);
- `RemoteOptions(cache_dir, cache_max_bytes, storage_options)`: how a remote dataset is read
  (`fastdata.formats.remote`);
- `MixOptions(samples_per_epoch, epoch_end, exhausted)`: a mixture's epoch;
- `RandomResizedCrop(size, scale, ratio)` and `ResizeCenterCrop(size)`: the classification presets
  (`augment="train"` / `"val"`) as objects, beside the detection ones (`fastdata.presets`); a list that starts
  with one and goes on with the recipe presets (`[RandomResizedCrop(224), TrivialAugmentWide(), ...]`) is that
  crop followed by a `fastdata.image.recipes.recipe.Recipe`.

The objects are the API. The flat keywords they replace (`dtype=`, `seq_len=`, `cache_dir=`, ...) are deprecated
but still work: `resolve_spelling` turns either spelling into the same objects, warns once per call site for each old
keyword with its replacement (fastdata.deprecations), and refuses both at once or a keyword the function does not
take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from fastdata.config import check_bool
from fastdata.deprecations import DEPRECATIONS, deprecated_alias, warn_deprecated
from fastdata.errors import ConfigError
from fastdata.formats.remote import RemoteOptions
from fastdata.image.mixture.mixed import CLASS_RULES
from fastdata.image.output import IMAGENET_MEAN, IMAGENET_STD, OutputFormat
from fastdata.image.recipes.recipe import Recipe, is_recipe_preset
from fastdata.order.mixing import check_epoch_rule
from fastdata.text.loader import TextOptions


@dataclass(frozen=True)
class OutputOptions:
    """What image batches are made of. `dtype` None keeps uint8; a floating dtype (torch.float32, bfloat16,
    float16) gives batches normalised as `(x / 255 - mean) / std` (`mean`, `std`: three numbers in 0..1 units,
    ImageNet's when not given), made in the workers or on the loader's `device`; `channels_last` (with a
    `device`) hands them over in channels-last memory format."""

    dtype: Any = None
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    channels_last: bool = False

    def __post_init__(self) -> None:
        """Each value checked when the object is made (one line naming what is wrong); whether they fit the
        dataset and the transform (mean without a floating dtype, channels_last without a device) is the loader's
        to say, which knows both."""
        check_bool("channels_last", self.channels_last)
        OutputFormat(self.dtype, IMAGENET_MEAN if self.mean is None else self.mean,
                     IMAGENET_STD if self.std is None else self.std)


@dataclass(frozen=True)
class MixOptions:
    """A mixture's epoch and labels (docs/mixing.md): `samples_per_epoch` its length in samples, all ranks
    together (None: `epoch_end` decides); `epoch_end` "first" (the epoch ends when the first dataset has given all
    its samples) or "last"; `exhausted`: a dataset that runs out before the epoch ends is "cycle"d (reshuffled,
    restarted) or "stop"ped (left out, the other weights renormalised); `classes` (image datasets of class labels):
    how their class lists make one label space: "auto" (identical lists share ids, the same names in another order
    are merged by name, lists with no name in common get a block each, lists that share only some names are
    refused), "by_name" (one class per distinct name) or "per_dataset" (each list its own block)."""

    samples_per_epoch: int | None = None
    epoch_end: str = "first"
    exhausted: str = "cycle"
    classes: str = "auto"

    def __post_init__(self) -> None:
        """Checked when the object is made (one line naming the option that is wrong)."""
        check_epoch_rule(self.samples_per_epoch, self.epoch_end, self.exhausted)
        if self.classes not in CLASS_RULES:
            raise ConfigError(f"classes must be one of {CLASS_RULES}, got {self.classes!r}")


@dataclass(frozen=True)
class RandomResizedCrop:
    """Classification training, as an object: torchvision's RandomResizedCrop(size, scale, ratio) + horizontal
    flip; `augment=RandomResizedCrop(224)` is `augment="train", image_size=224`. `size` is a side or
    (height, width); `scale` the range of the crop's area as a fraction of the image, `ratio` of its aspect
    (None: torchvision's defaults). For image classification datasets (and image-text pairs): detection and
    segmentation datasets take `fastdata.presets.ScaleJitterCrop` / `ResizeLongerPad`."""

    size: int | tuple[int, int] = 224
    scale: tuple[float, float] | None = None  # None: torchvision's (0.08, 1)
    ratio: tuple[float, float] | None = None  # None: torchvision's (3/4, 4/3)


@dataclass(frozen=True)
class ResizeCenterCrop:
    """Classification evaluation, as an object: torchvision's Resize(int(size / 0.875)) + CenterCrop(size);
    `augment=ResizeCenterCrop(224)` is `augment="val", image_size=224`."""

    size: int | tuple[int, int] = 224


#: the keywords each object replaces
REPLACED: dict[str, tuple[str, ...]] = {
    "output": tuple(f.name for f in fields(OutputOptions)),
    "text": tuple(f.name for f in fields(TextOptions)),
    "remote": tuple(f.name for f in fields(RemoteOptions)),
    "mixing": ("samples_per_epoch", "epoch_end", "exhausted"),  # (`classes` came with the object: no keyword)
    "augment": ("scale", "ratio"),
}
_OBJECT_TYPES = {"output": OutputOptions, "text": TextOptions, "remote": RemoteOptions, "mixing": MixOptions}


@dataclass(frozen=True)
class Spelled:
    """The options of one call, whichever spelling was used: the objects, and the augmentation as the loaders
    take it (`augment`, `image_size`, `scale`, `ratio`)."""

    output: OutputOptions
    text: TextOptions
    remote: RemoteOptions
    mixing: MixOptions
    augment: Any
    image_size: Any
    scale: Any
    ratio: Any
    preset: RandomResizedCrop | ResizeCenterCrop | None = None  # the classification preset given, if one was
    recipe: Recipe | None = None  # the presets after the crop in an augment list, if one was given

    def check_preset(self, path: Any, target_kind: str | None) -> None:
        """Refuse a classification preset over a detection or segmentation dataset (whose "train" and "val" are
        other geometries)."""
        refuse_preset(self.preset, path, target_kind)


def refuse_preset(preset: RandomResizedCrop | ResizeCenterCrop | None, path: Any, target_kind: str | None) -> None:
    """Refuse a classification `preset` over a detection or segmentation dataset (whose "train" and "val" are
    other geometries)."""
    if preset is not None and target_kind in ("detection", "segmentation"):
        raise ConfigError(f"{path}: augment={preset!r} is a classification preset; a {target_kind} "
                          "dataset takes fastdata.presets.ScaleJitterCrop or ResizeLongerPad")


def resolve_spelling(function: str, keywords: dict[str, Any], takes: Sequence[str], *,
                     output: OutputOptions | None = None, text: TextOptions | None = None,
                     remote: RemoteOptions | None = None, mixing: MixOptions | None = None, augment: Any = None,
                     image_size: Any = None) -> Spelled:
    """The options of a call to `function` (`fastdata.loader`, ...) given as objects or as the keywords they
    replace (`keywords`, the call's other keyword arguments). `takes` names the objects this function has:
    a replaced keyword of another (or any unknown keyword) is a TypeError, as Python raises for an unexpected
    keyword; an object given together with a keyword it replaces is a ConfigError. The replaced keywords are the
    old spelling (fastdata.deprecations): each one given warns, naming its replacement."""
    objects = {"output": output, "text": text, "remote": remote, "mixing": mixing}
    known = {name: group for group in takes for name in REPLACED[group]
             if _old_keyword(function, name) in DEPRECATIONS}
    unexpected = [name for name in keywords if name not in known]
    if unexpected:
        raise TypeError(f"{function}() got an unexpected keyword argument {unexpected[0]!r}")
    for name, value in objects.items():
        if value is not None and not isinstance(value, _OBJECT_TYPES[name]):
            raise ConfigError(f"{name} must be a fastdata.options.{_OBJECT_TYPES[name].__name__}, got {value!r} "
                              f"({type(value).__name__})")
    made: dict[str, Any] = {}
    for group, kind in _OBJECT_TYPES.items():
        given = {name: value for name, value in keywords.items() if known.get(name) == group}
        if given and objects[group] is not None:
            raise ConfigError(f"pass either {group}={kind.__name__}(...) or {', '.join(given)}, not both")
        made[group] = objects[group] if objects[group] is not None else kind(**given)
    for name in keywords:  # the old spelling works, and says what replaces it
        warn_deprecated(_old_keyword(function, name))
    scale, ratio = keywords.get("scale"), keywords.get("ratio")
    augment, recipe = split_recipe(augment)
    preset = augment if isinstance(augment, (RandomResizedCrop, ResizeCenterCrop)) else None
    if preset is not None:
        extra = [name for name, value in {"image_size": image_size, "scale": scale, "ratio": ratio}.items()
                 if value is not None]
        if extra:
            raise ConfigError(f"{', '.join(extra)}: already set by augment={augment!r}")
        image_size = preset.size
        if isinstance(preset, RandomResizedCrop):
            augment, scale, ratio = "train", preset.scale, preset.ratio
        else:
            augment = "val"
    return Spelled(made["output"], made["text"], made["remote"], made["mixing"], augment, image_size, scale,
                   ratio, preset, recipe)


def _old_keyword(function: str, name: str) -> str:
    """The `DEPRECATIONS` key of keyword `name` of `fastdata.<function>`."""
    return f"fastdata.{function}({name}=...)"


def split_recipe(augment: Any) -> tuple[Any, Recipe | None]:
    """An augment list (`[crop, *recipe presets]`, torchvision's order) as its crop (a classification preset,
    or "train" / "val") and the recipe that follows it; anything else as it is, with no recipe."""
    if not isinstance(augment, list | tuple):
        if is_recipe_preset(augment):
            raise ConfigError(f"augment={augment!r} follows a crop: pass a list that starts with one, e.g. "
                              f"augment=[fastdata.presets.RandomResizedCrop(224), {type(augment).__name__}(...)]")
        return augment, None
    if not augment:
        raise ConfigError("augment=[]: a list starts with the crop (fastdata.presets.RandomResizedCrop(...) or "
                          "ResizeCenterCrop(...)); pass augment=None for whole images")
    crop, *rest = augment
    if not (isinstance(crop, (RandomResizedCrop, ResizeCenterCrop)) or crop in ("train", "val")):
        raise ConfigError(f"an augment list starts with the crop, fastdata.presets.RandomResizedCrop(...) or "
                          f"ResizeCenterCrop(...) (or 'train' / 'val'), got {crop!r}")
    return crop, Recipe.of(rest)


def __getattr__(name: str) -> Any:
    """The old name of `OutputOptions`, said deprecated (PEP 562)."""
    return deprecated_alias(__name__, name, {"Output": ("fastdata.options.Output", OutputOptions)})
