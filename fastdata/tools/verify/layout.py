"""`fastdata verify --decode` of a dataset whose JPEGs were rewritten at conversion (`--jpeg-layout`).

Restart layout (issue 21): the stored file holds only the rewrite, so what can be checked is that each rewritten
JPEG is whole as a restart-indexed JPEG (its index rebuilds: one restart segment per MCU, EOI at the end), that a
crop decodes from its sub-JPEG to the whole image's pixels (the path a loader takes), that the count of rewritten
JPEGs is the manifest's, and, with `--source` (and no `--max-size`, which stores a re-encode, not the source), that
each decodes to exactly its source file's pixels.

Baseline layout: that no progressive JPEG is stored but those the rewrite refused (the manifest's count), and, with
`--source`, that every stored JPEG whose bytes are not its source file's decodes to exactly the source's pixels,
as many as the manifest says were rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdata.errors import UnsupportedJpegError
from fastdata.formats.manifest import Manifest
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.batch import EncodedSample
from fastdata.image.jpeg.header import progressive
from fastdata.image.jpeg.region import Region, region_decoder
from fastdata.image.jpeg.restart import build_index, decode_region, same_pixels


def layout_check(manifest: Manifest) -> type[RestartCheck] | type[BaselineCheck] | None:
    """The check for `manifest`'s JPEG layout (None: "original", nothing to check)."""
    checks: dict[str, type[RestartCheck] | type[BaselineCheck]] = {"restart": RestartCheck, "baseline": BaselineCheck}
    return checks.get(manifest.jpeg_layout)


@dataclass
class RestartCheck:
    """The restart checks of one verify run, sample by sample (`check`), then their verdict (`finish`)."""

    manifest: Manifest
    source_reader: Any = None  # the source's SampleReader, to compare the pixels with the source files'
    rewritten: int = 0
    kept: int = 0
    compared: int = 0
    problems: list[str] = field(default_factory=list)

    def check(self, sample: EncodedSample, image: np.ndarray) -> None:
        """Check one sample whose whole decode (RGB, H x W x 3, by the dataset's own pipeline) is `image`."""
        if sample.codec != CODEC_CV_JPEG:
            return
        where = f"sample {sample.key!r}" + (f" in {sample.origin}" if sample.origin else "")
        try:
            index = build_index(sample.data, name=sample.key)
        except UnsupportedJpegError:
            self.kept += 1  # a JPEG the rewrite refused at conversion: stored as it was
            return
        self.rewritten += 1
        decoder = region_decoder()
        if decoder is not None and image.ndim == 3 and image.shape[2] == 3:
            height, width = image.shape[:2]
            left, top = width // 3, height // 3
            box = Region(8, left, top, max(1, width // 3), max(1, height // 3))
            try:
                crop = decode_region(decoder, sample.data, index, box)
            except ValueError as exc:
                self.problems.append(f"{where}: its crop's sub-JPEG does not decode ({exc})")
                return
            if not np.array_equal(crop, image[top:top + box.height, left:left + box.width]):
                self.problems.append(f"{where}: a crop decoded from its sub-JPEG differs from the whole image's "
                                     "pixels")
        if self.source_reader is not None:
            _compare_with_source(self, sample, where)

    def finish(self, complete: bool) -> tuple[list[str], str]:
        """(problems, what was checked) after every sample; the manifest's count of rewritten JPEGs is compared
        when every sample was read."""
        problems = list(self.problems)
        expected = (self.manifest.stats.get("jpeg_layout") or {}).get("rewritten")
        if complete and expected is not None and expected != self.rewritten:
            problems.append(f"{self.rewritten:,} restart-indexed JPEGs in the data, the manifest says {expected:,} "
                            "were rewritten")
        checked = (f"restart layout: {self.rewritten:,} rewritten JPEGs whole (index, a crop's sub-JPEG), "
                   f"{self.kept:,} kept original")
        if self.source_reader is not None:
            checked += f", {self.compared:,} same pixels as their source files"
        return problems, checked


@dataclass
class BaselineCheck:
    """The baseline-layout checks of one verify run (see the module's docstring), sample by sample, then their
    verdict: the same interface as RestartCheck."""

    manifest: Manifest
    source_reader: Any = None
    progressive: int = 0  # progressive JPEGs stored (the rewrite refused them)
    rewritten: int = 0  # with a source: stored JPEGs whose bytes are not the source file's
    compared: int = 0
    problems: list[str] = field(default_factory=list)

    def check(self, sample: EncodedSample, image: np.ndarray) -> None:
        """Check one sample (`image`, its whole decode, is not needed: the pixels compared are the source's)."""
        if sample.codec != CODEC_CV_JPEG:
            return
        if progressive(sample.data):
            self.progressive += 1
            return
        if self.source_reader is None:
            return
        try:
            original = self.source_reader.read(sample.key)
        except OSError:
            return  # gone from the source: the source check names it
        if bytes(original) != bytes(sample.data):
            self.rewritten += 1
            _compare_with_source(self, sample, f"sample {sample.key!r}" + (f" in {sample.origin}" if sample.origin
                                                                           else ""), original)

    def finish(self, complete: bool) -> tuple[list[str], str]:
        """(problems, what was checked) after every sample; the counts are compared with the manifest's when every
        sample was read."""
        problems = list(self.problems)
        recorded = self.manifest.stats.get("jpeg_layout") or {}
        kept = sum((recorded.get("kept_original") or {}).values())
        if complete and recorded and self.progressive != kept:
            problems.append(f"{self.progressive:,} progressive JPEGs stored, the manifest says the rewrite kept "
                            f"{kept:,}")
        expected = recorded.get("rewritten")
        if complete and self.source_reader is not None and expected is not None and expected != self.rewritten:
            problems.append(f"{self.rewritten:,} stored JPEGs differ from their source files, the manifest says "
                            f"{expected:,} were rewritten")
        checked = f"baseline layout: {self.progressive:,} progressive JPEGs stored (refused by the rewrite)"
        if self.source_reader is not None:
            checked += f", {self.compared:,} rewritten ones with the same pixels as their source files"
        return problems, checked


def _compare_with_source(check: RestartCheck | BaselineCheck, sample: EncodedSample, where: str,
                         original: bytes | None = None) -> None:
    """Count `sample` as compared with its source file and note a problem when their pixels differ."""
    if original is None:
        try:
            original = check.source_reader.read(sample.key)
        except OSError:
            return  # gone from the source: the source check names it
    check.compared += 1
    if not same_pixels(original, sample.data):
        check.problems.append(f"{where}: the rewritten JPEG decodes to other pixels than the source file "
                              f"{check.source_reader.locate(sample.key)}")
