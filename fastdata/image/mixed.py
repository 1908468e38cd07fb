"""A weighted mixture of image datasets read by index (LMDB, local WebDataset shards through `IndexedShards`)
whose batches are alike (class labels, image-text pairs, detection or segmentation targets: `batch_structure`),
read as one: the global index space is the sources one after the other (`fastdata.order.mixing` says which index
each slot takes), and the label space is their union (identical class lists share ids; different ones get a block
each, named "source/class").

`MixedImageDataset` is map-style (`ds[i]`, `len`, `.classes`), so the loader's workers build batches from it as
from one LMDB dataset; `MixedImageLoader` is `ImageLoader` over it with the mixing schedule as its sampler."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.config import LoaderOptions
from fastdata.errors import ConfigError
from fastdata.image.batch import EncodedSample
from fastdata.image.datasets import LmdbImageDataset, WdsImageDataset
from fastdata.image.indexed_shards import IndexedShards
from fastdata.image.loader import ImageLoader, ImageOptions
from fastdata.order.mixing import MixedBatchSampler, MixedResumable, MixPlan
from fastdata.order.state import dataset_fingerprint


def class_union(names: list[str], class_lists: list[list[str]]) -> tuple[list[str], list[np.ndarray]]:
    """The union label space and, per source, the map from its class ids to the union's: sources with identical
    class lists share one block of ids; with several blocks, each block's names are prefixed with the name of
    the first source that has it ("a/cat"), so that no two classes share a name."""
    blocks: list[tuple[list[str], str]] = []
    block_of: list[int] = []
    for name, classes in zip(names, class_lists, strict=True):
        found = next((b for b, (known, _) in enumerate(blocks) if known == classes), None)
        if found is None:
            blocks.append((list(classes), name))
            found = len(blocks) - 1
        block_of.append(found)
    starts = np.cumsum([0] + [len(classes) for classes, _ in blocks])
    union = blocks[0][0] if len(blocks) == 1 else [f"{owner}/{c}" for classes, owner in blocks for c in classes]
    maps = [np.arange(len(class_lists[i]), dtype=np.int64) + starts[b] for i, b in enumerate(block_of)]
    return union, maps


_KIND_WORDS = {"class": "class labels", "pairs": "image-text pairs", "detection": "detection targets",
               "segmentation": "segmentation label maps"}


def batch_structure(data: LmdbImageDataset | IndexedShards) -> dict[str, Any]:
    """What a dataset's batches are made of beyond its images, as far as a mixture must have one of it: the target
    kind, and what its targets need to be alike (class datasets: the label kind, their class lists are unioned;
    pairs: how the captions are tokenized; detection: the classes the boxes are labelled with; segmentation: the
    label maps' dtype, ignore index and classes)."""
    m = data.manifest
    if m.target_kind == "pairs":
        pairs = m.pairs or {}
        return {"kind": "pairs", **{k: pairs.get(k) for k in ("tokens", "dtype", "tokenizer_sha256",
                                                               "pad_token_id", "closing_tokens")}}
    if m.target_kind == "detection":
        return {"kind": "detection", "classes": list(m.classes)}
    if m.target_kind == "segmentation":
        targets = m.targets or {}
        return {"kind": "segmentation", "classes": list(m.classes),
                **{k: targets.get(k) for k in ("mask_dtype", "ignore_index")}}
    return {"kind": "class", "label_kind": m.label_kind}


def by_index(sources: list[Any]) -> list[LmdbImageDataset | IndexedShards]:
    """The opened image sources, each readable by index: local WebDataset shards through `IndexedShards`."""
    return [IndexedShards(data) if isinstance(data, WdsImageDataset) else data for data in sources]


def check_image_sources(paths: list[str], sources: list[Any]) -> None:
    """ConfigError unless every source is an image dataset read by index (LMDB, or local shards through
    `IndexedShards`) and their batches are alike (`batch_structure`): one line naming the two sources that differ,
    and how."""
    for path, data in zip(paths, sources, strict=True):
        if not isinstance(data, LmdbImageDataset | IndexedShards):
            raise ConfigError(f"{path}: mixing reads image datasets by index (LMDB, or local WebDataset shards), "
                              f"not a {type(data).__name__}")
    first = batch_structure(sources[0])
    for path, data in zip(paths[1:], sources[1:], strict=True):
        other = batch_structure(data)
        if other["kind"] != first["kind"]:
            raise ConfigError(f"cannot mix {paths[0]} ({_KIND_WORDS[first['kind']]}) with {path} "
                              f"({_KIND_WORDS[other['kind']]}): their batches are made of different things")
        differ = [k for k in first if k != "kind" and first[k] != other[k]]
        if first["kind"] == "class" and differ:
            raise ConfigError(f"cannot mix single-label and multi-label datasets (their labels are class ids and "
                              f"multi-hot rows): {paths[0]} ({first['label_kind']}-label), {path} "
                              f"({other['label_kind']}-label)")
        if differ:
            said = "; ".join(f"{k} {first[k]!r} vs {other[k]!r}" for k in differ)
            raise ConfigError(f"cannot mix {paths[0]} with {path}: their {_KIND_WORDS[first['kind']]} differ ({said})")


class MixedImageDataset(LmdbImageDataset):
    """Map-style dataset over several image datasets (LMDB, local shards read by index) one after the other:
    `ds[i]` is source s's sample `i - offsets[s]`, its label mapped into the union label space (`.classes`); each
    sample's key is prefixed with its source's name. Augmentation as for one dataset, seeded from (seed, epoch,
    global index)."""

    def __init__(self, sources: list[LmdbImageDataset | IndexedShards], names: list[str], augment: Any = None,
                 image_size: Any = None, seed: int = 0, on_error: str = "raise", *, scale: Any = None,
                 ratio: Any = None, masks: bool = False) -> None:
        classes, self.label_maps = class_union(names, [data.classes for data in sources])
        self.sources, self.names = sources, names
        self.offsets = np.concatenate([[0], np.cumsum([len(d) for d in sources])]).astype(np.int64)
        first = sources[0].manifest
        manifest = dataclasses.replace(
            first, num_samples=int(self.offsets[-1]), classes=classes,
            class_counts=[0] * len(classes), files=[f for d in sources for f in d.manifest.files],
            # one pipeline reads every source: it looks for restart-indexed JPEGs when any source has them (an
            # original-layout source's JPEG is then told apart by its header, and decoded as before)
            jpeg_layout="restart" if any(d.manifest.jpeg_layout == "restart" for d in sources) else "original")
        root = Path("+".join(str(d.root) for d in sources))
        self._setup(root, manifest, augment, image_size, seed, on_error, False, scale, ratio, masks=masks)
        self.reader = _MixedKeys(self)  # type: ignore[assignment]  # what the loader's messages read: key(i)

    def locate(self, index: int) -> tuple[int, int]:
        """(source, index in that source) of global index `index`."""
        source = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return source, index - int(self.offsets[source])

    def encoded(self, index: int) -> EncodedSample:
        source, local = self.locate(index)
        sample = self.sources[source].encoded(local)
        mapping = self.label_maps[source]
        label = sample.label
        if isinstance(label, tuple):
            label = tuple(int(mapping[i]) for i in label)
        elif isinstance(label, int | np.integer):
            label = int(mapping[label])  # (a caption stays as it is)
        return dataclasses.replace(sample, key=f"{self.names[source]}/{sample.key}", label=label, position=(index,))

    def metadata(self, index: int) -> dict:
        source, local = self.locate(index if index >= 0 else index + len(self))
        return self.sources[source].metadata(local)

    @property
    def samples(self) -> list[tuple[str, Any]]:
        return [(f"{name}/{key}", label) for name, data in zip(self.names, self.sources, strict=True)
                for key, label in data.samples]

    @property
    def targets(self) -> list[Any]:
        """Every sample's label in the union label space: class ids, or (multi-label) lists of class ids."""
        out: list[Any] = []
        for data, mapping in zip(self.sources, self.label_maps, strict=True):
            out += [[int(mapping[i]) for i in t] if isinstance(t, (list, tuple)) else int(mapping[t])
                    for t in data.targets]
        return out

    def fingerprints(self) -> list[str]:
        return [dataset_fingerprint(data.manifest) for data in self.sources]


class _MixedKeys:
    """The reader methods the loader uses: a sample's key (for its error messages), and giving back the mapped
    pages of every source's data file once a batch is read."""

    def __init__(self, data: MixedImageDataset) -> None:
        self.data = data

    def key(self, index: int) -> str:
        source, local = self.data.locate(index)
        return f"{self.data.names[source]}/{self.data.sources[source].reader.key(local)}"

    def release_mapped(self) -> None:
        for source in self.data.sources:
            source.reader.release_mapped()


class MixedImageLoader(MixedResumable, ImageLoader):
    """`ImageLoader` over a MixedImageDataset, batches drawn by the mixing schedule (`fastdata.order.mixing`):
    `(images, labels)` with labels in the union label space (`loader.classes`); segmentation: `(images, masks)`."""

    def __init__(self, data: MixedImageDataset, plan: MixPlan, options: LoaderOptions,
                 image: ImageOptions | None = None) -> None:
        self.plan = plan
        sampler = MixedBatchSampler(plan, options.batch_size, options.shuffle, options.seed, options.drop_last,
                                    options.rank, options.world_size, options.uneven)
        super().__init__(data, options, image, sampler=sampler)

    def _resume_config(self) -> dict[str, Any]:
        assert isinstance(self.dataset, MixedImageDataset)
        return {**super()._resume_config(), **self._mix_config(self.dataset.names, self.dataset.fingerprints())}


def mixed_image_loader(data: MixedImageDataset, plan: MixPlan, options: LoaderOptions,
                       image: ImageOptions | None = None) -> MixedImageLoader:
    """The mixture's loader (its batches shaped by its kind of targets, as `ImageLoader`'s are)."""
    return MixedImageLoader(data, plan, options, image)

