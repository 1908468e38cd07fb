"""CPU side of decode="device" vs decode="worker": what one worker core does per image.

    python benchmarks/device_cpu_side.py [--images 3000] [--repeats 3]

The "worker" path reads, decodes, crops and resizes in the workers; the "device" path's workers only read the
JPEGs' bytes and draw the crop parameters (the GPU does the rest; the few non-JPEGs are decoded in the worker).
This measures batches built per second by one worker process for each, in the same run: the dataset's file read
once before timing, one untimed pass each, --repeats alternating runs, medians, and the ratio as the median of the
per-run ratios. It says how many more images per second the same cores can feed a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import fastdata
from fastdata.tools.bench_fair import DEFAULT_REPEATS, alternate, dataset_files, median_ratio, warm_page_cache


def batches_per_s(path: Path, encoded: bool, batch: int = 256) -> float:
    """Images/s of one timed pass of whole batches, after one untimed pass (the same for both paths)."""
    ds = fastdata.dataset(path, "train")
    ds.pipeline.ship_encoded = encoded
    order = np.random.default_rng(0).permutation(len(ds))
    for timed in (False, True):
        started = time.perf_counter()
        n = 0
        for start in range(0, len(order) - batch + 1, batch):
            ds.get_batch(order[start:start + batch], epoch=int(timed))
            n += batch
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    path = args.data / f"imagefolder-{args.images}.lmdb"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run benchmarks/imagefolder_vs_fastdata.py --images {args.images} first")
    import cv2

    cv2.setNumThreads(1)
    warm_page_cache(dataset_files(path))
    rates: dict[bool, list[float]] = {False: [], True: []}

    def run(encoded: bool, _repeat: int) -> None:
        rates[encoded].append(batches_per_s(path, encoded, args.batch_size))

    alternate([False, True], args.repeats, run)
    worker, device = rates[False], rates[True]
    w, d = statistics.median(worker), statistics.median(device)
    print(f"one core, batches of {args.batch_size}, {args.images:,} images, {args.repeats} alternating runs (medians)")
    print(f"  decode='worker' (read + decode + crop/resize/flip): {w:10,.0f} images/s  "
          f"({', '.join(f'{x:,.0f}' for x in worker)})")
    print(f"  decode='device' (read + crop parameters only):      {d:10,.0f} images/s  "
          f"({', '.join(f'{x:,.0f}' for x in device)})")
    print(f"  ratio (median of per-run ratios): {median_ratio(device, worker):.1f}x")


if __name__ == "__main__":
    main()
