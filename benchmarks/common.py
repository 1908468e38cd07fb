"""What the benchmarks share: their command-line options (`arguments`: one parser helper, used by every
benchmark), the sample photos they read and their loading tables. Benchmark-only code lives here, not in the
fastdata package."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.registry import of_module
from fastdata.tools.bench import run_contenders
from fastdata.tools.bench_fair import DEFAULT_REPEATS, per_run_ratios
from fastdata.tools.sample import make_sample_imagefolder

ROOT = Path(__file__).resolve().parent.parent  # where `python -m benchmarks...` runs from
DATA = ROOT / "benchmarks" / "data"
_HELPS = {"epochs": "timed passes per loading run (after one untimed pass)",
          "workers": "workers of every loader (default: the usable cores)",
          "batch_size": "samples per batch", "mb": "MB of UTF-8 text in the corpus"}


class BenchmarkParser(argparse.ArgumentParser):
    """A benchmark's parser: `--smoke` stands for the arguments of the benchmark's smoke run in the registry
    (`registry.py`; the arguments given beside it win), so that `python -m benchmarks.NAME --smoke` runs what
    `python -m benchmarks run NAME --smoke` runs."""

    def __init__(self, description: str | None, module: str) -> None:
        super().__init__(prog=f"python -m {module}" if module else None, description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
        self.module = module
        self.add_argument("--smoke", action="store_true", help="the registry's tiny smoke run: proof that it runs "
                          "(its figures mean nothing)")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else args)
        if "--smoke" in argv:
            argv = [*smoke_arguments(self.module), *argv]
        return super().parse_args(argv, namespace)


def smoke_arguments(module: str) -> tuple[str, ...]:
    """The registry's smoke arguments of the benchmark `python -m module` runs (its CPU smoke on a machine without
    the GPU it needs)."""
    benchmark = of_module(module)
    cuda = False
    if "cuda" in benchmark.needs:
        import torch

        cuda = torch.cuda.is_available()
    return benchmark.smoke_args(cuda)


def running_module() -> str:
    """The module `python -m` runs (`benchmarks.NAME`; "" where this process was started otherwise)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name if spec is not None else ""


def arguments(description: str | None, images: int | None = 3000, repeats: int = DEFAULT_REPEATS, *,
              data: bool | Path = True, json: bool = False, module: str | None = None,
              **options: Any) -> BenchmarkParser:
    """A benchmark's parser with the options every benchmark shares, each spelt one way: `--smoke` (the registry's
    smoke run), `--repeats` (alternating runs of each contender), `--images` (the sample's size; None: the
    benchmark has no such size), `--data` (where samples and conversions are cached; a Path: that default instead
    of benchmarks/data), `--json FILE` (`json`: the benchmark writes its own results there as it goes), and those
    of `options` given a default: `epochs`, `batch_size`, `workers` (None: the usable cores), `augment` ("train"
    / "val"), `mb`, ...; any other by the type of its default (False: a switch). `module`: the benchmark's
    (`benchmarks.NAME`, whose registry entry `--smoke` reads); by default the one `python -m` runs."""
    parser = BenchmarkParser(description, running_module() if module is None else module)
    if data:
        parser.add_argument("--data", type=Path, default=DATA if data is True else data)
    if images is not None:
        parser.add_argument("--images", type=int, default=images)
    parser.add_argument("--repeats", type=int, default=repeats)
    if json:
        parser.add_argument("--json", default=None, help="write the results here as they are measured")
    for name, default in options.items():
        flag = "--" + name.replace("_", "-")
        if name == "augment":
            parser.add_argument(flag, choices=("train", "val"), default=default)
        elif name == "workers" and not isinstance(default, str):
            parser.add_argument(flag, type=int, default=default, help=_HELPS["workers"])
        elif isinstance(default, bool):
            parser.add_argument(flag, action="store_true", default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=_HELPS.get(name))
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


def dataset_for(data: Path, images: int, jpeg_layout: str = "original", non_jpeg: str = "keep") -> Path:
    """The benchmarks' sample photos (`cached_sample_imagefolder`) as an LMDB dataset under `data`, converted once
    (on every core) with the layout options given; each combination is a dataset of its own."""
    src = cached_sample_imagefolder(data, images)
    name = f"imagefolder-{images}" + ("" if jpeg_layout == "original" else f"-{jpeg_layout}") + (
        "" if non_jpeg == "keep" else f"-non-jpeg-as-{non_jpeg}")
    out = data / f"{name}.lmdb"
    if not out.exists():
        import fastdata

        fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(progress=False, jpeg_layout=jpeg_layout,
                                                                            non_jpeg=non_jpeg))
    return out


def status_kb(pid: int, field: str) -> int:
    """A kB figure of /proc/PID/status (RssAnon, RssFile, RssShmem, ...); 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


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
