"""Restart-indexed JPEGs (issue 21): decoding a RandomResizedCrop's region from the sub-JPEG of the MCUs it covers,
against today's region decode of the original file, on one core, and what the lossless rewrite costs in bytes and
conversion time (with optimised Huffman tables, the default, and with the standard ones).

For every JPEG of the benchmarks' sample ImageFolder (benchmarks/common.py cached_sample_imagefolder, JPEG only),
one RandomResizedCrop 224 is drawn from its size (seeded, as the train preset does) and planned as today
(`plan_region`: the smallest power-of-two DCT scale that keeps the crop at least 224 pixels, the rows and columns it
covers); then timed, each over all images, alternating, median of `--repeats` passes:

- region, original (today): the extension decodes the region of the source file;
- region, rewritten whole file: the same, of the rewritten file (what the restart markers alone cost);
- sub-JPEG (stored index): RestartIndex.from_bytes + assemble the covered MCUs + region decode of the sub-JPEG
  (a path that does not ship: the formats store no index; kept to show what storing one would save);
- sub-JPEG (index from a scan): the same with the index rebuilt by scanning the file for restart markers (the path
  that ships: the loader rebuilds each sample's index from its bytes on every read);
- assemble only: RestartIndex.from_bytes + assemble, no decode;
- whole image, full size (OpenCV): what PIL-style loaders decode before cropping.

    python -m benchmarks.restart_decode [--images 2000] [--repeats 5]

Run nothing else heavy meanwhile: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder
from benchmarks.region_decode import alternating_passes, decode_table, one_core_decoder
from fastdata.errors import UnsupportedJpegError
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.augment import RandomResizedCropFlip
from fastdata.image.decode import decode_rgb, jpeg_size
from fastdata.image.jpeg.region import plan_region
from fastdata.image.jpeg.restart import RestartIndex, build_index, decode_region, rewrite, sub_jpeg_for
from fastdata.order.epoch import sample_rng


def main() -> None:
    parser = arguments(__doc__.split("\n")[0], images=2000, repeats=5)
    args = parser.parse_args()
    decoder = one_core_decoder()
    folder = cached_sample_imagefolder(args.data, args.images, jpeg_only=True)
    originals = [path.read_bytes() for path in sorted(folder.rglob("*")) if path.suffix.lower() in (".jpg", ".jpeg")]

    started = time.process_time()
    rewritten, refused = [], []
    for i, data in enumerate(originals):
        try:
            rewritten.append((i, *rewrite(data, decoder)))
        except UnsupportedJpegError as exc:
            refused.append(str(exc))
    rewrite_ms = (time.process_time() - started) / len(originals) * 1e3
    started = time.process_time()
    standard_bytes = sum(len(decoder.restart_rewrite(originals[i], 1, False)[0]) for i, _, _ in rewritten)
    standard_ms = (time.process_time() - started) / len(originals) * 1e3
    started = time.process_time()
    for i, _, _ in rewritten:
        decode_rgb(originals[i], CODEC_CV_JPEG)
    whole_ms = (time.process_time() - started) / len(originals) * 1e3

    records = []  # (original, rewritten, stored index, region)
    preset = RandomResizedCropFlip(224)
    for i, jpeg, index in rewritten:
        width, height = jpeg_size(originals[i])
        params = preset.params(width, height, sample_rng(0, 0, i))
        records.append((originals[i], jpeg, index.to_bytes(), plan_region(width, height, params, 224)))

    def sub(i: int) -> object:
        _, jpeg, stored, region = records[i]
        return sub_jpeg_for(jpeg, RestartIndex.from_bytes(stored), region)

    today = "region, original (today)"
    ways: dict[str, Callable[[int], object]] = {
        today: lambda i: decoder.decode(records[i][0], records[i][3]),
        "region, rewritten whole file": lambda i: decoder.decode(records[i][1], records[i][3]),
        "sub-JPEG (stored index)": lambda i: decode_region(decoder, records[i][1],
                                                           RestartIndex.from_bytes(records[i][2]), records[i][3]),
        "sub-JPEG (index from a scan)": lambda i: decode_region(decoder, records[i][1], build_index(records[i][1]),
                                                                records[i][3]),
        "assemble only (stored index)": sub,
        "whole image, full size (OpenCV)": lambda i: decode_rgb(records[i][0], CODEC_CV_JPEG),
    }
    # ms of this process's CPU time per call (everything runs on one thread: less disturbed by other load than
    # wall time)
    times = alternating_passes(ways, len(records), args.repeats, time.process_time)

    source_bytes = sum(len(records[k][0]) for k in range(len(records)))
    jpeg_bytes = sum(len(r[1]) for r in records)
    index_bytes = sum(len(r[2]) for r in records)
    covered = np.mean([len(sub(k).data) / len(records[k][1]) for k in range(len(records))])
    refusals = [f"refused: {reason}" for reason in sorted(set(refused))[:5]]
    report.table(f"the lossless rewrite of {len(originals)} JPEGs of {folder} ({len(refused)} refused): one thread, "
                 "CPU time per image, one pass; bytes against the sources",
                 ["rewrite", "ms per image", "vs a full-size OpenCV decode", "JPEG bytes", "index bytes"],
                 [["optimised Huffman tables (the default)", f"{rewrite_ms:.2f}", f"{rewrite_ms / whole_ms:.2f}x",
                   f"{jpeg_bytes / source_bytes - 1:+.1%}", f"{index_bytes / source_bytes:+.1%}"],
                  ["standard Huffman tables", f"{standard_ms:.2f}", "", f"{standard_bytes / source_bytes - 1:+.1%}",
                   ""]],
                 notes=[f"a sub-JPEG holds {covered:.0%} of its file's bytes on average", *refusals])
    decode_table(f"{len(originals)} JPEGs of {folder} ({len(refused)} refused by the rewrite), one RandomResizedCrop "
                 f"224 each; one thread, CPU time; median of {args.repeats} alternating passes", times, today,
                 "today's region decode")


if __name__ == "__main__":
    main()
