"""Reproducible throughput benchmark: torchvision ImageFolder + DataLoader vs fastdata.loader, same run, same bytes.

Generates an ImageNet-like ImageFolder (photo crops of about 500x375, some progressive / grayscale / PNG)
under benchmarks/data/, converts it to LMDB, to WebDataset and to LMDB with `--max-size 256`, and times the
loaders in two tables, each on one set of stored bytes:

1. full size: the ImageFolder's own files (less any the conversion rejected) against fastdata's LMDB and
   WebDataset conversions, which store those very bytes;
2. `--max-size 256`: an ImageFolder exported from the 256 dataset (its stored bytes, written out as files)
   against fastdata's LMDB of them. (Comparing the 256 dataset with the full-size source would time different
   inputs; `fastdata bench --baseline-source` does that on request, and says so.)

Every contender gets fastdata.loader's DataLoader settings, the same transform and batch size, one untimed pass,
its files read once before timing, and --repeats alternating runs (`fastdata.tools.bench.run_contenders`); the tables
give medians, and ratios that are medians of the per-run ratios.

    python benchmarks/imagefolder_vs_fastdata.py --images 3000 --repeats 3

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from common import cached_sample_imagefolder
from fastdata.converters.imagefolder import convert_imagefolder

from fastdata.tools.bench import BenchConfig, LoaderResult, baseline_contender, fastdata_contender, run_contenders
from fastdata.tools.bench_baseline import choose_baseline
from fastdata.tools.bench_fair import DEFAULT_REPEATS


def print_table(title: str, results: list[LoaderResult]) -> None:
    base = results[0]
    print(f"\n{title}\n")
    print("| loader | images/s | vs ImageFolder | MB/s | first batch s |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r.name} | {r.images_per_s:,.0f} | {r.ratio_to(base):.2f}x | {r.mb_per_s:,.1f} | "
              f"{r.first_batch_s:.2f} |")
    for r in results[1:]:
        ratios = [run.images_per_s / b.images_per_s for run, b in zip(r.runs, base.runs, strict=True)]
        print(f"  per-run ratios, {r.name}: {', '.join(f'{x:.2f}' for x in ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
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
    small = outputs["lmdb --max-size 256"]
    export = args.data / f"imagefolder-{args.images}-256-export"
    if export.exists():
        shutil.rmtree(export)  # the dataset was just rebuilt: so is its export
    full_source = choose_baseline(outputs["lmdb"], src)
    small_source = choose_baseline(small, src, export_dir=export, progress=print)
    print(f"\n{config.warmup_passes} untimed + {config.epochs} timed passes x {args.images} images per run, batch "
          f"{config.batch_size}, augment={config.augment}, {config.repeats} alternating runs each, DataLoader "
          f"settings {config.settings}")
    for line in full_source.notes() + small_source.notes():
        print(line)

    def progress(line: str) -> None:
        print(f"  {line}", flush=True)

    full = run_contenders([baseline_contender(full_source, config, "torchvision ImageFolder + DataLoader (PIL)"),
                           fastdata_contender(outputs["lmdb"], config, "`fastdata.loader`, LMDB"),
                           fastdata_contender(outputs["wds"], config, "`fastdata.loader`, WebDataset")],
                          config, progress)
    resized = run_contenders([baseline_contender(small_source, config, "torchvision ImageFolder + DataLoader (PIL), "
                                                                       "exported from the 256 dataset"),
                              fastdata_contender(small, config, "`fastdata.loader`, LMDB")], config, progress)
    print_table("full size: the source's own bytes", full)
    print_table("stored at max side 256 (`--max-size 256`, JPEG q90): the same stored bytes for both", resized)


if __name__ == "__main__":
    main()
