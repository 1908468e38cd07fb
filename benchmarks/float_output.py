"""What float output costs on the CPU path: the presets' batches as uint8 vs normalised float32, bfloat16 and
float16 (`fastdata.loader(..., output=OutputOptions(dtype=...))`, made image by image where the batch is built), in
the same run.

    python -m benchmarks.float_output [--images 3000] [--repeats 3] [--workers 0] [--augment train]

The sample ImageFolder and its LMDB conversion are the ones `imagefolder_vs_fastdata.py` uses
(benchmarks/data/imagefolder-<images>[.lmdb]), made here if missing. `--workers 0` (the default) builds every batch
in this process on one core (OpenCV and torch single-threaded, as in a DataLoader worker): the per-core cost;
`--workers N` runs the whole loader with N worker processes. Each dtype gets a fresh loader, one untimed pass and
one timed pass per run; `--repeats` runs alternate between the dtypes; the table gives medians, and the cost of a
float dtype as the median of the per-run ratios (uint8 images/s / that dtype's images/s, the runs taken next to
each other). Batches of float32 are 4x the bytes of uint8 (bfloat16, float16: 2x): the other cost, in memory
and in the copy to a GPU, which this does not time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import fastdata
from benchmarks import report
from benchmarks.common import arguments, dataset_for
from fastdata.tools.bench_fair import alternate, dataset_files, median_ratio, warm_page_cache

DTYPES = {"uint8": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def images_per_s(path: Path, dtype: torch.dtype | None, args: argparse.Namespace) -> float:
    """Images/s of one timed pass of a fresh loader, after one untimed pass."""
    loader = fastdata.loader(path, batch_size=args.batch_size, augment=args.augment, image_size=args.image_size,
                             num_workers=args.workers, output=fastdata.OutputOptions(dtype=dtype),
                             pin_memory=False, seed=0)
    for _pass in ("untimed", "timed"):  # the last one counts
        started, count = time.perf_counter(), 0
        for images, _ in loader:
            count += len(images)
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = arguments(__doc__, images=3000, batch_size=256, augment="train")
    parser.add_argument("--image-size", type=int, default=224)
    # its own --workers: 0 (the default) is not "the usable cores" but no worker at all, batches built here
    parser.add_argument("--workers", type=int, default=0, help="0: batches built here, on one core")
    args = parser.parse_args()
    path = dataset_for(args.data, args.images)
    if args.workers == 0:
        import cv2

        cv2.setNumThreads(1)
        torch.set_num_threads(1)
    warm_page_cache(dataset_files(path))
    rates: dict[str, list[float]] = {name: [] for name in DTYPES}

    def run(name: str, _repeat: int) -> None:
        rates[name].append(images_per_s(path, DTYPES[name], args))

    alternate(list(DTYPES), args.repeats, run)
    where = "one core (this process)" if args.workers == 0 else f"{args.workers} workers"
    report.table(f"float output: images/s of uint8 vs float batches, {where}, augment={args.augment!r} "
                 f"{args.image_size} px, batches of {args.batch_size}, {args.images:,} images, {args.repeats} "
                 "alternating runs (medians; cost: median of the per-run ratios)",
                 ["dtype", "images/s", "cost vs uint8", "runs (images/s)"],
                 [[name, f"{statistics.median(values):,.0f}", f"{median_ratio(rates['uint8'], values):.2f}x",
                   ", ".join(f"{v:,.0f}" for v in values)] for name, values in rates.items()], align="lrrl")


if __name__ == "__main__":
    main()
