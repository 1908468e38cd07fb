"""Composition root for text conversion: source files -> documents -> batched parallel tokenization
(`tokenizers`' own Rust thread pool) -> token storage writer -> tokenizer copy -> manifest, written last.

A reader thread parses the sources while the tokenizer (which releases the GIL) encodes the previous batch,
through a queue of a few batches, so memory stays bounded by the batch size, whatever the corpus size. The
output is built under `OUT.partial` and renamed into place after the manifest (an interrupted text
conversion starts again from the beginning when rerun).
"""

from __future__ import annotations

import queue
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from fastdata import __version__
from fastdata.config import parse_size
from fastdata.convert import DEFAULT_SHARD_SIZE, _resolve_format
from fastdata.converters.text import TXT_MODES, Rejected, SourceReader, check_extras, list_sources
from fastdata.errors import ConfigError, RejectedFileError
from fastdata.formats.manifest import MANIFEST_NAME, FileEntry, Manifest, sha256_file, write_atomic
from fastdata.output import check_output, commit_output, fresh_partial
from fastdata.text_lmdb import TextLmdbWriter
from fastdata.text_tokenizer import load_tokenizer, resolve_eos, resolve_pad, token_dtype, vocab_size
from fastdata.text_wds import TextWdsWriter

TOKENIZER_FILE = "tokenizer.json"
DEFAULT_BATCH_SIZE = "1MB"
MAX_LISTED_REJECTIONS = 10_000  # the manifest lists this many rejected records; all are counted
_MAX_BATCH_DOCUMENTS = 4096
_QUEUE_BATCHES = 3


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

    def __str__(self) -> str:
        secs = max(self.seconds, 1e-9)
        mean = self.tokens / self.documents if self.documents else 0.0
        eos = (f"{self.eos[0]} (id {self.eos[1]})" if self.eos else
               "none found: packed loading needs --eos-token (or eos_token= in the loader)")
        lines = [
            f"wrote {self.out} ({self.format}, {len(self.files)} file{'s' * (len(self.files) != 1)})",
            f"  documents {self.documents:,} from {self.source_files:,} source file"
            f"{'s' * (self.source_files != 1)}",
            f"  tokens    {self.tokens:,} ({self.dtype}; {mean:,.1f} per document, "
            f"longest {self.max_document_tokens:,})",
            f"  eos       {eos}",
            f"  bytes     {self.bytes_in / 1e6:,.1f} MB in -> {self.bytes_out / 1e6:,.1f} MB out",
            f"  time      {self.seconds:.1f} s ({self.documents / secs:,.0f} documents/s, "
            f"{self.tokens / secs / 1e6:,.2f} M tokens/s, {self.bytes_in / 1e6 / secs:,.1f} MB/s)",
            f"  rejected  {self.rejected_count:,} records",
        ]
        lines += [f"    {r}" for r in self.rejected[:50]]
        if self.rejected_count > 50:
            lines.append(f"    ... and {self.rejected_count - 50:,} more (the first "
                         f"{MAX_LISTED_REJECTIONS:,} are listed in {MANIFEST_NAME})")
        lines += [f"  note      {note}" for note in self.notes]
        return "\n".join(lines)


@dataclass
class _Batch:
    texts: list[str]
    where: list[tuple[str, int]]
    position: int  # source bytes read once this batch was cut


def _batches(files: Sequence[Path], field: str, txt_mode: str, batch_chars: int,
             sizes: Sequence[int]) -> Iterator[_Batch | Rejected]:
    """Documents cut into batches of about `batch_chars` characters, rejections in between, in source order."""
    texts: list[str] = []
    where: list[tuple[str, int]] = []
    chars, done = 0, 0
    for path, size in zip(files, sizes, strict=True):
        reader = SourceReader(path, field, txt_mode)
        for item in reader:
            if isinstance(item, Rejected):
                yield item
                continue
            texts.append(item.text)
            where.append((item.source, item.line))
            chars += len(item.text)
            if chars >= batch_chars or len(texts) >= _MAX_BATCH_DOCUMENTS:
                yield _Batch(texts, where, done + reader.tell())
                texts, where, chars = [], [], 0
        done += size
    if texts:
        yield _Batch(texts, where, done)


def _in_background(items: Iterator[Any], depth: int) -> Iterator[Any]:
    """Run the iterator `items` in a thread, `depth` items ahead; its exceptions re-raise here."""
    channel: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def offer(entry: tuple[Any, BaseException | None]) -> bool:
        while not stop.is_set():  # the consumer may have stopped: never block for good
            try:
                channel.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer((item, None)):
                    return
            offer((end, None))
        except BaseException as exc:  # handed to the consumer, raised there
            offer((end, exc))

    thread = threading.Thread(target=produce, name="fastdata-text-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = channel.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int] | str]:
    """Ids of each text (no special tokens added), or the reason a text cannot be tokenized."""
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # same ids, no offsets
    try:
        return [e.ids for e in encode_batch(texts, add_special_tokens=False)]
    except Exception:  # one bad text (e.g. a lone surrogate from a JSON escape) fails the batch: find it
        results: list[list[int] | str] = []
        for text in texts:
            try:
                results.append(tokenizer.encode(text, add_special_tokens=False).ids)
            except Exception as exc:
                results.append(f"cannot be tokenized ({exc})")
        return results


@dataclass
class _Tally:
    documents: int = 0
    tokens: int = 0
    longest: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    rejected_count: int = 0

    def reject(self, record: Rejected, strict: bool) -> None:
        if strict:
            raise RejectedFileError(f"{record} (--strict: nothing written)")
        self.rejected_count += 1
        if len(self.rejected) < MAX_LISTED_REJECTIONS:
            self.rejected.append(record)


def _tokenize_all(batches: Iterator[_Batch | Rejected], tokenizer: Any, writer: TextLmdbWriter | TextWdsWriter,
                  dtype: np.dtype, strict: bool, total_bytes: int, progress: bool) -> _Tally:
    from tqdm import tqdm

    tally = _Tally()
    started = last_postfix = time.perf_counter()
    with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenizing", disable=not progress,
              smoothing=0.1) as bar:
        for item in _in_background(batches, _QUEUE_BATCHES):
            if isinstance(item, Rejected):
                tally.reject(item, strict)
                continue
            encoded = _encode(tokenizer, item.texts)
            good = [ids for ids in encoded if not isinstance(ids, str)]
            flat = np.fromiter(chain.from_iterable(good), dtype, count=sum(map(len, good)))
            pos = 0
            for ids, (source, line) in zip(encoded, item.where, strict=True):
                if isinstance(ids, str):
                    tally.reject(Rejected(source, line, ids), strict)
                    continue
                tokens = flat[pos:pos + len(ids)]
                pos += len(ids)
                if isinstance(writer, TextWdsWriter):
                    writer.add(tokens, source, line)
                else:
                    writer.add(tokens)
                tally.longest = max(tally.longest, len(ids))
            tally.documents += len(good)
            tally.tokens += pos
            bar.update(item.position - bar.n)
            now = time.perf_counter()
            if now - last_postfix > 0.5:
                secs = now - started
                bar.set_postfix_str(f"{tally.documents / secs:,.0f} docs/s, {tally.tokens / secs / 1e6:.2f} M tok/s, "
                                    f"{tally.rejected_count} rejected")
                last_postfix = now
    return tally


def convert_text(
    src: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    tokenizer: str | Path,
    field: str = "text",
    format: str | None = None,
    txt_mode: str = "file",
    eos_token: str | None = None,
    shard_size: str | int = DEFAULT_SHARD_SIZE,
    batch_size: str | int = DEFAULT_BATCH_SIZE,
    overwrite: bool = False,
    strict: bool = False,
    progress: bool = True,
) -> TextConversionSummary:
    """Tokenize the text files `src` (a file, folder or glob, or a list of them) into `out` (LMDB if it ends
    in `.lmdb`, or `format="wds"` shards), with the `tokenizers` file `tokenizer`.

    Each document is stored whole as `tokenizer.encode(text, add_special_tokens=False).ids` (truncation and
    padding off), as uint16 when the vocabulary fits, else uint32, in source order. Unusable records are
    reported with file and line and skipped (`strict=True` raises at the first and writes nothing).
    """
    sources = [src] if isinstance(src, (str, Path)) else list(src)
    out, tokenizer_path = Path(out), Path(tokenizer)
    fmt = _resolve_format(out, format)
    shard_bytes, batch_chars = parse_size(shard_size), parse_size(batch_size)
    if txt_mode not in TXT_MODES:
        raise ConfigError(f"txt_mode must be one of {', '.join(TXT_MODES)}, got {txt_mode!r}")
    tok = load_tokenizer(tokenizer_path)
    eos, pad = resolve_eos(tok, eos_token, str(tokenizer_path)), resolve_pad(tok)
    vocab = vocab_size(tok)
    dtype = token_dtype(vocab)
    files = list_sources(sources)
    check_extras(files)
    check_output(out, overwrite)
    sizes = [f.stat().st_size for f in files]

    partial = fresh_partial(out)
    writer = TextLmdbWriter(partial, dtype) if fmt == "lmdb" else TextWdsWriter(partial, shard_bytes, dtype)
    started = time.perf_counter()
    try:
        batches = _batches(files, field, txt_mode, batch_chars, sizes)
        tally = _tokenize_all(batches, tok, writer, dtype, strict, sum(sizes), progress)
        data_files, layout = writer.close()
        write_atomic(partial / TOKENIZER_FILE, tokenizer_path.read_bytes())
    except BaseException:
        writer.abort()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    seconds = time.perf_counter() - started
    bytes_out = sum(f.bytes for f in data_files)
    text = {"dtype": dtype.name, "documents": tally.documents, "total_tokens": tally.tokens,
            "max_document_tokens": tally.longest, "vocab_size": vocab, "tokenizer": TOKENIZER_FILE,
            "tokenizer_sha256": sha256_file(partial / TOKENIZER_FILE),
            "eos_token": eos[0] if eos else None, "eos_token_id": eos[1] if eos else None,
            "pad_token": pad[0] if pad else None, "pad_token_id": pad[1] if pad else None, **layout}
    manifest = Manifest(
        format=fmt, kind="text", num_samples=tally.documents, classes=[], class_counts=[], files=data_files,
        fastdata_version=__version__, text=text,
        options={"format": fmt, "shard_size": shard_bytes if fmt == "wds" else None, "field": field,
                 "txt_mode": txt_mode, "eos_token": eos_token, "batch_size": batch_chars, "strict": strict},
        source={"kind": "text", "path": [str(s) for s in sources], "tokenizer": str(tokenizer_path.resolve()),
                "files": [{"name": str(f), "bytes": n} for f, n in zip(files, sizes, strict=True)]},
        rejected=[{"path": r.source, "line": r.line, "reason": r.reason} for r in tally.rejected],
        stats={"bytes_in": sum(sizes), "bytes_out": bytes_out, "seconds": round(seconds, 3),
               "rejected_records": tally.rejected_count},
    )
    commit_output(manifest, partial, out)
    notes = [] if tally.documents else ["no documents were written"]
    return TextConversionSummary(out, fmt, tally.documents, tally.tokens, dtype.name, tally.longest, len(files),
                                 data_files, tally.rejected, tally.rejected_count, eos, sum(sizes), bytes_out,
                                 seconds, notes)
