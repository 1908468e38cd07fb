"""LMDB storage: one directory `OUT.lmdb/` holding LMDB's `data.mdb` and the manifest.

Layout (no pickle; every value is raw bytes with a fixed layout):
- sub-database `images`: key = sample index as 8-byte big-endian, value = the encoded image bytes;
- sub-database `keys`: same key, value = the source-relative path (UTF-8);
- sub-database `meta`: `labels`, `widths`, `heights` (little-endian int32 arrays), `codecs` (uint8 array).
Sample i is the i-th image written, which the converter makes ImageFolder's sample i.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import CorruptSampleError, NotADatasetError
from fastdata.formats.manifest import FileEntry, sha256_file
from fastdata.formats.records import CODEC_PIL, ImageRecord, key_bytes, key_from_bytes

DATA_FILE = "data.mdb"
_MAX_DBS = 5
_COMMIT_EVERY = 2048
_META_ARRAYS = {"labels": "<i4", "widths": "<i4", "heights": "<i4", "codecs": "u1"}


def index_key(index: int) -> bytes:
    return struct.pack(">Q", index)


# py-lmdb allows one open environment per path per process, and a forked child inherits the parent's (and can
# read through it: the mapping is shared and read-only, and lock=False keeps the reader table out of it). So
# every reader of a path in a process shares one environment: {real path: (data file identity, env, dbs)}.
_OPEN_ENVIRONMENTS: dict[str, tuple[tuple[int, int, int], Any, dict[str, Any]]] = {}


def shared_environment(directory: Path, db_names: tuple[str, ...] = ("images", "keys", "meta")
                       ) -> tuple[Any, dict[str, Any]]:
    """The process-wide read-only environment of `directory` and its sub-databases `db_names` (opened on
    first use). Raises NotADatasetError when a sub-database is missing."""
    import lmdb

    path = os.path.realpath(directory)
    stat = os.stat(os.path.join(path, DATA_FILE))
    identity = (stat.st_dev, stat.st_ino, stat.st_mtime_ns)
    cached = _OPEN_ENVIRONMENTS.get(path)
    if cached is not None and cached[0] != identity:
        cached[1].close()  # the dataset was replaced on disk (e.g. converted again with --overwrite)
        cached = None
    if cached is None:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, max_dbs=_MAX_DBS, subdir=True,
                        max_readers=1024)
        cached = _OPEN_ENVIRONMENTS[path] = (identity, env, {})
    env, dbs = cached[1], cached[2]
    for name in db_names:
        if name not in dbs:
            try:
                dbs[name] = env.open_db(name.encode(), create=False)
            except lmdb.Error as exc:
                raise NotADatasetError(f"{directory}: sub-database {name!r} is missing; the dataset is damaged "
                                       f"or of another kind ({exc})") from exc
    return env, dbs


def is_current(directory_key: str, env: Any) -> bool:
    """Whether `env` is still the shared environment of the real path `directory_key` (not released)."""
    cached = _OPEN_ENVIRONMENTS.get(directory_key)
    return cached is not None and cached[1] is env


def release_environments() -> None:
    """Close every environment this process holds for reading (readers reopen on their next read). Needed only
    to write to a dataset's LMDB file directly from a process that has read it: py-lmdb refuses a second open."""
    while _OPEN_ENVIRONMENTS:
        _, (_, env, _) = _OPEN_ENVIRONMENTS.popitem()
        env.close()


_RECORD_META = struct.Struct("<iiiB")  # label, width, height, codec of one record
_INITIAL_MAP_SIZE = 1 << 30


class LmdbWriter:
    """Appends image records in index order into an LMDB environment in `directory`.

    Records are committed in transactions of `commit_every` records together with the caller's progress
    record (`checkpoint`), so a killed conversion resumes from its last checkpoint with the data and the
    progress always in agreement. The map grows as needed: a full map is enlarged and the transaction
    replayed, so `MapFullError` never reaches the user."""

    def __init__(self, directory: Path, commit_every: int = _COMMIT_EVERY,
                 map_size: int = _INITIAL_MAP_SIZE) -> None:
        import lmdb

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.commit_every = commit_every
        self._env = lmdb.open(str(self.directory), map_size=map_size, max_dbs=_MAX_DBS, subdir=True,
                              sync=False, metasync=False, writemap=False, meminit=False)
        self._dbs = {name: self._env.open_db(name.encode()) for name in ("images", "keys", "meta", "records")}
        with self._env.begin() as txn:
            self.count = txn.stat(self._dbs["images"])["entries"]
        self._pending: list[tuple[bytes, bytes, str]] = []  # (key, value, db) puts of the open transaction
        self._txn = self._env.begin(write=True)

    def saved_progress(self) -> bytes | None:
        """The progress record of the last checkpoint, if this environment holds one."""
        with self._env.begin() as txn:
            return txn.get(b"progress", db=self._dbs["meta"])

    def _put(self, key: bytes, value: bytes, db: str, append: bool = False) -> None:
        import lmdb

        self._pending.append((key, value, db))
        try:
            self._txn.put(key, value, db=self._dbs[db], append=append)
        except lmdb.MapFullError:
            self._grow_and_replay()

    def _grow_and_replay(self) -> None:
        import lmdb

        self._txn.abort()
        while True:
            self._env.set_mapsize(self._env.info()["map_size"] * 2)
            self._txn = self._env.begin(write=True)
            try:
                for key, value, db in self._pending:
                    self._txn.put(key, value, db=self._dbs[db])
                return
            except lmdb.MapFullError:
                self._txn.abort()

    def _commit(self) -> None:
        import lmdb

        try:
            self._txn.commit()
        except lmdb.MapFullError:
            self._grow_and_replay()
            self._txn.commit()
        self._pending.clear()
        self._txn = self._env.begin(write=True)

    def add(self, record: ImageRecord) -> None:
        key = index_key(self.count)
        self._put(key, record.data, "images", append=True)
        self._put(key, key_bytes(record.key), "keys", append=True)
        self._put(key, _RECORD_META.pack(record.label, record.width, record.height, record.codec), "records",
                  append=True)
        self.count += 1

    def checkpoint_due(self) -> bool:
        return len(self._pending) >= 3 * self.commit_every

    def checkpoint(self, progress: bytes) -> None:
        """Commit the records added so far together with `progress` (what to resume from)."""
        self._put(b"progress", progress, "meta")
        self._commit()

    def close(self) -> list[FileEntry]:
        """Write the per-sample arrays, flush to disk and describe the data file."""
        self._commit()  # so that the records of the open transaction are read back below
        columns = np.zeros((self.count, 4), dtype=np.int64)
        with self._env.begin() as txn, txn.cursor(db=self._dbs["records"]) as cursor:
            for i, value in enumerate(cursor.iternext(keys=False, values=True)):
                columns[i] = _RECORD_META.unpack(value)
        for i, (name, dtype) in enumerate(_META_ARRAYS.items()):
            self._put(name.encode(), columns[: self.count, i].astype(dtype).tobytes(), "meta")
        self._commit()
        self._txn.abort()
        self._env.sync(True)
        self._env.close()
        lock = self.directory / "lock.mdb"
        if lock.exists():
            lock.unlink()  # readers open with lock=False; a stale lock file only confuses
        data = self.directory / DATA_FILE
        return [FileEntry(DATA_FILE, data.stat().st_size, sha256_file(data), self.count)]

    def abort(self) -> None:
        """Drop the uncommitted records (the last checkpoint stays) and close."""
        try:
            self._txn.abort()
        finally:
            self._env.close()


class LmdbReader:
    """Random access to an LMDB dataset. Opens the environment lazily, once per process (never before
    DataLoader workers fork), read-only and without locking; safe to pickle for spawn."""

    def __init__(self, directory: Path, num_samples: int, num_classes: int | None = None) -> None:
        self.directory = Path(directory)
        self.num_samples = num_samples
        self.num_classes = num_classes
        self._env = None
        self._pid = -1
        self._real_path = ""
        self._arrays: dict[str, np.ndarray] | None = None
        if not (self.directory / DATA_FILE).is_file():
            raise NotADatasetError(f"{self.directory}: {DATA_FILE} is missing; the dataset is damaged")

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_env=None, _dbs=None, _pid=-1)
        return state

    def _open(self):
        if self._env is None or self._pid != os.getpid() or not is_current(self._real_path, self._env):
            self._real_path = os.path.realpath(self.directory)
            self._env, self._dbs = shared_environment(self.directory)
            self._pid = os.getpid()
        return self._env

    def _array(self, name: str) -> np.ndarray:
        if self._arrays is None:
            env = self._open()
            arrays = {}
            with env.begin(buffers=False) as txn:
                for array_name, dtype in _META_ARRAYS.items():
                    raw = txn.get(array_name.encode(), db=self._dbs["meta"])
                    if raw is None:
                        raise NotADatasetError(f"{self.directory}: meta record {array_name!r} is missing")
                    values = np.frombuffer(raw, dtype=dtype)
                    if len(values) != self.num_samples:
                        raise NotADatasetError(
                            f"{self.directory}: meta record {array_name!r} holds {len(values)} entries, "
                            f"the manifest says {self.num_samples} samples; the dataset is damaged")
                    arrays[array_name] = values
            self._check_bounds(arrays)
            self._arrays = arrays
        return self._arrays[name]

    def _check_bounds(self, arrays: dict[str, np.ndarray]) -> None:
        """Values from an untrusted file are range-checked once, before any is used."""
        problems = []
        if self.num_samples and (arrays["widths"].min() < 1 or arrays["heights"].min() < 1):
            problems.append("non-positive image sizes")
        if self.num_samples and arrays["codecs"].max() > CODEC_PIL:
            problems.append("unknown codec ids")
        labels = arrays["labels"]
        if self.num_samples and (labels.min() < 0 or (self.num_classes is not None
                                                      and labels.max() >= self.num_classes)):
            problems.append(f"labels outside 0..{(self.num_classes or 1) - 1}")
        if problems:
            raise NotADatasetError(f"{self.directory}: the meta records hold {', '.join(problems)}; the dataset "
                                   "is damaged or not a fastdata dataset")

    @property
    def labels(self) -> np.ndarray:
        return self._array("labels")

    @property
    def widths(self) -> np.ndarray:
        return self._array("widths")

    @property
    def heights(self) -> np.ndarray:
        return self._array("heights")

    @property
    def codecs(self) -> np.ndarray:
        return self._array("codecs")

    def _get(self, db: str, index: int) -> bytes:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample index {index} out of range for {self.num_samples} samples")
        env = self._open()
        with env.begin() as txn:
            value = txn.get(index_key(index), db=self._dbs[db])
        if value is None:
            raise CorruptSampleError(f"{self.directory}: record {index} is missing from '{db}'")
        return value

    def read(self, index: int) -> bytes:
        """The encoded image bytes of sample `index`."""
        return self._get("images", index)

    def key(self, index: int) -> str:
        """The source-relative path of sample `index`."""
        return key_from_bytes(self._get("keys", index))

    def all_keys(self) -> list[str]:
        env = self._open()
        with env.begin() as txn, txn.cursor(db=self._dbs["keys"]) as cursor:
            return [key_from_bytes(bytes(v)) for v in cursor.iternext(keys=False, values=True)]
