"""`fastdata verify` of an LMDB image dataset with per-record digests (`fastdata.formats.lmdb.record_digest`): the
digest table against the manifest's root, then every record's stored values against its digest, on every core,
each damaged record named by its index, key and source file."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fastdata.config import available_cores
from fastdata.errors import NotADatasetError
from fastdata.formats.lmdb import (
    DATA_FILE,
    DIGEST_DB,
    RECORD_DBS,
    digest_root,
    index_key,
    record_digest,
    shared_environment,
)
from fastdata.formats.manifest import Manifest
from fastdata.formats.records import key_from_bytes

CHUNK = 4096  # records a pool task checks

def _environment(root: str) -> tuple[Any, dict[str, Any]]:
    """The process's read-only environment of `root` (the one every reader of it shares: py-lmdb allows one per
    path and process) and the sub-databases a record may have values in."""
    env, dbs = None, {}
    for name in (*RECORD_DBS, DIGEST_DB):
        try:
            env, opened = shared_environment(Path(root), (name,))
        except NotADatasetError:  # a sub-database this dataset has none of (captions, targets, ...)
            continue
        dbs[name] = opened[name]
    return env, dbs


def _check_range(task: tuple[str, int, int]) -> list[tuple[int, str | None, str]]:
    """(index, key or None, what is wrong) of every damaged record of `start`..`stop` - 1."""
    root, start, stop = task
    env, dbs = _environment(root)
    damaged: list[tuple[int, str | None, str]] = []
    with env.begin(buffers=False) as txn:
        for index in range(start, stop):
            key = index_key(index)
            try:
                values = [(db, value) for db in RECORD_DBS if db in dbs
                          and (value := txn.get(key, db=dbs[db])) is not None]
                stored = txn.get(key, db=dbs[DIGEST_DB])
            except Exception as exc:  # an LMDB page so damaged that the record cannot be read
                damaged.append((index, None, f"cannot be read ({exc})"))
                continue
            name = next((key_from_bytes(v) for db, v in values if db == "keys"), None)
            if stored is None:
                damaged.append((index, name, "has no digest"))
            elif record_digest(values) != stored:
                damaged.append((index, name, "its stored values differ from their digest"))
    return damaged


def _check_arrays(root: Path, expected: dict[str, str], problems: list[str]) -> None:
    """The per-sample arrays (sizes, codecs, labels: the `meta` sub-database) against their recorded digests."""
    env, dbs = shared_environment(root, ("meta",))
    with env.begin() as txn:
        for name, digest in expected.items():
            value = txn.get(name.encode(), db=dbs["meta"])
            if value is None or digest_root(value) != digest:
                problems.append(f"{DATA_FILE}: the per-sample array {name!r} differs from its digest (damaged)")


def check_records(root: Path, manifest: Manifest, problems: list[str], progress: Callable[[str], None] | None,
                  workers: int | None = None) -> int:
    """Append a problem for a digest table that is not the manifest's and for every damaged record; returns the
    records checked."""
    expected = manifest.record_digests or {}
    count = manifest.num_samples
    try:
        env, dbs = shared_environment(root, (DIGEST_DB,))
        with env.begin() as txn, txn.cursor(db=dbs[DIGEST_DB]) as cursor:
            table = b"".join(cursor.iternext(keys=False, values=True))
    except Exception as exc:  # NotADatasetError (no digests), lmdb.Error (damaged)
        problems.append(f"{DATA_FILE}: its record digests cannot be read ({exc})")
        return 0
    if len(table) != 32 * count or digest_root(table) != expected.get("root"):
        problems.append(f"{DATA_FILE}: the record digests are not the manifest's ({len(table) // 32:,} digests, "
                        f"{count:,} records; their root differs): the file was altered")
    _check_arrays(root, expected.get("arrays", {}), problems)
    tasks = [(str(root), start, min(start + CHUNK, count)) for start in range(0, count, CHUNK)]
    workers = max(1, min(workers or available_cores(), len(tasks)))
    damaged: list[tuple[int, str | None, str]] = []
    results: Iterator[list[tuple[int, str | None, str]]]
    if workers == 1:
        results = map(_check_range, tasks)
    else:
        pool = multiprocessing.get_context("fork").Pool(workers)
        results = pool.imap(_check_range, tasks)
    try:
        for done, found in enumerate(results, start=1):
            damaged += found
            if progress:
                progress(f"checked {min(done * CHUNK, count):,} of {count:,} records")
    finally:
        if workers > 1:
            pool.close()
            pool.join()
    source = manifest.source.get("root") or manifest.source.get("path")
    for index, key, what in damaged:
        where = "" if key is None or not source else f", source file {os.path.join(str(source), key)}"
        name = f"record {index}" if key is None else f"record {index} ({key!r}{where})"
        problems.append(f"{DATA_FILE}: {name}: {what} (damaged)")
    return count
