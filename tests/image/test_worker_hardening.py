"""Hardening: bombs refused from the header, unsafe shard members refused, damaged LMDB metadata caught,
the LMDB map grows by itself, and dead, stuck or failing workers surface as errors that name what they were
loading."""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import tarfile
import textwrap
import time
import zlib
from pathlib import Path

import lmdb
import numpy as np
import pytest
from builders import build_solid_tree, encode, solid_pattern

import fastdata
import fastdata.order.epoch
from fastdata.errors import CorruptSampleError, NotADatasetError, WorkerError
from fastdata.formats.lmdb import LmdbReader, LmdbWriter
from fastdata.formats.records import ImageRecord


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that claims width x height (8-bit grayscale) but holds one compressed row: a decompression bomb's
    header, tiny on disk."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * (width + 1)))
            + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_solid_tree(tmp_path_factory.mktemp("hard") / "src", count=12)


@pytest.fixture(scope="module")
def small_lmdb(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("hard") / "d.lmdb"
    fastdata.convert_imagefolder(tree.root, out, workers=1, progress=False)
    return out


def convert_in_subprocess(src, out) -> tuple[int, list, int]:
    """(images, rejected, peak RSS in KB) of a conversion run in a fresh process."""
    code = textwrap.dedent(f"""
        import json, resource, fastdata
        summary = fastdata.convert_imagefolder({str(src)!r}, {str(out)!r}, workers=1, progress=False)
        print(json.dumps([summary.images, summary.rejected, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return tuple(json.loads(run.stdout.strip().splitlines()[-1]))


def test_30k_by_30k_png_is_refused_from_its_header_without_a_memory_spike(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "fine.jpg").write_bytes(encode(solid_pattern(1, 40, 30), "JPEG"))
    _, _, baseline_kb = convert_in_subprocess(src, tmp_path / "base.lmdb")
    (src / "a" / "bomb.png").write_bytes(png_header_only(30_000, 30_000))
    images, rejected, peak_kb = convert_in_subprocess(src, tmp_path / "out.lmdb")
    assert images == 1
    assert rejected[0]["path"] == "a/bomb.png"
    assert rejected[0]["reason"].startswith("refused:") and "900000000 pixels" in rejected[0]["reason"]
    # decoding it would take 900 MB (grey) or 2.7 GB (RGB): the peak stays where the same run without it is
    assert peak_kb - baseline_kb < 400_000


def test_max_pixels_is_configurable(tree, tmp_path):
    summary = fastdata.convert_imagefolder(tree.root, tmp_path / "o.lmdb", max_pixels=100, workers=1,
                                           progress=False)
    assert summary.images == 0 and len(summary.rejected) == len(tree.images)
    assert all(r["reason"].startswith("refused:") and "--max-pixels" in r["reason"] for r in summary.rejected)


def test_lmdb_map_grows_instead_of_failing(tmp_path):
    writer = LmdbWriter(tmp_path / "g.lmdb", commit_every=8, map_size=64 * 1024)
    payloads = [bytes([i]) * 20_000 for i in range(60)]  # 1.2 MB into a 64 KB map
    for i, payload in enumerate(payloads):
        writer.add(ImageRecord(f"k{i}", payload, "jpg", i % 3, 10, 10, 0))
        if writer.checkpoint_due():
            writer.checkpoint(b"{}")
    entries = writer.close()
    assert entries[0].samples == 60
    reader = LmdbReader(tmp_path / "g.lmdb", 60, 3)
    assert [reader.read(i) for i in range(60)] == payloads
    assert reader.labels.tolist() == [i % 3 for i in range(60)]


def test_damaged_lmdb_metadata_is_refused(small_lmdb, tmp_path):
    import shutil

    copy = tmp_path / "c.lmdb"
    shutil.copytree(small_lmdb, copy)
    env = lmdb.open(str(copy), max_dbs=5)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        labels = np.frombuffer(txn.get(b"labels", db=meta), "<i4").copy()
        labels[0] = 99
        txn.put(b"labels", labels.tobytes(), db=meta)
    env.close()
    with pytest.raises(NotADatasetError, match="labels outside"):
        fastdata.dataset(copy)[0]


def rewrite_shard(shard, extra: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    """Append members to a shard (after its first sample's members)."""
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(shard, "w") as tar:
        for info, data in members[:3] + extra + members[3:]:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


@pytest.mark.parametrize("case", ["pickle", "object-npy", "dotdot", "symlink", "absolute"])
def test_unsafe_shard_members_are_refused_by_name(tree, tmp_path, case):
    out = tmp_path / "shards"
    fastdata.convert_imagefolder(tree.root, out, format="wds", workers=1, progress=False)
    shard = out / fastdata.info(out).files[0].name
    with tarfile.open(shard) as tar:
        key = tar.getnames()[0].split(".")[0]
    if case == "pickle":
        extra, expect = [member(f"{key}.pth", b"\x80\x04K\x01.")], "pickle"
    elif case == "object-npy":
        buf = io.BytesIO()
        np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        extra, expect = [member(f"{key}.npy", buf.getvalue())], "object-dtype"
    elif case == "dotdot":
        extra, expect = [member("../evil.jpg", b"x")], "unsafe path"
    elif case == "absolute":
        extra, expect = [member("/etc/evil.jpg", b"x")], "unsafe path"
    else:
        info = tarfile.TarInfo("link.jpg")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        extra, expect = [(info, None)], "not a regular file"
    rewrite_shard(shard, extra)
    with pytest.raises(CorruptSampleError, match=expect) as info:
        list(fastdata.dataset(out))
    assert shard.name in str(info.value)


def test_harmless_unknown_members_are_skipped(tree, tmp_path):
    out = tmp_path / "shards"
    fastdata.convert_imagefolder(tree.root, out, format="wds", workers=1, progress=False)
    shard = out / fastdata.info(out).files[0].name
    with tarfile.open(shard) as tar:
        key = tar.getnames()[0].split(".")[0]
    buf = io.BytesIO()
    np.save(buf, np.arange(4))
    rewrite_shard(shard, [member(f"{key}.txt", b"a caption"), member(f"{key}.npy", buf.getvalue())])
    assert len(list(fastdata.dataset(out))) == len(tree.images)


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


def test_a_killed_worker_is_an_error_naming_the_worker_and_keys(small_lmdb):
    loader = fastdata.loader(small_lmdb, batch_size=4, augment=KillOwnWorker(), num_workers=2,
                             multiprocessing_context="fork")
    with pytest.raises(WorkerError) as info:
        next(iter(loader))
    message = str(info.value)
    assert "worker 0" in message and ("exited unexpectedly" in message or "killed by signal" in message)
    first_key = fastdata.dataset(small_lmdb).reader.key(int(fastdata.order.epoch.epoch_order(12, 0, 0, True)[0]))
    assert repr(first_key) in message


def test_a_stuck_worker_times_out_with_an_error(small_lmdb):
    loader = fastdata.loader(small_lmdb, batch_size=4, augment=Stall(), num_workers=1, timeout=1.5,
                             multiprocessing_context="fork")
    started = time.monotonic()
    with pytest.raises(WorkerError, match="timed out"):
        next(iter(loader))
    assert time.monotonic() - started < 25


def test_an_exception_in_a_worker_keeps_its_type_and_names_the_sample(small_lmdb):
    loader = fastdata.loader(small_lmdb, batch_size=4, augment=Explode(), shuffle=False, num_workers=1,
                             multiprocessing_context="fork")
    with pytest.raises(KeyError) as info:
        next(iter(loader))
    assert "while decoding sample" in str(info.value)
    assert fastdata.dataset(small_lmdb).reader.key(0) in str(info.value)


def test_two_loaders_with_several_workers_over_one_file(small_lmdb):
    train = fastdata.loader(small_lmdb, batch_size=3, augment="train", image_size=16, num_workers=2)
    val = fastdata.loader(small_lmdb, batch_size=5, augment="val", image_size=16, shuffle=False, num_workers=2)
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
