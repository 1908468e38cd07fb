"""The stored layout of a conversion's JPEGs (`--jpeg-layout`, issue 21): "original" keeps each source JPEG's bytes;
"restart" rewrites each JPEG record losslessly (`fastdata.image.jpeg.restart.rewrite`: the DCT coefficients copied, a
restart marker after every MCU, baseline, Huffman tables optimised), in the conversion worker after the record was
verified, so that a loader decodes a crop from the pieces it covers only (`fastdata.image.jpeg.restart.decode_region`);
"baseline" rewrites only the progressive JPEG records, losslessly, as baseline ones
(`fastdata.image.jpeg.restart.baseline_rewrite`), so that the GPU's hardware JPEG engines, which take baseline files
only, decode every stored JPEG they can; the others keep their bytes and are not counted.

A JPEG the rewrite refuses (arithmetic coding, 12-bit, CMYK/YCCK, damaged entropy data that Pillow tolerated) keeps
its original bytes and is counted with its reason (`LayoutCounts`): the dataset is still whole, and such a sample is
decoded the way every original-layout JPEG is. The counts and the size overhead (bytes after / before, JPEG records
only) go into the conversion summary and the manifest's `stats["jpeg_layout"]`.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from fastdata.errors import ConfigError, CorruptSampleError, FastdataError, UnsupportedJpegError
from fastdata.formats.records import CODEC_CV_JPEG, JPEG_LAYOUTS, ImageRecord

#: One record's outcome: ("" not a JPEG record or layout "original"; "rewritten"; else why it kept its original
#: bytes), the JPEG's bytes before, and after.
Outcome = tuple[str, int, int]
REWRITTEN = "rewritten"


def check_layout(jpeg_layout: str) -> str:
    """`jpeg_layout` if it is one of JPEG_LAYOUTS; ConfigError otherwise."""
    if jpeg_layout not in JPEG_LAYOUTS:
        raise ConfigError(f"--jpeg-layout must be one of {', '.join(JPEG_LAYOUTS)}, got {jpeg_layout!r}")
    return jpeg_layout


@functools.cache
def _rewriter() -> Any:
    """This process's libjpeg-turbo for the rewrite, proven by the restart self-check (once per process); raises
    FastdataError saying why there is none (a conversion with --jpeg-layout restart or baseline cannot run without
    it)."""
    from fastdata.image.jpeg.region import region_decoder, unavailable_reason
    from fastdata.image.jpeg.restart import self_check

    decoder = region_decoder()
    if decoder is None:
        raise FastdataError(f"a lossless JPEG rewrite (--jpeg-layout restart or baseline) needs the region "
                            f"decoder's libjpeg-turbo: {unavailable_reason()}; convert with --jpeg-layout original")
    failure, _ = self_check(decoder)
    if failure:
        raise FastdataError(f"a lossless JPEG rewrite (--jpeg-layout restart or baseline): {decoder.library} failed "
                            f"the restart self-check ({failure}); convert with --jpeg-layout original")
    return decoder


def check_rewriter() -> None:
    """Raise ConfigError, before any work, when this process cannot rewrite JPEGs (`--jpeg-layout restart` or
    `baseline`)."""
    try:
        _rewriter()
    except FastdataError as exc:
        raise ConfigError(str(exc)) from None


def apply_layout(record: ImageRecord, jpeg_layout: str, max_pixels: int) -> tuple[ImageRecord, Outcome]:
    """`record` with its JPEG rewritten as `jpeg_layout` asks (every JPEG record, CODEC_CV_JPEG, for "restart";
    the progressive ones for "baseline"), and what happened (`Outcome`). A JPEG the rewrite refuses keeps its
    bytes; the outcome says why."""
    if jpeg_layout == "original" or record.codec != CODEC_CV_JPEG:
        return record, ("", 0, 0)
    from fastdata.image.jpeg.header import progressive
    from fastdata.image.jpeg.restart import baseline_rewrite, rewrite

    if jpeg_layout == "baseline" and not progressive(record.data):
        return record, ("", 0, 0)
    before = len(record.data)
    try:
        if jpeg_layout == "baseline":
            jpeg = baseline_rewrite(record.data, _rewriter(), max_pixels=max_pixels, name=record.key)
        else:
            jpeg, _ = rewrite(record.data, _rewriter(), max_pixels=max_pixels, name=record.key)
    except (UnsupportedJpegError, CorruptSampleError) as exc:
        reason = str(exc).removeprefix(f"{record.key}: ").removesuffix(": keep its original bytes")
        return record, (reason, before, before)
    return replace(record, data=jpeg), (REWRITTEN, before, len(jpeg))


@dataclass
class LayoutCounts:
    """What the rewrite did over a conversion: JPEG records rewritten, kept original (by reason), and the bytes
    before and after of the JPEG records it was asked to rewrite (all of them for "restart", the progressive ones
    for "baseline"; kept ones count the same on both sides)."""

    rewritten: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0

    def add(self, outcome: Outcome) -> None:
        status, before, after = outcome
        if not status:
            return
        if status == REWRITTEN:
            self.rewritten += 1
        else:
            self.kept[status] = self.kept.get(status, 0) + 1
        self.bytes_before += before
        self.bytes_after += after

    @property
    def kept_total(self) -> int:
        return sum(self.kept.values())

    @property
    def overhead(self) -> float:
        """Bytes after / before over the JPEG records (1.0 when there were none)."""
        return self.bytes_after / self.bytes_before if self.bytes_before else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"rewritten": self.rewritten, "kept_original": dict(Counter(self.kept).most_common()),
                "jpeg_bytes_before": self.bytes_before, "jpeg_bytes_after": self.bytes_after,
                "size_ratio": round(self.overhead, 5)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> LayoutCounts:
        if not data:
            return cls()
        return cls(int(data.get("rewritten", 0)), dict(data.get("kept_original", {})),
                   int(data.get("jpeg_bytes_before", 0)), int(data.get("jpeg_bytes_after", 0)))

    def summary_lines(self, jpeg_layout: str = "restart") -> list[str]:
        """The conversion summary's lines about the layout."""
        what = "JPEGs" if jpeg_layout == "restart" else "progressive JPEGs"
        lines = [f"  layout    {jpeg_layout}: {self.rewritten:,} {what} rewritten, {self.kept_total:,} kept original; "
                 f"JPEG bytes x{self.overhead:.3f} ({self.bytes_before / 1e6:,.1f} -> {self.bytes_after / 1e6:,.1f} "
                 "MB)"]
        lines += [f"    kept original ({count:,}): {reason}" for reason, count in Counter(self.kept).most_common(10)]
        return lines
