"""File lists read as tables: what `fastdata convert list` and `fastdata convert pairs` share when their source is
a list of image paths.

LIST is a `.csv`, `.tsv`, `.jsonl` or `.parquet` file, or a folder or glob of them (concatenated in sorted order):
`list_files` finds them, `default_root` is what their image paths are relative to, `read_table` reads one with
pyarrow (one-line errors naming the file), `Rows` numbers the rows of the concatenated lists (from 1 in each file,
the CSV header not counted) for messages and the manifest, `path_keys` turns the image path column into sample
keys (normalised, relative to the root; paths outside it or listed twice refused, naming their rows), and
`metadata_names` / `metadata_values` / `ColumnMetadata` keep the other columns as per-sample metadata. Each
converter keeps its own columns' meaning (labels, captions) to itself.
"""

from __future__ import annotations

import bisect
import glob
import json
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastdata.convert.source_files.metadata import NOT_JSON, json_value
from fastdata.errors import ConfigError, SourceError
from fastdata.formats.masks import DEFAULT_IGNORE_INDEX

SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet")


# ------------------------------------------------------------------------------------------------ list files


def list_files(spec: str | os.PathLike[str]) -> list[Path]:
    """The list files LIST names: the file itself, the list files of a folder, or those a glob matches (sorted)."""
    text = str(spec)
    path = Path(text)
    if glob.has_magic(text):
        found = sorted(Path(p) for p in glob.glob(text) if Path(p).suffix.lower() in SUFFIXES and Path(p).is_file())
        if not found:
            raise SourceError(f"{text}: matches no {'/'.join(SUFFIXES)} file")
        return found
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file())
        if not found:
            raise SourceError(f"{path}: folder holds no {'/'.join(SUFFIXES)} file")
        return found
    if not path.exists():
        raise SourceError(f"{path}: no such file or folder")
    if path.suffix.lower() not in SUFFIXES:
        raise SourceError(f"{path}: not a list file (expected {', '.join(SUFFIXES)}, or a folder or glob of them)")
    return [path]


def default_root(spec: str | os.PathLike[str]) -> Path:
    """What image paths are relative to when `--root` is not given: LIST's folder (a folder LIST itself; for a
    glob, the folder its pattern starts in)."""
    path = Path(spec)
    if glob.has_magic(str(spec)):
        while glob.has_magic(str(path)):
            path = path.parent
        return path
    return path if path.is_dir() else path.parent


def read_table(path: Path, columns_as_text: tuple[str, ...]) -> Any:
    """One list file as a pyarrow Table (CSV/TSV cells of `columns_as_text` read as text, not inferred)."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pcsv
        import pyarrow.json as pjson
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError("convert list reads lists with pyarrow: pip install 'fastdata[lists]'") from exc
    suffix = path.suffix.lower()
    try:
        if suffix in (".csv", ".tsv"):
            return pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ","),
                                 convert_options=pcsv.ConvertOptions(
                                     column_types={name: pa.string() for name in columns_as_text},
                                     strings_can_be_null=True))
        if suffix == ".jsonl":
            return pjson.read_json(path)
        return pq.read_table(path)
    except pa.ArrowInvalid as exc:
        if suffix == ".jsonl" and "changed from" in str(exc):
            _explain_json_types(path)
        if "Empty CSV file" in str(exc):
            raise SourceError(f"{path}: the list is empty (no header, no rows)") from None
        raise SourceError(f"{path}: not a readable {suffix[1:]} list ({exc})") from None
    except OSError as exc:
        raise SourceError(f"{path}: unreadable ({exc.strerror or exc})") from None


def _explain_json_types(path: Path) -> None:
    """pyarrow refuses a JSON-lines column whose values change type: name a row of each type, as for labels."""
    first: dict[str, dict[str, tuple[int, Any]]] = {}
    with open(path, encoding="utf-8") as f:
        row = 0
        for line in f:
            if not line.strip():
                continue
            row += 1
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise SourceError(f"{path} row {row}: not a JSON object ({exc})") from None
            if not isinstance(record, dict):
                raise SourceError(f"{path} row {row}: not a JSON object")
            for name, value in record.items():
                if value is not None:
                    seen = first.setdefault(name, {})
                    seen.setdefault(type_name(value), (row, value))
                    if len(seen) > 1:
                        (type_a, (row_a, a)), (type_b, (row_b, b)) = list(seen.items())[:2]
                        raise SourceError(f"{path}: column {name!r} mixes types: row {row_a} holds {type_a} ({a!r}), "
                                          f"row {row_b} {type_b} ({b!r}); use one type in every row")


def type_name(value: Any) -> str:
    """A cell's type as messages name it ("an integer", "text", "a list", ...)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


# ------------------------------------------------------------------------------------------------ rows


@dataclass
class Rows:
    """Where each row of the concatenated lists comes from: list file and row number (from 1)."""

    files: list[Path]
    starts: list[int]  # global index of each file's first row

    def file_of(self, index: int) -> int:
        return bisect.bisect_right(self.starts, index) - 1

    def place(self, index: int) -> tuple[Path, int]:
        file = self.file_of(index)
        return self.files[file], index - self.starts[file] + 1

    def name(self, index: int) -> str:
        path, row = self.place(index)
        return f"{path} row {row}"

    def origin(self, index: int) -> dict[str, Any]:
        path, row = self.place(index)
        return {"list": str(path), "row": row}


class ColumnMetadata(Sequence):
    """Per-sample metadata kept as columns (one list per name), made into a dict only when a sample's is asked for:
    a million rows stay a few lists, not a million dicts."""

    def __init__(self, columns: dict[str, list[Any]], rows: list[int]) -> None:
        self.columns = columns
        self.rows = rows  # the list row of each sample

    @property
    def fields(self) -> list[str]:
        return list(self.columns)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        row = self.rows[index]
        return {name: values[row] for name, values in self.columns.items()}


@dataclass(frozen=True)
class ListOptions:
    """How a list is read (recorded in the manifest, so that `verify --source` reads it again the same way)."""

    root: str | None = None
    image_column: str = "path"
    label_column: str = "label"
    num_classes: int | None = None
    allow_outside_root: bool = False
    metadata_columns: tuple[str, ...] | None = None  # None: every other column
    mask_column: str | None = None  # semantic segmentation: the column of label map paths
    ignore_index: int = DEFAULT_IGNORE_INDEX  # with mask_column: the label maps' "no class" id

    @property
    def named_columns(self) -> tuple[str, ...]:
        """The columns with a role (not metadata)."""
        return (self.image_column, self.label_column) + ((self.mask_column,) if self.mask_column else ())


# ------------------------------------------------------------------------------------------------ metadata


def metadata_names(path: Path, names: list[str], options: ListOptions) -> list[str]:
    """The columns of list file `path` kept as metadata: `options.metadata_columns` (each checked), or every column
    without a role."""
    others = [n for n in names if n not in options.named_columns]
    if options.metadata_columns is None:
        return others
    unknown = [n for n in options.metadata_columns if n not in others]
    if unknown:
        raise SourceError(f"{path}: no metadata column {unknown[0]!r} (its other columns: "
                          f"{', '.join(others) or 'none'}); fix --metadata-columns")
    return list(options.metadata_columns)


def metadata_values(path: Path, name: str, values: list[Any]) -> list[Any]:
    """A metadata column's values as metadata keeps them (fastdata.convert.source_files.metadata: JSON scalars and
    lists of them); objects and binary values refused, naming the row."""
    out = []
    for row, value in enumerate(values, start=1):
        kept = json_value(value)
        if kept is NOT_JSON:
            raise SourceError(f"{path} row {row}: column {name!r} holds {type_name(value)}; metadata columns hold "
                              "text, numbers, booleans or lists of them: leave it out with --metadata-columns")
        out.append(kept)
    return out


# ------------------------------------------------------------------------------------------------ paths


def relative_key(value: Any, index: int, rows: Rows, root: Path, options: ListOptions, column: str
                 ) -> tuple[str, bool]:
    """(key, outside): a path cell normalised relative to the root (absolute when outside it); SourceError naming
    the row for an empty cell, or a path outside the root unless allowed."""
    if not isinstance(value, str) or not value:
        raise SourceError(f"{rows.name(index)}: column {column!r} holds no path ({value!r})")
    if os.path.isabs(value):
        normal = os.path.normpath(value)
        relative = os.path.relpath(normal, os.path.abspath(root))
        outside = relative == ".." or relative.startswith("../")
        key = normal if outside else Path(relative).as_posix()
    else:
        key = posixpath.normpath(value)
        outside = key == ".." or key.startswith("../")
    if outside and not options.allow_outside_root:
        raise SourceError(f"{rows.name(index)}: path {value!r} is outside the root {root} (refused; pass "
                          "--allow-outside-root to convert images from outside it, or --root a folder that "
                          "holds them all)")
    return key, outside


def path_keys(paths: list[Any], rows: Rows, root: Path, options: ListOptions) -> list[str]:
    """Each row's image path as its key (normalised, relative to the root); refuses empty paths, paths outside the
    root (unless allowed) and paths listed twice."""
    keys: list[str] = []
    first: dict[str, int] = {}
    duplicate: str | None = None
    for index, value in enumerate(paths):
        key, _ = relative_key(value, index, rows, root, options, options.image_column)
        if key in first and duplicate is None:
            duplicate = key
        first.setdefault(key, index)
        keys.append(key)
    if duplicate is not None:
        where = [rows.name(i) for i, key in enumerate(keys) if key == duplicate]
        more = len(keys) - len(first)
        raise SourceError(f"path {duplicate!r} is listed {len(where)} times: {', '.join(where)} (every image may be "
                          f"listed once; {more} {'rows repeat' if more != 1 else 'row repeats'} an earlier path)")
    return keys
