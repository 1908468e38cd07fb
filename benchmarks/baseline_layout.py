"""What `--jpeg-layout baseline` costs at conversion: the same sample photos converted with the original layout and
with the baseline layout (progressive JPEGs rewritten losslessly as baseline ones), alternating rounds, every core.

    python -m benchmarks.baseline_layout [--images 3000] [--repeats 3]

Prints the conversion seconds of each (medians, with the per-round ratio's range), how many JPEGs were rewritten,
the rewritten files' bytes against their sources', the rewrite alone per progressive file (the libjpeg-turbo
transcode, timed in this process over the source's progressive files), and whether every rewritten file decodes
to its source's pixels. Then what the layout changes for the CPU path: the worker's own work per image (the
train preset's decode, crop and resize of one stored record, `pipeline.process`, one core) over both
conversions, alternating, for the progressive files (rewritten in the baseline layout) and for the whole dataset.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import torch

import fastdata
from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder, dataset_for
from fastdata.formats.manifest import read_manifest
from fastdata.image.jpeg.header import progressive
from fastdata.image.jpeg.restart import baseline_rewrite, same_pixels
from fastdata.tools.bench_fair import alternate, per_run_ratios

LAYOUTS = ("original", "baseline")


def worker_times(lmdbs: dict[str, Path], repeats: int) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Per layout, the seconds per image of the worker's decode + crop + resize (train preset, 224) over the rows
    stored progressive in the original layout, and over every row, alternating `repeats` rounds on one core;
    and how many rows were progressive."""
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    datasets = {layout: fastdata.dataset(path, "train", image_size=224) for layout, path in lmdbs.items()}
    samples = {layout: [ds.encoded(i) for i in range(len(ds))] for layout, ds in datasets.items()}
    keys = [[sample.key for sample in rows] for rows in samples.values()]
    assert keys[0] == keys[1], "the two conversions store the same samples in the same order"
    chosen = [i for i, sample in enumerate(samples["original"]) if progressive(sample.data)]
    per_image: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    progressive_only: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}

    def run(layout: str, round_: int) -> None:
        pipeline, rows = datasets[layout].pipeline, samples[layout]
        begun = time.perf_counter()
        for i in chosen:
            pipeline.process(rows[i], round_)
        progressive_only[layout].append((time.perf_counter() - begun) / max(len(chosen), 1))
        begun = time.perf_counter()
        for sample in rows:
            pipeline.process(sample, round_)
        per_image[layout].append((time.perf_counter() - begun) / len(rows))

    for layout in LAYOUTS:  # untimed: the decoders' first calls
        run(layout, 0)
        per_image[layout].clear()
        progressive_only[layout].clear()
    alternate(LAYOUTS, repeats, run)
    return progressive_only, per_image, len(chosen)


def main() -> None:
    args = arguments(__doc__.split("\n")[0], images=3000, workers=None).parse_args()
    src = cached_sample_imagefolder(args.data, args.images)
    files = [path for path in sorted(src.rglob("*")) if path.is_file()]
    progressives = [data for data in map(Path.read_bytes, files) if progressive(data)]  # only these are kept
    if progressives:
        baseline_rewrite(progressives[0])  # untimed: loads and self-checks the libjpeg-turbo
    started = time.perf_counter()
    rewritten = [baseline_rewrite(data) for data in progressives]
    rewrite_ms = (time.perf_counter() - started) / max(len(progressives), 1) * 1e3
    pixels = all(same_pixels(a, b) for a, b in zip(progressives, rewritten, strict=True))
    seconds: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    stats: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(dir=args.data) as scratch:
        def convert(layout: str, round_: int) -> None:
            out = Path(scratch) / f"{layout}-{round_}.lmdb"
            begun = time.perf_counter()
            fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(progress=False, workers=args.workers,
                                                                             jpeg_layout=layout))
            seconds[layout].append(time.perf_counter() - begun)
            stats[layout] = read_manifest(out).stats
            shutil.rmtree(out)

        convert("original", -1)  # untimed: the page cache, the workers' first imports
        seconds["original"].clear()
        alternate(LAYOUTS, args.repeats, convert)
    # the benchmarks' cached conversions of the same sample, one per layout
    progressive_only, per_image, count = worker_times(
        {layout: dataset_for(args.data, args.images, layout) for layout in LAYOUTS}, args.repeats)
    layout = stats["baseline"].get("jpeg_layout") or {}
    ratios = per_run_ratios(seconds["baseline"], seconds["original"])
    rows = [[name, f"{statistics.median(seconds[name]):.2f}", f"{min(seconds[name]):.2f}-{max(seconds[name]):.2f}"]
            for name in LAYOUTS]
    report.table(f"`--jpeg-layout baseline` against the original layout: {len(files):,} sample photos, "
                 f"{len(progressives):,} of them progressive; conversion seconds, medians of {args.repeats} "
                 "alternating rounds",
                 ["layout", "conversion s", "range"], rows, align="lrr",
                 notes=[f"baseline / original: x{statistics.median(ratios):.3f} (rounds "
                        f"{min(ratios):.3f}-{max(ratios):.3f})",
                        f"rewritten {layout.get('rewritten', 0):,} progressive JPEGs, kept "
                        f"{sum((layout.get('kept_original') or {}).values()):,}; their bytes "
                        f"x{layout.get('size_ratio', 1.0):.3f}",
                        f"the rewrite alone: {rewrite_ms:.2f} ms per progressive file (one core); same pixels as "
                        f"the sources: {'yes, every one' if pixels else 'NO'}",
                        f"stored progressive JPEGs after: {stats['baseline'].get('gpu_kinds', {}).get('progressive')}"
                        f" (original layout: {stats['original'].get('gpu_kinds', {}).get('progressive')})"])
    rows = []
    for name in LAYOUTS:
        prog, every = progressive_only[name], per_image[name]
        rows.append([name, f"{statistics.median(prog) * 1e3:.2f}", f"{min(prog) * 1e3:.2f}-{max(prog) * 1e3:.2f}",
                     f"{statistics.median(every) * 1e3:.3f}", f"{min(every) * 1e3:.3f}-{max(every) * 1e3:.3f}",
                     f"{1 / statistics.median(every):,.0f}"])
    whole = per_run_ratios(per_image["original"], per_image["baseline"])
    report.table(f"the CPU path's worker, per image (train preset, 224: decode + crop + resize of one stored record, "
                 f"one core), over each conversion: the {count} files stored progressive in the original layout, "
                 f"and all {len(files):,}; medians of {args.repeats} alternating rounds",
                 ["layout", f"ms per image, the {count} progressive", "range", "ms per image, all", "range",
                  "images/s, all"], rows, align="lrrrrr",
                 notes=[f"the whole dataset, baseline layout against the original: x{statistics.median(whole):.3f} "
                        f"the images per second (rounds {min(whole):.3f}-{max(whole):.3f})"])


if __name__ == "__main__":
    main()
