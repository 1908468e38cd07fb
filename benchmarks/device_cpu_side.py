"""CPU side of decode="device" vs decode="worker": what one worker core does per image.

    python benchmarks/device_cpu_side.py [--images 3000] [--repeats 3]

The "worker" path reads, decodes, crops and resizes in the workers; the "device" path's workers only read the
JPEGs' bytes and draw the crop parameters (the GPU does the rest; the few non-JPEGs are decoded in the worker).
This measures batches built per second by one worker process for each, in the same run (alternating, medians):
the ratio says how many more images per second the same cores can feed a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import fastdata


def batches_per_s(path: Path, encoded: bool, batch: int = 256) -> float:
    ds = fastdata.dataset(path, "train")
    ds.pipeline.ship_encoded = encoded
    order = np.random.default_rng(0).permutation(len(ds))
    started = time.perf_counter()
    n = 0
    for start in range(0, len(order) - batch + 1, batch):
        ds.get_batch(order[start:start + batch], epoch=0)
        n += batch
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = args.data / f"imagefolder-{args.images}.lmdb"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run benchmarks/imagefolder_vs_fastdata.py --images {args.images} first")
    import cv2

    cv2.setNumThreads(1)
    worker, device = [], []
    for _ in range(args.repeats):
        worker.append(batches_per_s(path, encoded=False))
        device.append(batches_per_s(path, encoded=True))
    w, d = statistics.median(worker), statistics.median(device)
    print(f"one core, batches of 256, {args.images:,} images, {args.repeats} alternating runs (medians)")
    print(f"  decode='worker' (read + decode + crop/resize/flip): {w:10,.0f} images/s  "
          f"({', '.join(f'{x:,.0f}' for x in worker)})")
    print(f"  decode='device' (read + crop parameters only):      {d:10,.0f} images/s  "
          f"({', '.join(f'{x:,.0f}' for x in device)})")
    print(f"  ratio: {d / w:.1f}x")


if __name__ == "__main__":
    main()
