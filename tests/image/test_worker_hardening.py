"""Worker hardening: dead, stuck or failing workers surface as errors that name what they were loading; several
loaders share one file; a worker's heap stays flat over epochs."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from builders import SMALL_SOLID_COUNT, build_solid_tree

import fastdata
import fastdata.order.epoch
from fastdata.errors import WorkerError


class KillOwnWorker:
    """An augment that kills the worker process it runs in (as the OOM killer would)."""

    def __call__(self, image):
        os.kill(os.getpid(), signal.SIGKILL)


class Stall:
    def __call__(self, image):
        time.sleep(30)
        return image


class Explode:
    def __call__(self, image):
        raise KeyError("an augmentation bug")


def test_a_killed_worker_is_an_error_naming_the_worker_and_keys(small_solid_lmdb):
    loader = fastdata.loader(small_solid_lmdb, batch_size=4, augment=KillOwnWorker(), num_workers=2,
                             multiprocessing_context="fork")
    with pytest.raises(WorkerError) as info:
        next(iter(loader))
    message = str(info.value)
    assert "worker 0" in message and ("exited unexpectedly" in message or "killed by signal" in message)
    first = int(fastdata.order.epoch.epoch_order(SMALL_SOLID_COUNT, 0, 0, True)[0])
    first_key = fastdata.dataset(small_solid_lmdb).reader.key(first)
    assert repr(first_key) in message


def test_a_stuck_worker_times_out_with_an_error(small_solid_lmdb):
    loader = fastdata.loader(small_solid_lmdb, batch_size=4, augment=Stall(), num_workers=1, timeout=1.5,
                             multiprocessing_context="fork")
    started = time.monotonic()
    with pytest.raises(WorkerError, match="timed out"):
        next(iter(loader))
    assert time.monotonic() - started < 25


def test_an_exception_in_a_worker_keeps_its_type_and_names_the_sample(small_solid_lmdb):
    loader = fastdata.loader(small_solid_lmdb, batch_size=4, augment=Explode(), shuffle=False, num_workers=1,
                             multiprocessing_context="fork")
    with pytest.raises(KeyError) as info:
        next(iter(loader))
    assert "while decoding sample" in str(info.value)
    assert fastdata.dataset(small_solid_lmdb).reader.key(0) in str(info.value)


def test_two_loaders_with_several_workers_over_one_file(small_solid_lmdb):
    train = fastdata.loader(small_solid_lmdb, batch_size=3, augment="train", image_size=16, num_workers=2)
    val = fastdata.loader(small_solid_lmdb, batch_size=5, augment="val", image_size=16, shuffle=False, num_workers=2)
    for _ in range(2):
        seen = sum(len(labels) for _, labels in train) + sum(len(labels) for _, labels in val)
        assert seen == 24


def _anon_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc status")


def test_worker_heap_stays_flat_over_epochs(tmp_path):
    import psutil

    src = build_solid_tree(tmp_path / "src", count=150)
    out = tmp_path / "m.lmdb"
    fastdata.convert_imagefolder(src.root, out, workers=1, progress=False)
    loader = fastdata.loader(out, batch_size=8, augment="train", image_size=32, num_workers=2,
                             multiprocessing_context="fork")
    per_epoch = []
    for _ in range(4):
        assert sum(len(labels) for _, labels in loader) == 150
        workers = psutil.Process().children(recursive=True)
        assert len(workers) >= 2
        per_epoch.append(sorted(_anon_rss_kb(w.pid) for w in workers))
    for first, last in zip(per_epoch[0], per_epoch[-1], strict=True):
        assert (last - first) / first < 0.05, per_epoch
