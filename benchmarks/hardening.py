"""Hardening figures: per-worker memory over epochs, and the cost of corrupt samples with on_error="skip".

    python -m benchmarks.hardening --images 3000 --repeats 3

1. Memory stays flat: 3 epochs with 2 workers; each worker's RSS after every epoch (psutil), and its growth
   after the first epoch (target: under 5%).
2. Corrupt samples: 2% of the records of a copy of the dataset overwritten with garbage; with on_error="skip",
   one untimed and one timed epoch over it and over the clean dataset (fastdata.loader's DataLoader settings,
   both files read once before timing), --repeats alternating runs: skipped count, medians, and the
   throughput change as the median of the per-run ratios.
"""

from __future__ import annotations

import shutil
import statistics
import struct
import time
from pathlib import Path

import numpy as np
import psutil

import fastdata
from benchmarks import report
from benchmarks.common import arguments, dataset_for, status_kb
from fastdata.tools.bench_fair import alternate, dataset_files, loader_settings, median_ratio, warm_page_cache


def worker_memory_mb() -> list[tuple[float, float, float]]:
    """(RSS, anonymous RSS, file-backed RSS) in MB of each worker. File-backed pages are the LMDB file's pages
    the worker has read through its memory map: page cache, shared and reclaimable, not heap growth."""
    rows = []
    for child in psutil.Process().children(recursive=True):
        rss = child.memory_info().rss / 2**20
        rows.append((rss, status_kb(child.pid, "RssAnon") / 1024, status_kb(child.pid, "RssFile") / 1024))
    return sorted(rows)


def memory(out: Path, epochs: int, workers: int) -> None:
    loader = fastdata.loader(out, batch_size=128, augment="train", num_workers=workers)
    rows = []
    for _epoch in range(epochs):
        for _ in loader:
            pass
        rows.append(worker_memory_mb())
    report.table(f"per-worker memory (MB: RSS = anonymous + file-backed) after each epoch, {len(loader.dataset):,} "
                 f"images, {workers} workers, data file {fastdata.info(out).data_bytes / 2**20:,.0f} MB",
                 ["epoch", "worker (by RSS)", "RSS MB", "anonymous MB", "file-backed MB"],
                 [[str(epoch), str(worker), f"{rss:,.1f}", f"{anon:,.1f}", f"{file:,.1f}"]
                  for epoch, workers_mb in enumerate(rows) for worker, (rss, anon, file) in enumerate(workers_mb)],
                 align="llrrr")
    report.table(f"per-worker memory growth from the first epoch to the last ({epochs} epochs)",
                 ["worker (by RSS)", "RSS", "anonymous (heap) RSS"],
                 [[str(worker), *(f"{(last[c] - first[c]) / first[c] * 100:+.2f}%" for c in (0, 1))]
                  for worker, (first, last) in enumerate(zip(rows[0], rows[-1], strict=True))], align="lrr")


def corrupt_copy(out: Path, fraction: float, seed: int = 0) -> tuple[Path, int]:
    import lmdb

    copy = out.with_name(out.stem + "-corrupt.lmdb")
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(out, copy)
    n = fastdata.info(copy).num_samples
    bad = np.random.default_rng(seed).choice(n, int(n * fraction), replace=False)
    env = lmdb.open(str(copy), max_dbs=5, map_size=2 * (copy / "data.mdb").stat().st_size)
    images = env.open_db(b"images")
    with env.begin(write=True) as txn:
        for i in bad:
            txn.put(struct.pack(">Q", int(i)), b"\xff\xd8\xff garbage, not a JPEG", db=images)
    env.close()
    (copy / "lock.mdb").unlink(missing_ok=True)
    return copy, len(bad)


def epoch_rate(out: Path, workers: int) -> tuple[float, int]:
    """(images/s of the timed epoch, samples skipped in it), after one untimed epoch."""
    loader = fastdata.loader(out, batch_size=128, augment="train", on_error="skip",
                             **loader_settings(workers).loader_kwargs())
    for _ in loader:  # warm-up epoch
        pass
    borrowed_before = len(loader.borrowed)
    started, seen = time.perf_counter(), 0
    for _, labels in loader:
        seen += len(labels)
    rate = seen / (time.perf_counter() - started)
    # loader.skipped lists each bad sample once (all met in the warm-up epoch): count this epoch's from its yield
    return rate, len(loader.dataset) - seen + len(loader.borrowed) - borrowed_before


def corrupt(out: Path, repeats: int, workers: int) -> None:
    copy, bad = corrupt_copy(out, 0.02)
    warm_page_cache(dataset_files(out) + dataset_files(copy))
    rates: dict[Path, list[float]] = {out: [], copy: []}
    skipped = set()

    def run(path: Path, _repeat: int) -> None:
        rate, n = epoch_rate(path, workers)
        rates[path].append(rate)
        if path == copy:
            skipped.add(n)

    alternate([out, copy], repeats, run)
    clean, dirty = rates[out], rates[copy]
    delta = (median_ratio(dirty, clean) - 1) * 100
    report.table(f"corrupt samples: {bad} of {fastdata.info(out).num_samples:,} records overwritten with garbage; "
                 f'on_error="skip", one untimed + one timed epoch, medians of {repeats} alternating runs',
                 ["dataset", "images/s", "runs", "skipped per epoch", "throughput vs clean (median of the per-run "
                  "ratios)"],
                 [["clean", f"{statistics.median(clean):,.0f}", ", ".join(f"{r:,.0f}" for r in clean), "", ""],
                  ["corrupt", f"{statistics.median(dirty):,.0f}", ", ".join(f"{r:,.0f}" for r in dirty),
                   str(sorted(skipped)), f"{delta:+.1f}%"]],
                 align="lrrlr")


def main() -> None:
    args = arguments(__doc__, images=3000, epochs=3, workers=2).parse_args()
    out = dataset_for(args.data, args.images)
    memory(out, args.epochs, args.workers)
    corrupt(out, args.repeats, args.workers)


if __name__ == "__main__":
    main()
