"""The CPU path against its peers and against the decode ceiling, on the same stored bytes, in one run.

Workloads (2 workers = the machine's cores by default, batch 128, uint8 [B, 3, 224, 224] out):
  1. full-size stored JPEGs (the ImageFolder's own files, less any the conversion rejected; the LMDB holds the
     same bytes), train preset (RandomResizedCrop 224 + flip): torchvision.io decode + v2 transforms on uint8
     tensors (the baseline: the faster of torchvision's ways, the one its documentation recommends for speed),
     torchvision ImageFolder + PIL transforms (where most scripts start), fastdata (region decode), fastdata with
     whole-image OpenCV
     decode (what region decoding buys), the optional peers FFCV and NVIDIA DALI (CPU operators), and the
     decode-only ceiling: the fastest whole-image decoder of four (OpenCV, torchvision.io, Pillow, libjpeg-turbo
     through fastdata's extension), timed alone on one core, then run on all cores over every image in memory,
     with nothing else to do;
  2. the same, val preset (resize to 256, centre crop 224);
  3. stored at max side 256 as JPEG q90 (`fastdata convert --max-size 256`): torchvision (both ways) and DALI
     read an ImageFolder exported from that dataset (its very bytes); FFCV reads the .beton its own writer made
     with max_resolution=256 from the same source files.
Each workload also has a row for fastdata reading the same source JPEGs converted with `--jpeg-layout restart`
(issue 21: each JPEG rewritten losslessly with a restart marker after every MCU, the crop decoded from the sub-JPEG
of the MCUs it covers; the same pixels), next to today's region decode of the original bytes; the restart
conversions' size overhead and conversion time against the original layout's are printed first.
FFCV always stores what its writer re-encodes (JPEG q90), so its rows read FFCV's bytes, not the others': the row
says so. Every contender gets fastdata.loader's DataLoader settings (FFCV and DALI: as many threads as workers),
one untimed pass, the page cache warmed with its files, and `--repeats` alternating runs
(`fastdata.tools.bench.run_contenders`); the table gives medians, the median per-run ratio to the baseline, the share
of the decode ceiling, time to first batch and peak RSS (loader + workers). A peer that cannot be imported is left
out, with the reason printed (install: benchmarks/README.md).

    flock -x /tmp/cpu.lock python -m benchmarks.cpu_path --images 4000 --repeats 3

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import io
import multiprocessing
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from fastdata.converters.imagefolder import ImageFolderOptions, convert_imagefolder

from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder
from benchmarks.peers import PeerUnavailable, dali_contender, ffcv_beton, ffcv_contender
from fastdata.formats.lmdb import LmdbReader
from fastdata.formats.manifest import read_manifest
from fastdata.image.jpeg.region import Region, region_decoder
from fastdata.processes import stop_processes
from fastdata.tools.bench import (
    BenchConfig,
    Contender,
    LoaderResult,
    RunResult,
    baseline_contender,
    fastdata_contender,
    run_contenders,
)
from fastdata.tools.bench_baseline import Baseline, choose_baseline, source_baseline

# ---------------------------------------------------------------------------------------------- peers


def torchvision_io_v2(source: Baseline, config: BenchConfig, name: str = "torchvision.io decode + v2 transforms"
                      ) -> Contender:
    """The baseline's files read with torchvision.io, decoded to uint8 tensors, transformed by transforms.v2 (what
    torchvision's documentation recommends for speed: v2 transforms on uint8 tensors, not PIL images)."""
    import torch
    from torchvision import datasets
    from torchvision.io import ImageReadMode, decode_image, read_file
    from torchvision.transforms import v2

    size, settings, skip = config.image_size, config.settings, source.excluded_paths
    if config.augment == "train":
        transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])
    else:
        transform = v2.Compose([v2.Resize(int(size / 0.875), antialias=True), v2.CenterCrop(size)])

    def load(path: str):
        return decode_image(read_file(path), mode=ImageReadMode.RGB)

    def valid(path: str) -> bool:
        return path.lower().endswith((".jpg", ".jpeg", ".png")) and \
            Path(path).relative_to(source.root).as_posix() not in skip

    def make() -> Iterable:
        data = datasets.DatasetFolder(str(source.root), loader=load, is_valid_file=valid, transform=transform,
                                      allow_empty=True)
        return torch.utils.data.DataLoader(data, batch_size=config.batch_size, shuffle=True,
                                           **settings.dataloader_kwargs())

    per_image = sum(p.stat().st_size for p in source.files) / max(1, len(source.files))
    return Contender(LoaderResult(name), make, per_image, list(source.files))


def whole_image_decode(loader) -> None:
    loader.dataset.pipeline.region_decode = False  # the whole-image OpenCV decode, for comparison


# ---------------------------------------------------------------------------------------------- decode ceiling


def _decoders() -> dict[str, Callable[[bytes], object]]:
    import cv2
    import torch
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg

    def pil(data: bytes):
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))

    decoders = {
        "OpenCV imdecode": lambda data: cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_BGR),
        "torchvision.io decode_jpeg": lambda data: decode_jpeg(torch.frombuffer(data, dtype=torch.uint8),
                                                               mode=ImageReadMode.RGB),
        "Pillow": pil,
    }
    turbo = region_decoder()
    if turbo is not None:
        def whole(data: bytes):
            width, height, _ = turbo.header(data)
            return turbo.decode(data, Region(8, 0, 0, width, height), bgr=True)

        decoders["libjpeg-turbo (fastdata ext)"] = whole
    return decoders


def _single_core_ms(decode: Callable[[bytes], object], datas: list[bytes], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for data in datas:
            decode(data)
        times.append(time.perf_counter() - started)
    return statistics.median(times) / len(datas) * 1e3


def _decode_share(name: str, datas: list[bytes], passes: int, start, results) -> None:
    import cv2
    import torch

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    decode = _decoders()[name]
    start.wait()
    started = time.perf_counter()
    for _ in range(passes):
        for data in datas:
            decode(data)
    results.put(time.perf_counter() - started)


def decode_ceiling(name: str, datas: list[bytes], processes: int, passes: int = 2) -> float:
    """Images/s of `name` decoding every image in memory on `processes` processes (fork: the bytes are shared)."""
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_decode_share, args=(name, datas[i::processes], passes, start, results))
               for i in range(processes)]
    for worker in workers:
        worker.start()
    try:
        elapsed = max(results.get() for _ in workers)
    except BaseException:  # Ctrl-C, a worker's error: the others are not left decoding
        stop_processes(workers)
        raise
    stop_processes(workers, grace=60.0)  # each ends once it has put its result
    return len(datas) * passes / elapsed


# ---------------------------------------------------------------------------------------------- the run

RESTART_ROW = "fastdata (--jpeg-layout restart: sub-JPEG decode)"
REGION_ROW = "fastdata (region decode)"


def stored_bytes(path: Path) -> tuple[list[bytes], list[str]]:
    manifest = read_manifest(path)
    reader = LmdbReader(path, manifest.num_samples)
    return [reader.read(i) for i in range(manifest.num_samples)], [reader.key(i) for i in range(manifest.num_samples)]


def layout_row(label: str, original, restart) -> list[str]:
    """The restart conversion against the original one (manifests of the same source): JPEGs rewritten and kept,
    the size overhead, and the conversion time (each timed when it was made: a cached dataset keeps its time)."""
    stats = restart.stats.get("jpeg_layout") or {}
    kept = sum((stats.get("kept_original") or {}).values())
    seconds, base = restart.stats.get("seconds") or float("nan"), original.stats.get("seconds") or float("nan")
    return [label, f"{stats.get('rewritten', 0):,}", f"{kept:,}", f"x{stats.get('size_ratio', float('nan')):.3f}",
            f"{seconds:.1f}", f"{base:.1f}", f"{seconds / base:.2f}x"]


def peak_rss_mb(run: RunResult) -> float:
    return float((run.system or {}).get("rss_mb") or float("nan"))


def with_peers(contenders: list[Contender], peers: list[Callable[[], Contender]]) -> tuple[list[Contender], list[str]]:
    """`contenders` plus each peer that can be built here; a peer that cannot is left out, the reason a note of
    the table (the second item)."""
    out, omitted = list(contenders), []
    for build in peers:
        try:
            out.append(build())
        except PeerUnavailable as exc:
            omitted.append(f"(row left out: {exc})")
    return out, omitted


def run_workload(title: str, contenders: list[Contender], omitted: list[str], config: BenchConfig, ceiling: float,
                 ceiling_name: str) -> list[str] | None:
    """Time `contenders`, report their table; the restart layout's row against region decode's (None: not both
    ran)."""
    how = (f"{config.warmup_passes} untimed + {config.epochs} timed passes per run, batch {config.batch_size}, "
           f"{config.num_workers} workers, {config.repeats} alternating runs")
    print(f"\n## {title}: {how}")
    results = run_contenders(contenders, config, progress=lambda line: print(f"  {line}", flush=True))
    baseline = results[0]
    rows = [[r.name, f"{r.images_per_s:,.0f}", f"{r.ratio_to(baseline):.2f}x", f"{r.images_per_s / ceiling:.0%}",
             f"{r.first_batch_s:.2f}", f"{statistics.median(peak_rss_mb(run) for run in r.runs):,.0f}"]
            for r in results]
    base_rates = [run.images_per_s for run in baseline.runs]
    rows.append([f"decode-only ceiling: {ceiling_name}", f"{ceiling:,.0f}",
                 f"{statistics.median(ceiling / b for b in base_rates):.2f}x", f"{1:.0%}", "", ""])
    by_name = {r.name: r for r in results}
    report.table(f"{title}: images/s (medians), {how}; ratios: medians of the per-run ratios",
                 ["loader", "images/s", "vs baseline", "of ceiling", "first batch s", "peak RSS MB"], rows,
                 notes=omitted)
    if RESTART_ROW not in by_name or REGION_ROW not in by_name:
        return None
    region, restart = by_name[REGION_ROW], by_name[RESTART_ROW]
    return [f"{region.images_per_s:,.0f}", f"{restart.images_per_s:,.0f}", f"{restart.ratio_to(region):.2f}x",
            f"{restart.images_per_s / ceiling:.0%}"]


def main() -> None:
    parser = arguments(__doc__, images=4000, repeats=3, epochs=2, batch_size=128, workers=None)
    parser.add_argument("--workloads", default="train,val,256", help="comma-separated subset of train,val,256")
    parser.add_argument("--no-peers", action="store_true", help="leave FFCV and DALI out")
    args = parser.parse_args()
    workloads = set(args.workloads.split(","))

    src = cached_sample_imagefolder(args.data, args.images, jpeg_only=True)  # the workload: photo JPEGs
    full = args.data / f"cpu-path-{args.images}.lmdb"
    small = args.data / f"cpu-path-{args.images}-256.lmdb"
    full_restart = args.data / f"cpu-path-{args.images}-restart.lmdb"
    small_restart = args.data / f"cpu-path-{args.images}-256-restart.lmdb"
    for out, max_size, layout in ((full, None, "original"), (small, 256, "original"),
                                  (full_restart, None, "restart"), (small_restart, 256, "restart")):
        if not out.exists():
            convert_imagefolder(src, out, ImageFolderOptions(progress=False, max_size=max_size, quality=90,
                                                             jpeg_layout=layout, workers=args.workers))
    report.table("the restart layout (`--jpeg-layout restart`) against the original: JPEGs rewritten, the JPEG bytes' "
                 "size ratio, and each conversion's time (timed when it was made: a cached dataset keeps its time)",
                 ["stored", "JPEGs rewritten", "kept original", "JPEG bytes", "restart conversion s",
                  "original conversion s", "restart / original"],
                 [layout_row(label, read_manifest(original), read_manifest(restart))
                  for label, original, restart in (("full-size", full, full_restart),
                                                   ("max side 256", small, small_restart))])
    full_source = source_baseline(src, read_manifest(full))  # the stored bytes are the source's own
    small_source = choose_baseline(small, src, export_dir=args.data / f"cpu-path-{args.images}-256-export",
                                   progress=print)  # an ImageFolder of the 256 dataset's stored bytes
    for line in full_source.notes() + small_source.notes():
        print(line)

    train, val = (BenchConfig(epochs=args.epochs, batch_size=args.batch_size, augment=augment, workers=args.workers,
                              repeats=args.repeats) for augment in ("train", "val"))
    processes = max(1, train.num_workers)
    print(f"{args.images} images; {processes} processes for loaders and the decode ceiling; DataLoader settings "
          f"{train.settings}")

    ceilings = {}
    for label, path in (("full-size", full), ("max side 256", small)):
        datas = [d for d, k in zip(*stored_bytes(path), strict=True) if d[:2] == b"\xff\xd8"]
        timings = {name: _single_core_ms(fn, datas) for name, fn in _decoders().items()}
        fastest = min(timings, key=timings.get)
        ceilings[label] = (decode_ceiling(fastest, datas, processes), f"{fastest} x{processes}")
        report.table(f"single-core whole-image decode, {label} stored JPEGs ({len(datas)} images, "
                     f"{np.mean([len(d) for d in datas]) / 1e3:.0f} KB avg), median of 3 passes",
                     ["decoder", "ms/image"], [[name, f"{ms:.3f}"] for name, ms in
                                              sorted(timings.items(), key=lambda item: item[1])],
                     notes=[f"ceiling: {fastest} on {processes} processes: {ceilings[label][0]:,.0f} images/s"])

    betons: dict[str, Path] = {}

    def beton(max_resolution: int | None) -> Path:
        key = f"ffcv-{args.images}-{max_resolution or 'full'}"
        if key not in betons:
            betons[key] = ffcv_beton(full_source, args.data / f"{key}.beton", max_resolution, processes)
        return betons[key]

    def peers(source: Baseline, config: BenchConfig, max_resolution: int | None) -> list[Callable[[], Contender]]:
        if args.no_peers:
            return []
        stored = f"its writer's .beton, max_resolution={max_resolution}" if max_resolution else \
            "its writer's .beton, full size"
        return [lambda: ffcv_contender(beton(max_resolution), config, f"FFCV ({stored}, re-encoded JPEG q90)"),
                lambda: dali_contender(source, config, "NVIDIA DALI, CPU operators" + (
                    " (ROI decode)" if config.augment == "train" else ""))]

    # the baseline is the faster of torchvision's two ways (its documentation's recommended one); the ImageFolder +
    # PIL loader most scripts start from is shown beside it
    baseline = "torchvision.io decode + v2 transforms (baseline)"
    # workload -> its title, the baseline's files, fastdata's datasets (original, restart), config, FFCV's
    # max_resolution and the decode ceiling's stored JPEGs
    plans = {"train": ("full-size stored JPEGs, train preset (RandomResizedCrop 224 + flip)", full_source, full,
                       full_restart, train, None, "full-size"),
             "val": ("full-size stored JPEGs, val preset (resize 256 + centre crop 224)", full_source, full,
                     full_restart, val, None, "full-size"),
             "256": ("stored at max side 256, JPEG q90 (--max-size 256), train preset", small_source, small,
                     small_restart, train, 256, "max side 256")}
    layouts = []
    for workload, (title, source, stored, restart, config, max_resolution, ceiling) in plans.items():
        if workload not in workloads:
            continue
        contenders = [torchvision_io_v2(source, config, baseline),
                      baseline_contender(source, config, "torchvision ImageFolder + PIL"),
                      fastdata_contender(stored, config, REGION_ROW), fastdata_contender(restart, config, RESTART_ROW)]
        if workload == "train":  # what region decoding buys, on the full-size train workload
            contenders.append(fastdata_contender(stored, config, "fastdata (whole-image OpenCV decode)",
                                                 adjust=whole_image_decode))
        row = run_workload(title, *with_peers(contenders, peers(source, config, max_resolution)), config,
                           *ceilings[ceiling])
        if row:
            layouts.append([{"train": "full size, train", "val": "full size, val", "256": "max side 256, train"}[
                workload], *row])
    report.table("the restart layout against region decode, per workload, from the tables above: images/s "
                 "(medians), restart / region the median of the per-run ratios",
                 ["workload", "fastdata, region decode", "fastdata, --jpeg-layout restart", "restart / region",
                  "restart, of the decode ceiling"], layouts)


if __name__ == "__main__":
    main()
