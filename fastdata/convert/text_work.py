"""Tokenizing a text conversion's batches: in this process with the tokenizer's own thread pool (the default), or
with `workers` processes (`fastdata convert text --workers N`), each tokenizing on one thread.

With workers, each batch of the source (`fastdata.convert.text_source.Batch`) is cut into tasks of about
`TASK_CHARS` characters of text, given out to whichever worker is free, at most `AHEAD` tasks per worker beyond
the oldest one not yet back. A document longer than a task is first cut into pieces of about `TASK_CHARS` where
the tokenizer provably splits anyway (`fastdata.text.splitting`), so that a huge document (a whole book, a
nanoGPT `input.txt`) is tokenized on every worker, and its pieces' ids joined again. Results come back in source
order, as numpy arrays of the dataset's dtype; the ids are those of `encode_batch_fast(texts,
add_special_tokens=False)` of the whole documents, the same whichever way the documents are grouped or cut.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.convert.engines.pool import PoolStats, Workers
from fastdata.convert.text_source import Batch, Document
from fastdata.formats.records import exception_text
from fastdata.text.splitting import DocumentSplitter

TASK_CHARS = 1 << 16  # text per worker task: tens of milliseconds of tokenizing
AHEAD = 32  # tasks per worker given out beyond the oldest one not yet back

Encoded = list["np.ndarray | list[int] | str"]  # per document: its ids, or why it cannot be tokenized


def encode(tokenizer: Any, texts: list[str]) -> list[list[int] | str]:
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
                results.append(f"cannot be tokenized ({exception_text(exc)})")
        return results


@dataclass
class EncodedTask:
    """A task's documents' ids (arrays of the dataset's dtype, or the reason), and the seconds they took."""

    results: list[np.ndarray | str]
    seconds: float
    cpu_seconds: float


@dataclass
class EncodeJob:
    """What a tokenizing worker holds: the tokenizer (inherited by a forked worker) and the token dtype."""

    tokenizer: Any
    dtype: np.dtype

    def run_chunk(self, texts: list[str]) -> EncodedTask:
        wall, cpu = time.perf_counter(), time.process_time()
        results = [ids if isinstance(ids, str) else np.asarray(ids, self.dtype)
                   for ids in encode(self.tokenizer, texts)]
        return EncodedTask(results, time.perf_counter() - wall, time.process_time() - cpu)


def _one_thread() -> None:
    # the parallelism is the worker processes: the tokenizer's own thread pool in each would put
    # workers x cores threads on the cores (this sets it for this worker process only)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _texts(batch: Batch) -> list[str]:
    return [record.text for record in batch.records if isinstance(record, Document)]


def splitter_for(tokenizer: Any) -> DocumentSplitter:
    """What cuts documents longer than a task into pieces for this tokenizer (or says why it cannot)."""
    return DocumentSplitter.of(tokenizer, TASK_CHARS)


def splitting_notes(splitter: DocumentSplitter) -> list[str]:
    """What the summary says of the documents cut into pieces (or kept whole, and why)."""
    notes = []
    if splitter.split_documents:
        notes.append(f"{splitter.split_documents:,} long document{'s' * (splitter.split_documents != 1)} cut into "
                     f"{splitter.pieces_made:,} pieces tokenized in parallel (the ids of the whole document)")
    if splitter.kept_whole:
        notes.append(f"{splitter.kept_whole:,} document{'s' * (splitter.kept_whole != 1)} over "
                     f"{splitter.piece_chars:,} characters tokenized whole, on one core: cutting them cannot be "
                     f"shown to keep this tokenizer's ids ({splitter.reason})")
    return notes


def _pieces(texts: list[str], splitter: DocumentSplitter | None) -> tuple[list[str], list[int] | None]:
    """The texts to tokenize (long documents cut by `splitter`) and the number of pieces of each document (None:
    none was cut)."""
    if splitter is None:
        return texts, None
    cut = [splitter.pieces(text) for text in texts]
    if all(len(pieces) == 1 for pieces in cut):
        return texts, None
    return [piece for pieces in cut for piece in pieces], [len(pieces) for pieces in cut]


def _joined(results: list, counts: list[int] | None) -> list:
    """Each document's ids from its pieces' (or the first reason a piece could not be tokenized)."""
    if counts is None:
        return results
    joined, at = [], 0
    for count in counts:
        parts = results[at:at + count]
        at += count
        failed = next((part for part in parts if isinstance(part, str)), None)
        if count == 1 or failed is not None:
            joined.append(parts[0] if count == 1 else failed)
        elif isinstance(parts[0], np.ndarray):
            joined.append(np.concatenate(parts))
        else:
            joined.append([token for part in parts for token in part])
    return joined


def encoded_batches(batches: Iterator[Batch], tokenizer: Any, dtype: np.dtype, workers: int | None,
                    stats: PoolStats, encode_here: Callable[[Any, list[str]], list] = encode,
                    splitter: DocumentSplitter | None = None) -> Iterator[tuple[Batch, Encoded]]:
    """(batch, the ids of each of its documents, in order) for every batch, tokenized in this process by
    `encode_here` (`workers` None) or on `workers` processes; documents longer than `splitter.piece_chars` cut
    into pieces by `splitter` (None: never)."""
    if workers is None:
        for batch in batches:
            started = time.perf_counter()
            texts, counts = _pieces(_texts(batch), splitter)
            encoded = _joined(encode_here(tokenizer, texts), counts)
            stats.worker_seconds += time.perf_counter() - started
            yield batch, encoded
        return
    pending: deque[tuple[Batch, int, list[int] | None]] = deque()  # batches cut into tasks: tasks, pieces

    def tasks() -> Iterator[tuple[list[str]]]:
        for batch in batches:
            texts, counts = _pieces(_texts(batch), splitter)
            cut = _cut(texts)
            pending.append((batch, len(cut), counts))
            yield from ((texts,) for texts in cut)

    with Workers(EncodeJob(tokenizer, dtype), workers, _one_thread,
                 describe=lambda task: f"a task of {len(task[0])} documents") as pool:
        collected: Encoded = []
        tasks_left = None
        for _, result in pool.results(tasks(), stats, ahead=AHEAD):
            if tasks_left is None:
                tasks_left = pending[0][1]
            collected += result.results
            tasks_left -= 1
            if tasks_left == 0:
                batch, _, counts = pending.popleft()
                yield batch, _joined(collected, counts)
                collected, tasks_left = [], None


def _cut(texts: list[str]) -> list[list[str]]:
    """`texts` in consecutive groups of about TASK_CHARS characters (a longer text alone); always one group at
    least, so that a batch without documents still comes back in its place."""
    groups: list[list[str]] = [[]]
    size = 0
    for text in texts:
        if size and size + len(text) > TASK_CHARS:
            groups.append([])
            size = 0
        groups[-1].append(text)
        size += len(text)
    return groups
