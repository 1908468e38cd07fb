"""What the two token storage formats (LMDB, WebDataset) share: the stored dtype of token ids, the tokenizer file
kept beside them, and the reader interface (manifest facts and range reads), so that blocks, padded rows and the
dataset work on either."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

#: The tokenizer file a text dataset keeps beside its data (so that it can always be decoded).
TOKENIZER_FILE = "tokenizer.json"
UINT16_VOCAB = 1 << 16  # vocabularies up to this size store their ids as uint16


def token_dtype(vocab: int) -> np.dtype:
    """Little-endian uint16 when every id fits in 16 bits, else uint32."""
    return stored_dtype("uint16" if vocab <= UINT16_VOCAB else "uint32")


def stored_dtype(name: str) -> np.dtype:
    """The on-disk dtype for the manifest's dtype name (`uint16` / `uint32`): always little-endian."""
    if name not in ("uint16", "uint32"):
        raise ValueError(f"unknown token dtype {name!r} (expected uint16 or uint32)")
    return np.dtype(name).newbyteorder("<")


#: Bytes of document ends a reader keeps cached (`DocumentEnds.chunk`): the chunks it used last.
ENDS_CACHE_BYTES = 64 << 20


class DocumentEnds:
    """The cumulative token count at the end of each document (`ends[i]`: document i is tokens `[ends[i - 1],
    ends[i])`), read a chunk of documents at a time. Opening needs only each chunk's first document and last end
    (one pair per chunk: a reader starts as fast over 10M documents as over 10k); a chunk is read when one of its
    documents is asked for, and recently used chunks stay cached up to `cache_bytes`.

    `first_docs` (K + 1): the first document of each of the K chunks, then the number of documents; `last_ends`
    (K): the end of each chunk's last document; `load(k)`: chunk k's ends (int64, absolute)."""

    def __init__(self, first_docs: np.ndarray, last_ends: np.ndarray, load: Callable[[int], np.ndarray],
                 cache_bytes: int = ENDS_CACHE_BYTES) -> None:
        self.first_docs = np.asarray(first_docs, np.int64)
        self.last_ends = np.asarray(last_ends, np.int64)
        self._load, self.cache_bytes = load, cache_bytes
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cached_bytes = 0

    def __len__(self) -> int:
        return int(self.first_docs[-1])

    def chunk(self, k: int) -> np.ndarray:
        """Chunk `k`'s ends, read on first use."""
        found = self._cache.get(k)
        if found is not None:
            self._cache.move_to_end(k)
            return found
        found = self._cache[k] = self._load(k)
        self._cached_bytes += found.nbytes
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
            self._cached_bytes -= self._cache.popitem(last=False)[1].nbytes
        return found

    def full(self, per_doc: int = 0) -> np.ndarray:
        """Every document's end, plus `per_doc` per document before it (1: the end-of-text positions of the packed
        stream), as one int64 array made chunk by chunk (no other array of its size on the way, nothing cached)."""
        out = np.empty(len(self), np.int64)
        for k in range(len(self.last_ends)):
            lo, hi = int(self.first_docs[k]), int(self.first_docs[k + 1])
            cached = self._cache.get(k)
            out[lo:hi] = cached if cached is not None else self._load(k)
            if per_doc:
                out[lo:hi] += np.arange(lo, hi, dtype=np.int64) * per_doc
        return out

    def take(self, docs: np.ndarray) -> np.ndarray:
        """The ends of documents `docs` (int64; an empty document number -1 gives 0, the start of the stream)."""
        docs = np.asarray(docs, np.int64)
        out = np.zeros(docs.shape, np.int64)
        chunks = np.searchsorted(self.first_docs, docs, side="right") - 1
        for k in np.unique(chunks[docs >= 0]).tolist():
            here = (chunks == k) & (docs >= 0)
            out[here] = self.chunk(k)[docs[here] - self.first_docs[k]]
        return out

    def __getitem__(self, doc: int) -> int:
        if not 0 <= doc < len(self):
            raise IndexError(f"document {doc} out of range for {len(self)} documents")
        return int(self.take(np.array([doc]))[0])

    def searchsorted(self, positions: np.ndarray, side: Literal["left", "right"] = "left", per_doc: int = 0
                     ) -> np.ndarray:
        """`np.searchsorted(ends + per_doc * arange(n), positions, side)`, chunk by chunk (`per_doc=1` searches the
        stream with an end-of-text token after each document)."""
        positions = np.asarray(positions, np.int64)
        keys = self.last_ends + per_doc * (self.first_docs[1:] - 1)  # each chunk's last (shifted) end
        chunks = np.searchsorted(keys, positions, side=side)
        out = np.full(positions.shape, len(self), np.int64)
        for k in np.unique(chunks[chunks < len(keys)]).tolist():
            here = chunks == k
            values = self.chunk(k)
            if per_doc:
                values = values + per_doc * np.arange(self.first_docs[k], self.first_docs[k + 1], dtype=np.int64)
            out[here] = self.first_docs[k] + np.searchsorted(values, positions[here], side=side)
        return out


class TokenReader:
    """Random access to the concatenated token ids of a text dataset (documents in source order, nothing
    between them). Subclasses provide `ends` and `_fill`."""

    def __init__(self, text: dict[str, Any]) -> None:
        self.dtype = stored_dtype(text["dtype"])
        self.num_documents = int(text["documents"])
        self.total_tokens = int(text["total_tokens"])

    @property
    def ends(self) -> np.ndarray:
        """Cumulative token count at the end of each document (int64, one per document), all of them at once:
        for what needs every document (lengths for bucketing); `document_ends` reads them as needed."""
        raise NotImplementedError

    @property
    def document_ends(self) -> DocumentEnds:
        """The documents' ends, read a chunk at a time (what opening and batching use, whatever the corpus size)."""
        raise NotImplementedError

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens `[start, stop)`, as a new array of the stored dtype."""
        return self.read_many(np.array([start], np.int64), np.array([stop - start], np.int64))

    def read_many(self, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Token ranges `[starts[j], starts[j] + counts[j])`, concatenated into one new array."""
        starts, counts = np.asarray(starts, np.int64), np.asarray(counts, np.int64)
        stops = starts + counts
        if len(starts) and (starts.min() < 0 or counts.min() < 0 or stops.max() > self.total_tokens):
            raise IndexError(f"token ranges out of range for {self.total_tokens} tokens")
        out = np.empty(int(counts.sum()), self.dtype)
        self._fill(out, starts, stops)
        return out

    def read_into(self, out: np.ndarray, starts: np.ndarray, counts: np.ndarray, places: np.ndarray) -> None:
        """Token ranges `[starts[j], starts[j] + counts[j])` written into the flat array `out` (an integer dtype
        that holds the ids), range j from `out[places[j]]` on (ascending, not overlapping): a batch's rows laid out
        in one call. What lies between the ranges may be overwritten with other tokens: the caller writes it
        after."""
        starts, counts, places = (np.asarray(a, np.int64) for a in (starts, counts, places))
        stops = starts + counts
        if len(starts) and (starts.min() < 0 or counts.min() < 0 or stops.max() > self.total_tokens
                            or places.min() < 0 or (places + counts).max() > len(out)):
            raise IndexError(f"token ranges out of range for {self.total_tokens} tokens or {len(out)} places")
        self._put(out, starts, counts, places)

    def _fill(self, out: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> None:
        """Write the ranges `[starts[j], stops[j])` (int64 arrays, checked) one after the other into `out`."""
        raise NotImplementedError

    def _put(self, out: np.ndarray, starts: np.ndarray, counts: np.ndarray, places: np.ndarray) -> None:
        """`read_into` once checked: the ranges read one after the other, then put in their places."""
        tokens = np.empty(int(counts.sum()), self.dtype)
        self._fill(tokens, starts, starts + counts)
        scatter(out, tokens, counts, places)


def scatter(out: np.ndarray, tokens: np.ndarray, counts: np.ndarray, places: np.ndarray) -> None:
    """`tokens` (ranges of `counts` one after the other) written into `out`, range j from `places[j]` on."""
    index = np.repeat(places - (np.cumsum(counts) - counts), counts)
    index += np.arange(len(tokens))
    out[index] = tokens
