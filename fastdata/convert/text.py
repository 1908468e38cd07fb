"""The text conversion driver, generic over the source: a source's documents (`TextSource`, made by a converter in
`fastdata.converters`) -> batched parallel tokenization
(`tokenizers`' own Rust thread pool) -> token storage writer -> tokenizer copy -> manifest, written last.

A reader thread parses the sources while the tokenizer (which releases the GIL) encodes the previous batch,
through a queue of a few batches, so memory stays bounded by the batch size, whatever the corpus size. The
output is built under `OUT.partial` and renamed into place after the manifest; an interrupted conversion
keeps its last checkpoint there and resumes from it when rerun (see `fastdata.convert.checkpoints`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastdata._version import __version__
from fastdata.config import available_cores, parse_size
from fastdata.convert.checkpoints import (
    ProgressRecord,
    files_digest,
    fingerprint,
    keep_checkpoint_on_failure,
    open_or_resume,
)
from fastdata.convert.engines.pool import PoolStats
from fastdata.convert.kept import check_kept, rejection_limit
from fastdata.convert.options import DocumentConversionOptions, spelled
from fastdata.convert.staging import Staging, check_shard_count
from fastdata.convert.staging import shard_bytes as staged_shard_bytes
from fastdata.convert.text_source import Batch, Document, Rejected, TextSource, in_background, read_batches
from fastdata.convert.text_work import encode, encoded_batches, splitter_for, splitting_notes
from fastdata.errors import RejectedFileError, SourceError
from fastdata.formats.lmdb_text import TextLmdbWriter
from fastdata.formats.manifest import MANIFEST_NAME, FileEntry, Manifest, sha256_file, sha256_files, write_atomic
from fastdata.formats.registry import WriterOptions, resolve_format, storage
from fastdata.formats.tar_shards import PROGRESS_FILE
from fastdata.formats.tokens import TOKENIZER_FILE, token_dtype
from fastdata.formats.wds_text import TextWdsWriter
from fastdata.text.splitting import DocumentSplitter
from fastdata.text.tokenizer import load_tokenizer, resolve_eos, resolve_pad, vocab_size

MAX_LISTED_REJECTIONS = 10_000  # the manifest lists this many rejected records; all are counted
_QUEUE_BATCHES = 3  # batches the reader thread may be ahead of the tokenizer


@dataclass
class TextConversionSummary:
    """What a text conversion did; `str()` gives the end-of-run summary the CLI prints."""

    out: Path
    format: str
    documents: int
    tokens: int
    dtype: str
    max_document_tokens: int
    source_files: int
    files: list[FileEntry]
    rejected: list[Rejected]
    rejected_count: int
    eos: tuple[str, int] | None
    bytes_in: int
    bytes_out: int
    seconds: float
    notes: list[str] = field(default_factory=list)
    resumed_at: int | None = None  # source records already consumed by an interrupted run this one resumed
    resumed_documents: int | None = None  # and the documents it had written
    writer_waited: float | None = None  # with workers: seconds the writer (this process) waited for them

    def __str__(self) -> str:
        secs = max(self.seconds, 1e-9)
        mean = self.tokens / self.documents if self.documents else 0.0
        eos = (f"{self.eos[0]} (id {self.eos[1]})" if self.eos else
               "none found: packed loading needs --eos-token (or eos_token= in the loader)")
        lines = [note for note in self.notes if note.startswith("WARNING")]  # most of the input rejected: first
        if self.resumed_at is not None:
            lines.append(f"resumed an interrupted conversion after {self.resumed_documents or 0:,} documents "
                         f"({self.resumed_at:,} source records)")
        lines += [
            f"wrote {self.out} ({self.format}, {len(self.files)} file{'s' * (len(self.files) != 1)})",
            f"  documents {self.documents:,} from {self.source_files:,} source file"
            f"{'s' * (self.source_files != 1)}",
            f"  tokens    {self.tokens:,} ({self.dtype}; {mean:,.1f} per document, "
            f"longest {self.max_document_tokens:,})",
            f"  eos       {eos}",
            f"  bytes     {self.bytes_in / 1e6:,.1f} MB in -> {self.bytes_out / 1e6:,.1f} MB out",
            f"  time      {self.seconds:.1f} s ({self.documents / secs:,.0f} documents/s, "
            f"{self.tokens / secs / 1e6:,.2f} M tokens/s, {self.bytes_in / 1e6 / secs:,.1f} MB/s"
            + ("" if self.writer_waited is None else
               f", the writer waited for the workers {self.writer_waited / secs:.0%} of the time") + ")",
            f"  rejected  {self.rejected_count:,} records",
        ]
        lines += [f"    {r}" for r in self.rejected[:50]]
        if self.rejected_count > 50:
            lines.append(f"    ... and {self.rejected_count - 50:,} more (the first "
                         f"{MAX_LISTED_REJECTIONS:,} are listed in {MANIFEST_NAME})")
        lines += [f"  note      {note}" for note in self.notes if not note.startswith("WARNING")]
        return "\n".join(lines)


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int] | str]:
    """Tokenizing in this process (no workers): `fastdata.convert.text_work.encode`."""
    return encode(tokenizer, texts)


@dataclass
class _TextProgress(ProgressRecord):
    """Where a text conversion stands at a checkpoint; stored with the data so that the two always agree."""

    next_file: int = 0  # source files before this one are consumed,
    file_records: int = 0  # and this many records (documents and rejections) of it
    records: int = 0  # records consumed in all
    documents: int = 0
    tokens: int = 0
    longest: int = 0
    rejected: list[dict] = field(default_factory=list)  # the first MAX_LISTED_REJECTIONS, as in the manifest
    rejected_count: int = 0
    files: list[dict] = field(default_factory=list)  # finished WebDataset shards
    index_files: list[dict] = field(default_factory=list)  # and their indexes
    open_shard: dict | None = None  # the unfinished WebDataset shard (TextWdsWriter.open_shard)

    def reject(self, record: Rejected, strict: bool) -> None:
        if strict:
            raise RejectedFileError(f"{record} (--strict: nothing written)")
        self.rejected_count += 1
        if len(self.rejected) < MAX_LISTED_REJECTIONS:
            self.rejected.append({"path": record.source, "line": record.line, "reason": record.reason})


def _checkpoint(writer: TextLmdbWriter | TextWdsWriter, state: _TextProgress) -> None:
    if isinstance(writer, TextWdsWriter):
        state.files = [asdict(entry) for entry in writer.finished_shards]
        state.index_files = writer.index_files
        state.open_shard = writer.open_shard
    writer.checkpoint(state.to_json())


def _tokenize_all(batches: Iterator[Batch], tokenizer: Any, writer: TextLmdbWriter | TextWdsWriter,
                  dtype: np.dtype, strict: bool, state: _TextProgress, total_bytes: int, done_bytes: int,
                  progress: bool, checkpoint_bytes: int, workers: int | None = None,
                  splitter: DocumentSplitter | None = None) -> PoolStats:
    """Tokenize and write the records of `batches` in order, counting them in `state` and checkpointing it
    whenever the writer asks (a filled LMDB chunk group, a finished shard) and after the batch that takes the
    source read past `checkpoint_bytes` more since the last byte-driven checkpoint. Returns what the tokenizing
    measured (`workers`, `splitter`: see `fastdata.convert.text_work`)."""
    from tqdm import tqdm

    checkpointed_at = done_bytes
    stats = PoolStats()
    started = last_postfix = time.perf_counter()
    documents_at_start, tokens_at_start = state.documents, state.tokens

    def figures() -> str:
        secs = max(time.perf_counter() - started, 1e-9)
        return (f"{(state.documents - documents_at_start) / secs:,.0f} docs/s, "
                f"{(state.tokens - tokens_at_start) / secs / 1e6:.2f} M tok/s, {state.rejected_count} rejected")

    with tqdm(total=total_bytes, initial=done_bytes, unit="B", unit_scale=True, desc="tokenizing",
              disable=not progress, smoothing=0.1) as bar:
        for batch, ids_of_documents in encoded_batches(in_background(batches, _QUEUE_BATCHES), tokenizer, dtype,
                                                       workers, stats, lambda tok, texts: _encode(tok, texts),
                                                       splitter):
            encoded = iter(ids_of_documents)
            for record, (file_number, consumed) in zip(batch.records, batch.marks, strict=True):
                state.next_file, state.file_records = file_number, consumed
                state.records += 1
                ids = next(encoded) if isinstance(record, Document) else record
                if isinstance(ids, Rejected):
                    state.reject(ids, strict)
                elif isinstance(ids, str):
                    state.reject(Rejected(record.source, record.line, ids), strict)
                else:
                    tokens = np.asarray(ids, dtype)
                    if isinstance(writer, TextWdsWriter):
                        writer.add(tokens, record.source, record.line)
                    else:
                        writer.add(tokens)
                    state.documents += 1
                    state.tokens += len(tokens)
                    state.longest = max(state.longest, len(tokens))
                if writer.checkpoint_due():
                    _checkpoint(writer, state)
            if batch.position - checkpointed_at >= checkpoint_bytes:
                _checkpoint(writer, state)
                checkpointed_at = batch.position
            bar.update(max(0, batch.position - bar.n))
            now = time.perf_counter()
            if now - last_postfix > 0.5:
                bar.set_postfix_str(figures())
                last_postfix = now
        bar.set_postfix_str(figures())  # the bar is left showing the final count, the summary's
    return stats


def convert_documents(list_source: Callable[[], TextSource], out: str | os.PathLike[str], *,
                      tokenizer: str | os.PathLike[str], options: DocumentConversionOptions | None = None,
                      **keywords: Any) -> TextConversionSummary:
    """Tokenize the documents of `list_source()` into `out` (LMDB if it ends in `.lmdb`, or `format="wds"`
    shards), with the `tokenizers` file `tokenizer`; the source is listed once the options have been checked.

    Each document is stored whole as `tokenizer.encode(text, add_special_tokens=False).ids` (truncation and
    padding off), as uint16 when the vocabulary fits, else uint32, in source order. Unusable records are
    reported with file and line and skipped (`strict=True` raises at the first and writes nothing; more than
    `max_rejected` fail the conversion before it commits, as for images: `fastdata.convert.kept`). An
    interrupted conversion (killed, crashed, Ctrl-C) resumes when the same call is made again, from its last
    checkpoint: one after every `checkpoint_every` of source read (default 4MB; LMDB also every
    `commit_every_chunks` chunks of `chunk_tokens` tokens, WebDataset after each shard, and a WebDataset
    checkpoint inside a shard keeps that shard's documents so far); the source records consumed before are
    skipped without being tokenized again. `checkpoint_every` does not change the dataset, so a rerun may pass
    another value.

    Args:
        list_source: lists the source documents (a converter's scan, e.g. of JSONL files).
        out: the dataset to write: `OUT.lmdb`, or a directory of WebDataset shards.
        tokenizer: a `tokenizers` tokenizer.json file (copied into `out`).
        options: how to convert (`fastdata.convert.options.DocumentConversionOptions`; None: its defaults).
        **keywords: the options as flat keywords (deprecated: put them in `options`).
    """
    settings = spelled(DocumentConversionOptions, options, keywords, "fastdata.convert.text.convert_documents")
    return _convert(list_source, Path(out), Path(tokenizer), settings)


def _convert(list_source: Callable[[], TextSource], out: Path, tokenizer_path: Path,
             settings: DocumentConversionOptions) -> TextConversionSummary:
    """`convert_documents` with its options checked."""
    limit = rejection_limit(settings.max_rejected)
    fmt = resolve_format(out, settings.format)
    shard_size, eos_token, strict, overwrite = settings.shard_size, settings.eos_token, settings.strict, \
        settings.overwrite
    progress, split_documents, chunk_tokens = settings.progress, settings.split_documents, settings.chunk_tokens
    commit_every_chunks = settings.commit_every_chunks
    shard_bytes, batch_chars = staged_shard_bytes(fmt, shard_size), parse_size(settings.batch_size)
    checkpoint_bytes = parse_size(settings.checkpoint_every)
    workers = available_cores() if settings.workers is None else (settings.workers or None)  # None: in this process
    tok = load_tokenizer(tokenizer_path)
    tokenizer_bytes = tokenizer_path.read_bytes()
    eos, pad = resolve_eos(tok, eos_token, str(tokenizer_path)), resolve_pad(tok)
    vocab = vocab_size(tok)
    dtype = token_dtype(vocab)
    staging = Staging(out)
    staging.check_free()  # a conversion writing OUT now: said at once, before the source is listed
    source = list_source()
    files = source.files
    with staging.owned(overwrite):  # one writer per output: see `Staging.owned`
        sizes = [f.stat().st_size for f in files]
        options = {"format": fmt, "shard_size": shard_bytes if fmt == "wds" else None, **source.options,
                   "eos_token": eos_token, "batch_size": batch_chars, "strict": strict,
                   "chunk_tokens": chunk_tokens if fmt == "lmdb" else None}
        wanted = fingerprint(fmt, options, {"path": [os.path.abspath(s) for s in source.given], "files": len(files),
                                            "digest": files_digest((os.path.abspath(f), f) for f in files)},
                             tokenizer=f"sha256 {hashlib.sha256(tokenizer_bytes).hexdigest()}")

        def make_writer(directory: Path) -> TextLmdbWriter | TextWdsWriter:
            return storage("text", fmt).open_writer(directory, WriterOptions(
                shard_bytes=shard_bytes, dtype=dtype, chunk_tokens=chunk_tokens,
                commit_every_chunks=commit_every_chunks))

        writer, resumed = open_or_resume(staging, overwrite, wanted, make_writer, _TextProgress.parse)
        state = resumed or _TextProgress(wanted)
        resumed_at = resumed.records if resumed else None  # `state` moves on from here
        resumed_documents = resumed.documents if resumed else None
        if isinstance(writer, TextWdsWriter) and resumed is not None:
            try:
                writer.resume([FileEntry(**f) for f in resumed.files], resumed.index_files, resumed.tokens,
                              resumed.open_shard)
            except BaseException:
                writer.abort()
                raise
        partial = staging.partial
        started = time.perf_counter()
        with keep_checkpoint_on_failure(writer, partial):
            if resumed is None:
                writer.checkpoint(state.to_json())  # records the fingerprint at once
            write_atomic(partial / TOKENIZER_FILE, tokenizer_bytes)
            batches = read_batches(source, batch_chars, sizes, (state.next_file, state.file_records))
            splitter = splitter_for(tok) if split_documents else None
            stats = _tokenize_all(batches, tok, writer, dtype, strict, state, sum(sizes), sum(sizes[:state.next_file]),
                                  progress, checkpoint_bytes, workers, splitter)
            if isinstance(writer, TextWdsWriter):  # the final state is kept until the manifest is on disk
                data_files, layout = writer.close()
                _checkpoint(writer, state)
            else:
                writer.checkpoint(state.to_json())
                data_files, layout = writer.close()
        seconds = time.perf_counter() - started
        contents = _source_contents(files, workers, wanted["source"]["digest"])
        bytes_out = sum(f.bytes for f in data_files)
        text = {"dtype": dtype.name, "documents": state.documents, "total_tokens": state.tokens,
                "max_document_tokens": state.longest, "vocab_size": vocab, "tokenizer": TOKENIZER_FILE,
                "tokenizer_sha256": sha256_file(partial / TOKENIZER_FILE),
                "eos_token": eos[0] if eos else None, "eos_token_id": eos[1] if eos else None,
                "pad_token": pad[0] if pad else None, "pad_token_id": pad[1] if pad else None, **layout}
        manifest = Manifest(
            format=fmt, kind="text", num_samples=state.documents, classes=[], class_counts=[], files=data_files,
            fastdata_version=__version__, text=text, options=options,
            source={"kind": "text", "path": [str(s) for s in source.given], "tokenizer": str(tokenizer_path.resolve()),
                    "files": [{"name": str(f), "bytes": n, "sha256": digest}
                              for f, n, digest in zip(files, sizes, contents, strict=True)]},
            rejected=state.rejected,
            stats={"bytes_in": sum(sizes), "bytes_out": bytes_out, "seconds": round(seconds, 3),
                   "rejected_records": state.rejected_count, "resumed_at": resumed_at},
        )
        if fmt == "wds":
            check_shard_count(shard_size, len(data_files), state.documents, "documents")
        looked = (f"in field {source.options['field']!r} of {', '.join(source.given)}" if source.options.get("field")
                  else f"in {', '.join(source.given)}")
        warning = check_kept(out, partial, state.documents, state.rejected_count,
                             [r["reason"] for r in state.rejected], "documents", looked, limit)
        staging.commit(manifest, scratch=(PROGRESS_FILE,))
    notes = ([] if warning is None else [warning]) + ([] if splitter is None else splitting_notes(splitter))
    rejected = [Rejected(r["path"], r["line"], r["reason"]) for r in state.rejected]
    return TextConversionSummary(out, fmt, state.documents, state.tokens, dtype.name, state.longest, len(files),
                                 data_files, rejected, state.rejected_count, eos, sum(sizes), bytes_out,
                                 seconds, notes, resumed_at=resumed_at, resumed_documents=resumed_documents,
                                 writer_waited=stats.waited if workers is not None else None)


def _source_contents(files: list[Path], workers: int | None, digest: str) -> list[str]:
    """The sha256 of each source file, which the manifest records so that `fastdata verify --source` compares
    content, not only names and sizes (a second read of the source, on `workers` threads, mostly from the page
    cache); SourceError when a file changed while it was converted (its size or time differs from the start's)."""
    contents = sha256_files(files, workers or 1)
    if files_digest((os.path.abspath(f), f) for f in files) != digest:
        raise SourceError(f"{', '.join(str(f) for f in files[:3])}{' ...' if len(files) > 3 else ''}: a source "
                          "file changed while it was converted (its size or modification time differs from the "
                          "start's); rerun with --overwrite once the source stays as it is")
    return contents
