"""What `--jpeg-layout baseline` costs at conversion: the same sample photos converted with the original layout and
with the baseline layout (progressive JPEGs rewritten losslessly as baseline ones), alternating rounds, every core.

    python benchmarks/baseline_layout.py [--images 3000] [--repeats 3]

Prints the conversion seconds of each (medians, with the per-round ratio's range), how many JPEGs were rewritten,
the rewritten files' bytes against their sources', the rewrite alone per progressive file (the libjpeg-turbo
transcode, timed in this process over the source's progressive files), and whether every rewritten file decodes
to its source's pixels.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import report
from common import arguments, cached_sample_imagefolder

import fastdata
from fastdata.formats.manifest import read_manifest
from fastdata.image.jpeg.header import progressive
from fastdata.image.jpeg.restart import baseline_rewrite, same_pixels
from fastdata.tools.bench_fair import alternate, per_run_ratios

LAYOUTS = ("original", "baseline")


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
            fastdata.convert_imagefolder(src, out, progress=False, workers=args.workers, jpeg_layout=layout)
            seconds[layout].append(time.perf_counter() - begun)
            stats[layout] = read_manifest(out).stats
            shutil.rmtree(out)

        convert("original", -1)  # untimed: the page cache, the workers' first imports
        seconds["original"].clear()
        alternate(LAYOUTS, args.repeats, convert)
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


if __name__ == "__main__":
    main()
