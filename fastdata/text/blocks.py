"""Batches from stored documents: packed fixed-length blocks over the document stream, or one padded
document per row; and the length-bucketing batch order. Pure numpy over a TokenReader (LMDB or WebDataset),
so each piece is testable without a loader.

The packed stream is every document followed by the end-of-text token: doc0 EOS doc1 EOS ... Block k is
stream tokens `[k*L, k*L + L]` (L + 1 tokens; consecutive blocks share one token), so every stream token but
the first is a label exactly once per epoch; the tail after the last whole block (< L tokens) is left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fastdata.errors import ConfigError
from fastdata.formats.tokens import TokenReader
from fastdata.text.boundaries import IGNORE_INDEX
from fastdata.text.forms import RowsForm

__all__ = ["IGNORE_INDEX", "PackedBlocks", "PaddedDocuments", "num_blocks"]


def num_blocks(stream_tokens: int, seq_len: int) -> int:
    """Whole blocks of `seq_len + 1` tokens, overlapping by one, that fit in a stream of `stream_tokens`."""
    return max(0, (stream_tokens - 1) // seq_len)


class PackedBlocks:
    """Block k of the EOS-separated document stream; batches of blocks as `input_ids` / `labels` [B, L]
    int64, labels shifted by one (and what `form` adds: `fastdata.text.forms`)."""

    def __init__(self, store: TokenReader, seq_len: int, eos_id: int) -> None:
        if seq_len < 1:
            raise ConfigError(f"seq_len must be at least 1, got {seq_len}")
        self.store = store
        self.seq_len = seq_len
        self.eos_id = int(eos_id)
        self.form = RowsForm(seq_len, self.eos_id)
        self._eos_positions: np.ndarray | None = None

    def shaped(self, boundaries: bool = False, mask_cross_document: bool = False) -> PackedBlocks:
        """These blocks with document boundaries in the batch and / or cross-document labels masked."""
        self.form = RowsForm(self.seq_len, self.eos_id, None, boundaries, mask_cross_document)
        return self

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_eos_positions": None}

    @property
    def stream_tokens(self) -> int:
        return self.store.total_tokens + self.store.num_documents

    def __len__(self) -> int:
        return num_blocks(self.stream_tokens, self.seq_len)

    @property
    def eos_positions(self) -> np.ndarray:
        """Stream position of the end-of-text token after each document: made once per process, chunk by chunk
        from the stored document index (one int64 per document; the ends themselves are not kept)."""
        if self._eos_positions is None:
            self._eos_positions = self.store.document_ends.full(per_doc=1)
        return self._eos_positions

    def rows(self, blocks: Sequence[int] | np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Blocks as rows of L + 1 stream tokens [len(blocks), L + 1] (int64, or written into `out`): all
        blocks' token ranges read in one go, the end-of-text tokens placed with one vectorised scatter."""
        ks = np.asarray(blocks, dtype=np.int64).reshape(-1)
        if len(ks) and (ks.min() < 0 or ks.max() >= len(self)):
            raise IndexError(f"block index out of range for {len(self)} blocks")
        width = self.seq_len + 1
        eos = self.eos_positions
        starts = ks * self.seq_len
        first = np.searchsorted(eos, starts, side="left")
        per_row = np.searchsorted(eos, starts + width, side="left") - first  # end-of-text tokens in each block
        tokens = self.store.read_many(starts - first, width - per_row)
        rows = np.empty((len(ks), width), np.int64) if out is None else out
        total = int(per_row.sum())
        if total == 0:
            rows.reshape(-1)[:] = tokens
            return rows
        row_of = np.repeat(np.arange(len(ks)), per_row)
        nth = np.arange(total) - np.repeat(np.cumsum(per_row) - per_row, per_row)
        is_token = np.ones(rows.shape, bool)
        is_token[row_of, eos[np.repeat(first, per_row) + nth] - starts[row_of]] = False
        rows[is_token] = tokens
        rows[~is_token] = self.eos_id
        return rows

    def block(self, k: int) -> np.ndarray:
        """Stream tokens `[k*L, k*L + L]` (L + 1 int64)."""
        return self.rows([k])[0]

    def transfer_shapes(self, blocks: Sequence[int] | np.ndarray) -> list[tuple[int, ...]]:
        """The int32 arrays a batch of `blocks` hands over (`fastdata.text.forms`)."""
        return self.form.shapes(len(blocks))

    def transfer(self, blocks: Sequence[int] | np.ndarray, parts: list[np.ndarray]) -> np.ndarray | None:
        """Write a batch into its hand-over `parts` (int32 views into shared memory: the rows straight into the
        first); returns what travels beside it (`RowsForm.fill`)."""
        self.rows(blocks, parts[0])
        return self.form.fill(parts)

    def to_batch(self, parts: list[torch.Tensor], extra: np.ndarray | None = None) -> dict[str, torch.Tensor | int]:
        """The batch dict from a hand-over (`parts`, and what travelled beside it), int64 tensors [B, L]."""
        return self.form.batch(parts, extra)

    def batch(self, blocks: Sequence[int] | np.ndarray) -> dict[str, torch.Tensor | int]:
        """A batch of `blocks` built in this process."""
        parts = [np.empty(shape, np.int32) for shape in self.transfer_shapes(blocks)]
        extra = self.transfer(blocks, parts)
        return self.to_batch([torch.from_numpy(part) for part in parts], extra)


class PaddedDocuments:
    """One document per row: `input_ids` = its first `max_length` tokens, `labels` = the next token at each
    position (the document's end-of-text token after its last one, when there is one), padded to the longest
    row of the batch with `pad_id` / IGNORE_INDEX, and `attention_mask` 1 on real tokens."""

    keys = ("input_ids", "attention_mask", "labels")

    def __init__(self, store: TokenReader, max_length: int, eos_id: int | None, pad_id: int) -> None:
        if max_length < 1:
            raise ConfigError(f"max_length must be at least 1, got {max_length}")
        self.store = store
        self.max_length = max_length
        self.eos_id = eos_id
        self.pad_id = int(pad_id)

    def __len__(self) -> int:
        return self.store.num_documents

    def lengths(self) -> np.ndarray:
        """Row length (real tokens in `input_ids`) of every document."""
        ends = self.store.ends
        sizes = np.diff(ends, prepend=np.int64(0))
        if self.eos_id is None:
            sizes = np.maximum(sizes - 1, 0)
        return np.minimum(sizes, self.max_length)

    def _sequence(self, index: int) -> np.ndarray:
        ends = self.store.ends
        start, stop = (int(ends[index - 1]) if index else 0), int(ends[index])
        tokens = self.store.read(start, min(stop, start + self.max_length + 1)).astype(np.int64)
        if self.eos_id is not None and stop - start <= self.max_length:
            tokens = np.append(tokens, np.int64(self.eos_id))
        return tokens

    def batch_array(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """`[input_ids, attention_mask, labels]` of a batch of documents as one int64 array [3, B, W], W the
        longest row of the batch (at least 1); also the hand-over form (as int32)."""
        if any(not 0 <= int(i) < len(self) for i in indices):
            raise IndexError(f"document index out of range for {len(self)} documents")
        sequences = [self._sequence(int(i)) for i in indices]
        width = max([1, *(len(s) - 1 for s in sequences)])
        out = np.empty((3, len(sequences), width), np.int64)
        input_ids, mask, labels = out
        input_ids.fill(self.pad_id)
        mask.fill(0)
        labels.fill(IGNORE_INDEX)
        for row, tokens in enumerate(sequences):
            n = max(len(tokens) - 1, 0)
            input_ids[row, :n] = tokens[:n]
            labels[row, :n] = tokens[1:n + 1]
            mask[row, :n] = 1
        return out

    def parts(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """A batch's hand-over: its [3, B, W] array as int32."""
        return [self.batch_array(indices).astype(np.int32)]

    def to_batch(self, parts: list[torch.Tensor], extra: None = None) -> dict[str, torch.Tensor]:
        """The batch dict (contiguous int64 [B, W] each) from the hand-over (one [3, B, W] array)."""
        return dict(zip(self.keys, parts[0].to(torch.int64).unbind(0), strict=True))

    def batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, torch.Tensor]:
        return self.to_batch([torch.from_numpy(part) for part in self.parts(indices)])
