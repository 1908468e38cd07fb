"""What float output costs on the CPU path: the presets' batches as uint8 vs normalised float32, bfloat16 and
float16 (`fastdata.loader(..., dtype=...)`, made image by image where the batch is built), in the same run.

    python benchmarks/float_output.py [--images 3000] [--repeats 3] [--workers 0] [--augment train]

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
from common import cached_sample_imagefolder

import fastdata
from fastdata.tools.bench_fair import DEFAULT_REPEATS, alternate, dataset_files, median_ratio, warm_page_cache

DTYPES = {"uint8": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sample_lmdb(data: Path, images: int) -> Path:
    """benchmarks/data/imagefolder-<images>.lmdb, converted from the shared sample ImageFolder if missing."""
    path = data / f"imagefolder-{images}.lmdb"
    if not path.exists():
        fastdata.convert_imagefolder(cached_sample_imagefolder(data, images), path, progress=False)
    return path


def images_per_s(path: Path, dtype: torch.dtype | None, args: argparse.Namespace) -> float:
    """Images/s of one timed pass of a fresh loader, after one untimed pass."""
    loader = fastdata.loader(path, batch_size=args.batch_size, augment=args.augment, image_size=args.image_size,
                             num_workers=args.workers, dtype=dtype, pin_memory=False, seed=0)
    for _pass in ("untimed", "timed"):  # the last one counts
        started, count = time.perf_counter(), 0
        for images, _ in loader:
            count += len(images)
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--augment", choices=("train", "val"), default="train")
    parser.add_argument("--workers", type=int, default=0, help="0: batches built here, on one core")
    args = parser.parse_args()
    path = sample_lmdb(args.data, args.images)
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
    print(f"{where}, augment={args.augment!r} {args.image_size} px, batches of {args.batch_size}, "
          f"{args.images:,} images, {args.repeats} alternating runs (medians)")
    print(f"| {'dtype':<8} | images/s | cost vs uint8 | runs (images/s) |")
    print("|----------|---------:|--------------:|-----------------|")
    for name, values in rates.items():
        cost = median_ratio(rates["uint8"], values)
        print(f"| {name:<8} | {statistics.median(values):8,.0f} | {cost:12.2f}x | "
              f"{', '.join(f'{v:,.0f}' for v in values)} |")


if __name__ == "__main__":
    main()
