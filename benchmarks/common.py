"""What the benchmark runners share: their common command-line options and the sample photos they all read.
Benchmark-only code lives here, not in the fastdata package."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from fastdata.tools.bench_fair import DEFAULT_REPEATS
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
