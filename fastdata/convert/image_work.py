"""The per-sample work of an image conversion, all of it done in a conversion worker: read the sample's bytes (the
source's `SampleReader`), verify them (`fastdata.convert.encode.verify_record`: header, pixel limit, a decode at
1/8 DCT scale, re-encode with `--max-size`), check them against the sample's targets and attach its target record,
metadata and caption, and lay the record out exactly as the writer stores it (`lay_out`, the writer's own). The
parent process then only writes the laid-out records, in order.

A `SampleJob` travels to each worker once (inherited by a forked worker, pickled once into a spawned or Ray one);
after that a worker is sent only ranges of positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fastdata.convert.encode import EncodeOptions, verify_record
from fastdata.convert.sources import SampleReader, TargetSource
from fastdata.formats.records import ImageRecord, Label

#: One sample's outcome: (the record laid out for the writer, or None when rejected; the reason it was rejected;
#: the bytes read).
Result = tuple[Any, str, int]


@dataclass
class ChunkResult:
    """The outcomes of positions `start`.. in order, and the seconds the worker spent on them (wall and CPU)."""

    start: int
    results: list[Result]
    seconds: float
    cpu_seconds: float


@dataclass
class SampleJob:
    """Everything a worker needs to turn the sample at a write position into a laid-out record: position p is
    sample `order[p]` of `samples`."""

    reader: SampleReader
    samples: Sequence[tuple[str, Label]]
    order: np.ndarray
    options: EncodeOptions
    lay_out: Callable[[ImageRecord], Any]
    targets: TargetSource | None = None
    metadata: Sequence[dict[str, Any]] | None = None
    captions: Sequence[str] | None = None
    caption_tokens: Sequence[Any] | None = None

    def run(self, position: int) -> Result:
        """Read, verify and lay out the sample at write position `position`."""
        index = int(self.order[position])
        key, label = self.samples[index]
        try:
            data = self.reader.read(key)
        except OSError as exc:
            return None, f"unreadable ({exc.strerror or exc})", 0
        try:
            record = verify_record(data, key, label, self.options)
        except ValueError as exc:
            return None, str(exc), len(data)
        if self.targets is not None:
            width, height = self.targets.size(index)
            if (record.width, record.height) != (width, height):
                return None, (f"decodes to {record.width}x{record.height} pixels, its annotations say "
                              f"{width}x{height} (boxes and masks would not fit the image)"), len(data)
            record = replace(record, target=self.targets.record(index))
        if self.metadata is not None:
            record = replace(record, metadata=self.metadata[index])
        if self.captions is not None:
            tokens = self.caption_tokens[index] if self.caption_tokens is not None else None
            record = replace(record, caption=self.captions[index], tokens=tokens)
        return self.lay_out(record), "", len(data)

    def run_chunk(self, start: int, stop: int) -> ChunkResult:
        """`run` over positions start..stop-1, timed."""
        wall, cpu = time.perf_counter(), time.process_time()
        results = [self.run(position) for position in range(start, stop)]
        return ChunkResult(start, results, time.perf_counter() - wall, time.process_time() - cpu)
