"""Weighted dataset mixing at the read side's root: open the sources, check that they can be mixed (one kind;
images: LMDB or local WebDataset shards, batches alike; text: one tokenizer), and build the mixed loader
(`fastdata.loader([a, b], weights=...)`) or, for a DataLoader of your own, a `Mixture` (`fastdata.mix`).
The schedule itself is `fastdata.order.mixing` (docs/mixing.md)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fastdata.config import LoaderOptions, check_bool, check_epoch, check_int
from fastdata.errors import ConfigError, NotADatasetError
from fastdata.formats.manifest import read_manifest
from fastdata.formats.registry import storage
from fastdata.formats.remote import is_url
from fastdata.image.datasets import LmdbImageDataset, WdsImageDataset
from fastdata.image.loader import ImageOptions
from fastdata.image.mixture.mixed import (
    MixedImageDataset,
    MixedImageLoader,
    by_index,
    check_image_sources,
    merged_note,
    mixed_image_loader,
)
from fastdata.loader.options import MixOptions, resolve_spelling
from fastdata.order.mixing import MixedBatchSampler, MixPlan
from fastdata.order.ranks import check_uneven, resolve_world
from fastdata.text.dataset import TextDataset
from fastdata.text.loader import TextOptions
from fastdata.text.mixed import MixedTextDataset, MixedTextLoader, check_same_tokenizer, mixed_text_loader


def source_names(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """A short unambiguous name per source: its folder's name without suffix ("a" for a.lmdb), numbered when
    two share one."""
    stems = [Path(str(p).rstrip("/")).stem or str(p) for p in paths]
    return [stem if stems.count(stem) == 1 else f"{stem}#{i}" for i, stem in enumerate(stems)]


def open_sources(paths: Sequence[str | os.PathLike[str]], augment: Any = None, *, image_size: Any = None,
                 seed: int = 0, on_error: str = "raise", scale: Any = None, ratio: Any = None, masks: bool = False
                 ) -> list[LmdbImageDataset | WdsImageDataset | TextDataset]:
    """Each local dataset at `paths`, opened as `fastdata.dataset` opens it, and all of one kind."""
    if isinstance(paths, (str, bytes, os.PathLike)) or not paths:
        raise ConfigError(f"a mixture takes a list of dataset paths, got {paths!r}")
    if augment is not None and not isinstance(augment, str) and not callable(augment):
        raise ConfigError(f"augment must be None, 'train', 'val', an albumentations or torchvision transform or a "
                          f"callable on an HWC uint8 array, got {augment!r} ({type(augment).__name__})")
    opened: list[LmdbImageDataset | WdsImageDataset | TextDataset] = []
    for path in paths:
        if is_url(path):
            raise ConfigError(f"{path}: mixing reads local datasets by index; remote WebDataset shards stream in "
                              "order. Download and convert them to LMDB to mix them")
        root = Path(path)
        manifest = read_manifest(root)
        if manifest.kind == "text":
            opened.append(TextDataset(root, manifest))
        elif manifest.kind == "image":
            cls = LmdbImageDataset if storage("image", manifest.format, root).random_access else WdsImageDataset
            opened.append(cls(root, manifest, augment=augment, image_size=image_size, seed=seed, on_error=on_error,
                              scale=scale, ratio=ratio, masks=masks))
        else:
            raise NotADatasetError(f"{root}: holds a {manifest.kind!r} dataset, not images or text")
    kinds = {"text" if isinstance(d, TextDataset) else "image" for d in opened}
    if len(kinds) > 1:
        which = ", ".join(f"{p} ({'text' if isinstance(d, TextDataset) else 'images'})"
                          for p, d in zip(paths, opened, strict=True))
        raise ConfigError(f"cannot mix images and text in one loader: {which}")
    return opened


def mixed_loader(locations: Sequence[str | os.PathLike[str]], weights: Sequence[float] | None, options: LoaderOptions,
                 text: TextOptions, image_options: dict[str, Any], *, augment: Any, image_size: Any,
                 on_error: str, scale: Any, ratio: Any, masks: bool, mixing: MixOptions
                 ) -> MixedImageLoader | MixedTextLoader:
    """`fastdata.loader` over several datasets (its options already validated into `options`)."""
    samples_per_epoch, epoch_end, exhausted = mixing.samples_per_epoch, mixing.epoch_end, mixing.exhausted
    sources = open_sources(locations, augment, image_size=image_size, seed=options.seed, on_error=on_error,
                           scale=scale, ratio=ratio, masks=masks)
    names, paths = source_names(locations), [str(p) for p in locations]
    if isinstance(sources[0], TextDataset):
        given = ["augment"] if augment is not None and not (isinstance(augment, str) and augment == "train") else []
        given += [k for k, v in {"image_size": image_size, "scale": scale, "ratio": ratio}.items() if v is not None]
        given += ImageOptions.given_in(image_options) + (["classes"] if mixing.classes != "auto" else [])
        if given:
            raise ConfigError(f"{', '.join(given)}: for image datasets only; the mixture holds text")
        return mixed_text_loader(paths, names, sources, weights, options, text, samples_per_epoch,  # type: ignore[arg-type]
                                 epoch_end, exhausted)
    if text.given():
        raise ConfigError(f"{', '.join(text.given())}: for text datasets only; the mixture holds images")
    sources = by_index(sources)  # type: ignore[assignment]
    check_image_sources(paths, sources)
    data = MixedImageDataset(sources, names, augment, image_size, options.seed, on_error,  # type: ignore[arg-type]
                             scale=scale, ratio=ratio, masks=masks, classes_rule=mixing.classes)
    _say_merged(data, paths, stacklevel=4)  # (the caller of fastdata.loader, via its build step)
    plan = MixPlan.make([len(d) for d in sources], weights, samples_per_epoch, epoch_end, exhausted,
                        [str(p) for p in paths])
    return mixed_image_loader(data, plan, options, ImageOptions(**image_options))


def _say_merged(data: MixedImageDataset, paths: list[str], stacklevel: int) -> None:
    """Warn once (per mixture made) when class lists were merged by name: the labels of a dataset are not its
    stored ids."""
    note = merged_note(data.class_space, paths)
    if note is not None:
        warnings.warn(note, stacklevel=stacklevel + 1)


class Mixture:
    """A mixture for your own DataLoader: `dataset` (map-style over the sources one after the other: images
    `(uint8 CHW tensor, label)` with labels in the union label space, text `{"input_ids"}` per document) and
    `batch_sampler` (lists of indices into it, drawn by the mixing schedule, this rank's part):

        mixture = fastdata.mix([a, b], weights=[0.7, 0.3], batch_size=64)
        data = DataLoader(mixture.dataset, batch_sampler=mixture.batch_sampler, num_workers=8)
        for epoch in range(epochs):
            mixture.set_epoch(epoch)
            for images, labels in data: ...
    """

    def __init__(self, dataset: MixedImageDataset | MixedTextDataset, sampler: MixedBatchSampler) -> None:
        self.dataset, self.sampler = dataset, sampler
        self.batch_sampler = _IndexBatches(sampler)

    @property
    def classes(self) -> list[str]:
        """The union label space (images); [] for text."""
        return self.dataset.classes if isinstance(self.dataset, MixedImageDataset) else []

    @property
    def class_maps(self) -> dict[str, list[int]]:
        """Per dataset (by its name), the union's class id of each of its class ids (images); {} for text."""
        return self.dataset.class_maps if isinstance(self.dataset, MixedImageDataset) else {}

    def set_epoch(self, epoch: int) -> None:
        """Draw the next batches (and the images' augmentation) for `epoch`."""
        epoch = check_epoch(epoch)
        self.sampler.epoch, self.sampler.start, self.sampler.skip = epoch, 0, 0
        if isinstance(self.dataset, MixedImageDataset):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self.sampler)


class _IndexBatches:
    """A DataLoader batch_sampler: this rank's batches of the current epoch, as lists of int."""

    def __init__(self, sampler: MixedBatchSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        for _epoch, indices in self.sampler:
            yield indices.tolist()

    def __len__(self) -> int:
        return len(self.sampler)


def mix(paths: Sequence[str | os.PathLike[str]], weights: Sequence[float] | None = None, *, batch_size: int = 256,
        augment: Any = None, image_size: int | tuple[int, int] | None = None, shuffle: bool = True, seed: int = 0,
        drop_last: bool = False, rank: int | None = None, world_size: int | None = None, uneven: str = "pad",
        mixing: MixOptions | None = None, on_error: str = "raise", **keywords: Any) -> Mixture:
    """A weighted mixture of converted datasets for a DataLoader of your own (`Mixture`: `.dataset`,
    `.batch_sampler`, `.set_epoch`, `.classes`). The schedule, the epoch rule and the rank split are
    `fastdata.loader`'s over a list of paths (docs/mixing.md); text mixtures are mixed per document.

    Args:
        paths: two or more image datasets (LMDB, or local WebDataset shards) whose batches are alike, or text
            datasets (LMDB or WebDataset).
        weights: one number per dataset (None: equal); 0 leaves a dataset out.
        batch_size: samples per batch of the batch sampler.
        augment: as for `fastdata.dataset` (images): None, "train", "val", or a transform.
        image_size: as for `fastdata.dataset`.
        shuffle: draw each source's order (each cycle's) from (seed, epoch, source); False keeps the stored order.
        seed: the seed of the schedule and the augmentation.
        drop_last: leave out each epoch's last, short batch (of each rank's part).
        rank: this process's rank (None: torch.distributed's when initialised, else 0).
        world_size: the number of ranks (None: torch.distributed's when initialised, else 1).
        uneven: "pad" or "drop", when an epoch's samples do not divide between the ranks.
        mixing: a `fastdata.options.MixOptions(samples_per_epoch, epoch_end, exhausted, classes)`: the epoch's
            length in samples (None: `epoch_end` decides), when it ends ("first" or "last" source done), what a
            source that runs out does ("cycle" or "stop") and how class lists make one label space ("auto",
            "by_name", "per_dataset": docs/mixing.md); None: the defaults.
        on_error: as for `fastdata.dataset`.
        **keywords: deprecated flat spellings of `mixing`'s fields and of `fastdata.presets.RandomResizedCrop`'s
            `scale` and `ratio`: each warns with its replacement (docs/reference/deprecations.md).
    """
    spelled = resolve_spelling("mix", keywords, ("mixing", "augment"), mixing=mixing, augment=augment,
                               image_size=image_size)
    augment, image_size, scale, ratio = spelled.augment, spelled.image_size, spelled.scale, spelled.ratio
    samples_per_epoch, epoch_end, exhausted = (spelled.mixing.samples_per_epoch, spelled.mixing.epoch_end,
                                               spelled.mixing.exhausted)
    rank, world_size = resolve_world(rank, world_size)
    check_uneven(uneven)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    sources = open_sources(paths, augment, image_size=image_size, seed=check_int("seed", seed, minimum=0),
                           on_error=on_error, scale=scale, ratio=ratio)
    if isinstance(sources[0], TextDataset):
        if spelled.mixing.classes != "auto":
            raise ConfigError("classes: for image datasets only; the mixture holds text")
        check_same_tokenizer([str(p) for p in paths], sources)  # type: ignore[arg-type]
        dataset: MixedImageDataset | MixedTextDataset = MixedTextDataset(sources)  # type: ignore[arg-type]
    else:
        sources = by_index(sources)  # type: ignore[assignment]
        check_image_sources([str(p) for p in paths], sources)
        dataset = MixedImageDataset(sources, source_names(paths), augment, image_size, seed, on_error,  # type: ignore[arg-type]
                                    scale=scale, ratio=ratio, classes_rule=spelled.mixing.classes)
        _say_merged(dataset, [str(p) for p in paths], stacklevel=2)
    plan = MixPlan.make([len(d) for d in sources], weights, samples_per_epoch, epoch_end, exhausted,
                        [str(p) for p in paths])
    sampler = MixedBatchSampler(plan, batch_size, check_bool("shuffle", shuffle), seed,
                                check_bool("drop_last", drop_last), rank, world_size, uneven)
    return Mixture(dataset, sampler)


