"""CPU side of decode="device" vs decode="worker": what one worker core does per image.

    python -m benchmarks.device_cpu_side [--images 3000] [--repeats 3]

The "worker" path reads, decodes, crops and resizes in the workers; the "device" path's workers only read the
JPEGs' bytes and draw the crop parameters (the GPU does the rest; the few non-JPEGs are decoded in the worker).
This measures batches built per second by one worker process for each, in the same run: the dataset's file read
once before timing, one untimed pass each, --repeats alternating runs, medians, and the ratio as the median of the
per-run ratios. It says how many more images per second the same cores can feed a GPU, and what share of the
device path's worker time goes to the samples it still decodes itself (the last two rows: both paths over the same
sample converted with `--non-jpeg jpeg`, its PNGs stored as JPEGs, which the device takes).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

import fastdata
from benchmarks import report
from benchmarks.common import arguments, dataset_for
from fastdata.image.pipeline import PipelineConfig
from fastdata.tools.bench_fair import alternate, dataset_files, median_ratio, warm_page_cache


def batches_per_s(path: Path, encoded: bool, batch: int = 256) -> tuple[float, float, int]:
    """Images/s of one timed pass of whole batches, after one untimed pass (the same for both paths); with the
    share of the timed pass the worker spent decoding and resizing samples itself (on the device path: those the
    device does not take, e.g. PNGs), and how many those were."""
    ds = fastdata.dataset(path, "train")
    ds.pipeline.configure(PipelineConfig(ship_encoded=encoded))
    order = np.random.default_rng(0).permutation(len(ds))
    for timed in (False, True):
        started = time.perf_counter()
        n, decoding, decoded = 0, 0.0, 0
        for start in range(0, len(order) - batch + 1, batch):
            made = ds.get_batch(order[start:start + batch], epoch=int(timed))
            n += batch
            decoding += made.times.decode + made.times.augment
            decoded += int(made.worker_decoded.sum()) if encoded else batch
    seconds = time.perf_counter() - started
    return n / seconds, decoding / seconds, decoded


def main() -> None:
    args = arguments(__doc__, images=3000, batch_size=256).parse_args()
    mixed, as_jpeg = dataset_for(args.data, args.images), dataset_for(args.data, args.images, non_jpeg="jpeg")
    import cv2

    cv2.setNumThreads(1)
    warm_page_cache([*dataset_files(mixed), *dataset_files(as_jpeg)])
    contenders = {"decode='worker' (read + decode + crop/resize/flip)": (mixed, False),
                  "decode='device' (read + crop parameters; non-JPEGs decoded)": (mixed, True),
                  "decode='device', the same sample converted with --non-jpeg jpeg": (as_jpeg, True),
                  "decode='worker', the same sample converted with --non-jpeg jpeg": (as_jpeg, False)}
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    shares: dict[str, list[float]] = {name: [] for name in contenders}
    counts: dict[str, int] = {}

    def run(name: str, _repeat: int) -> None:
        rate, share, counts[name] = batches_per_s(*contenders[name], args.batch_size)
        rates[name].append(rate)
        shares[name].append(share)

    alternate(list(contenders), args.repeats, run)
    worker, device, *_ = contenders
    ratio = median_ratio(rates[device], rates[worker])
    report.table(f"the CPU side of decode='device' vs decode='worker': images/s of one core, batches of "
                 f"{args.batch_size}, {args.images:,} images, {args.repeats} alternating runs (medians)",
                 ["path", "images/s", "runs (images/s)"],
                 [[name, f"{statistics.median(values):,.0f}", ", ".join(f"{x:,.0f}" for x in values)]
                  for name, values in rates.items()],
                 align="lrl", notes=[f"ratio (median of per-run ratios): {ratio:.1f}x",
                                     f"decode='device': the worker decoded and resized {counts[device]:,} of the "
                                     f"timed pass's samples itself (those the device does not take: PNGs, ...), "
                                     f"{100 * statistics.median(shares[device]):.0f}% of its time (median; runs "
                                     f"{', '.join(f'{100 * x:.0f}%' for x in shares[device])})"])


if __name__ == "__main__":
    main()
