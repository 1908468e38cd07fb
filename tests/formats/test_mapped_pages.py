"""A loader reading LMDB reads each value from the file without mapping it and gives back what its lookups mapped,
so that its workers' resident set does not grow by the bytes they read over an epoch."""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import pytest
from builders.images import build_photo_tree

import fastdata
from fastdata.formats import mapped_pages
from fastdata.formats.lmdb import DATA_FILE, LmdbReader, LmdbWriter, index_key, shared_environment
from fastdata.formats.mapped_pages import MappedFile, mapped_ranges
from fastdata.formats.records import CODEC_PIL, ImageRecord

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc/self/maps are Linux's")

SAMPLES, SIZE = 27, 200_000  # odd-sized values, each over many pages


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


@pytest.mark.parametrize("release_every", [1, 5, 1000])
def test_reading_every_sample_leaves_nothing_mapped(written, monkeypatch, release_every):
    monkeypatch.setattr(mapped_pages, "RELEASE_EVERY", release_every)
    total = sum(len(_value(i)) for i in range(SAMPLES))
    # the measure sees the pages a read through the map leaves mapped: every value read that way first
    env, dbs = shared_environment(written)
    with env.begin(buffers=True) as txn:
        for index in range(SAMPLES):
            assert bytes(txn.get(index_key(index), db=dbs["images"])) == _value(index)
    assert _mapped_kb(written / DATA_FILE) * 1024 > 0.9 * total
    reader = LmdbReader(written, SAMPLES)
    order = random.Random(3).sample(range(SAMPLES), SAMPLES)  # shuffled, as an epoch reads
    assert [reader.read(i) for i in order] == [_value(i) for i in order]
    reader.release_mapped()  # as a batch ends
    assert _mapped_kb(written / DATA_FILE) * 1024 < 0.05 * total
    assert [reader.read(i) for i in order[:4]] == [_value(i) for i in order[:4]]  # read again after the release


def test_a_batch_read_by_a_dataset_leaves_nothing_mapped(tmp_path):
    tree = build_photo_tree(tmp_path / "src")
    fastdata.convert_imagefolder(tree.root, tmp_path / "d.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    dataset = fastdata.dataset(tmp_path / "d.lmdb", augment="val")
    batch = dataset.get_batch(np.arange(len(dataset)), epoch=0)
    assert len(batch.labels) == len(dataset)
    assert _mapped_kb(tmp_path / "d.lmdb" / DATA_FILE) == 0


def test_memory_outside_the_files_mapping_is_copied_and_never_released(written):
    shared_environment(written)
    ranges = mapped_ranges(str(written / DATA_FILE))
    assert ranges and all(offset == 0 for _, _, offset in ranges)  # LMDB maps its data file read-only, shared
    heap = bytearray(b"\x07" * 3 * 4096)
    assert MappedFile(written / DATA_FILE).copy(memoryview(heap)) == bytes(heap)
    MappedFile(written / DATA_FILE).release()
    assert heap == bytearray(b"\x07" * 3 * 4096)
    assert MappedFile(written / "lock.mdb").copy(memoryview(heap)) == bytes(heap)
