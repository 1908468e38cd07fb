"""Worker hardening: dead, stuck or failing workers surface as errors that name what they were loading (our own
errors with their own message, not torch's wrapper), and are stopped; a loader replaced after it raised leaves no
noise; Ctrl-C ends a training loop cleanly; several loaders share one file; a worker's heap stays flat over
epochs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from builders.damaged import corrupt_copy, corrupt_shard_copy
from builders.images import SMALL_SOLID_COUNT, build_solid_tree
from builders.runs import REPLACE_AFTER_ERROR, TRAIN_UNTIL_CTRL_C, less_the_fallback_note, run_python

import fastdata
import fastdata.order.epoch
from fastdata.errors import CorruptSampleError, WorkerError


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


def _new_children(before: set[int]) -> list[psutil.Process]:
    return [child for child in psutil.Process().children(recursive=True) if child.pid not in before]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_corrupt_sample_met_by_a_worker_raises_its_own_message_and_stops_the_workers(solid_lmdb, solid_wds,
                                                                                       tmp_path, fmt):
    """With workers, the CorruptSampleError says what it says without them: one line that starts with the dataset
    (and shard) and the key, not torch's "Caught CorruptSampleError in DataLoader worker process 0. Original
    Traceback ..." (the worker's traceback is its cause); the workers are gone once it is raised."""
    if fmt == "lmdb":
        path, key = corrupt_copy(solid_lmdb, tmp_path, 7, b"not an image")
        start = f"{path}: sample {key!r}: "
    else:
        path, shard, key = corrupt_shard_copy(solid_wds, tmp_path)
        start = f"{shard}: sample {key!r}: "
    raised = {}
    for workers in (0, 2):
        before = {child.pid for child in psutil.Process().children(recursive=True)}
        loader = fastdata.loader(path, batch_size=4, augment="train", image_size=16, num_workers=workers)
        with pytest.raises(CorruptSampleError) as info:
            for _ in loader:
                pass
        raised[workers] = str(info.value)
        assert _new_children(before) == []
    assert raised[2] == raised[0]
    assert raised[2].startswith(start) and "\n" not in raised[2], raised[2]
    assert "in DataLoader worker process" in str(info.value.__cause__)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_loader_replaced_after_it_raised_leaves_no_noise(solid_lmdb, solid_wds, tmp_path, fmt):
    """A user's program catches the error of a loader with workers, makes a new loader and trains on: nothing on
    stderr (the failed loader's workers were stopped when it raised; left to the garbage collector, their iterator
    may be collected inside the new loader's workers and print "Exception ignored in ... can only test a child
    process")."""
    good = solid_lmdb if fmt == "lmdb" else solid_wds
    bad = corrupt_copy(solid_lmdb, tmp_path, 7, b"not an image")[0] if fmt == "lmdb" else \
        corrupt_shard_copy(solid_wds, tmp_path)[0]
    options = {"batch_size": 4, "augment": "train", "image_size": 16, "num_workers": 2}
    with pytest.raises(CorruptSampleError) as info:
        for _ in fastdata.loader(bad, **{**options, "num_workers": 0}):
            pass
    batches = len(fastdata.loader(good, **options))
    result = run_python(REPLACE_AFTER_ERROR, bad, good, json.dumps(options))
    assert (result.returncode, less_the_fallback_note(result.stderr)) == (0, "")
    assert result.stdout.splitlines() == [f"raised: {info.value}", f"pass 0 {batches}", f"pass 1 {batches}"]


def test_ctrl_c_ends_a_training_loop_with_one_line_and_no_worker_left(small_solid_lmdb, reap):
    """A real SIGINT to the whole process group (as a terminal's Ctrl-C sends it: the workers get it too) while a
    user's loop trains: the loop's own `interrupted` is all stderr holds (no worker or torch traceback), exit code
    130, and no process of the group is left."""
    options = {"batch_size": 4, "augment": "train", "image_size": 16, "num_workers": 2}
    process = subprocess.Popen([sys.executable, "-c", TRAIN_UNTIL_CTRL_C, str(small_solid_lmdb), json.dumps(options)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    reap(process)
    assert process.stdout.readline() == "training\n", process.communicate()
    os.killpg(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert (process.returncode, stdout, less_the_fallback_note(stderr)) == (130, "", "interrupted\n")
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # no worker is left in the group


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
    fastdata.convert_imagefolder(src.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
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
