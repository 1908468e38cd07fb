"""A recipe: the presets that follow the crop in an `augment` list (`[RandomResizedCrop(224),
TrivialAugmentWide(), RandomErasing(p=0.25), RandomChoice([MixUp(0.2), CutMix(1.0)])]`), in torchvision's order:
per-sample presets (policies, erasing) applied in turn to each crop, then at most one batch preset (MixUp, CutMix
or a RandomChoice of them) on each batch. The crop preset itself (the first item) is the loader's
(`fastdata.loader.options`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastdata.errors import ConfigError
from fastdata.image.output import OutputFormat
from fastdata.image.recipes.erasing import RandomErasing
from fastdata.image.recipes.mixing import BatchPreset, CutMix, MixUp, RandomChoice, batch_rng, mix_images, mix_labels
from fastdata.image.recipes.ops import OPERATIONS, OpContext
from fastdata.image.recipes.policies import AutoAugment, Policy, RandAugment, TrivialAugmentWide

SamplePreset = Policy | RandomErasing
_SAMPLE = (TrivialAugmentWide, RandAugment, AutoAugment, RandomErasing)
_BATCH = (MixUp, CutMix, RandomChoice)


def is_recipe_preset(item: Any) -> bool:
    """Whether `item` is one of the presets a recipe is made of (what may follow the crop in an augment list)."""
    return isinstance(item, _SAMPLE + _BATCH)


@dataclass(frozen=True)
class Recipe:
    """The per-sample presets in order, and the batch preset (None: batches are not mixed)."""

    per_sample: tuple[SamplePreset, ...] = ()
    batch: BatchPreset | None = None

    @classmethod
    def of(cls, items: Sequence[Any]) -> Recipe:
        """The recipe of the presets that follow the crop in an augment list, checked: known presets, per-sample
        ones first, one batch preset at most, last."""
        per_sample: list[SamplePreset] = []
        batch: BatchPreset | None = None
        for item in items:
            if isinstance(item, _BATCH):
                if batch is not None:
                    raise ConfigError(f"two batch presets ({batch!r}, {item!r}): to pick one per batch, as "
                                      "torchvision's recipes do, pass RandomChoice([MixUp(...), CutMix(...)])")
                batch = item
            elif isinstance(item, _SAMPLE):
                if batch is not None:
                    raise ConfigError(f"{item!r} follows the batch preset {batch!r}: per-sample presets come "
                                      "first, the batch preset last (torchvision's order)")
                per_sample.append(item)
            else:
                raise ConfigError(f"augment list: {item!r} ({type(item).__name__}) is not a fastdata preset; after "
                                  "the crop come fastdata.presets.TrivialAugmentWide, RandAugment, AutoAugment, "
                                  "RandomErasing, then MixUp, CutMix or RandomChoice([...]). For a torchvision or "
                                  "albumentations pipeline pass it whole (augment=transform)")
        return cls(tuple(per_sample), batch)

    def __bool__(self) -> bool:
        return bool(self.per_sample) or self.batch is not None

    def describe(self) -> str:
        """What the recipe does, as stable text (resume states refuse another recipe)."""
        return repr([*self.per_sample, *([self.batch] if self.batch is not None else [])])

    def check_output(self, output: OutputFormat) -> None:
        """Refuse an erasing value the batches of `output` cannot hold (ConfigError)."""
        for preset in self.per_sample:
            if isinstance(preset, RandomErasing):
                preset.levels(output)

    def num_classes(self, classes: int, multi_label: bool) -> int:
        """The batch preset's num_classes, checked against the dataset's `classes` (None: theirs)."""
        assert self.batch is not None
        given = self.batch.num_classes
        if given is None:
            return classes
        if given < classes or (multi_label and given != classes):
            what = "exactly" if multi_label else "at least"
            raise ConfigError(f"{type(self.batch).__name__}(num_classes={given}): the dataset has {classes} classes; "
                              f"num_classes must be {what} that (or None: the dataset's)")
        return given

    def warm(self, height: int, width: int) -> None:
        """Work out the policies' magnitudes and tables for `height` x `width` crops now (before the workers fork,
        which then have them from the start)."""
        for preset in self.per_sample:
            if not isinstance(preset, RandomErasing):
                preset.warm(height, width)

    def apply(self, image: np.ndarray, rng: np.random.Generator, context: OpContext, output: OutputFormat) -> None:
        """The per-sample presets, in turn, on `image` (H x W x 3 uint8, BGR if `context.bgr`) in place."""
        for preset in self.per_sample:
            if isinstance(preset, RandomErasing):
                preset.apply(image, rng, _erasing_levels(preset, output), output, context.bgr)
            else:
                preset.apply(image, rng, _policy_context(context, preset))

    def apply_batch(self, images: np.ndarray, rngs: Sequence[np.random.Generator], context: OpContext,
                    output: OutputFormat) -> None:
        """`apply` on each of `images` (N x H x W x 3) with its sample's RNG, the same pixels, with each operation
        run on every image that drew it in turn (its code and tables stay in cache) instead of image by image.
        The draws do not depend on pixels, so each sample's RNG is drawn in the same order as by `apply`."""
        height, width = images.shape[1:3]
        for preset in self.per_sample:
            if isinstance(preset, RandomErasing):
                levels = _erasing_levels(preset, output)
                for image, rng in zip(images, rngs, strict=True):
                    preset.apply(image, rng, levels, output, context.bgr)
                continue
            context = _policy_context(context, preset)
            drawn = [preset.draw(rng, height, width) for rng in rngs]
            for step in range(max(map(len, drawn), default=0)):  # each image's operations in their order
                by_name: dict[str, list[tuple[int, float]]] = {}
                for index, operations in enumerate(drawn):
                    if step < len(operations):
                        name, magnitude = operations[step]
                        by_name.setdefault(name, []).append((index, magnitude))
                for name, uses in by_name.items():
                    operation = OPERATIONS[name]
                    for index, magnitude in uses:
                        operation(images[index], magnitude, context)

    def mix(self, images: torch.Tensor, labels: torch.Tensor, seed: int, epoch: int, key: tuple[int, ...],
            num_classes: int) -> torch.Tensor:
        """Mix one batch's `images` [B, 3, H, W] in place and return its labels as float `[B, num_classes]`, drawn
        from `batch_rng(seed, epoch, *key)`."""
        assert self.batch is not None
        mixed = self.batch.draw(batch_rng(seed, epoch, *key), images.shape[-2], images.shape[-1])
        mix_images(images, mixed)
        return mix_labels(labels, mixed, num_classes)


@functools.lru_cache(maxsize=64)
def _erasing_levels(preset: RandomErasing, output: OutputFormat) -> tuple[int, int, int] | None:
    """`preset.levels(output)`, worked out once, not per sample."""
    return preset.levels(output)


def _policy_context(context: OpContext, policy: Policy) -> OpContext:
    """`context` (its scratch, channel order) with `policy`'s interpolation and fill."""
    context.interpolation, context.fill = policy.interpolation, policy.levels
    return context
