"""Throughput of remote WebDataset loading (an HTTP server on 127.0.0.1) against the same shards on local disk.

Generates the sample ImageFolder, converts it with --format wds, serves the shard directory with
`python -m http.server` in its own process, and times `fastdata.loader` over the local directory and over the
URL: without a cache (each worker downloads and verifies the shards it reads), with a cold cache (each shard
downloaded once) and with a warm one. Same transform, batch size and DataLoader settings (fastdata.loader's,
`fastdata.tools.bench_fair.loader_settings`); the shard files are read once before timing (the server reads the same
files); no warm-up pass for any contender, since the first epoch's downloads are what is measured; --repeats
alternating runs, medians, and "vs local" as the median of the per-run ratios.

    python -m benchmarks.remote_vs_local --images 1000 --repeats 3

The server is local, so this measures fastdata's own cost of remote reading (fetch, sha256 check, spooling or
caching), not a network; over a real network add the transfer time of the shards.
"""

from __future__ import annotations

import argparse
import gc
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import fastdata
from benchmarks import report
from benchmarks.common import arguments, cached_sample_imagefolder
from fastdata.tools.bench_fair import alternate, dataset_files, loader_settings, median_ratio, warm_page_cache


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(path: str, args: argparse.Namespace, **options) -> tuple[float, float, float]:
    """(seconds to the first batch, images/s after it, images/s end to end) over `args.epochs` epochs of a
    fresh loader. Remote loading pays its downloads before the first batch of each epoch it downloads in."""
    loader = fastdata.loader(path, batch_size=args.batch_size, augment="train", image_size=224, seed=0,
                             **loader_settings(args.workers).loader_kwargs(), **options)
    started = time.perf_counter()
    first = steady_from = 0.0
    images = steady_images = 0
    for epoch in range(args.epochs):
        for n, (batch, _labels) in enumerate(loader):
            images += len(batch)
            if epoch == 0 and n == 0:
                first = steady_from = time.perf_counter() - started
            else:
                steady_images += len(batch)
    total = time.perf_counter() - started
    del loader
    gc.collect()  # the workers go now, not during the next contender's run
    return first, steady_images / (total - steady_from), images / total


def main() -> None:
    parser = arguments(__doc__, images=1000, epochs=3, batch_size=128, workers=2)
    parser.add_argument("--shard-size", default="16MB")
    args = parser.parse_args()

    src = cached_sample_imagefolder(args.data, args.images)
    shards = args.data / f"remote-{args.images}-{args.shard_size}.wds"
    if not shards.exists():
        fastdata.convert_imagefolder(src, shards, fastdata.ImageFolderOptions(format="wds", shard_size=args.shard_size,
                                                                              progress=False))
    files = fastdata.info(shards).files
    setup = (f"{len(files)} shards, {sum(f.bytes for f in files) / 1e6:.1f} MB, {args.images} images; "
             f"{args.workers} workers, batch {args.batch_size}, {args.epochs} epoch(s) per run")
    print(setup)

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(shards.parent)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/{shards.name}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/manifest.json", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        results: dict[str, list[tuple[float, float, float]]] = {
            "local disk": [], "HTTP, no cache": [], "HTTP, cold cache": [], "HTTP, warm cache": []}
        warm_page_cache(dataset_files(shards))

        def run(contender: str, _repeat: int) -> None:
            if contender == "local":
                results["local disk"].append(measure(str(shards), args))
            elif contender == "no cache":
                results["HTTP, no cache"].append(measure(url, args))
            else:  # the same cache directory, first cold, then warm
                with tempfile.TemporaryDirectory() as cache:
                    cached = fastdata.RemoteOptions(cache_dir=cache)
                    results["HTTP, cold cache"].append(measure(url, args, remote=cached))
                    results["HTTP, warm cache"].append(measure(url, args, remote=cached))

        alternate(["local", "no cache", "cache"], args.repeats, run)  # so that drift hits them alike
    finally:
        server.terminate()
        server.wait()
    local = [overall for _, _, overall in results["local disk"]]
    rows = []
    for name, values in results.items():
        first, steady, overall = (statistics.median(v[i] for v in values) for i in range(3))
        ratio = median_ratio([v[2] for v in values], local)
        rows.append([name, f"{first:.2f}", f"{steady:,.0f}", f"{overall:,.0f}", f"{ratio:.2f}x"])
    report.table(f"fastdata.loader over HTTP (127.0.0.1) vs local disk: {setup}, no warm-up pass; medians of "
                 f"{args.repeats} alternating runs, vs local the median of the per-run ratios (images/s all)",
                 ["loader", "first batch s", "images/s after", "images/s all", "vs local"], rows)


if __name__ == "__main__":
    main()
