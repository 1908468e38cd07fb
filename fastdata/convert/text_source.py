"""What the text driver reads: the source interface a converter implements (`TextSource`: files, and for each
its records, documents or rejections, in order), and how the driver reads it: cut into batches of about a given
amount of text, from a resume point on, in a background thread a few batches ahead of the tokenizer."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_MAX_BATCH_DOCUMENTS = 4096


@dataclass(frozen=True)
class Document:
    """One source document: its text and where it came from (file as listed, 1-based line or row)."""

    text: str
    source: str
    line: int


@dataclass(frozen=True)
class Rejected:
    """A record that could not be used, and why."""

    source: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason}" if self.line else f"{self.source}: {self.reason}"


class SourceFile(Iterable[Document | Rejected]):
    """What a text source yields for one of its files: its records (documents and rejections) in order, and
    `tell()`: the bytes of the file read so far (for progress and checkpoint cadence)."""

    def tell(self) -> int:
        raise NotImplementedError


@dataclass
class TextSource:
    """What a converter hands the text driver: the source files, how to read each, and what the manifest and the
    resume check record about them."""

    files: list[Path]
    open: Callable[[int], SourceFile]  # file number -> its records
    given: list[str]  # the sources as the user named them (files, folders, globs)
    options: dict[str, Any] = field(default_factory=dict)  # the source's reading options (field, txt_mode, ...)


@dataclass
class Batch:
    records: list[Document | Rejected]  # in source order
    marks: list[tuple[int, int]]  # after each record: (source file number, records of that file consumed)
    position: int  # source bytes read once this batch was cut


def read_batches(source: TextSource, batch_chars: int, sizes: Sequence[int],
             start: tuple[int, int] = (0, 0)) -> Iterator[Batch]:
    """The source records (documents and rejections) in source order, cut into batches of about `batch_chars`
    characters of text, from `start` on: (file number, records of it already consumed), which are re-read and
    skipped (files before it are not read)."""
    records: list[Document | Rejected] = []
    marks: list[tuple[int, int]] = []
    chars, done = 0, sum(sizes[:start[0]])
    for number in range(start[0], len(source.files)):
        reader = source.open(number)
        skip = start[1] if number == start[0] else 0
        for consumed, item in enumerate(reader, 1):
            if consumed <= skip:
                continue
            records.append(item)
            marks.append((number, consumed))
            if isinstance(item, Document):
                chars += len(item.text)
            if chars >= batch_chars or len(records) >= _MAX_BATCH_DOCUMENTS:
                yield Batch(records, marks, done + reader.tell())
                records, marks, chars = [], [], 0
        done += sizes[number]
    if records:
        yield Batch(records, marks, done)


def in_background(items: Iterator[Any], depth: int) -> Iterator[Any]:
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
    interrupted = False
    try:
        while True:
            item, error = channel.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        stop.set()
        if not interrupted:  # after Ctrl-C the reader may be stuck in a read (a stalled disk, a pipe): not waited
            thread.join()  # for, it is a daemon thread
