"""Per-image decode time on one core: the crop's region (what fastdata's train preset decodes) against whole images.

For every stored JPEG of a dataset, one RandomResizedCrop 224 is drawn from its stored size (as the train preset
does, seeded), then timed, each over all images, alternating, median of `--repeats` passes:

- region: fastdata's extension decodes only the crop's rows and columns at the smallest DCT scale that keeps
  the crop at least 224 pixels (`fastdata.image.jpeg.region.plan_region`);
- whole, same scale: OpenCV decodes the whole image at that DCT scale (fastdata's fallback path);
- whole, full size: OpenCV decodes the whole image at full size (what PIL-style loaders do before cropping).

    python -m benchmarks.region_decode [--data benchmarks/data/cpu-path-4000.lmdb] [--repeats 5]

The default dataset is the one `benchmarks/cpu_path.py` converts (run it first). Run nothing else heavy meanwhile.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks import report
from benchmarks.common import DATA, arguments
from fastdata.formats.lmdb import LmdbReader
from fastdata.formats.manifest import read_manifest
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.augment import RandomResizedCropFlip
from fastdata.image.decode import decode_rgb
from fastdata.image.geometry import reduce_factor
from fastdata.image.jpeg.region import plan_region, region_decoder
from fastdata.order.epoch import sample_rng


def jpegs(path: Path) -> list[tuple[bytes, int, int]]:
    """(bytes, stored width, stored height) of every JPEG record of an LMDB dataset."""
    manifest = read_manifest(path)
    reader = LmdbReader(path, manifest.num_samples, len(manifest.classes))
    return [(bytes(reader.read(i)), int(reader.widths[i]), int(reader.heights[i]))
            for i in range(manifest.num_samples) if int(reader.codecs[i]) == CODEC_CV_JPEG]


def one_core_decoder() -> object:
    """fastdata's region decoder, with OpenCV on one thread (the decoders are timed on one core)."""
    import cv2

    cv2.setNumThreads(1)
    decoder = region_decoder()
    if decoder is None:
        raise SystemExit("the region decoder is not available here (see `fastdata doctor`)")
    return decoder


def timed_pass(decode: Callable[[int], object], count: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """ms per call of `decode(i)` for every i below `count`, by `clock`."""
    started = clock()
    for i in range(count):
        decode(i)
    return (clock() - started) / count * 1e3


def alternating_passes(ways: dict[str, Callable[[int], object]], count: int, repeats: int,
                       clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Name -> ms per image of each of `repeats` passes over `count` images, the ways alternating (after one
    untimed pass each)."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for decode in ways.values():  # one untimed pass each
        timed_pass(decode, count, clock)
    for _ in range(repeats):
        for name, decode in ways.items():
            times[name].append(timed_pass(decode, count, clock))
    return times


def decode_table(title: str, times: dict[str, list[float]], baseline: str, against: str) -> None:
    """The table of median ms per image, and each against the median of `baseline` (called `against`)."""
    base = statistics.median(times[baseline])
    report.table(title, ["decode", "ms per image", f"vs {against}"],
                 [[name, f"{statistics.median(values):.3f}", f"{statistics.median(values) / base:.2f}x"]
                  for name, values in times.items()])


def main() -> None:
    parser = arguments(__doc__.split("\n")[0], images=None, repeats=5, data=DATA / "cpu-path-4000.lmdb")
    args = parser.parse_args()
    decoder = one_core_decoder()
    records = jpegs(args.data)
    preset = RandomResizedCropFlip(224)
    params = [preset.params(w, h, sample_rng(0, 0, i)) for i, (_, w, h) in enumerate(records)]
    regions = [plan_region(w, h, p, 224) for (_, w, h), p in zip(records, params, strict=True)]
    reduces = [reduce_factor(p, 224) for p in params]
    full = "whole image, full size (OpenCV)"
    ways = {
        "region (fastdata extension)": lambda i: decoder.decode(records[i][0], regions[i]),
        "whole image at the crop's DCT scale (OpenCV)": lambda i: decode_rgb(records[i][0], CODEC_CV_JPEG,
                                                                               reduces[i]),
        full: lambda i: decode_rgb(records[i][0], CODEC_CV_JPEG),
    }
    times = alternating_passes(ways, len(records), args.repeats)
    scaled = np.mean([r.scale_num < 8 for r in regions])
    decode_table(f"{len(records)} JPEGs of {args.data}, one RandomResizedCrop 224 each ({scaled:.0%} decoded at a "
                 f"reduced DCT scale); one core; median of {args.repeats} alternating passes", times, full,
                 "full size")


if __name__ == "__main__":
    main()
