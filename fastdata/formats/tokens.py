"""What the two token storage readers (LMDB, WebDataset) share: the manifest facts and range reads, so that
blocks, padded rows and the dataset work on either through one interface."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdata.text.tokenizer import stored_dtype


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
