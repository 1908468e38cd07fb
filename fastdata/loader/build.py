"""The third of `fastdata.loader`'s three steps: `build`, the loader a `Resolved` plan describes: an `ImageLoader`
(whose worker pipeline it configures once, with one value: fastdata.image.pipeline.PipelineConfig), a `TextLoader`,
or a mixture's loader. Options that do not fit the dataset opened (image options over text, text options over
images) are refused here, by name."""

from __future__ import annotations

from typing import Any

from fastdata.errors import ConfigError
from fastdata.image.loader import ImageLoader, ImageOptions
from fastdata.loader.mixing import mixed_loader
from fastdata.loader.opened import augment_given, refuse_image_options
from fastdata.loader.resolve import Resolved
from fastdata.text.dataset import TextDataset
from fastdata.text.loader import TextLoader, text_loader


def build(plan: Resolved) -> ImageLoader | TextLoader | Any:
    """The loader of `plan`, with `loader.tuned` saying what "auto" chose and where it came from (None: nothing
    was asked to be tuned, or a mixture)."""
    spec = plan.spec
    if plan.data is None:  # a weighted mixture (fastdata.loader.mixing)
        assert isinstance(spec.path, tuple)
        mixed = mixed_loader(list(spec.path), None if spec.weights is None else list(spec.weights), plan.options,
                             spec.text, spec.image_fields(), augment=spec.augment, image_size=spec.image_size,
                             on_error=spec.on_error, scale=spec.scale, ratio=spec.ratio, masks=spec.masks,
                             mixing=spec.mixing)
        mixed.tuned = None
        return mixed
    assert not isinstance(spec.path, tuple)
    built: ImageLoader | TextLoader
    if isinstance(plan.data, TextDataset):
        given = augment_given(spec.augment, "train", spec.image_size, spec.scale, spec.ratio)
        refuse_image_options(spec.path, given + ImageOptions.given_in(spec.image_fields()))
        built = text_loader(plan.data, plan.options, spec.text)
    else:
        text_only = [name for name in spec.text.given() if not (plan.data.pairs and name == "max_length")]
        if text_only:
            raise ConfigError(f"{', '.join(text_only)}: for text datasets only; {spec.path} holds images")
        built = ImageLoader(plan.data, plan.options, plan.image)
    built.tuned = plan.tuned
    return built
