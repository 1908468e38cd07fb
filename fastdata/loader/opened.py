"""Opening one converted dataset for the read side (`fastdata.dataset`, and `fastdata.loader`'s resolve step):
the dataset at a path or URL, whole, with its augmentation, and the refusals of image options over text."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastdata.config import check_int
from fastdata.errors import ConfigError, NotADatasetError
from fastdata.formats.manifest import read_manifest
from fastdata.formats.registry import storage
from fastdata.formats.remote import RemoteOptions, is_url
from fastdata.image.datasets import LmdbImageDataset, WdsImageDataset
from fastdata.image.detection_presets import is_detection_preset
from fastdata.image.geometry import output_size
from fastdata.image.recipes.recipe import Recipe
from fastdata.text.dataset import TextDataset


def open_dataset(path: str | os.PathLike[str], augment: Any = None, *, image_size: Any = None, seed: int = 0,
                  on_error: str = "raise", remote: RemoteOptions | None = None, scale: Any = None,
                  ratio: Any = None, metadata: bool = False, max_length: int | None = None, masks: bool = False,
                  recipe: Recipe | None = None) -> LmdbImageDataset | WdsImageDataset | TextDataset:
    """The dataset at `path`, whole (the loader splits epochs between ranks itself)."""
    if image_size is not None:
        output_size(image_size)  # ConfigError naming what was given
    check_int("seed", seed, minimum=0)
    if augment is not None and not isinstance(augment, str) and not callable(augment) \
            and not is_detection_preset(augment):
        raise ConfigError(f"augment must be None, 'train', 'val', an albumentations or torchvision transform or a "
                          f"callable on an HWC uint8 array, got {augment!r} ({type(augment).__name__})")
    remote = remote or RemoteOptions()
    extra = {"scale": scale, "ratio": ratio, "max_length": max_length, "recipe": recipe or None}
    if is_url(path):
        store = remote.shards(str(path))
        return WdsImageDataset(store.url, store.manifest, augment=augment, image_size=image_size, seed=seed,
                               on_error=on_error, store=store, metadata=metadata, masks=masks, **extra)
    if remote.given:
        raise ConfigError(f"cache_dir, cache_max_bytes and storage_options apply to remote URLs; {path} is local")
    root = Path(path)
    manifest = read_manifest(root)
    if manifest.kind == "text":
        if recipe:
            raise ConfigError(f"{path}: {recipe.describe()} augment images; this dataset holds text")
        if metadata or masks:
            raise ConfigError(f"{path}: {'metadata' if metadata else 'masks'}=True applies to image datasets; this one "
                              "holds text")
        return TextDataset(root, manifest)
    if manifest.kind != "image":
        raise NotADatasetError(f"{root}: holds a {manifest.kind!r} dataset, not images")
    cls = LmdbImageDataset if storage("image", manifest.format, root).random_access else WdsImageDataset
    return cls(root, manifest, augment=augment, image_size=image_size, seed=seed, on_error=on_error,
               metadata=metadata, masks=masks, **extra)


def refuse_image_options(path: str | os.PathLike[str], given: list[str]) -> None:
    """ConfigError naming the image options `given` over the text dataset at `path`."""
    if given:
        raise ConfigError(f"{', '.join(given)}: for image datasets only; {path} holds text")


def augment_given(augment: Any, default: Any, image_size: Any, scale: Any, ratio: Any) -> list[str]:
    """The names of the augmentation options set (`augment` when it is neither its `default` nor None, which
    asks for no augmentation and so fits text as well)."""
    given = {"augment": augment is not None and not (isinstance(augment, str) and augment == default),
             "image_size": image_size is not None, "scale": scale is not None, "ratio": ratio is not None}
    return [name for name, is_given in given.items() if is_given]
