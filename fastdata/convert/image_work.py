"""The per-sample work of an image conversion, all of it done in a conversion worker: read the sample's bytes (the
source's `SampleReader`), verify them (`fastdata.convert.encode.verify_record`: header, pixel limit, a decode at
1/8 DCT scale, re-encode with `--max-size`), check them against the sample's targets and attach its target record,
metadata and caption, with `--jpeg-layout restart` rewrite a JPEG record with restart markers
(`fastdata.convert.layout`), note how the GPU's decoders meet the stored bytes (`fastdata.image.jpeg.header.GPU_KINDS`),
and lay the record out exactly as the writer stores it (`lay_out`, the writer's own).
The parent process then only writes the laid-out records, in order.

A `SampleJob` travels to each worker once (inherited by a forked worker, pickled once into a spawned or Ray one);
after that a worker is sent only ranges of positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fastdata.convert.encode import EncodeOptions, verify_record
from fastdata.convert.layout import Outcome, apply_layout
from fastdata.convert.sources import SampleReader, TargetSource
from fastdata.formats.records import ImageRecord, Label
from fastdata.image.jpeg.header import image_gpu_kind

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
    # per result, what the target source noted while making its record (`noted_record`; segmentation: the class
    # ids a label map holds), for the parent's `observe`; empty when the targets note nothing
    notes: list[Any] = field(default_factory=list)
    # per result, what the JPEG layout did to it (`fastdata.convert.layout.Outcome`); empty with layout "original"
    layouts: list[Outcome] = field(default_factory=list)
    # per result, how the GPU's decoders meet the stored image (one of GPU_KINDS; "" for a rejected sample)
    gpu_kinds: list[str] = field(default_factory=list)
    # in the parent: the shared memory the results' large byte strings came in (`fastdata.convert.engines.messages`),
    # kept when the writer hands those bytes on rather than writing them itself (None: none, or not kept)
    shared: Any = None


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
        return self.run_noted(position)[0]

    def run_noted(self, position: int) -> tuple[Result, Any]:
        """`run`, and what the target source noted while making the sample's target record (None: nothing)."""
        result, note, _, _ = self.run_stored(position)
        return result, note

    def run_stored(self, position: int) -> tuple[Result, Any, Outcome, str]:
        """`run_noted`, what the JPEG layout did to the record (`fastdata.convert.layout.apply_layout`), and which
        of GPU_KINDS the stored image is ("" when the sample is rejected)."""
        none: Outcome = ("", 0, 0)
        index = int(self.order[position])
        key, label = self.samples[index]
        try:
            data = self.reader.read(key)
        except OSError as exc:
            return (None, f"unreadable ({exc.strerror or exc})", 0), None, none, ""
        try:
            record = verify_record(data, key, label, self.options)
        except ValueError as exc:
            return (None, str(exc), len(data)), None, none, ""
        note = None
        if self.targets is not None:
            segmentation = self.targets.kind == "segmentation"
            try:
                width, height = self.targets.size(index)
                if (record.width, record.height) != (width, height):
                    what = "label map is" if segmentation else "annotations say"
                    return (None, (f"decodes to {record.width}x{record.height} pixels, its {what} {width}x{height} "
                                   f"({'the mask' if segmentation else 'boxes and masks'} would not fit the image)"),
                            len(data)), None, none, ""
                noted = getattr(self.targets, "noted_record", None)
                if noted is not None:
                    target, note = noted(index)
                else:
                    target = self.targets.record(index)
            except (OSError, ValueError) as exc:  # a target that cannot be stored: the sample is rejected, named
                return (None, str(exc), len(data)), None, none, ""
            record = replace(record, target=target)
        if self.metadata is not None:
            record = replace(record, metadata=self.metadata[index])
        if self.captions is not None:
            tokens = self.caption_tokens[index] if self.caption_tokens is not None else None
            record = replace(record, caption=self.captions[index], tokens=tokens)
        record, outcome = apply_layout(record, self.options.jpeg_layout, self.options.max_pixels)
        return (self.lay_out(record), "", len(data)), note, outcome, image_gpu_kind(record.data)

    def run_chunk(self, start: int, stop: int) -> ChunkResult:
        """`run` over positions start..stop-1, timed."""
        wall, cpu = time.perf_counter(), time.process_time()
        outcomes = [self.run_stored(position) for position in range(start, stop)]
        notes = [note for _, note, _, _ in outcomes]
        layouts = [layout for _, _, layout, _ in outcomes] if self.options.jpeg_layout != "original" else []
        return ChunkResult(start, [result for result, _, _, _ in outcomes], time.perf_counter() - wall,
                           time.process_time() - cpu, notes if any(note is not None for note in notes) else [],
                           layouts, [kind for _, _, _, kind in outcomes])
