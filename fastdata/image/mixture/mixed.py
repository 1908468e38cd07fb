"""A weighted mixture of image datasets read by index (LMDB, local WebDataset shards through `IndexedShards`)
whose batches are alike (class labels, image-text pairs, detection or segmentation targets: `batch_structure`),
read as one: the global index space is the sources one after the other (`fastdata.order.mixing` says which index
each slot takes), and the label space is their union (`class_space`: identical class lists share ids, the same
names in another order are merged by name, lists with no name in common get a block each, named "source/class",
and lists that share only some names are refused unless a rule is chosen).

`MixedImageDataset` is map-style (`ds[i]`, `len`, `.classes`), so the loader's workers build batches from it as
from one LMDB dataset; `MixedImageLoader` is `ImageLoader` over it with the mixing schedule as its sampler."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.config import LoaderOptions
from fastdata.errors import ConfigError
from fastdata.image.batch import EncodedSample
from fastdata.image.datasets import LmdbImageDataset, WdsImageDataset
from fastdata.image.loader import ImageLoader, ImageOptions
from fastdata.image.mixture.indexed_shards import IndexedShards, PartKeys
from fastdata.order.mixing import MixedBatchSampler, MixedResumable, MixPlan
from fastdata.order.state import dataset_fingerprint

#: How a mixture's label space is made from its datasets' class lists (`MixOptions(classes=...)`, docs/mixing.md)
CLASS_RULES = ("auto", "by_name", "per_dataset")


@dataclass(frozen=True)
class ClassSpace:
    """A mixture's label space: `classes` (the union), per source `maps` (its class id -> the union's), and the
    sources whose ids were `merged` by name into another's order (`(source, first source with those names)`:
    the same names in another order), which the mixture says once."""

    classes: list[str]
    maps: list[np.ndarray]
    merged: list[tuple[int, int]]


def class_space(names: list[str], class_lists: list[list[str]], rule: str = "auto",
                where: list[str] | None = None) -> ClassSpace:
    """The union label space of sources named `names` with these class lists, by `rule` (CLASS_RULES):

    - "auto": lists with the same names (in any order) form one group, one class per name in the order of the
      group's first source (the others' ids remapped by name: `merged`); groups with no name in common get a
      block of ids each, one after the other, their names prefixed with the group's first source ("a/cat") when
      there are several; lists that share only some names are refused (ConfigError naming them and the rules
      that decide): whether "cat" in one is "cat" in the other is the user's to say;
    - "by_name": one class per distinct name, in the order first met; every source's ids mapped by name;
    - "per_dataset": each distinct list (identical lists share) its own block, prefixed as above, even where
      names coincide.
    `where` names the sources in errors (default: `names`)."""
    if rule not in CLASS_RULES:
        raise ConfigError(f"classes must be one of {CLASS_RULES}, got {rule!r}")
    where = where or names
    if rule == "by_name":
        union = list(dict.fromkeys(c for classes in class_lists for c in classes))
        return ClassSpace(union, [_by_name(classes, union) for classes in class_lists], [])
    group_of: list[int] = []  # per source, its group: the first source with the same names
    for i, classes in enumerate(class_lists):
        key = list(classes) if rule == "per_dataset" else set(classes)
        first = next(j for j in range(i + 1) if (list(class_lists[j]) if rule == "per_dataset"
                                                 else set(class_lists[j])) == key)
        group_of.append(first)
    heads = list(dict.fromkeys(group_of))
    if rule == "auto":
        _refuse_partial_overlap(heads, class_lists, where)
    starts = dict(zip(heads, np.cumsum([0] + [len(class_lists[h]) for h in heads]).tolist(), strict=False))
    union = list(class_lists[heads[0]]) if len(heads) == 1 else \
        [f"{names[h]}/{c}" for h in heads for c in class_lists[h]]
    maps = [_by_name(classes, list(class_lists[group_of[i]])) + starts[group_of[i]]
            for i, classes in enumerate(class_lists)]
    merged = [(i, group_of[i]) for i, classes in enumerate(class_lists)
              if list(classes) != list(class_lists[group_of[i]])]
    return ClassSpace(union, maps, merged)


def _by_name(classes: list[str], order: list[str]) -> np.ndarray:
    """Each of `classes`' ids -> the position of its name in `order`."""
    position = {name: i for i, name in enumerate(order)}
    return np.array([position[c] for c in classes], dtype=np.int64)


def _refuse_partial_overlap(heads: list[int], class_lists: list[list[str]], where: list[str]) -> None:
    for n, a in enumerate(heads):
        for b in heads[n + 1:]:
            shared = [c for c in class_lists[a] if c in set(class_lists[b])]
            if shared:
                only = sorted(set(class_lists[a]) ^ set(class_lists[b]))
                listed = ", ".join(map(repr, shared[:3])) + (f" and {len(shared) - 3} more" if len(shared) > 3 else "")
                raise ConfigError(
                    f"cannot tell whether the classes of {where[a]} and {where[b]} are the same: they share "
                    f"{len(shared)} class name{'s' * (len(shared) != 1)} ({listed}) but not {len(only)} others; "
                    "pass mixing=MixOptions(classes='by_name') to make each shared name one class, or "
                    "classes='per_dataset' to keep each dataset's classes apart")


def merged_note(space: ClassSpace, where: list[str]) -> str | None:
    """What a mixture says once when it merged reordered class lists by name (None: it did not)."""
    if not space.merged:
        return None
    said = [f"{where[i]} has the classes of {where[first]} in another order (its ids remapped "
            f"{dict(enumerate(space.maps[i].tolist()))})" for i, first in space.merged]
    return ("; ".join(said) + ": merged by name into one label space of "
            f"{len(space.classes)} classes (loader.class_maps has every dataset's map)")


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
                 ratio: Any = None, masks: bool = False, classes_rule: str = "auto") -> None:
        self.class_space = class_space(names, [data.classes for data in sources], classes_rule,
                                       [str(d.root) for d in sources])
        classes, self.label_maps = self.class_space.classes, self.class_space.maps
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
        self.reader = PartKeys(self)  # type: ignore[assignment]  # what the loader's messages read: key(i)

    @property
    def class_maps(self) -> dict[str, list[int]]:
        """Per source (by its name), the union's class id of each of its class ids."""
        return {name: mapping.tolist() for name, mapping in zip(self.names, self.label_maps, strict=True)}

    def locate(self, index: int) -> tuple[int, int]:
        """(source, index in that source) of global index `index`."""
        source = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return source, index - int(self.offsets[source])

    def part_key(self, source: int, local: int) -> str:
        """Sample `local` of source `source` as its messages name it: the source's name, then its own key."""
        return f"{self.names[source]}/{self.sources[source].reader.key(local)}"

    def mapped_readers(self) -> list[Any]:
        """Every source's reader: a batch leaves mapped pages of their data files behind."""
        return [data.reader for data in self.sources]

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


class MixedImageLoader(MixedResumable, ImageLoader):
    """`ImageLoader` over a MixedImageDataset, batches drawn by the mixing schedule (`fastdata.order.mixing`):
    `(images, labels)` with labels in the union label space (`loader.classes`); segmentation: `(images, masks)`."""

    def __init__(self, data: MixedImageDataset, plan: MixPlan, options: LoaderOptions,
                 image: ImageOptions | None = None) -> None:
        self.plan = plan
        sampler = MixedBatchSampler(plan, options.batch_size, options.shuffle, options.seed, options.drop_last,
                                    options.rank, options.world_size, options.uneven)
        super().__init__(data, options, image, sampler=sampler)

    @property
    def class_maps(self) -> dict[str, list[int]]:
        """Per dataset (by its name), the mixture's class id (`loader.classes`) of each of its class ids."""
        assert isinstance(self.dataset, MixedImageDataset)
        return self.dataset.class_maps

    def _resume_config(self) -> dict[str, Any]:
        assert isinstance(self.dataset, MixedImageDataset)
        return {**super()._resume_config(), **self._mix_config(self.dataset.names, self.dataset.fingerprints()),
                "classes": list(self.dataset.classes)}


def mixed_image_loader(data: MixedImageDataset, plan: MixPlan, options: LoaderOptions,
                       image: ImageOptions | None = None) -> MixedImageLoader:
    """The mixture's loader (its batches shaped by its kind of targets, as `ImageLoader`'s are)."""
    return MixedImageLoader(data, plan, options, image)

