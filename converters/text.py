"""Text sources -> documents: `.jsonl` (`.jsonl.gz`, `.jsonl.zst`), `.txt` (one document per file, or per
line), `.parquet` and `.arrow` files (Arrow IPC, as Hugging Face `datasets` writes them), or directories / glob
patterns of them (sorted order). A folder written by `datasets`' `save_to_disk` is read as its Arrow files, in the
dataset's order (a saved DatasetDict: one split's folder).

A record that cannot be used (a line that is not JSON, not an object, without the text field or with a
non-string one, invalid UTF-8, a null parquet value) is reported with its file and line (or row) number and
skipped; reading goes on. Files are streamed: memory is bounded by one line (one file for `.txt` in file
mode, one record batch for parquet and arrow), not by the corpus.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from fastdata.convert.options import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CHECKPOINT_EVERY,
    DocumentConversionOptions,
    check_choice,
    check_column,
    spelled,
)
from fastdata.convert.text import TextConversionSummary, convert_documents
from fastdata.convert.text_source import Document, Rejected, SourceFile, TextSource
from fastdata.errors import ConfigError, SourceError
from fastdata.formats.records import exception_text

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".txt", ".parquet", ".arrow")
TXT_MODES = ("file", "line")
_GLOB_CHARS = frozenset("*?[")
_PARQUET_ROWS = 1024


def source_suffix(path: Path) -> str | None:
    """The supported suffix `path` ends with (case-insensitive), or None."""
    name = path.name.lower()
    return next((suffix for suffix in SUFFIXES if name.endswith(suffix)), None)


def _files_under(directory: Path) -> list[Path]:
    from fastdata.convert.source_files.tables import saved_dataset_files

    saved = saved_dataset_files(directory)
    if saved is not None:  # its data files, not the cache files `datasets` may have written beside them
        return saved
    found: list[Path] = []
    for dirpath, _dirnames, filenames in os.walk(directory, followlinks=True):
        found.extend(Path(dirpath, name) for name in filenames if source_suffix(Path(name)))
    return sorted(found, key=lambda p: p.relative_to(directory).as_posix())


def list_sources(sources: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The source files, each SRC expanded in sorted order (a directory recursively, a glob pattern by its
    matches), SRCs in the order given, duplicates dropped."""
    files: list[Path] = []
    for src in sources:
        path = Path(src)
        if not path.exists() and _GLOB_CHARS & set(str(src)):
            matches = sorted(Path(m) for m in glob.glob(str(src), recursive=True))
            found = [m for m in matches if m.is_file() and source_suffix(m)]
            if not found:
                raise SourceError(f"{src}: pattern matches no {'/'.join(SUFFIXES)} file")
        elif path.is_dir():
            found = _files_under(path)
            if not found:
                raise SourceError(f"{path}: folder holds no {'/'.join(SUFFIXES)} file")
        elif path.is_file():
            if source_suffix(path) is None:
                raise SourceError(f"{path}: unsupported source file (expected {', '.join(SUFFIXES)})")
            found = [path]
        else:
            raise SourceError(f"{path}: no such file or directory")
        files.extend(found)
    return list(dict.fromkeys(files))


def check_extras(files: Sequence[Path]) -> None:
    """Fail early, naming the extra to install, when a source needs an optional package that is missing."""
    needs = {".parquet": ("pyarrow", "parquet"), ".arrow": ("pyarrow", "parquet"), ".jsonl.zst": ("zstandard", "zstd")}
    for suffix, (module, extra) in needs.items():
        if any(source_suffix(f) == suffix for f in files):
            try:
                __import__(module)
            except ImportError as exc:
                raise ConfigError(f"reading {suffix} files needs the `{module}` package: "
                                  f"pip install 'fastdata[{extra}]'") from exc


class SourceReader(SourceFile):
    """Streams the documents (and rejections) of one source file; `tell()` is the bytes of the file read so
    far (compressed bytes for compressed files), for progress."""

    def __init__(self, path: Path, field: str = "text", txt_mode: str = "file") -> None:
        if txt_mode not in TXT_MODES:
            raise ConfigError(f"txt_mode must be one of {TXT_MODES}, got {txt_mode!r}")
        self.path = Path(path)
        self.name = str(path)
        self.field = field
        self.txt_mode = txt_mode
        self.suffix = source_suffix(self.path)
        self._raw: io.BufferedReader | None = None
        self._done = 0

    def tell(self) -> int:
        if self._raw is None or self._raw.closed:
            return self._done
        return self._raw.tell()

    def __iter__(self) -> Iterator[Document | Rejected]:
        try:
            with open(self.path, "rb") as raw:
                self._raw = raw
                if self.suffix == ".parquet":
                    yield from self._parquet()
                elif self.suffix == ".arrow":
                    yield from self._arrow(raw)
                elif self.suffix == ".txt" and self.txt_mode == "file":
                    yield from self._txt_file(raw.read())
                elif self.suffix == ".txt":
                    yield from self._txt_lines(raw)
                else:
                    yield from self._jsonl(raw)
                self._done = raw.tell()
        except OSError as exc:
            raise SourceError(f"{self.path}: unreadable ({exc.strerror or exc})") from exc

    def _open_lines(self, raw: io.BufferedReader) -> tuple[io.BufferedIOBase, tuple[type[BaseException], ...]]:
        """The decompressed line stream, and the errors that mean the compressed data is damaged."""
        if self.suffix == ".jsonl.gz":
            return gzip.GzipFile(fileobj=raw, mode="rb"), (EOFError, gzip.BadGzipFile, zlib.error)
        if self.suffix == ".jsonl.zst":
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=False)
            return io.BufferedReader(reader), (zstandard.ZstdError, EOFError)
        return raw, ()

    def _jsonl(self, raw: io.BufferedReader) -> Iterator[Document | Rejected]:
        number = 0
        lines, damaged = self._open_lines(raw)
        try:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    yield self._record(line, number)
        except damaged as exc:
            yield Rejected(self.name, number + 1,
                           f"damaged compressed file, rest of it skipped ({exception_text(exc)})")

    def _record(self, line: bytes, number: int) -> Document | Rejected:
        try:
            obj = json.loads(line)
        except UnicodeDecodeError as exc:
            return Rejected(self.name, number, f"not valid UTF-8 ({exc.reason} at byte {exc.start})")
        except json.JSONDecodeError as exc:
            return Rejected(self.name, number, f"not valid JSON ({exc.msg} at column {exc.colno})")
        if not isinstance(obj, dict):
            return Rejected(self.name, number, f"not a JSON object (a {type(obj).__name__})")
        if self.field not in obj:
            keys = ", ".join(list(obj)[:8]) or "none"
            return Rejected(self.name, number, f"no field {self.field!r} (fields: {keys})")
        text = obj[self.field]
        if not isinstance(text, str):
            return Rejected(self.name, number, f"field {self.field!r} is {type(text).__name__}, not a string")
        return Document(text, self.name, number)

    def _txt_file(self, data: bytes) -> Iterator[Document | Rejected]:
        try:
            yield Document(data.decode("utf-8"), self.name, 1)
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            yield Rejected(self.name, line, f"not valid UTF-8 ({exc.reason}); whole file skipped")

    def _txt_lines(self, raw: io.BufferedReader) -> Iterator[Document | Rejected]:
        for number, line in enumerate(raw, 1):
            line = line.rstrip(b"\r\n")
            if not line.strip():
                continue
            try:
                yield Document(line.decode("utf-8"), self.name, number)
            except UnicodeDecodeError as exc:
                yield Rejected(self.name, number, f"not valid UTF-8 ({exc.reason} at byte {exc.start})")

    def _parquet(self) -> Iterator[Document | Rejected]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as exc:
            yield Rejected(self.name, 0, f"not a readable parquet file ({exception_text(exc)})")
            return
        if (problem := self._unusable_column(table.schema_arrow)) is not None:
            yield problem
            return
        yield from self._column(table.iter_batches(batch_size=_PARQUET_ROWS, columns=[self.field]), 0)

    def _arrow(self, raw: io.BufferedReader) -> Iterator[Document | Rejected]:
        """An Arrow IPC stream (what `datasets` writes) or IPC file, one record batch at a time."""
        import pyarrow as pa

        try:
            if raw.read(6) == b"ARROW1":
                raw.seek(0)
                whole = pa.ipc.open_file(raw)
                schema = whole.schema
                batches: Iterator[Any] = (whole.get_batch(i) for i in range(whole.num_record_batches))
            else:
                raw.seek(0)
                stream = pa.ipc.open_stream(raw)
                schema, batches = stream.schema, iter(stream)
        except (pa.ArrowException, OSError) as exc:
            yield Rejected(self.name, 0, f"not a readable arrow file ({exception_text(exc)})")
            return
        if (problem := self._unusable_column(schema)) is not None:
            yield problem
            return
        try:
            yield from self._column(batches, schema.get_field_index(self.field))
        except (pa.ArrowException, OSError) as exc:
            yield Rejected(self.name, 0, f"damaged arrow file, rest of it skipped ({exception_text(exc)})")

    def _unusable_column(self, schema: Any) -> Rejected | None:
        """Why the text column of a parquet / arrow file with `schema` cannot be read (None: it can)."""
        import pyarrow as pa

        if self.field not in schema.names:
            return Rejected(self.name, 0, f"no column {self.field!r} (columns: {', '.join(schema.names[:8])})")
        kind = schema.field(self.field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            return Rejected(self.name, 0, f"column {self.field!r} is {kind}, not a string")
        return None

    def _column(self, batches: Iterator[Any], index: int) -> Iterator[Document | Rejected]:
        """The documents of column `index` of the record `batches`, rows numbered from 1 (a null is rejected)."""
        row = 0
        for batch in batches:
            for text in batch.column(index).to_pylist():
                row += 1
                if text is None:
                    yield Rejected(self.name, row, f"row {row}: column {self.field!r} is null")
                else:
                    yield Document(text, self.name, row)


def text_source(sources: Sequence[str | os.PathLike[str]], field: str = "text", txt_mode: str = "file") -> TextSource:
    """The text source the driver reads: the files `sources` name (files, folders, glob patterns), each read as
    `field` of its JSONL lines / parquet or arrow rows, or as .txt per `txt_mode`."""
    files = list_sources(sources)
    check_extras(files)
    return TextSource(files, lambda number: SourceReader(files[number], field, txt_mode), [str(s) for s in sources],
                      {"field": field, "txt_mode": txt_mode})


@dataclass(frozen=True, kw_only=True)
class TextConversionOptions(DocumentConversionOptions):
    """How `fastdata.convert_text` reads text files (below) and tokenizes and stores their documents (the options
    of `fastdata.convert.options.DocumentConversionOptions`). Checked when made.

    Attributes:
        field: the JSONL field / parquet or arrow column that holds the text.
        txt_mode: .txt files: "file" (one document per file) or "line" (one per non-blank line).
    """

    field: str = "text"
    txt_mode: str = "file"

    def __post_init__(self) -> None:
        """Each value checked (one line naming the option and the value)."""
        super().__post_init__()
        check_column("field", self.field)
        check_choice("txt_mode", self.txt_mode, TXT_MODES)


def convert_text(src: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                 options: TextConversionOptions | None = None, *, tokenizer: str | os.PathLike[str],
                 **keywords: Any) -> TextConversionSummary:
    """Tokenize the text files `src` (a file, folder or glob, or a list of them) into `out` (LMDB if it ends in
    `.lmdb`, or `format="wds"` shards), with the `tokenizers` file `tokenizer`: each document stored whole as its
    exact ids, in source order; unusable records reported and skipped; an interrupted conversion resumed by the
    same call.

    Args:
        src: .jsonl, .jsonl.gz, .jsonl.zst, .txt, .parquet or .arrow files, folders or glob patterns of them, or a
            list.
        out: the dataset to write: `OUT.lmdb`, or a directory of WebDataset shards with `format="wds"`.
        options: how to read, tokenize and store (`fastdata.options.TextConversionOptions`; None: its defaults).
        tokenizer: a `tokenizers` tokenizer.json file (copied into `out`).
        **keywords: the options as flat keywords (deprecated: put them in `options`).
    """
    settings = spelled(TextConversionOptions, options, keywords, "fastdata.convert_text")
    sources = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    return convert_documents(lambda: text_source(sources, settings.field, settings.txt_mode), out,
                             tokenizer=tokenizer, options=settings)


#: the option object of `fastdata convert text`, and its parameters that are not options (its arguments)
OPTIONS = TextConversionOptions
ARGUMENTS = ("src", "out", "tokenizer")


def cli_command() -> click.Command:
    """`fastdata convert text SRC... OUT --tokenizer tokenizer.json ...`"""
    from fastdata.converters.options import options_from_flags, output_options

    @click.command("text")
    @click.argument("src", nargs=-1, required=True)
    @click.argument("out", type=click.Path(path_type=Path))
    @click.option("--tokenizer", required=True, type=click.Path(path_type=Path), metavar="PATH",
                  help="A `tokenizers` tokenizer.json file (copied into OUT).")
    @click.option("--field", default="text", show_default=True,
                  help="JSONL field / parquet or arrow column of the text.")
    @click.option("--txt-mode", type=click.Choice(TXT_MODES), default="file", show_default=True,
                  help=".txt files: one document per file, or one per non-blank line.")
    @click.option("--eos-token", default=None, metavar="TOKEN",
                  help="End-of-text token appended to every document when packing. Default: found among the "
                       "tokenizer's special tokens (<|endoftext|>, </s>, [SEP], ...).")
    @click.option("--batch-size", default=DEFAULT_BATCH_SIZE, show_default=True,
                  help="Text per tokenizer batch (bounds memory): 1MB, 512KB, ...")
    @click.option("--checkpoint-every", default=DEFAULT_CHECKPOINT_EVERY, show_default=True, metavar="SIZE",
                  help="Source read between checkpoints: an interrupted conversion resumes from its last one "
                       "(rerun the same command). Does not change the dataset.")
    @click.option("--workers", type=int, default=None,
                  help="Tokenize on N worker processes, one thread each. Default: one per core, as image "
                       "conversions; 0: in this process, on the tokenizer's own threads. The same dataset "
                       "either way.")
    @output_options
    def command(src: tuple[str, ...], out: Path, tokenizer: Path, **flags: Any) -> None:
        """Tokenize the text files SRC... (.jsonl, .jsonl.gz, .jsonl.zst, .txt, .parquet, .arrow, folders or quoted
        glob patterns of them, a Hugging Face save_to_disk folder) into OUT.

        OUT ending in .lmdb writes one LMDB dataset; --format wds writes WebDataset tar shards into the
        directory OUT. Documents keep source order; load them with
        fastdata.loader(OUT, text=TextOptions(seq_len=...)).
        """
        click.echo(str(convert_text(list(src), out, options_from_flags(OPTIONS, flags, ARGUMENTS),
                                    tokenizer=tokenizer)))

    return command
