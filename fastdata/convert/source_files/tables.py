"""Samples that are rows of Arrow or Parquet files (Hugging Face datasets, parquet exports): `TableFile` (one file's
rows, read from its metadata), `read_columns` (the columns a listing needs, never the image bytes) and `RowReader`,
the `SampleReader` that reads one row's image bytes by key.

Keys are `{prefix}/{row}` (the row number within all the files, in order, zero-padded): the reader finds the file
and the row from the key alone, so it holds no table of keys. Arrow files (IPC stream, as `datasets` writes them,
or IPC file format) are memory-mapped: a row is read without reading the rest of the file. Parquet files are read
a row group at a time (the smallest unit Parquet can read), kept in a small per-process cache, so that samples read
in order cost one read of each row group per worker; in shuffled order (WebDataset output) a row group may be read
again for each of its samples. The bytes are returned as stored: no decoding here.

An image cell is an `Image` feature's `{"bytes", "path"}` struct (bytes first; a `path`-only cell is the file at
that path, relative paths taken from the directory the listing was made in, as `datasets` takes them from the
working directory) or a binary cell holding the encoded image.

`saved_dataset_files` names the Arrow files of a folder `datasets`' `save_to_disk` wrote, in the dataset's order
(`fastdata convert hf` and `fastdata convert text` both read such folders).
"""

from __future__ import annotations

import errno
import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.convert.checkpoints import files_digest
from fastdata.errors import SourceError
from fastdata.formats.records import exception_text

TABLE_SUFFIXES = (".arrow", ".parquet")
_ARROW_FILE_MAGIC = b"ARROW1"  # the IPC file format starts with it; the IPC stream format (datasets') does not
_OPEN_FILES = 64  # per process: memory maps / parquet handles kept open
ROW_GROUP_CACHE_BYTES = 256 << 20  # per process: parquet row groups kept (at least the last one read)


@dataclass(frozen=True)
class TableFile:
    """One Arrow or Parquet file of a source: its path, rows and (Parquet) the first row of each row group."""

    path: Path
    rows: int
    row_group_starts: tuple[int, ...] = ()
    largest_row_group_bytes: int = 0

    @property
    def parquet(self) -> bool:
        return self.path.suffix.lower() == ".parquet"


def open_table_file(path: Path | str) -> TableFile:
    """The rows of the Arrow or Parquet file `path`, from its metadata (Arrow: counted over the memory map)."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path).metadata
            groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
            starts = tuple(int(s) for s in np.cumsum([0] + [g.num_rows for g in groups])[:-1])
            return TableFile(path, meta.num_rows, starts, max((g.total_byte_size for g in groups), default=0))
        return TableFile(path, _arrow_table(path).num_rows)
    except (OSError, ValueError) as exc:  # pyarrow's errors are OSError (IO) or ValueError (ArrowInvalid)
        raise SourceError(f"{path}: not a readable {path.suffix.lstrip('.')} file ({exception_text(exc)})") from exc


def saved_dataset_files(directory: Path) -> list[Path] | None:
    """The Arrow files of the dataset `save_to_disk` wrote to `directory`, in order (None: not a saved dataset).
    A saved DatasetDict is refused, naming its splits: one split's folder is the source."""
    if (directory / "dataset_dict.json").is_file():
        try:
            splits = json.loads((directory / "dataset_dict.json").read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            splits = ["?"]
        raise SourceError(f"{directory}: a saved DatasetDict (splits: {', '.join(splits)}); name one split's "
                          f"folder, e.g. {directory / splits[0]}")
    if not (directory / "state.json").is_file():
        return None
    try:
        names = [entry["filename"] for entry in json.loads((directory / "state.json").read_text())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{directory / 'state.json'}: unreadable ({exc}); save the dataset again") from exc
    return [directory / name for name in names]


def read_schema(path: Path | str) -> Any:
    """The pyarrow schema of an Arrow or Parquet file (with its `huggingface` metadata, when it has some)."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_schema(path)
        return _arrow_table(path).schema
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: not a readable {path.suffix.lstrip('.')} file ({exception_text(exc)})") from exc


def read_columns(file: TableFile, columns: Sequence[str]) -> Any:
    """The pyarrow table of `columns` of `file` (memory-mapped for Arrow; only those columns read for Parquet)."""
    try:
        if file.parquet:
            import pyarrow.parquet as pq

            return pq.ParquetFile(file.path).read(columns=list(columns))
        return _arrow_table(file.path).select(list(columns))
    except (OSError, ValueError) as exc:
        raise SourceError(f"{file.path}: columns {', '.join(columns)} unreadable ({exception_text(exc)})") from exc


def _arrow_table(path: Path) -> Any:
    """The whole Arrow file as a table over its memory map (nothing is read until a value is used)."""
    import pyarrow as pa

    source = pa.memory_map(str(path), "r")
    if source.read(len(_ARROW_FILE_MAGIC)) == _ARROW_FILE_MAGIC:
        source.seek(0)
        return pa.ipc.open_file(source).read_all()
    source.seek(0)
    return pa.ipc.open_stream(source).read_all()


def row_key(prefix: str, row: int, rows: int) -> str:
    """The key of row `row` (of `rows`): `prefix/000017`, padded so that keys sort in row order."""
    return f"{prefix}/{row:0{max(5, len(str(max(rows - 1, 0))))}d}"


class RowReader:
    """The SampleReader of sources whose samples are rows of Arrow / Parquet files (see the module docstring):
    `files` in order, the image in `column`, keys made by `row_key(prefix, ...)`; `name` is the source in one line
    (`describe()`), `base` the directory relative image paths are taken from."""

    def __init__(self, files: Sequence[TableFile], column: str, prefix: str, name: str, base: Path | str) -> None:
        self.files = list(files)
        self.column = column
        self.prefix = prefix
        self.name = name
        self.base = Path(base)
        self.starts = np.cumsum([0] + [f.rows for f in self.files])
        self._reset()

    def _reset(self) -> None:
        self._arrow: OrderedDict[int, tuple[Any, np.ndarray]] = OrderedDict()  # file -> (column, chunk starts)
        self._parquet: OrderedDict[int, Any] = OrderedDict()  # file -> ParquetFile
        self._groups: OrderedDict[tuple[int, int], Any] = OrderedDict()  # (file, row group) -> column values
        self._group_bytes = 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_arrow", "_parquet", "_groups", "_group_bytes"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    # ------------------------------------------------------------------------------------------- SampleReader

    def read(self, key: str) -> bytes:
        number, row = self._place(self.row_of(key))
        try:
            cell = self._cell(number, row)
        except (OSError, ValueError) as exc:  # a damaged file: its samples are rejected with the reason
            raise OSError(errno.EIO, f"{self.files[number].path.name} unreadable ({exception_text(exc)})") from exc
        return self._image_bytes(cell)

    def locate(self, key: str) -> str:
        index = self.row_of(key)
        number, row = self._place(index)
        return f"{self.files[number].path} row {row} ({self.prefix} row {index})"

    def describe(self) -> str:
        return self.name

    def digest(self, keys: Sequence[str]) -> str:
        """Each file's name, size and mtime, and which column of which split is read (not the keys: the listing's
        fingerprint holds them)."""
        files = files_digest((str(f.path), f.path) for f in self.files)
        return hashlib.sha256(f"{files}\t{self.column}\t{self.prefix}".encode()).hexdigest()

    # ------------------------------------------------------------------------------------------------ helpers

    def row_of(self, key: str) -> int:
        prefix, _, row = key.rpartition("/")
        if prefix != self.prefix or not row.isdigit() or int(row) >= self.starts[-1]:
            raise OSError(errno.ENOENT, f"no row {key!r} in this source", key)
        return int(row)

    def _place(self, index: int) -> tuple[int, int]:
        """(file number, row within that file) of row `index` of the source."""
        number = int(np.searchsorted(self.starts, index, side="right")) - 1
        return number, index - int(self.starts[number])

    def _cell(self, number: int, row: int) -> Any:
        """The Python value of the image cell at `row` of file `number`."""
        if self.files[number].parquet:
            starts = self.files[number].row_group_starts
            group = int(np.searchsorted(starts, row, side="right")) - 1
            return self._row_group(number, group)[row - starts[group]].as_py()
        column, chunk_starts = self._arrow_column(number)
        chunk = int(np.searchsorted(chunk_starts, row, side="right")) - 1
        return column.chunk(chunk)[row - int(chunk_starts[chunk])].as_py()

    def _arrow_column(self, number: int) -> tuple[Any, np.ndarray]:
        if number not in self._arrow:
            column = _arrow_table(self.files[number].path).column(self.column)
            self._arrow[number] = column, np.cumsum([0] + [len(chunk) for chunk in column.chunks])
            if len(self._arrow) > _OPEN_FILES:
                self._arrow.popitem(last=False)
        self._arrow.move_to_end(number)
        return self._arrow[number]

    def _row_group(self, number: int, group: int) -> Any:
        import pyarrow.parquet as pq

        if (number, group) in self._groups:
            self._groups.move_to_end((number, group))
            return self._groups[number, group]
        if number not in self._parquet:
            self._parquet[number] = pq.ParquetFile(self.files[number].path)
            if len(self._parquet) > _OPEN_FILES:
                self._parquet.popitem(last=False)
        self._parquet.move_to_end(number)
        values = self._parquet[number].read_row_group(group, columns=[self.column]).column(0).combine_chunks()
        self._groups[number, group] = values
        self._group_bytes += values.nbytes
        while len(self._groups) > 1 and self._group_bytes > ROW_GROUP_CACHE_BYTES:
            _, dropped = self._groups.popitem(last=False)
            self._group_bytes -= dropped.nbytes
        return values

    def _image_bytes(self, cell: Any) -> bytes:
        if isinstance(cell, bytes):
            return cell
        if cell is None:
            raise OSError(errno.ENODATA, "the row's image is null")
        data, path = cell.get("bytes"), cell.get("path")
        if data is not None:
            return data
        if not path:
            raise OSError(errno.ENODATA, "the row's image has neither bytes nor a path")
        if "://" in path:
            raise OSError(errno.ENOENT, f"the row's image is only a remote path ({path}), not read")
        try:
            return (self.base / path).read_bytes()
        except OSError as exc:
            raise OSError(exc.errno, f"its image file {self.base / path}: {exc.strerror or exc}") from exc
