"""LMDB storage: one directory `OUT.lmdb/` holding LMDB's `data.mdb` and the manifest.

Layout (no pickle; every value is raw bytes with a fixed layout, or JSON):
- sub-database `images`: key = sample index as 8-byte big-endian, value = the encoded image bytes;
- sub-database `keys`: same key, value = the source-relative path (UTF-8);
- sub-database `meta`: `widths`, `heights` (little-endian int32 arrays), `codecs` (uint8 array) and the labels:
  single-label datasets `labels` (little-endian int32 array, one class id per sample); multi-label datasets
  `label_offsets` (little-endian int64, samples + 1) and `label_values` (little-endian int32): sample i holds the
  class ids `label_values[label_offsets[i]:label_offsets[i + 1]]`;
- sub-database `metadata` (datasets whose source has per-sample metadata): same key, value = the sample's
  metadata as a UTF-8 JSON object;
- image-text pairs (`target_kind: "pairs"`): sub-database `captions`, same key, value = the caption as UTF-8 text,
  and with a tokenizer sub-database `tokens`, same key, value = its token ids as little-endian uint16 or uint32
  (the manifest's `pairs.dtype`).
- sub-database `targets` (datasets with targets, e.g. detection; created only for them): same key, value = the
  sample's target record (`fastdata.formats.targets`; segmentation: the label map PNG, `fastdata.formats.masks`).
- sub-database `digests`: same key, value = the record's digest (`record_digest`: sha256 over every value stored
  for it, in `RECORD_DBS` order), computed by the conversion worker that laid the record out; the manifest's
  `record_digests` holds the sha256 of all of them in index order (the root), so `fastdata verify` checks each
  record on every core and names the damaged ones, and no conversion hashes data.mdb as a whole (a dataset from
  before has the whole file's sha256 instead, and is verified as before).
Sample i is the i-th image written, which the converter makes ImageFolder's sample i.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import START_AGAIN, CorruptSampleError, NotADatasetError, StagingDamagedError
from fastdata.formats.manifest import FileEntry
from fastdata.formats.mapped_pages import MappedFile
from fastdata.formats.records import CODEC_PIL, ImageRecord, Label, key_bytes, key_from_bytes

DATA_FILE = "data.mdb"
_MAX_DBS = 16
_COMMIT_EVERY = 2048
# A transaction's dirty pages are the writer's own memory until the commit writes them out: kept to a few MiB, they
# stay in the CPU's caches and the allocator's hands, where a transaction of 2,048 photos (~100 MiB) streams them
# through memory twice and faults fresh heap pages in each time; the conversion parent's CPU per image halves
# (`benchmarks/convert_speed.py`, the parent / worker column)
_COMMIT_BYTES = 16 << 20
_SIZE_ARRAYS = {"widths": "<i4", "heights": "<i4", "codecs": "u1"}
_LABEL_ARRAYS = {"single": {"labels": "<i4"}, "multi": {"label_offsets": "<i8", "label_values": "<i4"}}


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


#: The sub-databases a record's values go to, in the order they are put and digested (`record_digest`).
RECORD_DBS = ("images", "keys", "records", "metadata", "captions", "tokens", "targets")
DIGEST_DB = "digests"
_LENGTH = struct.Struct("<Q")


def record_digest(values: Any) -> bytes:
    """sha256 over a record's stored values, (sub-database, value) in `RECORD_DBS` order: each value's
    sub-database name and length go in too, so that no value can stand for another."""
    digest = hashlib.sha256()
    for db, value in values:
        digest.update(db.encode())
        digest.update(_LENGTH.pack(len(value)))
        digest.update(value)
    return digest.digest()


def digest_root(table: bytes) -> str:
    """The manifest's `record_digests["root"]`: sha256 of every record's digest, in index order."""
    return hashlib.sha256(table).hexdigest()


_RECORD_META = struct.Struct("<iiiB")  # label, width, height, codec of one record (+ class ids: see _MULTI)
_MULTI = -1  # the label field of a multi-label record, whose class ids follow as little-endian int32
_INITIAL_MAP_SIZE = 1 << 30
_RESERVE = 1 << 16  # map bytes kept free for what a commit itself writes (its free-page list)


class LmdbWriter:
    """Appends image records in index order into an LMDB environment in `directory`.

    Records are committed in transactions of `commit_every` records (or fewer: `commit_bytes` of pages at most)
    together with the caller's progress record (`checkpoint`), so a killed conversion resumes from its last
    checkpoint with the data and the progress always in agreement. The map grows as needed: ahead of each
    transaction, to leave room for a few like the last, and when a transaction fills it all the same, it is
    enlarged and the transaction replayed, so
    `MapFullError` never reaches the user."""

    def __init__(self, directory: Path, commit_every: int = _COMMIT_EVERY,
                 map_size: int = _INITIAL_MAP_SIZE, targets: bool = False, pairs: bool = False,
                 commit_bytes: int = _COMMIT_BYTES) -> None:
        import lmdb

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.commit_every = commit_every
        self.commit_bytes = commit_bytes
        self._env = lmdb.open(str(self.directory), map_size=map_size, max_dbs=_MAX_DBS, subdir=True,
                              sync=False, metasync=False, writemap=False, meminit=False)
        # `targets`, `captions` and `tokens` only for a dataset that has them: every other dataset stays
        # byte-identical to what it was
        names = (("images", "keys", "meta", "records", "metadata", DIGEST_DB)
                 + (("captions", "tokens") if pairs else ()) + (("targets",) if targets else ()))
        self._dbs = {name: self._env.open_db(name.encode()) for name in names}
        with self._env.begin() as txn:
            self.count = txn.stat(self._dbs["images"])["entries"]
        self._page = self._env.stat()["psize"]
        # The puts of the open transaction, (key, value, db), to replay into a larger map. The values are kept only
        # once the transaction comes near the end of the map (`_room`): before that, a value is None and is read
        # back from the transaction itself if a replay may come; holding every value would keep a transaction's
        # worth of record bytes alive (the writer's page faults, not only its memory).
        self._pending: list[tuple[bytes, bytes | None, str]] = []
        self._keeping = False  # whether the values of `_pending` are kept
        self._txn_bytes = 0  # an upper bound of the map bytes the open transaction's puts use
        self._last_txn_bytes = 0
        self.record_digests: dict[str, Any] | None = None  # set by `close`: the manifest's `record_digests`
        self._txn_records = 0  # records added in the open transaction
        self._begin()

    def saved_progress(self) -> bytes | None:
        """The progress record of the last checkpoint, if this environment holds one."""
        with self._env.begin() as txn:
            return txn.get(b"progress", db=self._dbs["meta"])

    def _begin(self) -> None:
        """Open the next write transaction, the map first enlarged to leave room for a few more like the last."""
        info = self._env.info()
        used = (info["last_pgno"] + 1) * self._page
        wanted = used + 4 * self._last_txn_bytes + _RESERVE
        if self._last_txn_bytes and info["map_size"] < wanted:
            self._env.set_mapsize(max(info["map_size"] * 2, wanted))
        self._room = self._env.info()["map_size"] - used
        self._txn = self._env.begin(write=True)
        self._keeping = False
        self._txn_bytes = 0

    def _bound(self, values: Any, key_length: int = 8) -> int:
        """An upper bound of the map bytes that putting `values`, ((sub-database, value), ...), takes: each
        value's pages, a branch page too, and its key."""
        page = self._page
        return sum(page * (len(value) // page + 2) + key_length for _, value in values)

    def _put(self, key: bytes, value: bytes, db: str, append: bool = False) -> None:
        import lmdb

        self._txn_bytes += self._bound(((db, value),), len(key))
        if not self._keeping and self._txn_bytes > self._room // 2 - _RESERVE:
            self._keep_values()
        self._pending.append((key, value if self._keeping else None, db))
        try:
            self._txn.put(key, value, db=self._dbs[db], append=append)
        except lmdb.MapFullError:
            self._grow_and_replay()

    def _keep_values(self) -> None:
        """From now on keep the values of this transaction's puts, those so far read back from it."""
        self._pending = [(key, value if value is not None else self._txn.get(key, db=self._dbs[db]), db)
                         for key, value, db in self._pending]
        self._keeping = True

    def _grow_and_replay(self) -> None:
        import lmdb

        assert self._keeping, "a full map before the transaction came near its end"
        self._txn.abort()
        while True:
            self._env.set_mapsize(self._env.info()["map_size"] * 2)
            self._txn = self._env.begin(write=True)
            try:
                for key, value, db in self._pending:
                    self._txn.put(key, value, db=self._dbs[db])  # type: ignore[arg-type]  # kept: all bytes
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
        self._txn_records = 0
        self._last_txn_bytes = self._txn_bytes
        self._begin()

    @staticmethod
    def lay_out(record: ImageRecord) -> tuple[tuple[str, bytes], ...]:
        """The values `record` is stored as, (sub-database, value) in the order they are put: what a conversion
        worker prepares so that the writer only puts them (`add`)."""
        if isinstance(record.label, tuple):
            facts = (_RECORD_META.pack(_MULTI, record.width, record.height, record.codec)
                     + np.asarray(record.label, dtype="<i4").tobytes())
        else:
            facts = _RECORD_META.pack(record.label, record.width, record.height, record.codec)
        values = [("images", record.data), ("keys", key_bytes(record.key)), ("records", facts)]
        if record.metadata is not None:
            values.append(("metadata", json.dumps(record.metadata, ensure_ascii=False).encode("utf-8")))
        if record.caption is not None:
            values.append(("captions", record.caption.encode("utf-8")))
        if record.tokens is not None:
            values.append(("tokens", np.asarray(record.tokens).astype(record.tokens.dtype.newbyteorder("<")).tobytes()))
        if record.target is not None:
            values.append(("targets", record.target))
        values.append((DIGEST_DB, record_digest(values)))  # hashed here, in the worker that holds the bytes
        return tuple(values)

    def add(self, record: ImageRecord | tuple[tuple[str, bytes], ...]) -> None:
        """Append the next record: an `ImageRecord`, or its values as `lay_out` laid them out (in a worker)."""
        values = self.lay_out(record) if isinstance(record, ImageRecord) else record
        key = index_key(self.count)
        for db, _ in values:
            if db not in self._dbs:
                what = "caption" if db in ("captions", "tokens") else "target"
                raise ValueError(f"{self.directory}: a record with a {what}, for a writer opened without "
                                 f"{'pairs' if what == 'caption' else 'targets'}")
        bound = self._bound(values)
        if self._keeping or self._txn_bytes + bound > self._room // 2 - _RESERVE:
            for db, value in values:  # near the end of the map: one at a time, kept for a replay
                self._put(key, value, db, append=True)
        else:  # the common case, the one the conversion parent runs per image: the puts alone
            self._txn_bytes += bound
            self._pending.extend((key, None, db) for db, _ in values)
            put, dbs = self._txn.put, self._dbs
            for db, value in values:  # the map has room for them (`_room`)
                put(key, value, db=dbs[db], append=True)
        self.count += 1
        self._txn_records += 1

    def checkpoint_due(self) -> bool:
        """Whether the open transaction holds `commit_every` records or `commit_bytes` of pages."""
        return self._txn_records >= self.commit_every or (self._txn_records > 0
                                                          and self._txn_bytes >= self.commit_bytes)

    def checkpoint(self, progress: bytes) -> None:
        """Commit the records added so far together with `progress` (what to resume from)."""
        self._put(b"progress", progress, "meta")
        self._commit()

    def close(self) -> list[FileEntry]:
        """Write the per-sample arrays, flush to disk and describe the data file (its records' digests: see
        `record_digests`; no sha256 of the whole file, which would be a serial pass over it)."""
        self._commit()  # so that the records of the open transaction are read back below
        with self._env.begin() as txn:
            held = txn.stat(self._dbs["records"])["entries"]
        if held != self.count:  # another process wrote into the same staging (never with the output's lock)
            raise StagingDamagedError(f"{self.directory}: holds {held:,} records where this conversion wrote "
                                      f"{self.count:,}: another process wrote into it; {START_AGAIN}")
        columns = np.zeros((self.count, 4), dtype=np.int64)
        label_sets: list[np.ndarray] = []
        with self._env.begin() as txn, txn.cursor(db=self._dbs["records"]) as cursor:
            for i, value in enumerate(cursor.iternext(keys=False, values=True)):
                columns[i] = _RECORD_META.unpack_from(value)
                if columns[i, 0] == _MULTI:
                    label_sets.append(np.frombuffer(value, dtype="<i4", offset=_RECORD_META.size))
        if label_sets and len(label_sets) != self.count:
            raise ValueError(f"{self.directory}: {len(label_sets)} of {self.count} records are multi-label; a "
                             "dataset's samples are all single-label or all multi-label")
        arrays = {name: columns[: self.count, i + 1].astype(dtype)
                  for i, (name, dtype) in enumerate(_SIZE_ARRAYS.items())}
        if label_sets:
            offsets = np.zeros(self.count + 1, dtype="<i8")
            np.cumsum([len(ids) for ids in label_sets], out=offsets[1:])
            arrays["label_offsets"] = offsets
            arrays["label_values"] = np.concatenate(label_sets).astype("<i4")
        else:
            arrays["labels"] = columns[: self.count, 0].astype("<i4")
        for name, values in arrays.items():
            self._put(name.encode(), values.tobytes(), "meta")
        # the per-sample arrays' own digests (a few bytes per sample, hashed here) beside the records'
        self._arrays = {name: digest_root(values.tobytes()) for name, values in arrays.items()}
        self._commit()
        self._txn.abort()
        with self._env.begin() as txn, txn.cursor(db=self._dbs[DIGEST_DB]) as cursor:
            table = b"".join(cursor.iternext(keys=False, values=True))
        if len(table) != 32 * self.count:
            raise ValueError(f"{self.directory}: {len(table) // 32} record digests for {self.count} records")
        self.record_digests = {"algorithm": "sha256", "records": self.count, "root": digest_root(table),
                               "arrays": self._arrays}
        self._env.sync(True)
        data = self.directory / DATA_FILE
        self._env.close()
        lock = self.directory / "lock.mdb"
        if lock.exists():
            lock.unlink()  # readers open with lock=False; a stale lock file only confuses
        return [FileEntry(DATA_FILE, data.stat().st_size, "", self.count)]

    def abort(self) -> None:
        """Drop the uncommitted records (the last checkpoint stays) and close."""
        try:
            self._txn.abort()
        finally:
            self._env.close()


class LmdbReader:
    """Random access to an LMDB dataset. Opens the environment lazily, once per process (never before
    DataLoader workers fork), read-only and without locking; safe to pickle for spawn."""

    def __init__(self, directory: Path, num_samples: int, num_classes: int | None = None,
                 label_kind: str = "single") -> None:
        self.directory = Path(directory)
        self.num_samples = num_samples
        self.num_classes = num_classes
        if label_kind not in _LABEL_ARRAYS:
            raise NotADatasetError(f"{self.directory}: unknown label kind {label_kind!r} in the manifest (known: "
                                   f"{', '.join(_LABEL_ARRAYS)}); upgrade fastdata")
        self.label_kind = label_kind
        self._env: Any = None
        self._pid = -1
        self._real_path = ""
        self._mapped: MappedFile | None = None
        self._arrays: dict[str, np.ndarray] | None = None
        if not (self.directory / DATA_FILE).is_file():
            raise NotADatasetError(f"{self.directory}: {DATA_FILE} is missing; the dataset is damaged")

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_env=None, _dbs=None, _pid=-1, _mapped=None)
        return state

    def _open(self) -> Any:
        if self._env is None or self._pid != os.getpid() or not is_current(self._real_path, self._env):
            self._real_path = os.path.realpath(self.directory)
            self._env, self._dbs = shared_environment(self.directory)
            self._pid = os.getpid()
            self._mapped = MappedFile(os.path.join(self._real_path, DATA_FILE))
        return self._env

    def _array(self, name: str) -> np.ndarray:
        if self._arrays is None:
            env = self._open()
            arrays = {}
            wanted = {**_SIZE_ARRAYS, **_LABEL_ARRAYS[self.label_kind]}
            lengths = {"label_offsets": self.num_samples + 1, "label_values": None}
            with env.begin(buffers=False) as txn:
                for array_name, dtype in wanted.items():
                    raw = txn.get(array_name.encode(), db=self._dbs["meta"])
                    if raw is None:
                        raise NotADatasetError(f"{self.directory}: meta record {array_name!r} is missing")
                    values = np.frombuffer(raw, dtype=dtype)
                    expected = lengths.get(array_name, self.num_samples)
                    if expected is not None and len(values) != expected:
                        raise NotADatasetError(
                            f"{self.directory}: meta record {array_name!r} holds {len(values)} entries, "
                            f"the manifest's {self.num_samples} samples need {expected}; the dataset is damaged")
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
        labels = arrays["labels"] if "labels" in arrays else arrays["label_values"]
        if len(labels) and (labels.min() < 0 or (self.num_classes is not None and labels.max() >= self.num_classes)):
            problems.append(f"labels outside 0..{(self.num_classes or 1) - 1}")
        offsets = arrays.get("label_offsets")
        if offsets is not None and (offsets[0] != 0 or offsets[-1] != len(labels) or np.any(np.diff(offsets) < 0)):
            problems.append("label offsets that do not index the label values")
        if problems:
            raise NotADatasetError(f"{self.directory}: the meta records hold {', '.join(problems)}; the dataset "
                                   "is damaged or not a fastdata dataset")

    @property
    def labels(self) -> np.ndarray:
        """Single-label datasets: every sample's class id (int32). Multi-label datasets: see `label`."""
        if self.label_kind != "single":
            raise TypeError(f"{self.directory}: a multi-label dataset has no single label per sample; use label(i) "
                            "or label_list()")
        return self._array("labels")

    def label(self, index: int) -> Label:
        """Sample `index`'s class id, or (multi-label) the tuple of its class ids."""
        if self.label_kind == "single":
            return int(self._array("labels")[index])
        offsets = self._array("label_offsets")
        return tuple(self._array("label_values")[offsets[index]:offsets[index + 1]].tolist())

    def label_list(self) -> list[int] | list[list[int]]:
        """Every sample's label: class ids, or (multi-label) lists of class ids."""
        if self.label_kind == "single":
            return self._array("labels").tolist()
        offsets, values = self._array("label_offsets").tolist(), self._array("label_values").tolist()
        return [values[start:end] for start, end in itertools.pairwise(offsets)]

    def metadata(self, index: int) -> dict | None:
        """Sample `index`'s metadata (the JSON object its source row had), or None when the dataset stores none."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample index {index} out of range for {self.num_samples} samples")
        env = self._open()
        try:
            _, dbs = shared_environment(self.directory, ("metadata",))
        except NotADatasetError:  # converted without metadata (or by an older fastdata)
            return None
        with env.begin() as txn:
            value = txn.get(index_key(index), db=dbs["metadata"])
        if value is None:
            return None
        try:
            found = json.loads(bytes(value).decode("utf-8"))
        except ValueError as exc:
            raise CorruptSampleError(f"{self.directory}: sample {index}'s metadata is not JSON ({exc})") from exc
        if not isinstance(found, dict):
            raise CorruptSampleError(f"{self.directory}: sample {index}'s metadata is not a JSON object")
        return found

    def caption(self, index: int) -> str:
        """Sample `index`'s caption (image-text pairs)."""
        raw = self._get_in("captions", index)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptSampleError(f"{self.directory}: sample {index}'s caption is not UTF-8 ({exc})") from exc

    def caption_tokens(self, index: int, dtype: np.dtype) -> np.ndarray:
        """Sample `index`'s caption token ids (image-text pairs converted with a tokenizer), of `dtype`."""
        raw = self._get_in("tokens", index)
        if len(raw) % dtype.itemsize:
            raise CorruptSampleError(f"{self.directory}: sample {index}'s token ids are {len(raw)} bytes, not a "
                                     f"whole number of {dtype.name} ids; the dataset is damaged")
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<"))

    def _get_in(self, db: str, index: int) -> bytes:
        """The value of sample `index` in the sub-database `db`, opened on first use (those that only some datasets
        have)."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample index {index} out of range for {self.num_samples} samples")
        env = self._open()
        _, dbs = shared_environment(self.directory, (db,))
        with env.begin(buffers=False) as txn:
            value = txn.get(index_key(index), db=dbs[db])
        if value is None:
            raise CorruptSampleError(f"{self.directory}: record {index} is missing from '{db}'")
        return value
    def target(self, index: int) -> bytes:
        """Sample `index`'s stored target record (`fastdata.formats.targets`); NotADatasetError when the dataset
        holds no targets, CorruptSampleError when this sample's is missing."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample index {index} out of range for {self.num_samples} samples")
        env = self._open()
        _, dbs = shared_environment(self.directory, ("targets",))
        with env.begin() as txn:
            value = txn.get(index_key(index), db=dbs["targets"])
        if value is None:
            raise CorruptSampleError(f"{self.directory}: sample {index}'s target record is missing")
        return bytes(value)

    @property
    def widths(self) -> np.ndarray:
        return self._array("widths")

    @property
    def heights(self) -> np.ndarray:
        return self._array("heights")

    @property
    def codecs(self) -> np.ndarray:
        return self._array("codecs")

    def _get(self, db: str, index: int, unmapped: bool = False) -> bytes:
        """Sample `index`'s value in `db`; `unmapped`: read from the data file, not through the map
        (`fastdata.formats.mapped_pages`)."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample index {index} out of range for {self.num_samples} samples")
        env = self._open()
        with env.begin(buffers=True) as txn:
            value = txn.get(index_key(index), db=self._dbs[db])
            if value is None:
                raise CorruptSampleError(f"{self.directory}: record {index} is missing from '{db}'")
            return self._mapped.copy(value) if unmapped and self._mapped is not None else bytes(value)

    def read(self, index: int) -> bytes:
        """The encoded image bytes of sample `index`, read from the data file without mapping them
        (`fastdata.formats.mapped_pages`: a worker's resident set does not grow by what it read)."""
        return self._get("images", index, unmapped=True)

    def release_mapped(self) -> None:
        """Give back this process's mapping of the data file (the B-tree pages lookups mapped): called when a batch
        is read (`fastdata.formats.mapped_pages`)."""
        if self._mapped is not None:
            self._mapped.release()

    def key(self, index: int) -> str:
        """The source-relative path of sample `index`."""
        return key_from_bytes(self._get("keys", index))

    def all_keys(self) -> list[str]:
        return list(self.iter_keys())

    def iter_keys(self) -> Iterator[str]:
        """Every sample's key in index order, read with one cursor (none held in memory beyond the one given)."""
        env = self._open()
        with env.begin() as txn, txn.cursor(db=self._dbs["keys"]) as cursor:
            for value in cursor.iternext(keys=False, values=True):
                yield key_from_bytes(bytes(value))

    def iter_labels(self, chunk: int = 1 << 16) -> Iterator[int | list[int]]:
        """Every sample's label in index order (class ids, or lists of class ids), made a chunk at a time from the
        label arrays."""
        if self.label_kind == "single":
            labels = self._array("labels")
            for start in range(0, len(labels), chunk):
                yield from labels[start:start + chunk].tolist()
            return
        offsets, values = self._array("label_offsets"), self._array("label_values")
        for start in range(0, self.num_samples, chunk):
            bounds = offsets[start:min(start + chunk, self.num_samples) + 1].tolist()
            ids = values[bounds[0]:bounds[-1]].tolist()
            yield from (ids[lo - bounds[0]:hi - bounds[0]] for lo, hi in itertools.pairwise(bounds))
