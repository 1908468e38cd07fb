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

    python -m benchmarks.imagefolder_vs_fastdata --images 3000 --repeats 3

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import shutil
import time

from fastdata.converters.imagefolder import ImageFolderOptions, convert_imagefolder

from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder, loading_table, per_run_ratios_text
from fastdata.tools.bench import BenchConfig, LoaderResult, baseline_contender, fastdata_contender, run_contenders
from fastdata.tools.bench_baseline import choose_baseline


def print_table(title: str, results: list[LoaderResult], config: BenchConfig) -> None:
    base = results[0]
    loading_table(f"{title}: medians of {config.repeats} alternating runs, ratios the medians of the per-run ratios",
                  results, [base], vs=["vs ImageFolder"],
                  notes=[f"per-run ratios, {r.name}: {per_run_ratios_text(r, base)}" for r in results[1:]])


def main() -> None:
    args = arguments(__doc__, images=3000, epochs=2, batch_size=128, workers=None, augment="train").parse_args()

    src = cached_sample_imagefolder(args.data, args.images)
    outputs = {"lmdb": args.data / f"imagefolder-{args.images}.lmdb",
               "wds": args.data / f"imagefolder-{args.images}.wds",
               "lmdb --max-size 256": args.data / f"imagefolder-{args.images}-256.lmdb"}
    rows = []
    for name, out in outputs.items():
        if out.exists():
            shutil.rmtree(out)
        started = time.perf_counter()
        summary = convert_imagefolder(src, out, ImageFolderOptions(
            format=name.split()[0], progress=False, max_size=256 if "max-size" in name else None, shard_size="64MB"))
        seconds = time.perf_counter() - started
        rows.append([name, f"{seconds:.1f}", f"{summary.images / seconds:,.0f}", f"{summary.bytes_in / 1e6:.1f}",
                     f"{summary.bytes_out / 1e6:.1f}", f"{summary.bytes_out / summary.bytes_in:.2f}"])
    report.table(f"conversions of {args.images} images (`fastdata convert imagefolder`, one timed run each)",
                 ["conversion", "seconds", "images/s", "MB in", "MB out", "out/in"], rows)

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
    print_table("full size: the source's own bytes", full, config)
    print_table("stored at max side 256 (`--max-size 256`, JPEG q90): the same stored bytes for both", resized, config)


if __name__ == "__main__":
    main()
