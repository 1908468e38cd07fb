"""Token storage in LMDB: one directory `OUT.lmdb/` holding LMDB's `data.mdb`, the tokenizer and the manifest.

Layout (no pickle; raw little-endian arrays):
- sub-database `tokens`: key = chunk number as 8-byte big-endian, value = the concatenated token ids of all
  documents (source order, no separators), `chunk_tokens` ids per chunk (the last one shorter), in the
  manifest's token dtype;
- sub-database `ends`: same keys, value = int64 array of the cumulative token count at the end of each
  document, ENDS_PER_CHUNK documents per chunk (document i is tokens `[ends[i-1], ends[i])`);
- sub-database `meta`: `progress`, the converter's last checkpoint (JSON; what an interrupted run resumes from).
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
from fastdata.formats.tokens import DocumentEnds, TokenReader

CHUNK_TOKENS = 1 << 18
ENDS_PER_CHUNK = 1 << 16
_MAX_DBS = 4
_DBS = ("tokens", "ends")
COMMIT_EVERY_CHUNKS = 32


def _environment(directory: Path) -> tuple[Any, dict[str, Any]]:
    """The process-wide read-only environment of `directory` (shared with the image readers' registry: py-lmdb
    allows one environment per path per process), with the text sub-databases opened."""
    from fastdata.formats.lmdb import shared_environment

    return shared_environment(directory, _DBS)


class TextLmdbWriter:
    """Appends documents (arrays of token ids) in order into an LMDB environment in `directory`.

    Data is committed only by `checkpoint(progress)`, in one transaction with the caller's progress record
    (sub-database `meta`, key `progress`) and the unfilled last chunks (stored under their own keys, completed
    later), so a killed conversion leaves data and progress in agreement. Opening an environment that already
    holds documents continues after them."""

    def __init__(self, directory: Path, dtype: np.dtype, chunk_tokens: int = CHUNK_TOKENS,
                 map_size: int = 1 << 40, commit_every_chunks: int = COMMIT_EVERY_CHUNKS) -> None:
        import lmdb

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.dtype = np.dtype(dtype)
        self.chunk_tokens = chunk_tokens
        self.commit_every_chunks = commit_every_chunks
        self._env = lmdb.open(str(self.directory), map_size=map_size, max_dbs=_MAX_DBS, subdir=True,
                              sync=False, metasync=False, meminit=False)
        self._dbs = {name: self._env.open_db(name.encode()) for name in (*_DBS, "meta")}
        self._buffers = {"tokens": np.empty(chunk_tokens, self.dtype), "ends": np.empty(ENDS_PER_CHUNK, np.int64)}
        self._filled = {"tokens": 0, "ends": 0}
        self._chunks = {"tokens": 0, "ends": 0}  # full chunks stored
        self._tail_stored = {"tokens": False, "ends": False}  # an unfilled chunk is stored under the next key
        self._load_tails()
        self.count = self._chunks["ends"] * ENDS_PER_CHUNK + self._filled["ends"]
        self.total_tokens = self._chunks["tokens"] * chunk_tokens + self._filled["tokens"]
        self._uncommitted_chunks = 0
        self._txn = self._env.begin(write=True)

    def _load_tails(self) -> None:
        """Continue after the chunks the environment holds: an unfilled last chunk is taken back into memory."""
        with self._env.begin() as txn:
            for db, buffer in self._buffers.items():
                with txn.cursor(db=self._dbs[db]) as cursor:
                    if not cursor.last():
                        continue
                    number = int.from_bytes(cursor.key(), "big")
                    values = np.frombuffer(cursor.value(), buffer.dtype)
                if len(values) < len(buffer):
                    buffer[:len(values)] = values
                    self._chunks[db], self._filled[db], self._tail_stored[db] = number, len(values), True
                else:
                    self._chunks[db] = number + 1

    def saved_progress(self) -> bytes | None:
        """The progress record of the last checkpoint, if this environment holds one."""
        with self._env.begin() as txn:
            return txn.get(b"progress", db=self._dbs["meta"])

    def _store(self, db: str, full: bool) -> None:
        """Put the chunk in memory of `db` under its key (a full one is final: the next chunk starts)."""
        data = self._buffers[db][:self._filled[db]]
        self._txn.put(index_key(self._chunks[db]), data.tobytes(), db=self._dbs[db],
                      append=not self._tail_stored[db])  # a stored unfilled chunk is overwritten
        self._tail_stored[db] = not full
        if full:
            self._chunks[db] += 1
            self._filled[db] = 0
            self._uncommitted_chunks += 1

    def add(self, ids: np.ndarray) -> None:
        """Append one document's token ids (already in the dataset's dtype)."""
        tokens, pos, n = self._buffers["tokens"], 0, len(ids)
        while pos < n:
            filled = self._filled["tokens"]
            take = min(n - pos, self.chunk_tokens - filled)
            tokens[filled:filled + take] = ids[pos:pos + take]
            self._filled["tokens"] = filled + take
            pos += take
            if self._filled["tokens"] == self.chunk_tokens:
                self._store("tokens", full=True)
        self.total_tokens += n
        self._buffers["ends"][self._filled["ends"]] = self.total_tokens
        self._filled["ends"] += 1
        self.count += 1
        if self._filled["ends"] == ENDS_PER_CHUNK:
            self._store("ends", full=True)

    def checkpoint_due(self) -> bool:
        """Whether `commit_every_chunks` chunks were filled since the last checkpoint."""
        return self._uncommitted_chunks >= self.commit_every_chunks

    def _store_unfilled(self) -> None:
        for db in _DBS:
            if self._filled[db]:
                self._store(db, full=False)

    def checkpoint(self, progress: bytes) -> None:
        """Commit the documents added so far together with `progress` (what to resume from)."""
        self._store_unfilled()
        self._txn.put(b"progress", progress, db=self._dbs["meta"])
        self._txn.commit()
        self._txn = self._env.begin(write=True)
        self._uncommitted_chunks = 0

    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Flush the last chunks and describe the data file; returns (files, layout facts for the manifest)."""
        self._store_unfilled()
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
        """Drop what was added since the last checkpoint (which stays) and close."""
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
        self._document_ends: DocumentEnds | None = None
        if not (self.directory / DATA_FILE).is_file():
            raise NotADatasetError(f"{self.directory}: {DATA_FILE} is missing; the dataset is damaged")

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_env": None, "_dbs": {}, "_pid": -1, "_ends": None, "_document_ends": None}

    def _open(self) -> Any:
        from fastdata.formats.lmdb import is_current

        if (self._env is None or self._pid != os.getpid()
                or not is_current(os.path.realpath(self.directory), self._env)):
            self._env, self._dbs = _environment(self.directory)
            self._pid = os.getpid()
        return self._env

    @property
    def ends(self) -> np.ndarray:
        """Cumulative token count at the end of each document (int64, one per document), made once per process."""
        if self._ends is None:
            self._ends = self.document_ends.full()
        return self._ends

    @property
    def document_ends(self) -> DocumentEnds:
        """The documents' ends, a stored chunk (ENDS_PER_CHUNK documents) at a time: opening reads only each
        chunk's size and last value."""
        if self._document_ends is None:
            env = self._open()
            sizes, lasts = [], []
            with env.begin(buffers=True) as txn, txn.cursor(db=self._dbs["ends"]) as cursor:
                for number, (key, value) in enumerate(cursor.iternext(keys=True, values=True)):
                    if bytes(key) != index_key(number) or not len(value) or len(value) % 8:
                        raise NotADatasetError(f"{self.directory}: document index chunk {number} is missing or "
                                               "damaged; the dataset is damaged")
                    sizes.append(len(value) // 8)
                    lasts.append(int.from_bytes(bytes(value[len(value) - 8:]), "little", signed=True))
            documents, last = sum(sizes), (lasts[-1] if lasts else 0)
            if documents != self.num_documents or last != self.total_tokens:
                raise NotADatasetError(
                    f"{self.directory}: document index holds {documents} documents / {last} tokens, the manifest "
                    f"says {self.num_documents} / {self.total_tokens}; the dataset is damaged")
            first_docs = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
            self._document_ends = DocumentEnds(first_docs, np.array(lasts, np.int64), self._ends_chunk)
        return self._document_ends

    def _ends_chunk(self, number: int) -> np.ndarray:
        env = self._open()
        with env.begin() as txn:
            value = txn.get(index_key(number), db=self._dbs["ends"])
        if value is None:
            raise CorruptSampleError(f"{self.directory}: document index chunk {number} is missing; the dataset is "
                                     "damaged")
        return np.frombuffer(value, "<i8")

    def _fill(self, out: np.ndarray, starts: list[int], stops: list[int]) -> None:
        env, size, db, dtype = self._open(), self.chunk_tokens, self._dbs["tokens"], self.dtype
        with env.begin(buffers=True) as txn:
            chunks: dict[int, np.ndarray] = {}  # each chunk read once per call (a batch's ranges share chunks)
            views = []  # the ranges' tokens, copied into `out` in one go

            def take(number: int, lo: int, hi: int) -> None:
                found = chunks.get(number)
                if found is None:
                    value = txn.get(index_key(number), db=db)
                    found = chunks[number] = np.frombuffer(value, dtype) if value is not None else np.zeros(0, dtype)
                if len(found) < hi:
                    raise CorruptSampleError(f"{self.directory}: token chunk {number} is missing or short; "
                                             "the dataset is damaged")
                views.append(found[lo:hi])

            for start, stop in zip(starts, stops, strict=True):
                first = start // size
                if stop - first * size <= size:  # the usual case: a range inside one chunk (or empty)
                    take(first, start - first * size, stop - first * size)
                    continue
                for number in range(first, (stop - 1) // size + 1):
                    take(number, max(start - number * size, 0), min(stop - number * size, size))
            if views:
                np.concatenate(views, out=out)
