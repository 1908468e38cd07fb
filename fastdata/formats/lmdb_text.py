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
from fastdata.formats.mapped_pages import mapped_ranges
from fastdata.formats.tokens import DocumentEnds, TokenReader, scatter

CHUNK_TOKENS = 1 << 18
ENDS_PER_CHUNK = 1 << 16
_MAX_DBS = 4
_DBS = ("tokens", "ends")
COMMIT_EVERY_CHUNKS = 32
#: A read whose ranges average fewer tokens than this is one gather (`np.take`: a few passes over the tokens read,
#: whatever the number of ranges), else a slice of the map per range (a Python step each, then one copy): about
#: where the two cost the same for a batch of 32 x 1,025 tokens.
GATHER_BELOW = 192


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
    """Random access to the token stream of an LMDB text dataset. Opens the environment lazily, once per process,
    read-only and unlocked; safe to pickle for spawn.

    A read of many ranges (a batch's rows) is one gather: each token chunk is a value of its own, stored contiguously
    in the data file, so once its place in the file is known (looked up once per process, with its length checked)
    a range is a slice of one read-only map of the file, and all ranges are one `np.take` of an index made with a few
    vectorised steps, whatever their number (a best-fit batch of short documents holds hundreds). Where the file's
    place in memory cannot be found (no /proc/self/maps: not Linux), each range is copied from its chunk's value."""

    def __init__(self, directory: Path, text: dict[str, Any]) -> None:
        super().__init__(text)
        self.directory = Path(directory)
        self.chunk_tokens = int(text["chunk_tokens"])
        self._env: Any = None
        self._dbs: dict[str, Any] = {}
        self._pid = -1
        self._real_path = ""
        self._ends: np.ndarray | None = None
        self._document_ends: DocumentEnds | None = None
        self._file: np.ndarray | None = None  # the data file as tokens (a read-only map), once chunks are placed
        self._chunk_at: np.ndarray | None = None  # each chunk's first token in `_file`; -1: not looked up yet
        self._mapped: list[tuple[int, int, int]] | None = None  # where LMDB maps the file (`mapped_ranges`)
        if not (self.directory / DATA_FILE).is_file():
            raise NotADatasetError(f"{self.directory}: {DATA_FILE} is missing; the dataset is damaged")

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_env": None, "_dbs": {}, "_pid": -1, "_ends": None, "_document_ends": None,
                "_file": None, "_chunk_at": None, "_mapped": None}

    def _open(self) -> Any:
        from fastdata.formats.lmdb import is_current

        if self._env is None or self._pid != os.getpid() or not is_current(self._real_path, self._env):
            self._real_path = os.path.realpath(self.directory)
            self._env, self._dbs = _environment(self.directory)
            self._pid = os.getpid()
            self._file = self._chunk_at = self._mapped = None  # chunks are placed again in this environment's file
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

    def _fill(self, out: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> None:
        counts = stops - starts
        self._put(out, starts, counts, np.cumsum(counts) - counts)

    def _put(self, out: np.ndarray, starts: np.ndarray, counts: np.ndarray, places: np.ndarray) -> None:
        chunk, lo, hi, places = self._chunk_pieces(starts, starts + counts, places)
        if not len(chunk):
            return
        at = self._chunk_places(chunk)
        if at is None:
            scatter(out, self._copy_pieces(chunk, lo, hi), hi - lo, places)
            return
        assert self._file is not None  # placed chunks: the file is mapped
        counts, first = hi - lo, at + lo  # each piece's length and first token in the file
        end = int(places[-1] + counts[-1])
        if end - int(places[0]) >= GATHER_BELOW * len(first):  # long pieces: a slice of the map each, one copy
            np.concatenate(self._views(first, counts, places), out=out[int(places[0]):end])
            return
        runs = np.diff(places, append=end)  # each piece and what lies after it, up to the next one
        index = np.repeat(first - places, runs)
        index += np.arange(int(places[0]), end)
        out[int(places[0]):end] = np.take(self._file, index, mode="clip")

    def _views(self, first: np.ndarray, counts: np.ndarray, places: np.ndarray) -> list[np.ndarray]:
        """The pieces as slices of the map, each followed by as many zeros as lie before the next piece's place."""
        gaps = np.diff(places, append=places[-1] + counts[-1]) - counts
        filler = np.zeros(int(gaps.max()), self.dtype)
        file, views = self._file, []
        assert file is not None  # placed chunks: the file is mapped
        for a, n, gap in zip(first.tolist(), counts.tolist(), gaps.tolist(), strict=True):
            views.append(file[a:a + n])
            if gap:
                views.append(filler[:gap])
        return views

    def _chunk_pieces(self, starts: np.ndarray, stops: np.ndarray, places: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The non-empty ranges `[starts, stops)` cut at the chunks' ends: (chunk, first, end, place) of each
        piece, the first and end within the chunk. A range almost always lies in one chunk."""
        size = self.chunk_tokens
        keep = stops > starts
        starts, stops, places = starts[keep], stops[keep], places[keep]
        first = starts // size
        spans = (stops - 1) // size - first + 1
        if not len(spans) or int(spans.max()) == 1:
            return first, starts - first * size, stops - first * size, places
        of = np.repeat(np.arange(len(spans)), spans)
        chunk = np.repeat(first - (np.cumsum(spans) - spans), spans) + np.arange(len(of))
        lo = np.maximum(starts[of] - chunk * size, 0)
        return chunk, lo, np.minimum(stops[of] - chunk * size, size), places[of] + chunk * size + lo - starts[of]

    def _chunk_places(self, chunks: np.ndarray) -> np.ndarray | None:
        """Where chunks `chunks` begin in `_file` (looked up, and checked, on first use in this process); None
        where the file's mapping cannot be found."""
        self._open()
        if self._chunk_at is None:
            self._chunk_at = np.full(-(-self.total_tokens // self.chunk_tokens), -1, np.int64)
        at = self._chunk_at[chunks]
        if (at < 0).any():
            self._place_chunks(np.unique(chunks[at < 0]).tolist())
            at = self._chunk_at[chunks]
        return at if self._file is not None else None

    def _chunk_value(self, txn: Any, number: int) -> Any:
        """Token chunk `number`'s value (a view into LMDB's map), its length checked."""
        value = txn.get(index_key(number), db=self._dbs["tokens"])
        tokens = min(self.chunk_tokens, self.total_tokens - number * self.chunk_tokens)
        if value is None or len(value) < tokens * self.dtype.itemsize:
            raise CorruptSampleError(f"{self.directory}: token chunk {number} is missing or short; the dataset is "
                                     "damaged")
        return value

    def _place_chunks(self, numbers: list[int]) -> None:
        """Find the chunks `numbers` in the data file (from where LMDB's map holds their values); without the
        file's mapping, only check them."""
        path = os.path.join(self._real_path, DATA_FILE)
        if self._mapped is None:
            self._mapped = mapped_ranges(path)  # the environment's map does not move while it is open
        ranges = self._mapped
        itemsize = self.dtype.itemsize
        assert self._chunk_at is not None  # made with the map's ranges (`_chunk_places`)
        with self._open().begin(buffers=True) as txn:
            for number in numbers:
                address = np.frombuffer(self._chunk_value(txn, number), np.uint8).ctypes.data
                offset = next((address - low + at for low, high, at in ranges if low <= address < high), -1)
                self._chunk_at[number] = offset // itemsize if offset >= 0 and offset % itemsize == 0 else 0
                if offset < 0 or offset % itemsize:
                    ranges = self._mapped = []  # unknown place: every read copies from the values (`_copy_pieces`)
        if ranges and self._file is None:  # a plain array over the map: slicing a np.memmap costs more
            self._file = np.asarray(np.memmap(path, dtype=self.dtype, mode="r"))
        elif not ranges:
            self._file = None

    def _copy_pieces(self, chunks: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Without the file's map: the pieces copied from their chunks' values (in one read transaction), one after
        the other."""
        views = []
        with self._open().begin(buffers=True) as txn:
            values: dict[int, np.ndarray] = {}
            for number, first, end in zip(chunks.tolist(), lo.tolist(), hi.tolist(), strict=True):
                found = values.get(number)
                if found is None:
                    found = values[number] = np.frombuffer(self._chunk_value(txn, number), self.dtype)
                views.append(found[first:end])
            return np.concatenate(views)
