"""Token storage in WebDataset shards: a directory of tar shards, an index file per shard, the tokenizer and
the manifest.

Each document is two tar members sharing a key (its document number, zero-padded): `{key}.ids` (its token
ids as raw little-endian bytes of the manifest's dtype) and `{key}.json` ({"source", "line", "tokens"}), so
the `webdataset` library reads the shards as they are. Documents keep source order across the shards.
Beside `shard-NNNNNN.tar`, `shard-NNNNNN.idx` holds an int64 pair per document (byte offset of its ids in
the tar, token count), which gives random access to any document or token range without scanning tars.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import START_AGAIN, CorruptSampleError, NotADatasetError, StagingDamagedError
from fastdata.formats.manifest import FileEntry, sha256_file
from fastdata.formats.tar_shards import ShardWriter, check_kept_files
from fastdata.formats.tokens import DocumentEnds, TokenReader

INDEX_SUFFIX = ".idx"


def index_name(shard_name: str) -> str:
    return shard_name.rsplit(".", 1)[0] + INDEX_SUFFIX


class TextWdsWriter:
    """Writes documents into tar shards of about `shard_size` bytes each, in the order given (a `ShardWriter`),
    plus each shard's index, written when the shard is complete. Holds one shard's index in memory."""

    def __init__(self, directory: Path, shard_size: int, dtype: np.dtype) -> None:
        self.shards = ShardWriter(directory, shard_size, on_shard_closed=self._write_index)
        self.directory = self.shards.directory
        self.dtype = np.dtype(dtype)
        self._index: list[tuple[int, int]] = []
        self._index_entries: list[dict[str, Any]] = []
        self.total_tokens = 0

    @property
    def count(self) -> int:
        return self.shards.count

    def saved_progress(self) -> bytes | None:
        return self.shards.saved_progress()

    def add(self, ids: np.ndarray, source: str = "", line: int = 0) -> None:
        """Append one document's token ids (already in the dataset's dtype)."""
        key = f"{self.shards.count:010d}"
        meta = json.dumps({"source": source, "line": line, "tokens": len(ids)}).encode()
        data_offset, _ = self.shards.append([(f"{key}.ids", ids.tobytes()), (f"{key}.json", meta)])
        self._index.append((data_offset, len(ids)))
        self.total_tokens += len(ids)
        self.shards.sample_done()

    def _write_index(self, shard_name: str) -> None:
        path = self.directory / index_name(shard_name)
        pairs = np.asarray(self._index, dtype="<i8").reshape(-1, 2)
        with open(path, "wb") as f:
            f.write(pairs.tobytes())
        # the shard's token count too, so that a reader finds where each shard starts in the token stream
        # without reading every index (`TextWdsReader.document_ends`)
        self._index_entries.append({"name": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path),
                                    "tokens": int(pairs[:, 1].sum())})
        self._index = []

    def checkpoint_due(self) -> bool:
        return self.shards.checkpoint_due()

    @property
    def finished_shards(self) -> list[FileEntry]:
        return self.shards.finished_shards

    @property
    def index_files(self) -> list[dict[str, Any]]:
        """The index files of the finished shards (name, bytes, sha256)."""
        return list(self._index_entries)

    @property
    def open_shard(self) -> dict[str, Any] | None:
        """Where the unfinished shard stands (name, bytes of complete members, documents), None without one:
        a checkpoint records it, so that a resumed conversion continues inside that shard."""
        state = self.shards.open_shard
        if state is None:
            return None
        name, size, documents = state
        return {"name": name, "bytes": size, "documents": documents}

    def checkpoint(self, progress: bytes) -> None:
        """Record `progress` (which must list `finished_shards`, `index_files` and `open_shard`) as the point to
        resume from; the unfinished shard's documents so far are put on disk first."""
        self.shards.sync()
        self.shards.checkpoint(progress)

    def resume(self, entries: list[FileEntry], index_files: list[dict[str, Any]], total_tokens: int,
               open_shard: dict[str, Any] | None = None) -> None:
        """Continue after the finished shards `entries` and their `index_files` (from the saved progress),
        which with the documents of `open_shard` (the unfinished shard as `open_shard` described it) hold
        `total_tokens` tokens: that shard is cut back to those documents and continued, anything else in the
        directory is dropped. Raises StagingDamagedError when the unfinished shard is not there as recorded."""
        check_kept_files(self.directory, [(f["name"], f["bytes"]) for f in index_files], "shard index")
        tmp = None
        if open_shard is not None:
            tmp = self.directory / (open_shard["name"] + ".tmp")
            finished = self.directory / open_shard["name"]
            if not tmp.exists() and finished.is_file():  # completed after the checkpoint, before the next one
                os.replace(finished, tmp)
        self.shards.resume(entries, keep_files=[f["name"] for f in index_files] + ([tmp.name] if tmp else []))
        self._index_entries = list(index_files)
        self.total_tokens = total_tokens
        if tmp is not None and open_shard is not None:
            self._continue_shard(tmp, open_shard["bytes"], open_shard["documents"])

    def _continue_shard(self, tmp: Path, size: int, documents: int) -> None:
        """Reopen the unfinished shard `tmp` at its first `size` bytes (`documents` documents), rebuilding its
        index from the tar, and append to it from there: the same bytes as if it had never stopped."""
        try:
            file = open(tmp, "r+b")  # noqa: SIM115 (the shard's file until it is closed)
        except OSError as exc:
            raise StagingDamagedError(f"{tmp}: the unfinished shard of the last checkpoint cannot be opened "
                                      f"({exc.strerror or exc}); {START_AGAIN}") from exc
        try:
            if os.fstat(file.fileno()).st_size < size:
                raise StagingDamagedError(f"{tmp}: holds {os.fstat(file.fileno()).st_size:,} bytes, the last "
                                          f"checkpoint recorded {size:,}; {START_AGAIN}")
            file.truncate(size)
            index = []
            with tarfile.open(fileobj=file, mode="r:") as tar:
                for member in tar:
                    if member.name.endswith(".ids"):
                        index.append((member.offset_data, member.size // self.dtype.itemsize))
            if len(index) != documents:
                raise StagingDamagedError(f"{tmp}: holds {len(index):,} documents in its first {size:,} bytes, "
                                          f"the last checkpoint recorded {documents:,}; {START_AGAIN}")
        except tarfile.TarError as exc:
            file.close()
            raise StagingDamagedError(f"{tmp}: the unfinished shard is damaged ({exc}); {START_AGAIN}") from exc
        except BaseException:
            file.close()
            raise
        file.seek(size)
        self.shards.continue_shard(file, documents)
        self._index = index

    def close(self) -> tuple[list[FileEntry], dict[str, Any]]:
        """Finish the last shard; returns (shard files, layout facts for the manifest)."""
        return self.shards.close(), {"index_files": list(self._index_entries)}

    def abort(self) -> None:
        """Close the open shard (left as .tmp, dropped on resume); finished shards and progress stay."""
        self.shards.abort()


class TextWdsReader(TokenReader):
    """Random access to the token stream of a WebDataset text dataset through the shard indexes; shards are
    opened lazily and read with `pread`, so one reader serves any process (safe to pickle for spawn)."""

    def __init__(self, directory: Path, files: list[FileEntry], text: dict[str, Any]) -> None:
        super().__init__(text)
        self.directory = Path(directory)
        self.files = list(files)
        # each shard's token count, as the manifest lists it with the shard's index (conversions since it did)
        self._shard_tokens = {entry["name"]: entry["tokens"] for entry in text.get("index_files", [])
                              if isinstance(entry, dict) and isinstance(entry.get("tokens"), int)}
        self._document_ends: DocumentEnds | None = None
        self._pairs: dict[int, np.ndarray] = {}  # shard -> its index file, memory-mapped ([documents, 2] int64)
        self._handles: dict[int, Any] = {}
        for entry in self.files:
            for name in (entry.name, index_name(entry.name)):
                if not (self.directory / name).is_file():
                    raise NotADatasetError(f"{self.directory / name}: missing; the dataset is damaged")

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handles": {}, "_document_ends": None, "_pairs": {}}

    @property
    def ends(self) -> np.ndarray:
        """Cumulative token count at the end of each document (int64, one per document), made on each call."""
        return self.document_ends.full()

    @property
    def document_ends(self) -> DocumentEnds:
        """The documents' ends, a shard at a time: opening takes each shard's token count from the manifest (or,
        for a dataset converted before it listed them, from the shard's index: a vectorised sum, nothing kept);
        a shard's ends are computed, and checked against that count, when it is read."""
        if self._document_ends is None:
            totals = []
            for entry in self.files:
                tokens = self._shard_tokens.get(index_name(entry.name))
                if tokens is None:
                    path = self.directory / index_name(entry.name)
                    pairs = np.fromfile(path, dtype="<i8")
                    if len(pairs) != 2 * entry.samples:
                        raise NotADatasetError(f"{path}: holds {len(pairs) // 2} documents, the manifest says "
                                               f"{entry.samples}; the dataset is damaged")
                    tokens = int(pairs[1::2].sum())
                totals.append(tokens)
            last_ends = np.cumsum(totals, dtype=np.int64)
            total = int(last_ends[-1]) if len(last_ends) else 0
            documents = sum(entry.samples for entry in self.files)
            if documents != self.num_documents or total != self.total_tokens:
                raise NotADatasetError(f"{self.directory}: shard indexes hold {documents} documents / {total} "
                                       f"tokens, the manifest says {self.num_documents} / {self.total_tokens}")
            first_docs = np.concatenate([[0], np.cumsum([e.samples for e in self.files], dtype=np.int64)])
            self._document_ends = DocumentEnds(first_docs, last_ends, self._shard_ends)
        return self._document_ends

    def _shard_pairs(self, shard: int) -> np.ndarray:
        """Shard `shard`'s index, (byte offset of its ids, token count) per document, memory-mapped."""
        pairs = self._pairs.get(shard)
        if pairs is None:
            path = self.directory / index_name(self.files[shard].name)
            # a plain array over the mapped file: its pages are read as they are used, shared between processes
            pairs = (np.memmap(path, dtype="<i8", mode="r").view(np.ndarray) if path.stat().st_size
                     else np.zeros(0, np.int64)).reshape(-1, 2)
            if len(pairs) != self.files[shard].samples:
                raise CorruptSampleError(f"{path}: holds {len(pairs)} documents, the manifest says "
                                         f"{self.files[shard].samples}; the dataset is damaged")
            self._pairs[shard] = pairs
        return pairs

    def _shard_ends(self, shard: int) -> np.ndarray:
        index = self.document_ends
        base = int(index.last_ends[shard - 1]) if shard else 0
        ends = base + np.cumsum(self._shard_pairs(shard)[:, 1], dtype=np.int64)
        if (int(ends[-1]) if len(ends) else base) != int(index.last_ends[shard]):
            path = self.directory / index_name(self.files[shard].name)
            raise CorruptSampleError(f"{path}: holds {int(ends[-1]) - base if len(ends) else 0} tokens, the manifest "
                                     f"says {int(index.last_ends[shard]) - base}; the dataset is damaged")
        return ends

    def _handle(self, shard: int) -> Any:
        handle = self._handles.get(shard)
        if handle is None:
            handle = self._handles[shard] = open(self.directory / self.files[shard].name, "rb", buffering=0)  # noqa: SIM115 (kept open for reuse)
        return handle

    def _fill(self, out: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> None:
        index = self.document_ends
        size, pos, shard, ends, offsets, base = self.dtype.itemsize, 0, -1, index.last_ends, index.last_ends, 0
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
            local = -1  # the document of `start` in its shard, once found
            while start < stop:
                if shard < 0 or not base <= start < int(ends[-1]):  # the shard that holds token `start`
                    shard = int(np.searchsorted(index.last_ends, start, side="right"))
                    ends, offsets = index.chunk(shard), self._shard_pairs(shard)[:, 0]
                    base, local = (int(index.last_ends[shard - 1]) if shard else 0), -1
                if local < 0:
                    local = int(np.searchsorted(ends, start, side="right"))
                doc_start = int(ends[local - 1]) if local else base
                hi = min(stop, int(ends[local]))
                if hi > start:
                    target = out[pos:pos + hi - start].view(np.uint8)
                    handle = self._handle(shard)
                    got = os.preadv(handle.fileno(), [target],  # type: ignore[list-item]  # numpy: a buffer
                                    int(offsets[local]) + (start - doc_start) * size)
                    if got != len(target):
                        raise CorruptSampleError(f"{handle.name}: document {int(index.first_docs[shard]) + local} "
                                                 "is truncated; the dataset is damaged")
                    pos += hi - start
                    start = hi
                local += 1  # the next document (a shard's last one: the shard check above moves on)
