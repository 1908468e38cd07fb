"""A loader reading LMDB through its memory map gives back each sample's pages once their bytes are copied out, so
that its workers' resident set does not grow by the bytes they read over an epoch."""

from __future__ import annotations

import os
import sys

import pytest

from fastdata.formats.lmdb import DATA_FILE, LmdbReader, LmdbWriter, index_key, shared_environment
from fastdata.formats.mapped_pages import MappedFile, mapped_ranges
from fastdata.formats.records import CODEC_PIL, ImageRecord

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/maps are Linux's")

SAMPLES, SIZE = 24, 200_000  # odd-sized values, each over many pages


def _value(index: int) -> bytes:
    return bytes([index % 251]) * (SIZE + 37 * index)


def _mapped_kb(path) -> int:
    """Resident kB of this process's mappings of file `path` (/proc/self/smaps)."""
    real, total, inside = os.path.realpath(path), 0, False
    with open("/proc/self/smaps", encoding="utf-8", errors="surrogateescape") as smaps:
        for line in smaps:
            head = line.split(maxsplit=5)
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
                inside = len(head) == 6 and head[5].rstrip("\n") == real
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


@pytest.fixture()
def written(tmp_path):
    writer = LmdbWriter(tmp_path / "d.lmdb")
    for index in range(SAMPLES):
        writer.add(ImageRecord(f"c/{index}.bin", _value(index), "png", index % 3, 5, 5, CODEC_PIL))
    writer.close()
    return tmp_path / "d.lmdb"


def test_reading_every_sample_leaves_its_pages_unmapped(written):
    total = sum(len(_value(i)) for i in range(SAMPLES))
    # the measure sees pages a plain read leaves mapped: every value read through the same map, kept mapped
    env, dbs = shared_environment(written)
    with env.begin(buffers=True) as txn:
        for index in range(SAMPLES):
            assert bytes(txn.get(index_key(index), db=dbs["images"])) == _value(index)
    assert _mapped_kb(written / DATA_FILE) * 1024 > 0.9 * total
    reader = LmdbReader(written, SAMPLES)
    assert [reader.read(i) for i in range(SAMPLES)] == [_value(i) for i in range(SAMPLES)]
    assert _mapped_kb(written / DATA_FILE) * 1024 < 0.05 * total  # the B-tree's few pages at most
    assert [reader.read(i) for i in reversed(range(SAMPLES))] == [_value(i) for i in reversed(range(SAMPLES))]


def test_only_bytes_of_the_files_own_mapping_are_released(written):
    env, dbs = shared_environment(written)
    assert mapped_ranges(str(written / DATA_FILE))  # LMDB maps its data file read-only and shared
    mapped = MappedFile(written / DATA_FILE)
    heap = bytearray(b"\x07" * 3 * 4096)
    assert not mapped.release(memoryview(heap))  # other memory: never given up (anonymous pages would be zeroed)
    assert heap == bytearray(b"\x07" * 3 * 4096)
    assert not MappedFile(written / "lock.mdb").release(memoryview(heap))
    with env.begin(buffers=True) as txn:
        view = txn.get(index_key(3), db=dbs["images"])
        assert mapped.release(view)
        assert bytes(view) == _value(3)  # mapped again from the page cache when read
