"""Storage hardening: the LMDB map grows by itself, damaged LMDB metadata is caught, and unsafe WebDataset shard
members are refused by name while harmless unknown ones are skipped."""

from __future__ import annotations

import io
import tarfile

import lmdb
import numpy as np
import pytest

import fastdata
from fastdata.errors import CorruptSampleError, NotADatasetError
from fastdata.formats.lmdb import LmdbReader, LmdbWriter
from fastdata.formats.records import ImageRecord


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


def test_lmdb_map_grows_for_a_huge_record_in_the_middle_of_a_transaction(tmp_path):
    """Records put while the map has room are not held by the writer; a huge one later in the same transaction
    fills the map, and the transaction is replayed whole into a larger one (the earlier records read back)."""
    writer = LmdbWriter(tmp_path / "h.lmdb", commit_every=1000, map_size=1 << 20)
    payloads = [bytes([i]) * 20_000 for i in range(10)] + [b"\x07" * 3_000_000] + [bytes([i]) * 30_000
                                                                                  for i in range(40)]
    for i, payload in enumerate(payloads):
        writer.add(ImageRecord(f"k{i}", payload, "jpg", 1, 10, 10, 0))
        if i == 25:
            writer.checkpoint(b"{}")  # and more transactions after it, the map grown ahead of them
    entries = writer.close()
    reader = LmdbReader(tmp_path / "h.lmdb", entries[0].samples, 3)
    assert [reader.read(i) for i in range(len(payloads))] == payloads
    assert [reader.key(i) for i in range(len(payloads))] == [f"k{i}" for i in range(len(payloads))]


def test_lmdb_checkpoints_come_after_commit_bytes_of_records_too(tmp_path):
    """Large records are checkpointed by bytes before `commit_every` records (a transaction of a few MiB stays in
    the caches); small ones by count."""
    writer = LmdbWriter(tmp_path / "b.lmdb", commit_every=100, commit_bytes=200_000)
    due_after = []
    for i in range(30):
        writer.add(ImageRecord(f"k{i}", bytes([i]) * 50_000, "jpg", 0, 10, 10, 0))
        if writer.checkpoint_due():
            due_after.append(i + 1)
            writer.checkpoint(b"{}")
    assert due_after and due_after[0] < 10 and len(due_after) >= 3
    assert len(set(due_after[i + 1] - due_after[i] for i in range(len(due_after) - 1))) == 1  # evenly spaced
    writer.close()
    small = LmdbWriter(tmp_path / "s.lmdb", commit_every=5, commit_bytes=200_000)
    small_due = []
    for i in range(12):
        small.add(ImageRecord(f"k{i}", b"x" * 100, "jpg", 0, 10, 10, 0))
        if small.checkpoint_due():
            small_due.append(i + 1)
            small.checkpoint(b"{}")
    small.close()
    assert small_due == [5, 10]


def test_damaged_lmdb_metadata_is_refused(small_solid_lmdb, tmp_path):
    import shutil

    copy = tmp_path / "c.lmdb"
    shutil.copytree(small_solid_lmdb, copy)
    env = lmdb.open(str(copy), max_dbs=5)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        labels = np.frombuffer(txn.get(b"labels", db=meta), "<i4").copy()
        labels[0] = 99
        txn.put(b"labels", labels.tobytes(), db=meta)
    env.close()
    with pytest.raises(NotADatasetError, match="labels outside"):
        fastdata.dataset(copy)[0]


def test_lmdb_stores_class_sets_and_metadata(tmp_path):
    sets = [(0, 2), (), (1,), (0, 1, 2)]
    writer = LmdbWriter(tmp_path / "m.lmdb", commit_every=2)
    for i, ids in enumerate(sets):
        writer.add(ImageRecord(f"k{i}", b"x", "jpg", ids, 10, 10, 0, metadata={"i": i, "name": f"é{i}"}))
    writer.close()
    reader = LmdbReader(tmp_path / "m.lmdb", 4, 3, "multi")
    assert [reader.label(i) for i in range(4)] == sets
    assert reader.label_list() == [list(ids) for ids in sets]
    assert [reader.metadata(i) for i in range(4)] == [{"i": i, "name": f"é{i}"} for i in range(4)]
    with pytest.raises(TypeError, match="multi-label"):
        reader.labels  # noqa: B018


def test_lmdb_refuses_to_mix_single_and_multi_labels(tmp_path):
    writer = LmdbWriter(tmp_path / "x.lmdb")
    writer.add(ImageRecord("a", b"x", "jpg", 1, 10, 10, 0))
    writer.add(ImageRecord("b", b"x", "jpg", (1,), 10, 10, 0))
    with pytest.raises(ValueError, match="1 of 2 records are multi-label"):
        writer.close()


@pytest.mark.parametrize(("array", "dtype", "position", "value", "problem"), [
    ("label_values", "<i4", 0, 99, "labels outside"),
    ("label_offsets", "<i8", -1, 10**6, "label offsets"),
])
def test_damaged_multi_label_arrays_are_refused(multi_label_lmdb, tmp_path, array, dtype, position, value, problem):
    import shutil

    copy = tmp_path / "c.lmdb"
    shutil.copytree(multi_label_lmdb, copy)
    env = lmdb.open(str(copy), max_dbs=8)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        values = np.frombuffer(txn.get(array.encode(), db=meta), dtype).copy()
        values[position] = value
        txn.put(array.encode(), values.tobytes(), db=meta)
    env.close()
    with pytest.raises(NotADatasetError, match=problem):
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
def test_unsafe_shard_members_are_refused_by_name(small_solid_tree, tmp_path, case):
    out = tmp_path / "shards"
    fastdata.convert_imagefolder(
        small_solid_tree.root, out, fastdata.ImageFolderOptions(format="wds", workers=1, progress=False)
    )
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


def test_harmless_unknown_members_are_skipped(small_solid_tree, tmp_path):
    out = tmp_path / "shards"
    fastdata.convert_imagefolder(
        small_solid_tree.root, out, fastdata.ImageFolderOptions(format="wds", workers=1, progress=False)
    )
    shard = out / fastdata.info(out).files[0].name
    with tarfile.open(shard) as tar:
        key = tar.getnames()[0].split(".")[0]
    buf = io.BytesIO()
    np.save(buf, np.arange(4))
    rewrite_shard(shard, [member(f"{key}.txt", b"a caption"), member(f"{key}.npy", buf.getvalue())])
    assert len(list(fastdata.dataset(out))) == len(small_solid_tree.images)
