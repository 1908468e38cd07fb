"""Damaged copies of a conversion: a record, a shard or a text dataset with bytes that are not what they
should be."""

from __future__ import annotations

import io
import os
import shutil
import struct
import tarfile
from pathlib import Path

import lmdb

import fastdata

from .images import solid_id_of_path


def corrupt_copy(solid_lmdb, tmp_path, index: int, payload: bytes):
    """A copy of the solid LMDB dataset whose record `index` holds `payload`; returns (path, key)."""
    copy = tmp_path / "corrupt.lmdb"
    shutil.copytree(solid_lmdb, copy)
    env = lmdb.open(str(copy), max_dbs=4, subdir=True, map_size=1 << 26)
    try:
        images = env.open_db(b"images", create=False)
        keys = env.open_db(b"keys", create=False)
        with env.begin(write=True) as txn:
            assert txn.get(struct.pack(">Q", index), db=images) is not None
            txn.put(struct.pack(">Q", index), payload, db=images)
            key = bytes(txn.get(struct.pack(">Q", index), db=keys)).decode()
    finally:
        env.close()
    (copy / "lock.mdb").unlink(missing_ok=True)
    return copy, key


def rewritten_target_copy(path: Path, copy: Path, index: int, rewrite) -> str:
    """Copy the LMDB dataset `path` to `copy` with sample `index`'s stored target record replaced by
    `rewrite(the record's bytes)`; returns the sample's key."""
    shutil.copytree(path, copy)
    env = lmdb.open(str(copy), max_dbs=8, subdir=True, map_size=1 << 26)
    try:
        targets, keys = env.open_db(b"targets", create=False), env.open_db(b"keys", create=False)
        with env.begin(write=True) as txn:
            txn.put(struct.pack(">Q", index), rewrite(bytes(txn.get(struct.pack(">Q", index), db=targets))),
                    db=targets)
            key = bytes(txn.get(struct.pack(">Q", index), db=keys)).decode()
    finally:
        env.close()
    (copy / "lock.mdb").unlink(missing_ok=True)
    return key


def corrupt_ids_copy(path, tmp_path, sample_ids: set[int], payload: bytes = b"not an image"):
    """A copy of a solid conversion (LMDB or WebDataset) whose samples with the given ids hold `payload` instead
    of their image bytes (the WebDataset shards are rewritten member by member, in order)."""
    import tarfile

    from fastdata.formats.wds import IMAGE_EXTS

    copy = tmp_path / f"corrupt-{path.name}"
    shutil.copytree(path, copy)
    if path.suffix == ".lmdb":
        env = lmdb.open(str(copy), max_dbs=4, subdir=True, map_size=1 << 26)
        try:
            images, keys = env.open_db(b"images", create=False), env.open_db(b"keys", create=False)
            with env.begin(write=True) as txn:
                for index_bytes, key in list(txn.cursor(db=keys)):
                    if solid_id_of_path(bytes(key).decode()) in sample_ids:
                        txn.put(bytes(index_bytes), payload, db=images)
        finally:
            env.close()
        (copy / "lock.mdb").unlink(missing_ok=True)
        return copy
    for shard in sorted(copy.glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
        with tarfile.open(shard, "w") as tar:
            for member, data in members:
                if member.name.rsplit(".", 1)[-1] in IMAGE_EXTS and solid_id_of_path(member.name) in sample_ids:
                    data = payload
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    return copy


def corrupt_shard_copy(wds: Path, tmp_path: Path) -> tuple[Path, Path, str]:
    """A copy of a WebDataset image conversion whose second shard's first image holds garbage of its own size (the
    tar stays whole); returns (copy, that shard, the sample's key: its image member's name)."""
    copy = tmp_path / "corrupt_shards"
    shutil.copytree(wds, copy)
    shard = copy / fastdata.info(copy).files[1].name
    with tarfile.open(shard) as tar:
        victim = next(m for m in tar.getmembers() if m.name.rpartition(".")[2] not in ("json", "cls"))
    with open(shard, "r+b") as file:
        file.seek(victim.offset_data)
        file.write(b"\xff" * victim.size)
    return copy, shard, victim.name


def damaged_text_copy(data: Path, tmp_path: Path) -> tuple[Path, str]:
    """A copy of a text conversion with tokens missing (LMDB: its first token chunk cut to one token; WebDataset:
    its first shard cut after its first tar header); returns (copy, how the loader's error starts)."""
    copy = tmp_path / f"damaged_{data.name}"
    shutil.copytree(data, copy)
    if (copy / "data.mdb").is_file():
        env = lmdb.open(str(copy), max_dbs=8, subdir=True)
        try:
            with env.begin(write=True) as txn:
                tokens = env.open_db(b"tokens", txn=txn, create=False)
                txn.put(struct.pack(">Q", 0), b"\0" * 8, db=tokens)
        finally:
            env.close()
        (copy / "lock.mdb").unlink(missing_ok=True)
        return copy, f"{copy}: token chunk 0 is missing or short; the dataset is damaged"
    shard = copy / fastdata.info(copy).files[0].name
    os.truncate(shard, 512)  # its first tar header only
    return copy, f"{shard}: document "
