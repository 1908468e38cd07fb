"""Tokenizing a text conversion's batches: in this process with the tokenizer's own thread pool (the default), or
with `workers` processes (`fastdata convert text --workers N`), each tokenizing on one thread.

With workers, each batch of the source (`fastdata.convert.text_source.Batch`) is cut into tasks of about
`TASK_CHARS` characters of text, given out to whichever worker is free, at most `AHEAD` tasks per worker beyond
the oldest one not yet back: a huge document (megabytes) holds up only its own worker while the others go on
with the text after it. Results come back in source order, as numpy arrays of the dataset's dtype; the ids are
those of `encode_batch_fast(texts, add_special_tokens=False)`, the same whichever way the documents are grouped.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.convert.pool import PoolStats, Workers
from fastdata.convert.text_source import Batch, Document
from fastdata.formats.records import exception_text

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


def encoded_batches(batches: Iterator[Batch], tokenizer: Any, dtype: np.dtype, workers: int | None,
                    stats: PoolStats, encode_here: Callable[[Any, list[str]], list] = encode
                    ) -> Iterator[tuple[Batch, Encoded]]:
    """(batch, the ids of each of its documents, in order) for every batch, tokenized in this process by
    `encode_here` (`workers` None) or on `workers` processes."""
    if workers is None:
        for batch in batches:
            started = time.perf_counter()
            encoded = encode_here(tokenizer, _texts(batch))
            stats.worker_seconds += time.perf_counter() - started
            yield batch, encoded
        return
    pending: deque[tuple[Batch, int]] = deque()  # batches cut into tasks, with their number of tasks

    def tasks() -> Iterator[tuple[list[str]]]:
        for batch in batches:
            cut = _cut(_texts(batch))
            pending.append((batch, len(cut)))
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
                yield pending.popleft()[0], collected
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
