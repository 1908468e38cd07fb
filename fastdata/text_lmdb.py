"""Token storage in LMDB: one directory `OUT.lmdb/` holding LMDB's `data.mdb`, the tokenizer and the manifest.

Layout (no pickle; raw little-endian arrays):
- sub-database `tokens`: key = chunk number as 8-byte big-endian, value = the concatenated token ids of all
  documents (source order, no separators), `chunk_tokens` ids per chunk (the last one shorter), in the
  manifest's token dtype;
- sub-database `ends`: same keys, value = int64 array of the cumulative token count at the end of each
  document, ENDS_PER_CHUNK documents per chunk (document i is tokens `[ends[i-1], ends[i])`).
Writing holds one chunk of each in memory, whatever the corpus size.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import CorruptSampleError, NotADatasetError
from fastdata.formats.lmdb import DATA_FILE, index_key
from fastdata.formats.manifest import FileEntry, sha256_file
from fastdata.text_store import TokenReader

CHUNK_TOKENS = 1 << 18
ENDS_PER_CHUNK = 1 << 16
_MAX_DBS = 4
_DBS = ("tokens", "ends")
_COMMIT_EVERY_CHUNKS = 32


def _environment(directory: Path) -> tuple[Any, dict[str, Any]]:
    """The process-wide read-only environment of `directory` (shared with the image readers' registry: py-lmdb
    allows one environment per path per process), with the text sub-databases opened."""
    from fastdata.formats.lmdb import shared_environment

    return shared_environment(directory, _DBS)


class TextLmdbWriter:
    """Appends documents (arrays of token ids) in order into a new LMDB environment in `directory`."""

    def __init__(self, directory: Path, dtype: np.dtype, chunk_tokens: int = CHUNK_TOKENS,
                 map_size: int = 1 << 40) -> None:
        import lmdb

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.dtype = np.dtype(dtype)
        self.chunk_tokens = chunk_tokens
        self._env = lmdb.open(str(self.directory), map_size=map_size, max_dbs=_MAX_DBS, subdir=True,
                              sync=False, metasync=False, meminit=False)
        self._dbs = {name: self._env.open_db(name.encode()) for name in _DBS}
        self._txn = self._env.begin(write=True)
        self._tokens = np.empty(chunk_tokens, self.dtype)
        self._filled = 0
        self._ends = np.empty(ENDS_PER_CHUNK, np.int64)
        self._ends_filled = 0
        self._chunks = {"tokens": 0, "ends": 0}
        self.count = 0
        self.total_tokens = 0

    def _put(self, db: str, data: np.ndarray) -> None:
        number = self._chunks[db]
        self._txn.put(index_key(number), data.tobytes(), db=self._dbs[db], append=True)
        self._chunks[db] = number + 1
        if (number + 1) % _COMMIT_EVERY_CHUNKS == 0:
            self._txn.commit()
            self._txn = self._env.begin(write=True)

    def add(self, ids: np.ndarray) -> None:
        """Append one document's token ids (already in the dataset's dtype)."""
        pos, n = 0, len(ids)
        while pos < n:
            take = min(n - pos, self.chunk_tokens - self._filled)
            self._tokens[self._filled:self._filled + take] = ids[pos:pos + take]
            self._filled += take
            pos += take
            if self._filled == self.chunk_tokens:
                self._put("tokens", self._tokens)
                self._filled = 0
        self.total_tokens += n
        self._ends[self._ends_filled] = self.total_tokens
        self._ends_filled += 1
        self.count += 1
        if self._ends_filled == ENDS_PER_CHUNK:
            self._put("ends", self._ends)
            self._ends_filled = 0

    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Flush the last chunks and describe the data file; returns (files, layout facts for the manifest)."""
        if self._filled:
            self._put("tokens", self._tokens[:self._filled])
        if self._ends_filled:
            self._put("ends", self._ends[:self._ends_filled])
        self._txn.commit()
        self._env.sync(True)
        self._env.close()
        lock = self.directory / "lock.mdb"
        if lock.exists():
            lock.unlink()  # readers open with lock=False
        data = self.directory / DATA_FILE
        return ([FileEntry(DATA_FILE, data.stat().st_size, sha256_file(data), self.count)],
                {"chunk_tokens": self.chunk_tokens})

    def abort(self) -> None:
        try:
            self._txn.abort()
        finally:
            self._env.close()


class TextLmdbReader(TokenReader):
    """Random access to the token stream of an LMDB text dataset (all ranges of one `read_many` in one read
    transaction). Opens the environment lazily, once per process, read-only and unlocked; safe to pickle
    for spawn."""

    def __init__(self, directory: Path, text: dict[str, Any]) -> None:
        super().__init__(text)
        self.directory = Path(directory)
        self.chunk_tokens = int(text["chunk_tokens"])
        self._env: Any = None
        self._dbs: dict[str, Any] = {}
        self._pid = -1
        self._ends: np.ndarray | None = None
        if not (self.directory / DATA_FILE).is_file():
            raise NotADatasetError(f"{self.directory}: {DATA_FILE} is missing; the dataset is damaged")

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_env": None, "_dbs": {}, "_pid": -1, "_ends": None}

    def _open(self) -> Any:
        from fastdata.formats.lmdb import is_current

        if (self._env is None or self._pid != os.getpid()
                or not is_current(os.path.realpath(self.directory), self._env)):
            self._env, self._dbs = _environment(self.directory)
            self._pid = os.getpid()
        return self._env

    @property
    def ends(self) -> np.ndarray:
        """Cumulative token count at the end of each document (int64, one per document)."""
        if self._ends is None:
            env = self._open()
            with env.begin() as txn, txn.cursor(db=self._dbs["ends"]) as cursor:
                parts = [np.frombuffer(value, "<i8") for value in cursor.iternext(keys=False, values=True)]
            ends = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            last = int(ends[-1]) if len(ends) else 0
            if len(ends) != self.num_documents or last != self.total_tokens:
                raise NotADatasetError(
                    f"{self.directory}: document index holds {len(ends)} documents / {last} tokens, the manifest "
                    f"says {self.num_documents} / {self.total_tokens}; the dataset is damaged")
            self._ends = ends
        return self._ends

    def _fill(self, out: np.ndarray, starts: list[int], stops: list[int]) -> None:
        env, size, itemsize, db = self._open(), self.chunk_tokens, self.dtype.itemsize, self._dbs["tokens"]
        pos = 0
        with env.begin(buffers=True) as txn:
            for start, stop in zip(starts, stops, strict=True):
                if stop == start:
                    continue
                first, last = start // size, (stop - 1) // size
                for number in range(first, last + 1):
                    value = txn.get(index_key(number), db=db)
                    lo = start - number * size if number == first else 0
                    hi = stop - number * size if number == last else size
                    if value is None or len(value) < hi * itemsize:
                        raise CorruptSampleError(f"{self.directory}: token chunk {number} is missing or short; "
                                                 "the dataset is damaged")
                    out[pos:pos + hi - lo] = np.frombuffer(value, self.dtype, hi - lo, lo * itemsize)
                    pos += hi - lo
