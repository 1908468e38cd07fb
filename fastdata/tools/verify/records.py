"""`fastdata verify` of an image dataset with per-record digests: the digest table against the manifest's root, then
the records against their digests, each damaged one named.

- LMDB (`fastdata.formats.lmdb.record_digest`): every record's stored values, on every core, each damaged record
  named by its index, key and source file (they stand for the data file's sha256);
- WebDataset (`fastdata.formats.wds.sample_digest`, a `.digests` file beside each shard): each shard is hashed whole
  as before; a shard whose sha256 (or size) differs has its samples' bytes checked against their digests, so that
  the damaged sample is named by shard and key, also when it still decodes."""

from __future__ import annotations

import hashlib
import os
import tarfile
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastdata.config import available_cores
from fastdata.convert.engines.pool import PoolStats, Workers
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
from fastdata.formats.wds import DIGEST_BYTES, digests_name, split_member_name
from fastdata.workers import worker_ignores_ctrl_c

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


@dataclass
class _Checked:
    """What a worker hands back for a range of records: the damaged ones (`results`, as the pool counts them) and
    its seconds."""

    results: list[tuple[int, str | None, str]]
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@dataclass(frozen=True)
class _RecordChecks:
    """The pool's job: `run_chunk(start, stop)` checks records start..stop-1 of the dataset at `root`."""

    root: str

    def run_chunk(self, start: int, stop: int) -> _Checked:
        began, cpu = time.perf_counter(), time.process_time()
        damaged = _check_range((self.root, start, stop))
        return _Checked(damaged, time.perf_counter() - began, time.process_time() - cpu)


def _ranges_checked(root: Path, tasks: list[tuple[str, int, int]], workers: int
                    ) -> Generator[list[tuple[int, str | None, str]], None, None]:
    """Each range's damaged records, in order: here (one worker) or on the house's worker pool
    (`fastdata.convert.engines.pool.Workers`), whose shutdown on an error or Ctrl-C stops every worker at once,
    SIGKILL after SIGTERM (`fastdata.processes.stop_processes`): never a join that waits for good on a worker
    that cannot end (one that died with a range in hand, one stuck in a library's exit handler)."""
    if workers == 1:
        yield from map(_check_range, tasks)
        return
    with Workers(_RecordChecks(str(root)), workers, worker_init=worker_ignores_ctrl_c,
                 describe=lambda task: f"check records {task[0]}..{task[1] - 1}", role="verify",
                 after_death="Run verify again") as pool:  # (the workers leave Ctrl-C to this process)
        for _, checked in pool.results(((start, stop) for _, start, stop in tasks), PoolStats()):
            yield checked.results


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
    results = _ranges_checked(root, tasks, workers)
    try:
        for done, found in enumerate(results, start=1):
            damaged += found
            if progress:
                progress(f"checked {min(done * CHUNK, count):,} of {count:,} records")
    finally:  # an error or Ctrl-C here: the workers are stopped at once, not waited for
        results.close()
    source = manifest.source.get("root") or manifest.source.get("path")
    for index, key, what in damaged:
        where = "" if key is None or not source else f", source file {os.path.join(str(source), key)}"
        name = f"record {index}" if key is None else f"record {index} ({key!r}{where})"
        problems.append(f"{DATA_FILE}: {name}: {what} (damaged)")
    return count


def shard_digest_tables(root: Path, manifest: Manifest, problems: list[str]) -> dict[str, bytes]:
    """A WebDataset image dataset's record digests, shard name -> its table (32 bytes per sample), those that are
    there whole; a problem for each missing or cut one, and for tables that are not the manifest's (their root)."""
    tables: dict[str, bytes] = {}
    whole = bytearray()
    for entry in manifest.files:
        name = digests_name(entry.name)
        try:
            table = (root / name).read_bytes()
        except OSError as exc:
            problems.append(f"{name}: the record digests of {entry.name} cannot be read ({exc.strerror or exc})")
            continue
        if len(table) != DIGEST_BYTES * entry.samples:
            problems.append(f"{name}: {len(table) // DIGEST_BYTES:,} record digests for the {entry.samples:,} samples "
                            f"of {entry.name} (the file was altered)")
            continue
        tables[entry.name] = table
        whole += table
    if len(tables) == len(manifest.files) and digest_root(bytes(whole)) != (manifest.record_digests or {}).get("root"):
        problems.append("the shards' record digests are not the manifest's (their root differs): a .digests file "
                        "was altered")
    return tables


def damaged_samples(path: Path, table: bytes) -> list[str]:
    """What differs between the shard at `path` and its samples' digests `table`: each sample whose bytes differ,
    named by its key and members, a sample count that is not the table's, and where the shard stops being a tar
    file."""
    name = path.name
    found: list[str] = []
    samples: list[tuple[str, list[str], int, int]] = []  # key, member names, first byte, end
    try:
        with open(path, "rb") as file, tarfile.open(fileobj=file, mode="r:") as tar:
            for member in tar:
                key, _ = split_member_name(member.name)
                end = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
                if samples and samples[-1][0] == key:
                    samples[-1] = (key, [*samples[-1][1], member.name], samples[-1][2], end)
                else:
                    samples.append((key, [member.name], member.offset, end))
    except (OSError, tarfile.TarError) as exc:
        found.append(f"{name}: unreadable as a tar file after its first {len(samples):,} samples ({exc})")
    fd = os.open(path, os.O_RDONLY)
    try:
        for index, (key, members, start, end) in enumerate(samples):
            expected = table[DIGEST_BYTES * index:DIGEST_BYTES * (index + 1)]
            if hashlib.sha256(os.pread(fd, end - start, start)).digest() != expected:
                what = "has no record digest" if not expected else "its bytes differ from its record digest"
                found.append(f"{name}: sample {index} ({key!r}: {', '.join(members)}): {what} (damaged)")
    finally:
        os.close(fd)
    if not found and len(samples) != len(table) // DIGEST_BYTES:
        found.append(f"{name}: holds {len(samples):,} samples, its record digests {len(table) // DIGEST_BYTES:,}")
    return found
