"""File lists -> the image conversion driver (`fastdata.convert.images`): `fastdata convert list LIST OUT`.

LIST is a `.csv`, `.tsv`, `.jsonl` or `.parquet` file, or a folder or glob of them (concatenated in sorted order),
read with pyarrow. One row per image:

- `--image-column` (default `path`): the image's path, relative to `--root` (default: the folder of LIST). The
  normalised path is the sample's key. A path that leaves the root (`..`, or an absolute path outside it) is
  refused unless `--allow-outside-root`; a path listed twice is refused.
- `--label-column` (default `label`): class names (strings; classes = the sorted unique names, as ImageFolder's
  class folders), integer class ids (kept as given; classes "0".."C-1", C = `--num-classes` or the largest id + 1),
  or lists of either (multi-label; duplicates in a row count once, `[]` is a sample of no class). In CSV/TSV,
  where every cell is text, a cell of digits is an id and a cell holding a JSON or Python list (`[1, 2]`,
  `['cat', 'dog']`, as pandas writes lists) is a list. A column mixing these types is refused. A cell of text
  joined by `;`, `|` or `,` (`cat;dog`) is one class name: when class names look like such joins, the conversion
  warns (write `["cat", "dog"]` for two labels).
- A missing label (null, empty cell, NaN) is refused, naming its row: every sample needs one; a multi-label sample
  of no class is written `[]`.
- `--mask-column` (semantic segmentation, `fastdata.convert.masks`): the column holding each image's label map, a
  path relative to the root like the image's: a single-channel PNG of class ids (8-bit; 16-bit when ids exceed
  255; a palette PNG's indices are its ids, as VOC ships them), stored losslessly with the image. The label
  column is then optional: without one every sample is in one class, "unlabelled"; `--num-classes` bounds the
  label maps' ids (the `--ignore-index`, default 255, apart) instead of the labels'. A row without a label map,
  a label map that is missing, not a PNG (a JPEG is lossy), a colour (RGB) map or one with an alpha channel is a
  one-line error naming its row, before anything is written; one whose size differs from its decoded image, or
  holding an id not below `--num-classes`, is rejected like an undecodable image, named with its row.
- Every other column (or those named by `--metadata-columns`) is kept per sample as JSON scalars: text, numbers,
  booleans, None (null, empty cells and NaN), dates and times as ISO text, and lists of these (kept as lists).
  Objects and binary values are refused.

Rows are numbered from 1 in each list file, the CSV header not counted. Every problem with the list itself
(missing column, empty list, duplicates, mixed label types, paths outside the root, ...) is a one-line error naming
the file, row and column, before anything is written. A listed image that is missing or unreadable is rejected
like an ImageFolder file, named in the summary and the manifest with its list file and row.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from fastdata.config import check_bool, check_int, check_optional_int
from fastdata.convert.images import ConversionSummary, convert_images
from fastdata.convert.masks import LabelMapTargets, scan_label_maps
from fastdata.convert.options import (
    ImageConversionOptions,
    check_column,
    check_names,
    check_path,
    normalise,
    spelled,
)
from fastdata.convert.source_files.file_lists import (
    ColumnMetadata,
    ListOptions,
    Rows,
    default_root,
    list_files,
    metadata_names,
    metadata_values,
    path_keys,
    read_table,
    relative_key,
    type_name,
)
from fastdata.convert.sources import NO_LABEL_CLASS, ImageSource, labels_of
from fastdata.errors import ConfigError, SourceError
from fastdata.formats.manifest import Manifest
from fastdata.formats.masks import DEFAULT_IGNORE_INDEX
from fastdata.formats.records import Label

_INTEGER = re.compile(r"-?\d+")
_NUMBER = re.compile(r"-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?|-?(nan|inf|infinity)", re.IGNORECASE)


def _check(options: ListOptions) -> None:
    """How a list is read, checked (one line naming the option and the value)."""
    check_column("image_column", options.image_column)
    check_column("label_column", options.label_column)
    check_column("mask_column", options.mask_column, optional=True)
    check_bool("allow_outside_root", options.allow_outside_root)
    num_classes = check_optional_int("num_classes", options.num_classes)
    if num_classes is not None and num_classes < 1:
        raise ConfigError(f"--num-classes must be at least 1, got {options.num_classes}")
    if not 0 <= check_int("ignore_index", options.ignore_index) <= 65535 and options.mask_column is not None:
        raise ConfigError(f"--ignore-index must be within 0..65535 (a label map's pixel value), got "
                          f"{options.ignore_index}")


@dataclass(frozen=True, kw_only=True)
class FileListOptions(ImageConversionOptions):
    """How `fastdata.convert_list` converts a file list: how the list is read (below), and the options of every
    image conversion (`fastdata.convert.options.ImageConversionOptions`). Checked when made.

    Attributes:
        root: the folder the image paths are relative to (None: the list's folder).
        image_column: the column holding each image's path.
        label_column: the column holding each label: a class name, an integer class id, or a list of either
            (multi-label: loaded as multi-hot float32 `[B, C]`). Optional with `mask_column`: without it, every
            sample is in one class, "unlabelled".
        num_classes: the number of classes of integer labels (None: the largest id + 1); with `mask_column`, the
            bound on the label maps' class ids instead (checked; the ignore index apart).
        allow_outside_root: accept image paths outside `root` (`..`, absolute paths elsewhere).
        metadata_columns: the columns kept as per-sample metadata, a list or "A,B" (None: every other column;
            empty: none).
        mask_column: semantic segmentation: the column holding each image's label map, a single-channel PNG of
            class ids (8- or 16-bit, or palette indices), relative to `root`; stored losslessly, and
            `fastdata.dataset(out)[i]` gives `(image, mask)`.
        ignore_index: with `mask_column`: the label maps' "no class" value, left out of the class ids counted and
            of the `num_classes` check.
    """

    root: str | os.PathLike[str] | None = None
    image_column: str = "path"
    label_column: str = "label"
    num_classes: int | None = None
    allow_outside_root: bool = False
    metadata_columns: str | Sequence[str] | None = None
    mask_column: str | None = None
    ignore_index: int = DEFAULT_IGNORE_INDEX

    def __post_init__(self) -> None:
        """Each value checked (one line naming the option and the value), the root and the metadata columns
        normalised (a str, a tuple)."""
        super().__post_init__()
        normalise(self, root=check_path("root", self.root),
                  metadata_columns=check_names("metadata_columns", self.metadata_columns))
        _check(self.list_options())

    def list_options(self) -> ListOptions:
        """How the list is read (what the manifest records)."""
        return ListOptions(self.root, self.image_column, self.label_column, self.num_classes,  # type: ignore[arg-type]
                           self.allow_outside_root, self.metadata_columns,  # type: ignore[arg-type]
                           self.mask_column, self.ignore_index)


def scan(spec: str | os.PathLike[str], options: ListOptions | None = None) -> ImageSource:
    """List the samples of the list(s) LIST names (see the module docstring); SourceError/ConfigError naming the
    file, row and column of the first problem."""
    options = options or ListOptions()
    _check(options)
    files = list_files(spec)
    root = Path(options.root) if options.root is not None else default_root(spec)
    if not root.is_dir():
        raise SourceError(f"{root}: the root of the list's image paths is not a folder (--root)")
    paths: list[Any] = []
    labels: list[Any] = []
    columns: dict[str, list[Any]] = {}
    starts: list[int] = []
    masks: list[Any] = []
    with_labels = True  # a segmentation list may have no label column
    for path in files:
        table = read_table(path, options.named_columns)
        names = list(table.column_names)
        roles = [("--image-column", options.image_column), ("--label-column", options.label_column)]
        if options.mask_column is not None:  # labels optional: those of the first list file say
            roles[1] = ("--mask-column", options.mask_column)
            if path == files[0]:
                with_labels = options.label_column in names
            elif not with_labels and options.label_column in names:
                raise SourceError(f"{path}: has a label column {options.label_column!r}, the first list "
                                  f"{files[0]} has none; label every list's images or none")
            if with_labels:
                roles.append(("--label-column", options.label_column))
        for role, name in roles:
            if name not in names:
                raise SourceError(f"{path}: no column {name!r} (its columns: {', '.join(names) or 'none'}); name "
                                  f"the right one with {role}")
        kept = metadata_names(path, names, options)
        starts.append(len(paths))
        for name in kept:
            values = metadata_values(path, name, table.column(name).to_pylist())
            columns.setdefault(name, [None] * len(paths)).extend(values)
        paths.extend(table.column(options.image_column).to_pylist())
        if with_labels:
            labels.extend(table.column(options.label_column).to_pylist())
        if options.mask_column is not None:
            masks.extend(table.column(options.mask_column).to_pylist())
        for values in columns.values():
            values.extend([None] * (len(paths) - len(values)))  # a column this file lacks
    rows = Rows(files, starts)
    if not paths:
        raise SourceError(f"{spec}: the list has no rows (every image to convert is one row)")
    keys = path_keys(paths, rows, root, options)
    text_cells = [p.suffix.lower() in (".csv", ".tsv") for p in files]
    targets = None
    if options.mask_column is not None:
        mask_keys = [relative_key(value, index, rows, root, options, options.mask_column)[0]
                     for index, value in enumerate(masks)]
        mask_paths = [Path(key) if os.path.isabs(key) else root / key for key in mask_keys]
        targets = LabelMapTargets(mask_paths, scan_label_maps(mask_paths, rows.name), options.ignore_index,
                                  options.num_classes)
    parsed: list[Label]
    if not with_labels:
        classes, parsed, kind = [NO_LABEL_CLASS], [0] * len(paths), "single"
    else:
        label_options = options if options.mask_column is None else replace(options, num_classes=None)
        classes, parsed, kind = _labels(labels, rows, label_options, text_cells)
    counts = [0] * len(classes)
    for label in parsed:
        for class_id in label if isinstance(label, tuple) else (label,):
            counts[class_id] += 1
    details: dict[str, Any] = {"lists": [str(p) for p in files], "root": str(root.absolute()),
               "list_options": {"image_column": options.image_column, "label_column": options.label_column,
                                "num_classes": options.num_classes, "allow_outside_root": options.allow_outside_root,
                                "metadata_columns": None if options.metadata_columns is None
                                else list(options.metadata_columns)}}
    if options.mask_column is not None:
        details["list_options"].update(mask_column=options.mask_column, ignore_index=options.ignore_index)
    return ImageSource("list", root, classes, list(zip(keys, parsed, strict=True)),
                       empty_classes=[name for name, n in zip(classes, counts, strict=True) if n == 0],
                       label_kind=kind, metadata=ColumnMetadata(columns, list(range(len(paths)))) if columns else None,
                       origin=rows.origin, details=details, targets=targets)


# ------------------------------------------------------------------------------------------------ labels


def _cell(value: Any, from_text: bool) -> tuple[str, Any]:
    """(type, value) of one label cell: "missing", "integer", "name", "list" (of ints or names), or the type of an
    unusable value. CSV/TSV cells are text: digits are an id, a bracketed list is a list."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return "missing", value
    if isinstance(value, str) and from_text:
        text = value.strip()
        if _INTEGER.fullmatch(text):
            return "integer", int(text)
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError:
                try:
                    parsed = ast.literal_eval(text)  # pandas writes lists of strings as Python literals
                except (ValueError, SyntaxError):
                    return "an unreadable list", value
            return ("list", parsed) if isinstance(parsed, list) else ("an unreadable list", value)
        if _NUMBER.fullmatch(text):
            return "a number", value
        return "name", value
    if isinstance(value, bool):
        return "a boolean", value
    if isinstance(value, int):
        return "integer", value
    if isinstance(value, str):
        return "name", value
    if isinstance(value, (list, tuple)):
        return "list", list(value)
    return type_name(value), value


_DESCRIBE = {"integer": "an integer class id", "name": "a class name", "list of integer": "a list of class ids",
             "list of name": "a list of class names"}


def _compatible(a: str, b: str) -> bool:
    """Whether two kinds of label cell can share a column (an empty list fits either kind of list)."""
    return a == b or ("list" in (a, b) and a.startswith("list") and b.startswith("list"))


def _labels(values: list[Any], rows: Rows, options: ListOptions, text_cells: list[bool]
            ) -> tuple[list[str], list[Label], str]:
    """(classes, label per row, "single" or "multi") from the label column's values."""
    column = options.label_column
    kinds: dict[str, int] = {}  # the kinds of label met, each with the first row holding it
    cells: list[tuple[str, Any]] = []
    for index, value in enumerate(values):
        from_text = text_cells[rows.file_of(index)]
        kind, cell = _cell(value, from_text)
        if kind == "missing":
            raise SourceError(f"{rows.name(index)}: no label in column {column!r}; every sample needs one (a "
                              "multi-label sample of no class is written [])")
        if kind == "list":
            items = [_cell(item, from_text) for item in cell]
            bad = next((item for item in items if item[0] not in ("integer", "name")), None)
            if bad is not None:
                raise SourceError(f"{rows.name(index)}: column {column!r} holds the list {value!r}, whose item "
                                  f"{bad[1]!r} is neither a class name nor a class id")
            item_kinds = {k for k, _ in items}
            if len(item_kinds) > 1:
                raise SourceError(f"{rows.name(index)}: column {column!r} holds the list {value!r}, which mixes "
                                  "class names and class ids; use one type")
            kind = f"list of {item_kinds.pop()}" if item_kinds else "list"
            cell = [v for _, v in items]
        elif kind not in ("integer", "name"):
            raise SourceError(f"{rows.name(index)}: column {column!r} holds {kind} ({value!r}); labels are class "
                              "names, integer class ids, or lists of them")
        kinds.setdefault(kind, index)
        cells.append((kind, cell))
    met = sorted(kinds.items(), key=lambda item: item[1])
    clash = next(((a, b) for i, a in enumerate(met) for b in met[i + 1:] if not _compatible(a[0], b[0])), None)
    if clash is not None:
        (kind_a, row_a), (kind_b, row_b) = clash
        raise SourceError(f"column {column!r} mixes label types: {rows.name(row_a)} holds "
                          f"{_DESCRIBE.get(kind_a, 'an empty list')} ({values[row_a]!r}), {rows.name(row_b)} "
                          f"{_DESCRIBE.get(kind_b, 'an empty list')} ({values[row_b]!r}); use one type in every row")
    multi = any(k.startswith("list") for k in kinds)
    by_name = any(k in ("name", "list of name") for k in kinds)
    if by_name:
        if options.num_classes is not None:
            raise ConfigError("--num-classes applies to integer class ids; class names make their own classes")
        classes, labels = labels_of([cell if multi else [cell] for _, cell in cells], multi)
        _warn_joined_names(classes, [cell for _, cell in cells], rows, column)
        return classes, labels, "multi" if multi else "single"
    ids = [(i, class_id) for i, (_, cell) in enumerate(cells) for class_id in (cell if multi else [cell])]
    negative = next(((i, c) for i, c in ids if c < 0), None)
    if negative is not None:
        raise SourceError(f"{rows.name(negative[0])}: label {negative[1]} in column {column!r} is negative; class "
                          "ids count from 0")
    count = options.num_classes if options.num_classes is not None else max((c for _, c in ids), default=-1) + 1
    too_big = next(((i, c) for i, c in ids if c >= count), None)
    if too_big is not None:
        raise SourceError(f"{rows.name(too_big[0])}: label {too_big[1]} in column {column!r} is not below "
                          f"--num-classes {count}")
    if count == 0:
        raise SourceError(f"column {column!r}: every row's list is empty, so there are no classes; pass "
                          "--num-classes")
    classes, labels = labels_of([cell if multi else [cell] for _, cell in cells], multi, count)
    return classes, labels, "multi" if multi else "single"


JOINERS = (";", "|", ",")


def _warn_joined_names(classes: list[str], cells: list[Any], rows: Rows, column: str) -> None:
    """Warn when class names look like several classes joined into one text (`a;b`): each such text is a class of
    its own, which is rarely what a multi-label list meant. Said when a joined name's parts are classes of their
    own, or when several class names are joined with the same character."""
    names = set(classes)
    for joiner in JOINERS:
        joined = [name for name in classes if joiner in name and all(part.strip() for part in name.split(joiner))]
        if not joined:
            continue
        if len(joined) >= 2 or any(part.strip() in names for part in joined[0].split(joiner)):
            first = next(i for i, cell in enumerate(cells) if isinstance(cell, str) and cell in joined)
            warnings.warn(
                f"{rows.name(first)}: column {column!r} holds {cells[first]!r}, which looks like labels joined by "
                f"{joiner!r} ({len(joined)} of the {len(classes)} class names do): each such text becomes one class "
                f"of its own. For several labels per image write a list, e.g. {json.dumps(cells[first].split(joiner))}"
                " (a JSON list in a CSV cell, a list in JSONL/parquet)", UserWarning, stacklevel=4)
            return


# ------------------------------------------------------------------------------------------------ API and CLI


def relist(src: str | os.PathLike[str], manifest: Manifest) -> ImageSource:
    """The list a dataset was converted from, read again as its conversion read it (`fastdata verify --source`)."""
    recorded = manifest.source.get("list_options", {})
    return scan(src, ListOptions(root=manifest.source.get("root"), image_column=recorded.get("image_column", "path"),
                                 label_column=recorded.get("label_column", "label"),
                                 num_classes=recorded.get("num_classes"),
                                 allow_outside_root=recorded.get("allow_outside_root", False),
                                 metadata_columns=None if recorded.get("metadata_columns") is None
                                 else tuple(recorded["metadata_columns"]), mask_column=recorded.get("mask_column"),
                                 ignore_index=recorded.get("ignore_index", DEFAULT_IGNORE_INDEX)))


def convert_list(list_path: str | os.PathLike[str], out: str | os.PathLike[str],
                 options: FileListOptions | None = None, **keywords: Any) -> ConversionSummary:
    """Pack the images a file list names into `out` (LMDB if it ends in `.lmdb`, or `format="wds"` shards): the
    list's columns as the module docstring says, every image verified by decoding it, missing or unusable ones
    rejected and named with their list file and row (`strict=True`: the first raises and nothing is written),
    interrupted conversions resumed by the same call.

    Args:
        list_path: the list: a `.csv`, `.tsv`, `.jsonl` or `.parquet` file, or a folder or glob of them (read in
            sorted order, one after the other).
        out: the dataset to write: `OUT.lmdb`, or a directory of WebDataset shards with `format="wds"`.
        options: how to read the list and convert (`fastdata.options.FileListOptions`; None: its defaults).
        **keywords: the options as flat keywords (deprecated: put them in `options`).
    """
    settings = spelled(FileListOptions, options, keywords, "fastdata.convert_list")
    return convert_images(lambda: scan(list_path, settings.list_options()), out, settings)


#: the option object of `fastdata convert list`, and its parameters that are not options (its arguments)
OPTIONS = FileListOptions
ARGUMENTS = ("list_path", "out")


def cli_command() -> click.Command:
    """`fastdata convert list LIST OUT ...`"""
    from fastdata.converters.options import convert_options, options_from_flags

    @click.command("list")
    @click.argument("list_path", metavar="LIST")
    @click.argument("out", type=click.Path(path_type=Path))
    @click.option("--root", type=click.Path(path_type=Path), default=None, metavar="DIR",
                  help="Folder the image paths are relative to. Default: the folder of LIST.")
    @click.option("--image-column", default="path", show_default=True, help="Column holding each image's path.")
    @click.option("--label-column", default="label", show_default=True,
                  help="Column holding each label: a class name, an integer class id, or a list of them.")
    @click.option("--num-classes", type=int, default=None,
                  help="Number of classes of integer labels. Default: the largest id + 1.")
    @click.option("--allow-outside-root", is_flag=True,
                  help="Accept image paths outside --root ('..', absolute paths elsewhere).")
    @click.option("--metadata-columns", default=None, metavar="A,B",
                  help="Columns kept as per-sample metadata. Default: every other column; '' keeps none.")
    @click.option("--mask-column", default=None,
                  help="Semantic segmentation: column holding each image's label map (a single-channel PNG of "
                       "class ids). The label column is then optional.")
    @click.option("--ignore-index", type=int, default=DEFAULT_IGNORE_INDEX, show_default=True,
                  help="With --mask-column: the label maps' 'no class' value.")
    @convert_options
    def command(list_path: str, out: Path, **flags: Any) -> None:
        """Pack the images that the file list LIST names into OUT.

        LIST is a .csv, .tsv, .jsonl or .parquet file, or a folder or glob of them (concatenated in sorted
        order), one row per image: its path, its label, and other columns kept as metadata; with
        --mask-column, its label map too (semantic segmentation).
        OUT ending in .lmdb writes one LMDB dataset (sample i = row i); --format wds writes WebDataset tar
        shards into the directory OUT.
        """
        click.echo(str(convert_list(list_path, out, options_from_flags(OPTIONS, flags, ARGUMENTS))))

    return command
