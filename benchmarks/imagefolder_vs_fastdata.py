"""Reproducible throughput benchmark: torchvision ImageFolder + DataLoader vs fastdata.loader, same run.

Generates an ImageNet-like ImageFolder (photo crops of about 500x375, some progressive / grayscale / PNG)
under benchmarks/data/, converts it to LMDB and WebDataset, and times every loader with the same transform,
batch size and workers, alternating them over --repeats runs; prints medians and ratios to the baseline.

    python benchmarks/imagefolder_vs_fastdata.py --images 3000 --repeats 3

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

from fastdata.bench import BenchConfig, LoaderResult, format_table, imagefolder_baseline, time_loader
from fastdata.convert import convert_imagefolder
from fastdata.loader import loader
from fastdata.sample import cached_sample_imagefolder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--augment", choices=["train", "val"], default="train")
    args = parser.parse_args()

    src = cached_sample_imagefolder(args.data, args.images)
    outputs = {"lmdb": args.data / f"imagefolder-{args.images}.lmdb",
               "wds": args.data / f"imagefolder-{args.images}.wds",
               "lmdb --max-size 256": args.data / f"imagefolder-{args.images}-256.lmdb"}
    print(f"\n{'conversion':<22} {'seconds':>8} {'images/s':>9} {'MB in':>8} {'MB out':>8} {'out/in':>7}")
    for name, out in outputs.items():
        if out.exists():
            shutil.rmtree(out)
        started = time.perf_counter()
        summary = convert_imagefolder(src, out, format=name.split()[0], progress=False,
                                      max_size=256 if "max-size" in name else None, shard_size="64MB")
        seconds = time.perf_counter() - started
        print(f"{name:<22} {seconds:>8.1f} {summary.images / seconds:>9,.0f} {summary.bytes_in / 1e6:>8.1f} "
              f"{summary.bytes_out / 1e6:>8.1f} {summary.bytes_out / summary.bytes_in:>7.2f}")

    config = BenchConfig(epochs=args.epochs, batch_size=args.batch_size, augment=args.augment,
                         workers=args.workers, repeats=args.repeats)
    bytes_per_image = sum(p.stat().st_size for p in src.rglob("*") if p.is_file()) / args.images
    contenders = [(LoaderResult("torchvision ImageFolder"), imagefolder_baseline(src, config), bytes_per_image)]
    for name, out in outputs.items():
        def make(out: Path = out):
            return loader(out, batch_size=config.batch_size, augment=config.augment, num_workers=config.num_workers)
        stored = sum(p.stat().st_size for p in out.iterdir()) / args.images
        contenders.append((LoaderResult(f"fastdata {name}"), make, stored))
    print(f"\n{args.epochs} epochs x {args.images} images, batch {config.batch_size}, {config.num_workers} workers, "
          f"augment={config.augment}, {config.repeats} alternating runs each")
    for repeat in range(config.repeats):
        for result, make, bpi in contenders:
            run = time_loader(result.name, make, config.epochs, bpi)
            result.runs.append(run)
            print(f"  run {repeat + 1}: {result.name:<30} {run.images_per_s:8,.0f} images/s")
    print()
    print(format_table([r for r, _, _ in contenders]))
    base = [r.images_per_s for r in contenders[0][0].runs]
    for result, _, _ in contenders[1:]:
        ratios = [r.images_per_s / b for r, b in zip(result.runs, base, strict=True)]
        print(f"per-run ratio {result.name:<30} median {statistics.median(ratios):.2f}x  "
              f"({', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
