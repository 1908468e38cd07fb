"""Hugging Face datasets -> the image conversion driver (`fastdata.convert.images`).

SRC is one of:

- a folder written by `datasets`' `save_to_disk`: a `Dataset` (`state.json`), or a `DatasetDict`
  (`dataset_dict.json`; `split` chooses, default `train`);
- Parquet or Arrow files: one file, or a folder of them (as `Dataset.to_parquet` writes them, or the Hub's
  `data/train-00000-of-00001.parquet` layout), split by file name the way `datasets` splits such a folder (files
  without a split in their name are `train`);
- the name of a Hub dataset (`user/name`) already in the local Hugging Face cache (`cache_dir`, default: the one
  `datasets` uses, from `HF_HOME` / `HF_DATASETS_CACHE`). Only the cache is read, never the network: a dataset not
  yet there is downloaded once with `datasets.load_dataset(name)`.

Every sample is a row, keyed `{split}/{row}` (zero-padded). The image bytes are stored as they are (a JPEG stays
that JPEG, unless `max_size` re-encodes it), read by `fastdata.convert.source_files.tables.RowReader` from the `Image`
feature's `{bytes, path}` cells without decoding them during the listing; the driver verifies each by decoding it,
and rejects (naming split and row) those that do not decode. Labels: a `ClassLabel` gives the class names (ids
kept); a list of `ClassLabel` (`Sequence(ClassLabel)`) makes a multi-label dataset; an integer column keeps its
ids (classes "0".."C-1"); a string column's classes are its sorted distinct values. The other scalar columns
(numbers, strings, booleans, other `ClassLabel`s) are stored per sample as JSON metadata
(`fastdata.dataset(OUT, metadata=True)`); the rest (lists, structs, other images) are named in the manifest as not
kept.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from fastdata.config import check_bool
from fastdata.convert.images import ConversionSummary, convert_images
from fastdata.convert.options import ImageConversionOptions, check_column, check_path, normalise, spelled
from fastdata.convert.source_files.metadata import NOT_JSON, json_value
from fastdata.convert.source_files.tables import (
    ROW_GROUP_CACHE_BYTES,
    TABLE_SUFFIXES,
    RowReader,
    TableFile,
    open_table_file,
    read_columns,
    read_schema,
    row_key,
)
from fastdata.convert.sources import ImageSource
from fastdata.errors import ConfigError, SourceError
from fastdata.formats.manifest import Manifest

DEFAULT_SPLIT = "train"  # what datasets calls the one split of data without split names
DEFAULT_LABEL_COLUMN = "label"
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_SCALAR_DTYPES = re.compile(r"(bool|u?int(8|16|32|64)|float(16|32|64)|half|float|double|string|large_string)")


@dataclass
class _Split:
    """One split of a source, found: its name, its Arrow / Parquet files in order, its features, where it is."""

    name: str
    files: list[Path]
    features: Any  # datasets.Features
    location: str  # where the split is, in one line (the manifest's source path)
    ignored: list[str] = field(default_factory=list)  # files of a folder that are not Parquet / Arrow


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError("reading Hugging Face datasets needs the `datasets` package: pip install "
                          "'fastdata[hf]'") from exc
    return datasets


# ------------------------------------------------------------------------------------------- finding the split


def _choose(src: str, splits: Sequence[str], split: str | None) -> str:
    wanted = DEFAULT_SPLIT if split is None else split
    if wanted not in splits:
        raise SourceError(f"{src}: no split {wanted!r} (splits: {', '.join(splits)}); choose one with --split")
    return wanted


def _saved_dict(root: Path, split: str | None) -> _Split:
    try:
        splits = json.loads((root / "dataset_dict.json").read_text())["splits"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{root / 'dataset_dict.json'}: unreadable ({exc}); save the DatasetDict again") from exc
    name = _choose(str(root), splits, split)
    found = _saved_dataset(root / name, None, f"{root} split {name!r}")
    found.name = name
    return found


def _saved_dataset(root: Path, split: str | None, where: str | None = None) -> _Split:
    datasets = _datasets()
    try:
        ds = datasets.load_from_disk(str(root))
    except (OSError, ValueError, KeyError) as exc:
        raise SourceError(f"{where or root}: not a readable saved dataset ({exc}); save it again with "
                          "save_to_disk") from exc
    name = str(ds.split) if ds.split is not None else DEFAULT_SPLIT
    if split is not None and split != name:
        raise SourceError(f"{root}: one saved Dataset, whose split is {name!r}: no split {split!r} (splits: {name}); "
                          "drop --split or name that split")
    return _from_dataset(ds, name, str(root.resolve()), where or str(root))


def _from_dataset(ds: Any, name: str, location: str, where: str) -> _Split:
    """A split that `datasets` opened (memory-mapped over its Arrow files)."""
    if getattr(ds, "_indices", None) is not None:
        raise SourceError(f"{where}: the dataset has an indices mapping (select/shuffle not flattened); save it "
                          "again with save_to_disk")
    files = [Path(entry["filename"]) for entry in ds.cache_files]
    if not files:
        raise SourceError(f"{where}: the dataset is held in memory, not in Arrow files; save it with save_to_disk")
    return _Split(name, files, ds.features, location)


def _table_files(src: Path, split: str | None) -> _Split:
    """Parquet / Arrow files: one file, or a folder split by file name as `datasets` splits one."""
    datasets = _datasets()
    if src.is_file():
        if src.suffix.lower() not in TABLE_SUFFIXES:
            raise SourceError(f"{src}: not a Parquet or Arrow file (expected {', '.join(TABLE_SUFFIXES)}, a saved "
                              "dataset folder, or a Hub dataset name)")
        by_split: dict[str, list[str]] = {DEFAULT_SPLIT: [str(src)]}
    else:
        from datasets.data_files import DataFilesDict, get_data_patterns

        try:
            patterns = get_data_patterns(str(src))
            by_split = {str(name): list(files) for name, files in
                        DataFilesDict.from_patterns(patterns, base_path=str(src)).items()}
        except (FileNotFoundError, datasets.data_files.EmptyDatasetError) as exc:
            raise SourceError(f"{src}: holds no Parquet or Arrow files (nor a saved dataset's dataset_dict.json "
                              "or state.json)") from exc
    tables = {name: [f for f in files if Path(f).suffix.lower() in TABLE_SUFFIXES] for name, files in by_split.items()}
    tables = {name: files for name, files in tables.items() if files}
    if not tables:
        raise SourceError(f"{src}: holds no Parquet or Arrow files (nor a saved dataset's dataset_dict.json or "
                          "state.json)")
    name = _choose(str(src), list(tables), split)
    root = src if src.is_dir() else src.parent
    ignored = sorted(Path(f).relative_to(root).as_posix() for f in by_split.get(name, [])
                     if Path(f).suffix.lower() not in TABLE_SUFFIXES)
    files = [Path(f) for f in tables[name]]
    features = datasets.Features.from_arrow_schema(read_schema(files[0]))
    return _Split(name, files, features, str(src.resolve()), ignored)


def _hub_cache(name: str, split: str | None, config: str | None, cache_dir: str | None) -> _Split:
    """A Hub dataset from the local cache only (the builder `datasets.load_dataset` itself uses offline)."""
    datasets = _datasets()
    from datasets.packaged_modules.cache.cache import Cache

    cache = os.path.expanduser(str(cache_dir or datasets.config.HF_DATASETS_CACHE))
    try:
        builder = Cache(cache_dir=cache, repo_id=name, dataset_name=name.split("/")[-1], config_name=config,
                        version="auto", hash="auto")
    except ValueError as exc:
        said = "; ".join(line.strip() for line in str(exc).splitlines()
                         if line.strip() and not line.strip().startswith(("Please", "load_dataset("))
                         and "load_dataset(" not in line)
        if "Couldn't find cache" in str(exc) and not config:
            raise SourceError(f"{name}: no such file or folder, and not in the Hugging Face datasets cache {cache} "
                              f"(fastdata reads the cache, offline: download it once with "
                              f"datasets.load_dataset({name!r}), or pass --cache-dir)") from exc
        remedy = "choose one with --config" if "multiple" in str(exc) else "check --config and --cache-dir"
        raise SourceError(f"{name}: {said} ({cache}); {remedy}") from exc
    splits = list(builder.info.splits or {})
    chosen = _choose(name, splits, split)
    ds = builder.as_dataset(split=chosen)
    return _from_dataset(ds, chosen, builder.cache_dir, f"{name} split {chosen!r}")


def find_split(src: str | os.PathLike[str], split: str | None = None, config: str | None = None,
               cache_dir: str | None = None) -> _Split:
    """The split `split` (None: the only one, or `train`) of the source `src` (see the module docstring)."""
    path = Path(src)
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        return _saved_dict(path, split)
    if path.is_dir() and (path / "state.json").is_file():
        return _saved_dataset(path, split)
    if path.exists():
        return _table_files(path, split)
    if _HUB_NAME.fullmatch(str(src)) and not str(src).startswith("."):
        return _hub_cache(str(src), split, config, cache_dir)
    raise SourceError(f"{src}: no such file or folder (nor a Hub dataset name)")


# ----------------------------------------------------------------------------------------- columns and labels


def _type_name(feature: Any) -> str:
    """A short name for a feature's type, for messages."""
    datasets = _datasets()
    if isinstance(feature, datasets.Value):
        return f"Value({feature.dtype})"
    if isinstance(feature, datasets.ClassLabel):
        return f"ClassLabel({feature.num_classes} names)"
    if isinstance(feature, dict):
        return "struct{" + ", ".join(feature) + "}"
    inner = getattr(feature, "feature", None)
    if inner is not None:
        return f"{type(feature).__name__}({_type_name(inner)})"
    return type(feature).__name__


def _features_text(features: Any) -> str:
    return ", ".join(f"{name} ({_type_name(feature)})" for name, feature in features.items())


def _is_image(feature: Any) -> bool:
    datasets = _datasets()
    if isinstance(feature, datasets.Image):
        return True
    if isinstance(feature, dict):
        return {"bytes", "path"} <= set(feature)
    return isinstance(feature, datasets.Value) and feature.dtype in ("binary", "large_binary")


def _image_column(found: _Split, src: str, wanted: str | None) -> str:
    datasets = _datasets()
    features = found.features
    where = f"{src} (split {found.name!r})"
    if wanted is not None:
        if wanted not in features:
            raise SourceError(f"{where}: no column {wanted!r} (columns: {', '.join(features)}); name the image "
                              "column with --image-column")
        if not _is_image(features[wanted]):
            raise SourceError(f"{where}: column {wanted!r} is {_type_name(features[wanted])}, not images (an Image "
                              "feature, a {bytes, path} struct or binary); name the image column with --image-column")
        return wanted
    if "image" in features and _is_image(features["image"]):
        return "image"
    images = [name for name, feature in features.items() if isinstance(feature, datasets.Image)]
    if len(images) == 1:
        return images[0]
    if images:
        raise SourceError(f"{where}: several image columns ({', '.join(images)}); choose one with --image-column")
    raise SourceError(f"{where}: no image column; its features are {_features_text(features)}: name the column "
                      "that holds the images with --image-column")


def _list_types() -> tuple[type[Any], ...]:
    datasets = _datasets()
    return tuple(t for t in (getattr(datasets, n, None) for n in ("List", "LargeList", "Sequence"))
                 if isinstance(t, type))


def _label_kind(feature: Any) -> tuple[str, str, list[str] | None]:
    """("single" | "multi", "ids" | "names", ClassLabel names or None) of a label column; SourceError if it is
    none of ClassLabel, integers, strings or lists of them."""
    datasets = _datasets()
    multi = isinstance(feature, _list_types())
    inner = feature.feature if multi else feature
    kind = "multi" if multi else "single"
    if isinstance(inner, datasets.ClassLabel):
        return kind, "ids", list(inner.names)
    if isinstance(inner, datasets.Value) and re.fullmatch(r"u?int(8|16|32|64)", inner.dtype):
        return kind, "ids", None
    if isinstance(inner, datasets.Value) and inner.dtype in ("string", "large_string"):
        return kind, "names", None
    raise ValueError(_type_name(feature))


def _labels(column: str, feature: Any, values: list[Any], where: str) -> tuple[list[str], list[Any], str]:
    """(class names, labels, label kind) of the label column's `values` (see the module docstring)."""
    try:
        kind, encoding, names = _label_kind(feature)
    except ValueError as exc:
        raise SourceError(f"{where}: label column {column!r} is {exc}, not class labels (a ClassLabel, integers or "
                          "strings, or lists of them); name the label column with --label-column") from None
    rows = values if kind == "multi" else [[v] for v in values]
    missing = [i for i, row in enumerate(rows) if row is None or any(v is None or (encoding == "ids" and v < 0)
                                                                     for v in row)]
    if missing:
        shown = ", ".join(str(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise SourceError(f"{where}: label column {column!r} has no label in {len(missing):,} rows ({shown}; -1 or "
                          "null, as in unlabelled test splits); convert a labelled split")
    if encoding == "names":
        names = sorted({v for row in rows for v in row})
        index = {name: i for i, name in enumerate(names)}
        rows = [[index[v] for v in row] for row in rows]
    elif names is None:
        names = [str(i) for i in range(max((v for row in rows for v in row), default=-1) + 1)]
    else:
        outside = [i for i, row in enumerate(rows) if any(v >= len(names) for v in row)]
        if outside:
            raise SourceError(f"{where}: label column {column!r}: row {outside[0]} has class id "
                              f"{max(rows[outside[0]])}, outside its ClassLabel's {len(names)} names")
    if kind == "multi":
        return names, [tuple(sorted(set(row))) for row in rows], kind
    return names, [row[0] for row in rows], kind


def _is_scalar(feature: Any) -> bool:
    """Whether metadata keeps the column: JSON scalars (a Value of a scalar dtype, a ClassLabel) and lists of
    them (`Sequence`/`List`, nested too), as every source kind keeps them (fastdata.convert.source_files.metadata)."""
    datasets = _datasets()
    if isinstance(feature, _list_types()):
        return _is_scalar(feature.feature)
    if isinstance(feature, datasets.ClassLabel):
        return True
    return isinstance(feature, datasets.Value) and bool(_SCALAR_DTYPES.fullmatch(feature.dtype))


def _json_scalar(value: Any) -> Any:
    """A kept column's value as metadata holds it (NaN and infinities as null, lists as lists)."""
    kept = json_value(value)
    return None if kept is NOT_JSON else kept


# -------------------------------------------------------------------------------------------------- listing


def scan(src: str | os.PathLike[str], split: str | None = None, image_column: str | None = None,
         label_column: str = DEFAULT_LABEL_COLUMN, config: str | None = None, cache_dir: str | None = None,
         metadata: bool = True) -> ImageSource:
    """List the rows of split `split` of the Hugging Face source `src` (see the module docstring) as samples:
    keys, labels and metadata read from their columns, never the image bytes."""
    found = find_split(src, split, config, cache_dir)
    where = f"{src} (split {found.name!r})"
    image = _image_column(found, str(src), image_column)
    if label_column not in found.features:
        raise SourceError(f"{where}: no label column {label_column!r}; its features are "
                          f"{_features_text(found.features)}: name the label column with --label-column")
    if label_column == image:
        raise SourceError(f"{where}: column {label_column!r} holds the images; name the label column with "
                          "--label-column")
    others = [name for name in found.features if name not in (image, label_column)]
    kept = [name for name in others if _is_scalar(found.features[name])] if metadata else []
    left_out = [f"{name} ({_type_name(found.features[name])})" for name in others if name not in kept]
    tables = [open_table_file(path) for path in found.files]
    _warn_about_large_row_groups(tables)
    columns: dict[str, list[Any]] = {name: [] for name in [label_column, *kept]}
    for table in tables:
        missing = [name for name in [image, *columns] if name not in read_schema(table.path).names]
        if missing:
            raise SourceError(f"{table.path}: no column {', '.join(map(repr, missing))} (the split's other files "
                              "have it): its files must share one schema")
        part = read_columns(table, list(columns))
        for name in columns:
            columns[name].extend(part.column(name).to_pylist())
    rows = sum(t.rows for t in tables)
    if rows == 0:
        raise SourceError(f"{where}: the split has no rows")
    classes, labels, kind = _labels(label_column, found.features[label_column], columns[label_column], where)
    keys = [row_key(found.name, row, rows) for row in range(rows)]
    counts = [0] * len(classes)
    for label in labels:
        for class_id in (label if isinstance(label, tuple) else (label,)):
            counts[class_id] += 1
    split_name = found.name
    return ImageSource(
        "hf", Path(found.location), classes, list(zip(keys, labels, strict=True)), found.ignored,
        [name for name, n in zip(classes, counts, strict=True) if n == 0],
        reader=RowReader(tables, image, found.name, found.location, Path.cwd()), label_kind=kind,
        metadata=([{name: _json_scalar(columns[name][row]) for name in kept} for row in range(rows)]
                  if kept else None),
        origin=lambda index: {"split": split_name, "row": index},
        details={"hf": {"split": split, "image_column": image_column, "label_column": label_column,
                        "config": config, "cache_dir": cache_dir, "metadata": metadata},
                 "split": found.name, "image_column": image, "columns_not_kept": left_out},
    )


def _warn_about_large_row_groups(tables: list[TableFile]) -> None:
    large = [t for t in tables if t.largest_row_group_bytes > ROW_GROUP_CACHE_BYTES]
    if large:
        warnings.warn(f"{large[0].path}: Parquet row groups of up to {large[0].largest_row_group_bytes / 1e6:,.0f} MB "
                      f"({len(large)} such file(s)): a sample is read with its whole row group, so a shuffled "
                      "(--format wds) conversion reads it again and again; files written with row groups of ~100 "
                      "images (as datasets writes them) convert faster", stacklevel=2)


def relist(src: str | os.PathLike[str], manifest: Manifest) -> ImageSource:
    """The source of a dataset this converter made, listed again as the conversion listed it (`fastdata verify
    --source`)."""
    return scan(src, **manifest.source.get("hf", {}))


@dataclass(frozen=True, kw_only=True)
class HfOptions(ImageConversionOptions):
    """How `fastdata.convert_hf` converts a Hugging Face image dataset: which split and columns (below), and the
    options of every image conversion (`fastdata.convert.options.ImageConversionOptions`). Checked when made.

    Attributes:
        split: the split to convert (None: `train`, or the only one).
        image_column: the column of the images (None: `image`, or the only Image column).
        label_column: the column of the labels: ClassLabel, integers, strings, or lists of them (multi-label).
        config: the configuration of a cached Hub dataset that has several.
        cache_dir: the Hugging Face datasets cache to look in (None: datasets' own).
        metadata: keep the other scalar columns as per-sample metadata.
    """

    split: str | None = None
    image_column: str | None = None
    label_column: str = DEFAULT_LABEL_COLUMN
    config: str | None = None
    cache_dir: str | os.PathLike[str] | None = None
    metadata: bool = True

    def __post_init__(self) -> None:
        """Each value checked (one line naming the option and the value), `cache_dir` as a str."""
        super().__post_init__()
        check_column("split", self.split, optional=True)
        check_column("image_column", self.image_column, optional=True)
        check_column("label_column", self.label_column)
        check_column("config", self.config, optional=True)
        check_bool("metadata", self.metadata)
        normalise(self, cache_dir=check_path("cache_dir", self.cache_dir))


def convert_hf(src: str | os.PathLike[str], out: str | os.PathLike[str], options: HfOptions | None = None,
               **keywords: Any) -> ConversionSummary:
    """Pack a split of the Hugging Face dataset `src` (a `save_to_disk` folder, Parquet / Arrow files, or a Hub
    dataset name in the local cache: see `fastdata.converters.hf`) into `out` (LMDB if it ends in `.lmdb`, or
    `format="wds"` shards): image bytes stored as they are, each verified by decoding it, rows that do not decode
    rejected and named.

    Args:
        src: a `save_to_disk` folder (Dataset or DatasetDict), a Parquet / Arrow file or a folder of them, or the
            name of a Hub dataset already in the local cache (never downloaded).
        out: the dataset to write: `OUT.lmdb`, or a directory of WebDataset shards with `format="wds"`.
        options: which split and columns, and how to convert (`fastdata.options.HfOptions`; None: its defaults).
        **keywords: the options as flat keywords (deprecated: put them in `options`).
    """
    settings = spelled(HfOptions, options, keywords, "fastdata.convert_hf")
    return convert_images(lambda: scan(src, settings.split, settings.image_column, settings.label_column,
                                       settings.config, settings.cache_dir, settings.metadata),  # type: ignore[arg-type]
                          out, settings)


#: the option object of `fastdata convert hf`, and its parameters that are not options (its arguments)
OPTIONS = HfOptions
ARGUMENTS = ("src", "out")


def cli_command() -> click.Command:
    """`fastdata convert hf SRC OUT ...`"""
    from fastdata.converters.options import convert_options, options_from_flags

    @click.command("hf")
    @click.argument("src")
    @click.argument("out", type=click.Path(path_type=Path))
    @click.option("--split", default=None, help=f"Split to convert. Default: {DEFAULT_SPLIT} (or the only one).")
    @click.option("--image-column", default=None, metavar="NAME",
                  help="Column of the images. Default: image, or the only Image column.")
    @click.option("--label-column", default=DEFAULT_LABEL_COLUMN, show_default=True, metavar="NAME",
                  help="Column of the labels: ClassLabel, integers, strings, or lists of them (multi-label).")
    @click.option("--config", default=None, metavar="NAME", help="Configuration of a cached Hub dataset.")
    @click.option("--cache-dir", default=None, metavar="DIR",
                  help="Hugging Face datasets cache to find a Hub dataset in. Default: datasets' own.")
    @click.option("--metadata/--no-metadata", default=True, show_default=True,
                  help="Store the other scalar columns with each sample (fastdata.dataset(OUT, metadata=True)).")
    @convert_options
    def command(src: str, out: Path, **flags: Any) -> None:
        """Pack a Hugging Face dataset SRC into OUT: a save_to_disk folder (Dataset or DatasetDict), Parquet or
        Arrow files (a file or a folder), or the name of a Hub dataset in the local cache (read offline).

        OUT ending in .lmdb writes one LMDB dataset (sample i = row i of the split); --format wds writes WebDataset
        tar shards into the directory OUT. Image bytes are stored as they are (no re-encoding unless --max-size).
        """
        summary = convert_hf(src, out, options_from_flags(OPTIONS, flags, ARGUMENTS))
        click.echo(str(summary))
        left_out = _columns_note(out)
        if left_out:
            click.echo(left_out)

    return command


def _columns_note(out: Path) -> str:
    """The note the CLI prints after a conversion: the source columns not kept (not JSON scalars), if any."""
    from fastdata.formats.manifest import read_manifest

    left_out = read_manifest(out).source.get("columns_not_kept", [])
    if not left_out:
        return ""
    return f"  note      columns not kept (not JSON scalars or lists of them): {', '.join(left_out)}"
