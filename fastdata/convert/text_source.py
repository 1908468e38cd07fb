"""What the text driver reads: the source interface a converter implements (`TextSource`: files, and for each
its records, documents or rejections, in order), and how the driver reads it: cut into batches of about a given
amount of text, from a resume point on, in a background thread a few batches ahead of the tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastdata.background import Ahead

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
    """Run the iterator `items` on a thread, `depth` items ahead (`fastdata.background.Ahead`); its exceptions
    re-raise here, and the thread ends with this generator (closed, exhausted or failed)."""
    ahead = Ahead(items, _as_is, depth, "fastdata-text-reader").start()
    interrupted = False
    try:
        yield from ahead
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if interrupted:  # after Ctrl-C the reader may be stuck in a read (a stalled disk, a pipe): not waited for,
            ahead.stop()  # it is a daemon thread
        else:
            ahead.close()


def _as_is(item: Any) -> Any:
    return item
