"""Finished WebDataset shards hashed in processes of their own, while the conversion goes on: the sha256 of every
byte written is the one per-image cost that would otherwise stay in the writer (the conversion's parent process),
a single process that caps the conversion however many cores verify images. Shards are hashed in parallel, one
per hashing process; the writer holds a checkpoint back until the digests it lists are in
(`fastdata.formats.tar_shards.ShardWriter`)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from fastdata.convert.pool import start_method
from fastdata.formats.manifest import fsync_path, sha256_file


def _start_hashing_process(parent: int) -> None:
    """A hashing process leaves Ctrl-C to the conversion's parent, and ends when the parent is gone (a pool's
    processes hold their own task pipe open, so a killed parent's end never reaches them as end-of-file)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="fastdata-parent-watch", daemon=True).start()


def _hash(path: str) -> str:
    """Put the shard on disk (its writer did not wait for that), then hash it."""
    fsync_path(Path(path))
    return sha256_file(Path(path))


class ShardHashing:
    """`hashing(path)` -> the future of the file's sha256 (`ready()`, `get()`), from `processes` processes started
    by `start()` (before any thread of the conversion: they are forked where the platform allows) and stopped when
    the `with` block ends (terminated on an error: its digests are not wanted)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._pool: Any = None

    def start(self) -> ShardHashing:
        context = multiprocessing.get_context(start_method())
        self._pool = context.Pool(self.processes, initializer=_start_hashing_process, initargs=(os.getpid(),))
        return self

    def __call__(self, path: str) -> Any:
        if self._pool is None:
            raise RuntimeError("ShardHashing.start() first")
        return self._pool.apply_async(_hash, (path,))

    def __enter__(self) -> ShardHashing:
        return self

    def __exit__(self, kind: type | None, *_exc: object) -> None:
        if self._pool is None:
            return
        if kind is None:
            self._pool.close()
        else:
            self._pool.terminate()
        self._pool.join()
        self._pool = None


def hashing_processes(workers: int) -> int:
    """Processes that keep up with `workers` conversion workers: hashing a shard is ~10% of verifying its images
    (sha256 at ~400 MB/s against ~0.7 ms of verification per 50 KB image), so one per 8 workers."""
    return max(1, workers // 8)
