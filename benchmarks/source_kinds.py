"""Two kinds of source, the same photos: a file list (CSV) and a Hugging Face dataset, converted and loaded, against
the loaders people use for each, in one run (issue 17).

From the benchmarks' sample photos (`--images`, JPEG, 20 classes) it builds, once, under --data:
  - a CSV file list (pandas `to_csv`: `path` relative to the photos' folder, `label` the class name);
  - an HF dataset of the same JPEG bytes (`datasets.Dataset.from_dict`, `Image()` + `ClassLabel` features,
    `save_to_disk`).
Then:
  1. conversion: `fastdata.convert_list(list.csv, ...)` and `fastdata.convert_hf(saved, ...)` to LMDB, each
     `--repeats` times, alternating, overwriting its output (`overwrite=True`); the source files are read once
     before timing; images/s of the whole call (listing, reading, verifying every image by decoding, writing,
     hashing, manifest);
  2. loading (`--augment train`: RandomResizedCrop 224 + flip; `val`: resize 256 + centre crop 224; uint8 out):
     (a) torchvision-style Dataset over the list (`ListImages`: PIL decode, the torchvision transform equal to
     the preset) in a DataLoader, the baseline of `fastdata bench --baseline-list`; (b) HF `datasets`:
     `load_from_disk` + `set_transform` applying that same torchvision transform to the decoded PIL images
     (a batched transform, as the HF docs show) in a DataLoader; (c) `fastdata.loader` over the list's LMDB;
     (d) `fastdata.loader` over the HF dataset's LMDB.
Every loader gets fastdata.loader's DataLoader settings with --workers workers (persistent workers, pinned
memory, prefetch factor: `fastdata.tools.bench_fair.loader_settings`), the same batch size and transform, one
untimed pass over a freshly built loader, its files read once before any timing, and --repeats alternating runs
(`fastdata.tools.bench.run_contenders`, as every benchmark and `fastdata bench`); the table gives medians and, against
each baseline, the median of the per-run ratios. The target of issue 17: fastdata at least 2x each baseline.

    python -m benchmarks.source_kinds --images 3000 --repeats 3

Needs `datasets` (`pip install 'fastdata[hf]'`). Run nothing else heavy while it runs: the ratios are only as good
as the machine is quiet.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import fastdata
from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder, loading_table, per_run_ratios_text
from fastdata.formats.manifest import read_manifest
from fastdata.tools.bench import (
    BenchConfig,
    Contender,
    LoaderResult,
    baseline_contender,
    fastdata_contender,
    run_contenders,
)
from fastdata.tools.bench_baseline import choose_baseline, torchvision_transform
from fastdata.tools.bench_fair import alternate, warm_page_cache

TARGET = 2.0  # issue 17: loading at least 2x each baseline

# ---------------------------------------------------------------------------------------------- the sources


def photo_rows(src: Path) -> list[tuple[str, str]]:
    """(path relative to `src`, class name) of every photo of the sample ImageFolder, in sorted order."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    classes, class_to_idx = find_classes(str(src))
    return [(Path(path).relative_to(src).as_posix(), classes[label])
            for path, label in make_dataset(str(src), class_to_idx, extensions=IMG_EXTENSIONS)]


def file_list(src: Path, out: Path) -> Path:
    """The photos as a CSV file list (`path` relative to `src`, `label` the class name), written once."""
    import pandas as pd

    if not out.is_file():
        tmp = out.with_name(out.name + ".tmp")
        pd.DataFrame(photo_rows(src), columns=["path", "label"]).to_csv(tmp, index=False)
        os.replace(tmp, out)
    return out


def hf_dataset(src: Path, out: Path) -> Path:
    """The photos as an HF dataset saved to disk (an `Image()` column holding each file's own bytes, a `ClassLabel`
    label), built once under a temporary name."""
    import datasets

    if (out / "state.json").is_file():
        return out
    rows = photo_rows(src)
    classes = sorted({name for _, name in rows})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    data = datasets.Dataset.from_dict(
        {"image": [{"bytes": (src / path).read_bytes(), "path": None} for path, _ in rows],
         "label": [classes.index(name) for _, name in rows]}, features=features)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    data.save_to_disk(str(tmp))
    os.replace(tmp, out)
    return out


def arrow_files(saved: Path) -> list[Path]:
    return sorted(saved.glob("*.arrow"))


# ---------------------------------------------------------------------------------------------- conversion


def conversion_table(conversions: dict[str, Callable[[], Any]], inputs: dict[str, list[Path]],
                     repeats: int) -> None:
    """Time each conversion `repeats` times, alternating; its input files read once before any timing."""
    read = warm_page_cache(f for files in inputs.values() for f in files)
    print(f"\n## conversion: {repeats} alternating runs each (inputs read once before timing: {read / 1e6:,.1f} MB)")
    runs: dict[str, list[tuple[int, float, int]]] = {name: [] for name in conversions}

    def run(name: str, repeat: int) -> None:
        started = time.perf_counter()
        summary = conversions[name]()
        seconds = time.perf_counter() - started
        if summary.resumed_at is not None:
            raise RuntimeError(f"{name}: resumed an earlier conversion; every run must convert from scratch")
        runs[name].append((summary.images, seconds, summary.bytes_in))
        print(f"  run {repeat + 1}: {name}: {summary.images:,} images in {seconds:.2f} s "
              f"({summary.images / seconds:,.0f} images/s, {len(summary.rejected)} rejected)", flush=True)

    alternate(list(conversions), repeats, run)
    rows = []
    for name, results in runs.items():
        rates = [images / seconds for images, seconds, _ in results]
        mbs = statistics.median(bytes_in / seconds / 1e6 for _, seconds, bytes_in in results)
        rows.append([name, f"{statistics.median(rates):,.0f}", f"{min(rates):,.0f}-{max(rates):,.0f}", f"{mbs:,.1f}"])
    report.table(f"conversion: images/s of the whole call, medians of {repeats} alternating runs (inputs read once "
                 f"before timing: {read / 1e6:,.1f} MB)", ["conversion (the whole call)", "images/s", "range",
                                                           "MB/s in"], rows)


# ---------------------------------------------------------------------------------------------- loading


def hf_contender(saved: Path, config: BenchConfig, name: str) -> Contender:
    """HF `datasets` as its docs show for image classification: `load_from_disk`, `set_transform` with a batched
    function applying the torchvision transform (the one equal to fastdata's preset) to the decoded PIL images,
    a DataLoader with a collate function stacking them; fastdata.loader's DataLoader settings."""
    import datasets
    import torch

    transform = torchvision_transform(config)
    settings = config.settings

    def transforms(examples: dict[str, list]) -> dict[str, list]:
        examples["pixel_values"] = [transform(image.convert("RGB")) for image in examples["image"]]
        del examples["image"]
        return examples

    def collate(examples: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.stack([example["pixel_values"] for example in examples]),
                torch.tensor([example["label"] for example in examples]))

    def make() -> Iterable:
        data = datasets.load_from_disk(str(saved))
        data.set_transform(transforms)
        return torch.utils.data.DataLoader(data, batch_size=config.batch_size, shuffle=True, collate_fn=collate,
                                           **settings.dataloader_kwargs())

    files = arrow_files(saved)
    rows = datasets.load_from_disk(str(saved)).num_rows
    return Contender(LoaderResult(name, role="baseline"), make, sum(f.stat().st_size for f in files) / max(1, rows),
                     files)


def report_loading(results: list[LoaderResult], baselines: list[LoaderResult], config: BenchConfig) -> None:
    notes = []
    for r in results:
        if r in baselines:
            continue
        for b in baselines:
            ratio = r.ratio_to(b)
            verdict = "meets" if ratio >= TARGET else "MISSES"
            notes.append(f"{r.name} vs {b.name}: {ratio:.2f}x (per run: {per_run_ratios_text(r, b)}); {verdict} the "
                         f"{TARGET:g}x target")
    loading_table(f"loading, augment={config.augment}: {config.warmup_passes} untimed + {config.epochs} timed passes "
                  f"per run, batch {config.batch_size}, image size {config.image_size}, {config.num_workers} workers, "
                  f"{config.repeats} alternating runs (medians); ratios: medians of the per-run ratios",
                  results, baselines, notes=notes)


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = arguments(__doc__, images=3000, epochs=2, batch_size=256, workers=None, augment="train")
    parser.add_argument("--skip-conversion", action="store_true",
                        help="Time no conversion; convert once only where an output is missing.")
    args = parser.parse_args()
    try:
        import datasets
    except ImportError as exc:
        sys.exit(f"this benchmark needs HF datasets ({exc}): pip install 'fastdata[hf]'")

    src = cached_sample_imagefolder(args.data, args.images, jpeg_only=True)
    here = args.data / f"source-kinds-{args.images}"
    here.mkdir(parents=True, exist_ok=True)
    csv = file_list(src, here / "list.csv")
    saved = hf_dataset(src, here / "hf-saved")
    list_lmdb, hf_lmdb = here / "list.lmdb", here / "hf.lmdb"
    photos = [src / path for path, _ in photo_rows(src)]
    print(f"{len(photos):,} photos in {src} ({sum(p.stat().st_size for p in photos) / 1e6:,.1f} MB); list {csv}; "
          f"HF dataset {saved} (datasets {datasets.__version__}, {len(arrow_files(saved))} Arrow files)")

    options = {"workers": args.workers, "progress": False, "overwrite": True}
    conversions = {
        "`fastdata.convert_list` (CSV list) -> LMDB":
            lambda: fastdata.convert_list(csv, list_lmdb, fastdata.FileListOptions(root=src, **options)),
        "`fastdata.convert_hf` (saved HF dataset) -> LMDB":
            lambda: fastdata.convert_hf(saved, hf_lmdb, fastdata.HfOptions(**options)),
    }
    if args.skip_conversion:
        for (name, convert), out in zip(conversions.items(), (list_lmdb, hf_lmdb), strict=True):
            if not (out / "manifest.json").is_file():
                print(f"converting once (untimed): {name}")
                convert()
    else:
        conversion_table(conversions, {"list": [csv, *photos], "hf": arrow_files(saved)}, args.repeats)
    for out in (list_lmdb, hf_lmdb):
        manifest = read_manifest(out)
        print(f"  {out.name}: {manifest.num_samples:,} samples, {manifest.data_bytes / 1e6:,.1f} MB stored, "
              f"{len(manifest.rejected)} rejected")

    config = BenchConfig(epochs=args.epochs, batch_size=args.batch_size, augment=args.augment, workers=args.workers,
                         repeats=args.repeats)
    print(f"\nDataLoader settings for every loader (fastdata.loader given the same): {config.settings}")
    listed = choose_baseline(list_lmdb, csv)  # the images the list names, less any the conversion rejected
    for note in listed.notes():
        print(f"  {note}")
    contenders = [
        baseline_contender(listed, config, "torchvision Dataset over the list"),
        hf_contender(saved, config, "HF datasets + set_transform"),
        fastdata_contender(list_lmdb, config, "fastdata.loader, list -> LMDB"),
        fastdata_contender(hf_lmdb, config, "fastdata.loader, HF -> LMDB"),
    ]
    results = run_contenders(contenders, config, progress=lambda line: print(f"  {line}", flush=True),
                             what=f"{args.images:,} photos")
    report_loading(results, results[:2], config)


if __name__ == "__main__":
    main()
