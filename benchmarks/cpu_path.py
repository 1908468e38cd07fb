"""The CPU path against its peers and against the decode ceiling, on the same stored bytes, in one run.

Workloads (2 workers = the machine's cores by default, batch 128, uint8 [B, 3, 224, 224] out):
  1. full-size stored JPEGs (the ImageFolder's own files; the LMDB holds the same bytes), train preset
     (RandomResizedCrop 224 + flip): torchvision ImageFolder + PIL transforms (the baseline), torchvision.io decode +
     v2 transforms (the fastest existing pipeline), fastdata (region decode), fastdata with whole-image OpenCV decode
     (what region decoding buys), and the decode-only ceiling: the fastest whole-image decoder of four (OpenCV,
     torchvision.io, Pillow, libjpeg-turbo through fastdata's extension), timed alone on one core, then run on all
     cores over every image in memory, with nothing else to do;
  2. the same, val preset (resize to 256, centre crop 224);
  3. stored at max side 256 as JPEG q90 (`fastdata convert --max-size 256`): the baseline and torchvision.io run on
     an ImageFolder of those very bytes.
Each contender runs `--repeats` times, alternating; the table gives medians, the median per-run ratio to the
baseline run beside it, the share of the decode ceiling, time to first batch and peak RSS (loader + workers).

    flock -x /tmp/cpu.lock python benchmarks/cpu_path.py --images 3000 --repeats 3

Run nothing else heavy while it runs: the ratios are only as good as the machine is quiet.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import shutil
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from fastdata.bench import BenchConfig, RunResult, imagefolder_baseline, time_loader
from fastdata.convert import convert_imagefolder
from fastdata.formats.lmdb import LmdbReader
from fastdata.formats.manifest import read_manifest
from fastdata.jpeg_region import Region, region_decoder
from fastdata.loader import loader
from fastdata.sample import cached_sample_imagefolder

# ---------------------------------------------------------------------------------------------- peers


def torchvision_io_v2(src: Path, config: BenchConfig) -> Callable[[], Iterable]:
    """ImageFolder files read with torchvision.io, decoded to uint8 tensors, transformed by transforms.v2."""
    import torch
    from torchvision import datasets
    from torchvision.io import ImageReadMode, decode_image, read_file
    from torchvision.transforms import v2

    size = config.image_size
    if config.augment == "train":
        transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])
    else:
        transform = v2.Compose([v2.Resize(round(size / 0.875), antialias=True), v2.CenterCrop(size)])

    def load(path: str):
        return decode_image(read_file(path), mode=ImageReadMode.RGB)

    def make() -> Iterable:
        data = datasets.DatasetFolder(str(src), loader=load, extensions=(".jpg", ".jpeg", ".png"),
                                      transform=transform)
        return torch.utils.data.DataLoader(data, batch_size=config.batch_size, shuffle=True,
                                           num_workers=config.num_workers, worker_init_fn=_one_thread)

    return make


def _one_thread(_worker_id: int) -> None:
    import torch

    torch.set_num_threads(1)


def fastdata_loader(path: Path, config: BenchConfig, region: bool = True) -> Callable[[], Iterable]:
    def make() -> Iterable:
        batches = loader(path, batch_size=config.batch_size, augment=config.augment, num_workers=config.num_workers)
        batches.dataset.pipeline.region_decode = region  # False: the whole-image OpenCV decode, for comparison
        return batches

    return make


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
    elapsed = max(results.get() for _ in workers)
    for worker in workers:
        worker.join()
    return len(datas) * passes / elapsed


# ---------------------------------------------------------------------------------------------- the run


def stored_bytes(path: Path) -> tuple[list[bytes], list[str]]:
    manifest = read_manifest(path)
    reader = LmdbReader(path, manifest.num_samples)
    return [reader.read(i) for i in range(manifest.num_samples)], [reader.key(i) for i in range(manifest.num_samples)]


def as_imagefolder(path: Path, out: Path) -> Path:
    """An ImageFolder tree of the LMDB's stored bytes (so that the peers read exactly what fastdata reads)."""
    if out.exists():
        shutil.rmtree(out)
    datas, keys = stored_bytes(path)
    for data, key in zip(datas, keys, strict=True):
        target = out / Path(key).with_suffix(".jpg")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return out


def peak_rss_mb(run: RunResult) -> float:
    return float((run.system or {}).get("rss_mb") or float("nan"))


def run_workload(title: str, contenders: list[tuple[str, Callable[[], Iterable]]], config: BenchConfig,
                 ceiling: float, ceiling_name: str) -> None:
    runs: dict[str, list[RunResult]] = {name: [] for name, _ in contenders}
    print(f"\n## {title}: {config.epochs} epochs per run, batch {config.batch_size}, {config.num_workers} workers, "
          f"{config.repeats} alternating runs")
    for repeat in range(config.repeats):
        for name, make in contenders:
            run = time_loader(name, make, config.epochs, 0.0)
            runs[name].append(run)
            print(f"  run {repeat + 1}: {name:<50} {run.images_per_s:8,.0f} images/s")
    baseline = [r.images_per_s for r in runs[contenders[0][0]]]
    print(f"\n| {'loader':<50} | images/s | vs baseline | of ceiling | first batch s | peak RSS MB |")
    print(f"|{'-' * 52}|---------:|------------:|-----------:|--------------:|------------:|")
    for name, _ in contenders:
        rates = [r.images_per_s for r in runs[name]]
        ratio = statistics.median(rate / base for rate, base in zip(rates, baseline, strict=True))
        median = statistics.median(rates)
        print(f"| {name:<50} | {median:8,.0f} | {ratio:10.2f}x | {median / ceiling:9.0%} | "
              f"{statistics.median(r.first_batch_s for r in runs[name]):13.2f} | "
              f"{statistics.median(peak_rss_mb(r) for r in runs[name]):11,.0f} |")
    print(f"| {'decode-only ceiling: ' + ceiling_name:<50} | {ceiling:8,.0f} | "
          f"{statistics.median(ceiling / b for b in baseline):10.2f}x | {1:9.0%} | {'':>13} | {'':>11} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=None, help="default: the usable cores")
    parser.add_argument("--workloads", default="train,val,256", help="comma-separated subset of train,val,256")
    args = parser.parse_args()
    workloads = set(args.workloads.split(","))

    src = cached_sample_imagefolder(args.data, args.images, jpeg_only=True)  # the workload: photo JPEGs
    full = args.data / f"cpu-path-{args.images}.lmdb"
    small = args.data / f"cpu-path-{args.images}-256.lmdb"
    for out, max_size in ((full, None), (small, 256)):
        if not out.exists():
            convert_imagefolder(src, out, progress=False, max_size=max_size, quality=90)
    small_src = as_imagefolder(small, args.data / f"cpu-path-{args.images}-256-imagefolder")

    train = BenchConfig(epochs=args.epochs, batch_size=args.batch_size, augment="train", workers=args.workers,
                        repeats=args.repeats)
    val = BenchConfig(epochs=args.epochs, batch_size=args.batch_size, augment="val", workers=args.workers,
                      repeats=args.repeats)
    processes = train.num_workers
    print(f"{args.images} images; {processes} processes for loaders and the decode ceiling")

    ceilings = {}
    for label, path in (("full-size", full), ("max side 256", small)):
        datas = [d for d, k in zip(*stored_bytes(path), strict=True) if d[:2] == b"\xff\xd8"]
        print(f"\nsingle-core whole-image decode, {label} stored JPEGs ({len(datas)} images, "
              f"{np.mean([len(d) for d in datas]) / 1e3:.0f} KB avg), median of 3 passes:")
        timings = {name: _single_core_ms(fn, datas) for name, fn in _decoders().items()}
        for name, ms in sorted(timings.items(), key=lambda item: item[1]):
            print(f"  {name:<32} {ms:6.3f} ms/image")
        fastest = min(timings, key=timings.get)
        ceilings[label] = (decode_ceiling(fastest, datas, processes), f"{fastest} x{processes}")
        print(f"  ceiling: {fastest} on {processes} processes: {ceilings[label][0]:,.0f} images/s")

    if "train" in workloads:
        run_workload("full-size stored JPEGs, train preset (RandomResizedCrop 224 + flip)", [
            ("torchvision ImageFolder + PIL (baseline)", imagefolder_baseline(src, train)),
            ("torchvision.io decode + v2 transforms", torchvision_io_v2(src, train)),
            ("fastdata (region decode)", fastdata_loader(full, train)),
            ("fastdata (whole-image OpenCV decode)", fastdata_loader(full, train, region=False)),
        ], train, *ceilings["full-size"])
    if "val" in workloads:
        run_workload("full-size stored JPEGs, val preset (resize 256 + centre crop 224)", [
            ("torchvision ImageFolder + PIL (baseline)", imagefolder_baseline(src, val)),
            ("torchvision.io decode + v2 transforms", torchvision_io_v2(src, val)),
            ("fastdata (region decode)", fastdata_loader(full, val)),
        ], val, *ceilings["full-size"])
    if "256" in workloads:
        run_workload("stored at max side 256, JPEG q90 (--max-size 256), train preset", [
            ("torchvision ImageFolder + PIL (baseline)", imagefolder_baseline(small_src, train)),
            ("torchvision.io decode + v2 transforms", torchvision_io_v2(small_src, train)),
            ("fastdata (region decode)", fastdata_loader(small, train)),
        ], train, *ceilings["max side 256"])


if __name__ == "__main__":
    main()
