"""Per-image decode time on one core: the crop's region (what fastdata's train preset decodes) against whole images.

For every stored JPEG of a dataset, one RandomResizedCrop 224 is drawn from its stored size (as the train preset
does, seeded), then timed, each over all images, alternating, median of `--repeats` passes:

- region: fastdata's extension decodes only the crop's rows and columns at the smallest DCT scale that keeps
  the crop at least 224 pixels (`fastdata.image.jpeg.region.plan_region`);
- whole, same scale: OpenCV decodes the whole image at that DCT scale (fastdata's fallback path);
- whole, full size: OpenCV decodes the whole image at full size (what PIL-style loaders do before cropping).

    python benchmarks/region_decode.py [--data benchmarks/data/cpu-path-4000.lmdb] [--repeats 5]

The default dataset is the one `benchmarks/cpu_path.py` converts (run it first). Run nothing else heavy meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

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


def timed_pass(decode: Callable[[int], object], count: int) -> float:
    started = time.perf_counter()
    for i in range(count):
        decode(i)
    return (time.perf_counter() - started) / count * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data" / "cpu-path-4000.lmdb")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import cv2

    cv2.setNumThreads(1)
    decoder = region_decoder()
    if decoder is None:
        raise SystemExit("the region decoder is not available here (see `fastdata doctor`)")
    records = jpegs(args.data)
    preset = RandomResizedCropFlip(224)
    params = [preset.params(w, h, sample_rng(0, 0, i)) for i, (_, w, h) in enumerate(records)]
    regions = [plan_region(w, h, p, 224) for (_, w, h), p in zip(records, params, strict=True)]
    reduces = [reduce_factor(p, 224) for p in params]
    ways = {
        "region (fastdata extension)": lambda i: decoder.decode(records[i][0], regions[i]),
        "whole image at the crop's DCT scale (OpenCV)": lambda i: decode_rgb(records[i][0], CODEC_CV_JPEG,
                                                                               reduces[i]),
        "whole image, full size (OpenCV)": lambda i: decode_rgb(records[i][0], CODEC_CV_JPEG),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for decode in ways.values():  # one untimed pass each
        timed_pass(decode, len(records))
    for _ in range(args.repeats):
        for name, decode in ways.items():
            times[name].append(timed_pass(decode, len(records)))
    scaled = np.mean([r.scale_num < 8 for r in regions])
    print(f"{len(records)} JPEGs of {args.data}, one RandomResizedCrop 224 each ({scaled:.0%} decoded at a reduced "
          f"DCT scale); one core; median of {args.repeats} alternating passes\n")
    print("| decode | ms per image | vs full size |")
    print("|---|---:|---:|")
    full = statistics.median(times["whole image, full size (OpenCV)"])
    for name, values in times.items():
        ms = statistics.median(values)
        print(f"| {name} | {ms:.3f} | {ms / full:.2f}x |")


if __name__ == "__main__":
    main()
