"""What the benchmark runners share: their common command-line options and the sample photos they all read.
Benchmark-only code lives here, not in the fastdata package."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import report

from fastdata.tools.bench import run_contenders
from fastdata.tools.bench_fair import DEFAULT_REPEATS, per_run_ratios
from fastdata.tools.sample import make_sample_imagefolder

DATA = Path(__file__).resolve().parent / "data"


def arguments(description: str | None, images: int = 3000, repeats: int = DEFAULT_REPEATS, *,
              data: bool = True, **options: object) -> argparse.ArgumentParser:
    """A runner's parser with the options every loading benchmark has: `--data` (where samples and conversions
    are cached), `--images`, `--repeats` (alternating runs of each contender), and those of `options` given a
    default: `epochs`, `batch_size`, `workers` (None: the usable cores), `augment` ("train" / "val")."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if data:
        parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--images", type=int, default=images)
    parser.add_argument("--repeats", type=int, default=repeats)
    helps = {"epochs": "timed passes per loading run (after one untimed pass)",
             "workers": "workers of every loader (default: the usable cores)"}
    for name, default in options.items():
        flag = "--" + name.replace("_", "-")
        if name == "augment":
            parser.add_argument(flag, choices=("train", "val"), default=default)
        elif name == "workers":
            parser.add_argument(flag, type=int, default=default, help=helps["workers"])
        else:
            parser.add_argument(flag, type=type(default), default=default, help=helps.get(name))
    return parser


def cached_sample_imagefolder(data: str | Path, images: int, classes: int = 20, jpeg_only: bool = False) -> Path:
    """`data/imagefolder-<images>` (`-jpeg` with `jpeg_only`: no PNGs among the photos), generated once (built
    under a temporary name, renamed when complete) and reused by later runs: the benchmarks' shared sample."""
    src = Path(data) / (f"imagefolder-{images}-jpeg" if jpeg_only else f"imagefolder-{images}")
    if not src.is_dir():
        print(f"generating {images} images in {src} ...")
        tmp = src.with_suffix(".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        make_sample_imagefolder(tmp, images=images, classes=classes, png_fraction=0.0 if jpeg_only else 0.04)
        tmp.rename(src)
    return src


def per_run_ratios_text(result, baseline) -> str:
    """`result`'s throughput over `baseline`'s, run by run (LoaderResults of one `run_contenders`): "1.92, 2.03"."""
    return ", ".join(f"{x:.2f}" for x in per_run_ratios([r.images_per_s for r in result.runs],
                                                         [b.images_per_s for b in baseline.runs]))


def loading_table(title: str, results, baselines, vs: list[str] | None = None, notes=()) -> None:
    """Report loaders' results (`run_contenders`) as a table: images/s, the median of the per-run ratios to each
    of `baselines` (columns "vs <name>", or named by `vs`), MB/s and seconds to the first batch (medians)."""
    vs = vs or [f"vs {b.name}" for b in baselines]
    report.table(title, ["loader", "images/s", *vs, "MB/s", "first batch s"],
                 [[r.name, f"{r.images_per_s:,.0f}", *(f"{r.ratio_to(b):.2f}x" for b in baselines),
                   f"{r.mb_per_s:,.1f}", f"{r.first_batch_s:.2f}"] for r in results], notes=notes)


def convert_once(outputs: dict[str, Path], convert) -> None:
    """`convert(fmt, out)` for each output (format -> folder) that has no manifest yet, its time printed: the
    conversions a loading benchmark reads, made once under --data and untimed for its table."""
    for fmt, out in outputs.items():
        if not (out / "manifest.json").is_file():
            started = time.perf_counter()
            convert(fmt, out)
            print(f"converted to {fmt} in {time.perf_counter() - started:.1f} s (untimed for the table)")


def loading_race(title: str, contenders: list, config, what: str, target: float, unit: str = "img/s") -> list:
    """Run `contenders` (`fastdata.tools.bench.run_contenders`, progress printed) and report their table: medians
    against the first (the baseline; the median of the per-run ratios), the first batch, and whether each other
    loader meets `target`."""
    results = run_contenders(contenders, config, progress=lambda line: print(f"  {line}", flush=True), what=what)
    baseline = results[0]
    verdicts = [f"{r.name}: {r.ratio_to(baseline):.2f}x; "
                f"{'meets' if r.ratio_to(baseline) >= target else 'MISSES'} the {target:g}x target"
                for r in results[1:]]
    report.table(title, ["loader", unit, f"vs {baseline.name}", "first batch s"],
                 [[r.name, f"{r.images_per_s:,.0f}", f"{r.ratio_to(baseline):.2f}x", f"{r.first_batch_s:.2f}"]
                  for r in results], notes=verdicts)
    return results
