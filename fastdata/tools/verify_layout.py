"""`fastdata verify --decode` of a restart-layout dataset (`jpeg_layout: "restart"`, issue 21): the stored file holds
only the rewrite, so what can be checked is that each rewritten JPEG is whole as a restart-indexed JPEG (its index
rebuilds: one restart segment per MCU, EOI at the end), that a crop decodes from its sub-JPEG to the whole image's
pixels (the path a loader takes), that the count of rewritten JPEGs is the manifest's, and, with `--source` (and no
`--max-size`, which stores a re-encode, not the source), that each decodes to exactly its source file's pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdata.errors import UnsupportedJpegError
from fastdata.formats.manifest import Manifest
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.batch import EncodedSample
from fastdata.image.jpeg.region import Region, region_decoder
from fastdata.image.jpeg.restart import build_index, decode_region, same_pixels


@dataclass
class RestartCheck:
    """The restart checks of one verify run, sample by sample (`check`), then their verdict (`finish`)."""

    manifest: Manifest
    source_reader: Any = None  # the source's SampleReader, to compare the pixels with the source files'
    rewritten: int = 0
    kept: int = 0
    compared: int = 0
    problems: list[str] = field(default_factory=list)

    @classmethod
    def applies(cls, manifest: Manifest) -> bool:
        return manifest.jpeg_layout == "restart"

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
            try:
                original = self.source_reader.read(sample.key)
            except OSError:
                return  # gone from the source: the source check names it
            self.compared += 1
            if not same_pixels(original, sample.data):
                self.problems.append(f"{where}: the rewritten JPEG decodes to other pixels than the source file "
                                     f"{self.source_reader.locate(sample.key)}")

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
