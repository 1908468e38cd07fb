"""Existing WebDataset shards (img2dataset, webdataset's own `TarWriter` / `ShardWriter`, ...) -> the image
conversion driver (`fastdata.convert.images`), their stored image bytes kept as they are.

SRC is a folder of uncompressed `.tar` shards (its `*.tar` files, sorted by name; not recursive), one `.tar`, or a
brace pattern (`shards-{000000..000009}.tar`, expanded by `braceexpand` as webdataset expands it; every shard it
names must exist). Compressed shards (`.tar.gz`, ...) are refused: samples are read by their offset in the tar,
which a compressed stream does not have; decompress them first (`gunzip`).

Each shard is indexed once, with `tarfile`: members are grouped into samples as webdataset groups them (key = the
member name up to the first dot of its base name, within its directory; extensions lower-cased; consecutive
members of one key are one sample; `__...__` meta members and names without a dot are skipped and counted as
ignored). A sample's image is its first member whose extension is in `--image-ext`; its key in the dataset is that
member's name (the webdataset key plus its extension, as an ImageFolder key is a path with its extension), so a
WebDataset re-shard keeps the webdataset keys. The images are read by offset in the conversion workers
(`TarMemberReader`), each verified by decoding it.

Labels (`--label-key NAME`, default `cls`): the `{key}.NAME` member when the shards have one (text: all integers
-> class ids, otherwise class names), else the field NAME of `{key}.json`: an integer (class id), a string (class
name) or a list of them (multi-label: the sample's set of classes). Class ids are kept, classes named "0".."C-1"
(C = the largest id + 1, or `--num-classes`); class names are sorted, as ImageFolder sorts class folders.
`--no-labels` converts without labels (every sample in the one class "unlabelled"). Every other `.json` field is
kept as per-sample metadata (lists and objects as their JSON text), and a `.txt` member as the metadata field
`caption` (over a `.json` "caption", which img2dataset fills with the same text).

Refused, with one line naming the shard and member or sample (nothing written): a truncated or damaged shard,
members that are links, devices or sparse, or whose names are absolute or climb out with `..`, members that could
run code when loaded (pickles, object .npy: as fastdata's own WebDataset reader refuses them), two members of one
sample with the same extension, a sample with no image member, a label that is missing or not a class, and a key
found in two places.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from fastdata.config import available_cores, check_bool, check_optional_int
from fastdata.convert.images import ConversionSummary, convert_images
from fastdata.convert.options import ImageConversionOptions, check_column, normalise, spelled
from fastdata.convert.source_files.tar_samples import (
    DEFAULT_IMAGE_EXTS,
    IndexedSample,
    TarMemberReader,
    choose_images,
    image_exts,
    index_shards,
    listed,
    parsed_json,
    refuse_duplicates,
    sample_metadata,
    shard_files,
    where,
)
from fastdata.convert.sources import NO_LABEL_CLASS, ImageSource, labels_of
from fastdata.errors import ConfigError, SourceError
from fastdata.formats.manifest import Manifest

DEFAULT_LABEL_KEY = "cls"  # webdataset's class id member (TarWriter writes `{key}.cls` as ASCII digits)
_INTEGER = re.compile(r"[+-]?\d+")


# ----------------------------------------------------------------------------------------------------- labels


@dataclass(frozen=True)
class LabelOptions:
    """Where labels come from (see the module docstring)."""

    key: str | None = DEFAULT_LABEL_KEY  # None: no labels
    num_classes: int | None = None


def _raw_labels(samples: list[IndexedSample], jsons: list[dict | None], key: str, names: list[str]
                ) -> tuple[list[Any], str]:
    """Each sample's label as the source holds it, and where it was found ("member" or "json")."""
    if any(key in s.members for s in samples):
        values: list[Any] = []
        for sample in samples:
            try:
                text = sample.texts[key].decode("utf-8").strip() if key in sample.texts else ""
            except UnicodeDecodeError:
                raise SourceError(f"{where(sample, names)}: its .{key} label is not UTF-8 text") from None
            values.append(text or None)
        if all(v is None or _INTEGER.fullmatch(v) for v in values):
            values = [None if v is None else int(v) for v in values]
        return values, "member"
    if any(meta is not None and key in meta for meta in jsons):
        return [meta.get(key) if meta is not None else None for meta in jsons], "json"
    raise SourceError(f"no sample has a .{key} member or a {key!r} field in its .json: pass --label-key NAME (a member"
                      " extension or a .json field), or --no-labels to convert without labels")


def _label_parts(value: Any) -> list[Any] | None:
    """The class ids or names of one label value (None: not a label)."""
    parts = value if isinstance(value, list) else [value]
    if all(isinstance(p, (int, str)) and not isinstance(p, bool) for p in parts):
        return parts
    return None


def resolve_labels(samples: list[IndexedSample], jsons: list[dict | None], options: LabelOptions, names: list[str]
                   ) -> tuple[list[str], list[Any], str, str]:
    """(classes, label per sample, label kind, where the labels were found: "member", "json" or "none")."""
    if options.key is None:
        return [NO_LABEL_CLASS], [0] * len(samples), "single", "none"
    values, found = _raw_labels(samples, jsons, options.key, names)
    missing = [where(s, names) for s, v in zip(samples, values, strict=True) if v is None]
    if missing:
        raise SourceError(f"{len(missing)} sample(s) have no label (.{options.key} member or {options.key!r} field "
                          f"in .json): {listed(missing)}; pass --no-labels to convert without labels")
    first_of: dict[type, tuple[str, Any]] = {}
    for sample, value in zip(samples, values, strict=True):
        parts = _label_parts(value)
        if parts is None:
            raise SourceError(f"{where(sample, names)}: label {value!r} is not a class id (an integer), a class name "
                              "(a string) or a list of them")
        for part in parts:
            first_of.setdefault(type(part), (where(sample, names), value))
    if len(first_of) > 1:
        (a, a_value), (b, b_value) = first_of[int], first_of[str]
        raise SourceError(f"labels mix class ids and class names: {a} has {a_value!r}, {b} has {b_value!r}")
    multi = any(isinstance(v, list) for v in values)
    if str in first_of:
        if options.num_classes is not None:
            raise ConfigError("--num-classes applies to integer class ids; these labels are class names")
        count = None
    else:
        count = _class_count(samples, values, options.num_classes, names)
    classes, labels = labels_of([_label_parts(v) or () for v in values], multi, count)
    return classes, labels, "multi" if multi else "single", found


def _class_count(samples: list[IndexedSample], values: list[Any], num_classes: int | None, names: list[str]) -> int:
    """The number of classes of integer labels: `num_classes`, or the largest id + 1 (each id checked)."""
    largest, largest_at = -1, ""
    for sample, value in zip(samples, values, strict=True):
        for class_id in _label_parts(value) or ():
            if class_id < 0:
                raise SourceError(f"{where(sample, names)}: class id {class_id} is negative")
            if class_id > largest:
                largest, largest_at = class_id, where(sample, names)
    if num_classes is not None and largest >= num_classes:
        raise SourceError(f"{largest_at}: class id {largest} is not below --num-classes {num_classes}")
    return num_classes if num_classes is not None else largest + 1


# ----------------------------------------------------------------------------------------------------- listing


def _label_options(label_key: Any, num_classes: Any, no_labels: Any) -> LabelOptions:
    """Where the labels come from, checked (one line naming the option and the value)."""
    check_column("label_key", label_key, optional=True)
    num_classes = check_optional_int("num_classes", num_classes)
    if num_classes is not None and num_classes < 1:
        raise ConfigError(f"--num-classes must be at least 1, got {num_classes}")
    if check_bool("no_labels", no_labels) and (label_key is not None or num_classes is not None):
        raise ConfigError("--no-labels takes neither --label-key nor --num-classes")
    labels = LabelOptions(None if no_labels else (label_key or DEFAULT_LABEL_KEY), num_classes)
    if labels.key is not None and (labels.key in DEFAULT_IMAGE_EXTS or labels.key == "json"):
        raise ConfigError(f"--label-key {labels.key}: a label cannot be an image or the .json member itself (a "
                          ".json field is named by itself: --label-key label)")
    return labels


def scan(src: str | os.PathLike[str], image_ext: str | Sequence[str] | None = None, label_key: str | None = None,
         num_classes: int | None = None, no_labels: bool = False, workers: int | None = None) -> ImageSource:
    """Index the shards of `src` (over `workers` processes; default: all cores) and list their samples, labels and
    metadata (see the module docstring)."""
    exts = image_exts(image_ext)
    labels = _label_options(label_key, num_classes, no_labels)
    root, paths, described = shard_files(src)
    names = [p.resolve().relative_to(root).as_posix() for p in paths]
    read_exts = frozenset({"json", "txt"} | ({labels.key} if labels.key else set()))
    samples, ignored = index_shards(paths, names, read_exts, available_cores() if workers is None else workers)
    if not samples:
        raise SourceError(f"{described}: no samples in its {len(paths)} shard(s)")
    refuse_duplicates(samples, names)
    chosen = choose_images(samples, exts, names)
    jsons = [parsed_json(s, names) for s in samples]
    classes, label_values, kind, found_in = resolve_labels(samples, jsons, labels, names)
    label_field = labels.key if found_in == "json" else None
    caption = labels.key != "txt"
    rows = [sample_metadata(s, meta, label_field, caption, names) for s, meta in zip(samples, jsons, strict=True)]
    used = {"json"} | ({"txt"} if caption else set()) | ({labels.key} if found_in == "member" else set())
    for sample, image in zip(samples, chosen, strict=True):
        ignored += [f"{names[sample.shard]}!{m.name}" for ext, m in sample.members.items()
                    if ext != image and ext not in used]
    keys = [s.members[image].name for s, image in zip(samples, chosen, strict=True)]
    table = {key: (s.shard, s.members[image].offset, s.members[image].size)
             for key, s, image in zip(keys, samples, chosen, strict=True)}
    shard_of = [s.shard for s in samples]
    counts = [0] * len(classes)
    for label in label_values:
        for class_id in label if isinstance(label, tuple) else (label,):
            counts[class_id] += 1
    return ImageSource(
        "webdataset", root, classes, list(zip(keys, label_values, strict=True)), ignored,
        [name for name, n in zip(classes, counts, strict=True) if n == 0],
        reader=TarMemberReader(described, list(paths), names, table), label_kind=kind,
        metadata=rows if any(rows) else None, origin=lambda index: {"shard": names[shard_of[index]]},
        details={"shards": len(paths), "image_ext": list(exts), "label_key": labels.key, "labels_from": found_in,
                 "num_classes": num_classes})


def relist(src: str | os.PathLike[str], manifest: Manifest) -> ImageSource:
    """The shards a dataset was converted from, listed again with the options the conversion used (`fastdata verify
    --source`)."""
    source = manifest.source
    no_labels = source.get("labels_from") == "none"
    return scan(src, source.get("image_ext"), None if no_labels else source.get("label_key"),
                None if no_labels else source.get("num_classes"), no_labels)


@dataclass(frozen=True, kw_only=True)
class WebDatasetOptions(ImageConversionOptions):
    """How `fastdata.convert_webdataset` converts existing WebDataset shards: which members are the images and the
    labels (below), and the options of every image conversion (`fastdata.convert.options.ImageConversionOptions`).
    Checked when made.

    Attributes:
        image_ext: the image member extensions, in order of preference, a list or "jpg,png" (None: every image
            extension fastdata reads, jpg first).
        label_key: the label: a member extension (`{key}.NAME`) or a `.json` field (None: `cls`); an integer, a
            class name, or a list of them (multi-label).
        num_classes: the number of classes of integer labels (None: the largest id + 1).
        no_labels: the shards hold no labels: every sample in one class, "unlabelled".
    """

    image_ext: str | Sequence[str] | None = None
    label_key: str | None = None
    num_classes: int | None = None
    no_labels: bool = False

    def __post_init__(self) -> None:
        """Each value checked (one line naming the option and the value), `image_ext` as a tuple."""
        super().__post_init__()
        normalise(self, image_ext=None if self.image_ext is None else image_exts(self.image_ext))
        _label_options(self.label_key, self.num_classes, self.no_labels)


def convert_webdataset(src: str | os.PathLike[str], out: str | os.PathLike[str],
                       options: WebDatasetOptions | None = None, **keywords: Any) -> ConversionSummary:
    """Convert existing WebDataset shards `src` (a folder of `.tar` files, one `.tar`, or a brace pattern) into
    `out` (LMDB if it ends in `.lmdb`, or `format="wds"` shards with fastdata's manifest and hashes): the stored
    image bytes kept, every image verified, labels from `label_key` (a member extension, default `cls`, or a
    `.json` field), the other `.json` fields and `.txt` captions kept as metadata.

    Args:
        src: a folder of uncompressed `.tar` shards, one `.tar`, or a brace pattern (`shards-{000..009}.tar`).
        out: the dataset to write: `OUT.lmdb`, or a directory of WebDataset shards with `format="wds"`.
        options: which members are the images and labels, and how to convert (`fastdata.options.WebDatasetOptions`;
            None: its defaults).
        **keywords: the options as flat keywords (deprecated: put them in `options`).
    """
    settings = spelled(WebDatasetOptions, options, keywords, "fastdata.convert_webdataset")
    return convert_images(lambda: scan(src, settings.image_ext, settings.label_key, settings.num_classes,
                                       settings.no_labels, settings.workers), out, settings)


#: the option object of `fastdata convert webdataset`, and its parameters that are not options (its arguments)
OPTIONS = WebDatasetOptions
ARGUMENTS = ("src", "out")


def cli_command() -> click.Command:
    """`fastdata convert webdataset SRC OUT ...`"""
    from fastdata.converters.options import convert_options, options_from_flags

    @click.command("webdataset")
    @click.argument("src")
    @click.argument("out", type=click.Path(path_type=Path))
    @click.option("--image-ext", default=None, metavar="EXT,...",
                  help=f"Image member extensions, in order of preference. Default: {','.join(DEFAULT_IMAGE_EXTS)}.")
    @click.option("--label-key", default=None, metavar="NAME",
                  help="The label: the {key}.NAME member, else the NAME field of {key}.json. Default: cls.")
    @click.option("--num-classes", type=int, default=None,
                  help="Number of classes of integer labels. Default: the largest class id + 1.")
    @click.option("--no-labels", is_flag=True, help="No labels: every sample in one class, 'unlabelled'.")
    @convert_options
    def command(src: str, out: Path, **flags: Any) -> None:
        """Convert existing WebDataset shards SRC into OUT, keeping their image bytes.

        SRC: a folder of .tar shards, one .tar, or a brace pattern ('shards-{000000..000009}.tar', quoted).
        Labels from {key}.cls (or --label-key); other .json fields and .txt captions kept as metadata.
        OUT ending in .lmdb writes one LMDB dataset (in shard order); --format wds writes new shards.
        """
        click.echo(str(convert_webdataset(src, out, options_from_flags(OPTIONS, flags, ARGUMENTS))))

    return command
