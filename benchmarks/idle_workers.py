"""What an evaluation loader's workers hold between its passes, with persistent workers and without.

    python -m benchmarks.idle_workers --images 3000 --workers 4 --repeats 3

A val loader (augment="val") over an LMDB conversion of the benchmarks' sample, as a training script has one
beside its training loader: after its passes, the worker processes still alive are counted and measured (psutil:
RSS, of it anonymous, file-backed and shared-memory pages, and USS: what would be freed if they exited), with
persistent_workers=True and with the default (None: not persistent for "val"). The price of the default is the
start of its workers at every pass: the seconds to the first batch and to the end of a pass are given for both
settings (medians of --repeats passes, after one untimed pass).
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import psutil

import fastdata
from benchmarks import report
from benchmarks.common import arguments, dataset_for, status_kb

MB = 2**20


def idle_workers() -> list[dict[str, float]]:
    """Memory in MB of each live child process of this one (the loader's workers)."""
    rows = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            full = child.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        status = {field: status_kb(child.pid, field) / 1024 for field in ("RssAnon", "RssFile", "RssShmem")}
        rows.append({"rss": full.rss / MB, "uss": full.uss / MB, "anon": status["RssAnon"],
                     "file": status["RssFile"], "shmem": status["RssShmem"]})
    return rows


def passes(loader, repeats: int) -> tuple[list[float], list[float]]:
    """(seconds to the first batch, seconds per pass) of `repeats` timed passes after an untimed one."""
    for _ in loader:
        pass
    first, whole = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        batches = iter(loader)
        next(batches)
        first.append(time.perf_counter() - started)
        for _ in batches:
            pass
        whole.append(time.perf_counter() - started)
    return first, whole


def measure(out: Path, persistent: bool | None, workers: int, batch_size: int, repeats: int) -> tuple[list, list]:
    """The table row of one setting (idle workers and their memory in MB in all, median seconds to the first batch
    and of a whole pass) and its notes (each worker's memory, each pass's seconds)."""
    loader = fastdata.loader(out, batch_size=batch_size, augment="val", shuffle=False, num_workers=workers,
                             persistent_workers=persistent)
    first, whole = passes(loader, repeats)
    rows = idle_workers()
    label = "persistent_workers=True" if persistent else "default (not persistent for val)"
    total = {key: sum(r[key] for r in rows) for key in ("rss", "uss", "anon", "file", "shmem")}
    print(f"\n{label}: {loader._loader.persistent_workers=}")
    row = [label, len(rows), *(f"{total[key]:,.1f}" for key in ("rss", "anon", "file", "shmem", "uss")),
           f"{statistics.median(first):.3f}", f"{statistics.median(whole):.3f}"]
    notes = [f"{label}, worker {i}: RSS {r['rss']:,.1f}, USS {r['uss']:,.1f}, anonymous {r['anon']:,.1f}, "
             f"file-backed {r['file']:,.1f}, shared memory {r['shmem']:,.1f}" for i, r in enumerate(rows)]
    notes.append(f"{label}: first batch of a pass {', '.join(f'{s:.3f}' for s in first)} s; whole pass "
                 f"{', '.join(f'{s:.3f}' for s in whole)} s")
    del loader
    gc.collect()
    psutil.wait_procs(psutil.Process().children(recursive=True), timeout=10)
    return row, notes


def main() -> None:
    args = arguments(__doc__, images=3000, repeats=3, workers=4, batch_size=128).parse_args()
    out = dataset_for(args.data, args.images)
    print(f"{out}: {fastdata.info(out).num_samples:,} images, {fastdata.info(out).data_bytes / MB:,.1f} MB; "
          f"val loader, {args.workers} workers, batch {args.batch_size}, image_size 224")
    rows, notes = [], []
    for persistent in (True, None):
        row, more = measure(out, persistent, args.workers, args.batch_size, args.repeats)
        rows.append(row)
        notes += more
    report.table(f"a val loader's idle workers after its passes ({args.workers} workers, batch {args.batch_size}): "
                 "their number and MB in all (psutil RSS and USS; /proc RssAnon, RssFile, RssShmem), and the seconds "
                 f"to the first batch and of a whole pass (medians of {args.repeats} passes after an untimed one)",
                 ["setting", "idle workers", "RSS MB", "anonymous MB", "file-backed MB", "shared memory MB", "USS MB",
                  "first batch s", "whole pass s"], rows, align="lrrrrrrrr", notes=notes)


if __name__ == "__main__":
    main()
