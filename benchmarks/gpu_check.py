"""GPU check for decode="device": one command, a few minutes on a GPU machine, one table.

    python benchmarks/gpu_check.py [--images 2000] [--out /tmp/gpu_check]

1. GPU decode vs CPU decode on the benchmark sample (nvjpeg vs libjpeg-turbo): max / mean abs pixel difference.
2. Decode-only images/s on the GPU (one batched `decode_jpeg` call) for batch sizes 64 and 256.
3. End-to-end loader images/s (random resized crop 224 + flip + normalise to bf16 on the GPU) for
   decode="device" vs decode="worker" vs the torchvision ImageFolder baseline, and peak GPU memory; for
   decode="device", the samples decoded in the workers (fallbacks: the sample's PNGs) and the device errors.

Needs torch + torchvision with CUDA; lmdb, webdataset, albumentations, tokenizers, opencv-python-headless,
scikit-image may be installed from wheels brought along (the machine may have no network):
    pip install --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch


def sample(out: Path, images: int) -> tuple[Path, Path]:
    import fastdata
    from fastdata.tools.sample import cached_sample_imagefolder

    src, lmdb = cached_sample_imagefolder(out, images), out / f"sample-{images}.lmdb"
    if not lmdb.exists():
        fastdata.convert_imagefolder(src, lmdb, progress=False)
    return src, lmdb


def decode_agreement(lmdb: Path, n: int = 256) -> tuple[float, float]:
    from torchvision.io import ImageReadMode, decode_jpeg

    import fastdata

    ds = fastdata.dataset(lmdb)
    reader = ds.reader
    indices = [i for i in range(min(n, len(ds))) if reader.codecs[i] == 0]
    data = [torch.frombuffer(bytearray(reader.read(i)), dtype=torch.uint8) for i in indices]
    gpu = decode_jpeg(data, mode=ImageReadMode.RGB, device="cuda")
    cpu = decode_jpeg(data, mode=ImageReadMode.RGB, device="cpu")
    diffs = [(g.cpu().int() - c.int()).abs() for g, c in zip(gpu, cpu, strict=True)]
    return max(float(d.max()) for d in diffs), statistics.mean(float(d.float().mean()) for d in diffs)


def decode_rate(lmdb: Path, batch: int, repeats: int = 5) -> float:
    from torchvision.io import ImageReadMode, decode_jpeg

    import fastdata

    reader = fastdata.dataset(lmdb).reader
    jpeg = [i for i in range(len(reader.codecs)) if reader.codecs[i] == 0][:batch]
    data = [torch.frombuffer(bytearray(reader.read(i)), dtype=torch.uint8) for i in jpeg]
    decode_jpeg(data, mode=ImageReadMode.RGB, device="cuda")  # warm-up
    rates = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        decode_jpeg(data, mode=ImageReadMode.RGB, device="cuda")
        torch.cuda.synchronize()
        rates.append(len(data) / (time.perf_counter() - started))
    return statistics.median(rates)


def loader_rate(make, epochs: int = 2, to_device: bool = False) -> tuple[float, object]:
    """images/s after the first batch, and the loader; `to_device` moves and normalises CPU batches as a
    training step would."""
    loader = make()
    first, seen = None, 0
    for _ in range(epochs):
        for images, labels in loader:
            if to_device:
                images = images.cuda(non_blocking=True).to(torch.bfloat16).div_(255)
            if first is None:
                torch.cuda.synchronize()
                first = time.perf_counter()
                continue
            seen += len(labels)
    torch.cuda.synchronize()
    return seen / (time.perf_counter() - first), loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpu_check"))
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here")
    import fastdata
    from fastdata.config import available_cores
    from fastdata.tools.bench import BenchConfig, imagefolder_baseline

    args.out.mkdir(parents=True, exist_ok=True)
    src, lmdb = sample(args.out, args.images)
    workers = min(available_cores(), 16)
    rows = [("device", torch.cuda.get_device_name(0)), ("cores / loader workers", f"{available_cores()} / {workers}")]
    max_diff, mean_diff = decode_agreement(lmdb)
    rows.append(("GPU vs CPU decode, max / mean abs diff", f"{max_diff:.0f} / {mean_diff:.3f}"))
    for batch in (64, 256):
        rows.append((f"decode only, batch {batch}", f"{decode_rate(lmdb, batch):,.0f} images/s"))

    def fast(decode: str):
        return lambda: fastdata.loader(lmdb, batch_size=args.batch_size, num_workers=workers, device="cuda",
                                       decode=decode, dtype=torch.bfloat16, channels_last=True)

    baseline = imagefolder_baseline(src, BenchConfig(batch_size=args.batch_size, workers=workers))
    results = {}
    for name, make, to_device in (("imagefolder", baseline, True), ("worker", fast("worker"), False),
                                  ("device", fast("device"), False)):
        torch.cuda.reset_peak_memory_stats()
        results[name], loader = loader_rate(make, to_device=to_device)
        rows.append((f"end to end: {name}", f"{results[name]:,.0f} images/s, peak GPU "
                                            f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"))
        if name == "device":  # over both epochs: fallbacks are the non-JPEG samples, errors should be 0
            rows.append(("device path: fallbacks (decoded in workers) / device errors",
                         f"{loader.device_fallbacks:,} / {loader.device_errors:,}"))
    base = results["imagefolder"]
    ratios = f"{results['device'] / base:.2f}x / {results['worker'] / base:.2f}x / 1.00x"
    rows.append(("ratio device / worker / imagefolder", ratios))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
