"""What the two token storage formats (LMDB, WebDataset) share: the stored dtype of token ids, the tokenizer file
kept beside them, and the reader interface (manifest facts and range reads), so that blocks, padded rows and the
dataset work on either."""

from __future__ import annotations

from typing import Any

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


class TokenReader:
    """Random access to the concatenated token ids of a text dataset (documents in source order, nothing
    between them). Subclasses provide `ends` and `_fill`."""

    def __init__(self, text: dict[str, Any]) -> None:
        self.dtype = stored_dtype(text["dtype"])
        self.num_documents = int(text["documents"])
        self.total_tokens = int(text["total_tokens"])

    @property
    def ends(self) -> np.ndarray:
        """Cumulative token count at the end of each document (int64, one per document)."""
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
        self._fill(out, starts.tolist(), stops.tolist())
        return out

    def _fill(self, out: np.ndarray, starts: list[int], stops: list[int]) -> None:
        """Write the ranges `[starts[j], stops[j])` one after the other into `out`."""
        raise NotImplementedError
