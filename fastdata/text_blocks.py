"""Batches from stored documents: packed fixed-length blocks over the document stream, or one padded
document per row; and the length-bucketing batch order. Pure numpy over a token store (anything with
`ends`, `read(start, stop)`, `total_tokens`, `num_documents`), so each piece is testable without a loader.

The packed stream is every document followed by the end-of-text token: doc0 EOS doc1 EOS ... Block k is
stream tokens `[k*L, k*L + L]` (L + 1 tokens; consecutive blocks share one token), so every stream token but
the first is a label exactly once per epoch; the tail after the last whole block (< L tokens) is left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np
import torch

from fastdata.datasets import EpochBatchSampler
from fastdata.errors import ConfigError
from fastdata.order import epoch_order

IGNORE_INDEX = -100  # torch.nn.functional.cross_entropy's default ignore_index


class TokenStore(Protocol):
    """What a batcher needs from a storage reader."""

    num_documents: int
    total_tokens: int

    @property
    def ends(self) -> np.ndarray: ...

    def read(self, start: int, stop: int) -> np.ndarray: ...


def num_blocks(stream_tokens: int, seq_len: int) -> int:
    """Whole blocks of `seq_len + 1` tokens, overlapping by one, that fit in a stream of `stream_tokens`."""
    return max(0, (stream_tokens - 1) // seq_len)


class PackedBlocks:
    """Block k of the EOS-separated document stream; batches of blocks as `input_ids` / `labels` [B, L]
    int64, labels shifted by one."""

    def __init__(self, store: TokenStore, seq_len: int, eos_id: int) -> None:
        if seq_len < 1:
            raise ConfigError(f"seq_len must be at least 1, got {seq_len}")
        self.store = store
        self.seq_len = seq_len
        self.eos_id = int(eos_id)
        self._eos_positions: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_eos_positions": None}

    @property
    def stream_tokens(self) -> int:
        return self.store.total_tokens + self.store.num_documents

    def __len__(self) -> int:
        return num_blocks(self.stream_tokens, self.seq_len)

    @property
    def eos_positions(self) -> np.ndarray:
        """Stream position of the end-of-text token after each document."""
        if self._eos_positions is None:
            ends = self.store.ends
            self._eos_positions = ends + np.arange(len(ends), dtype=np.int64)
        return self._eos_positions

    def block_into(self, k: int, out: np.ndarray) -> None:
        """Write stream tokens `[k*L, k*L + L]` into `out` (L + 1 int64)."""
        if not 0 <= k < len(self):
            raise IndexError(f"block {k} out of range for {len(self)} blocks")
        start, stop = k * self.seq_len, k * self.seq_len + self.seq_len + 1
        eos = self.eos_positions
        first, last = np.searchsorted(eos, (start, stop), side="left")
        tokens = self.store.read(start - int(first), start - int(first) + (stop - start) - int(last - first))
        if first == last:
            out[:] = tokens
            return
        is_token = np.ones(stop - start, bool)
        is_token[eos[first:last] - start] = False
        out[is_token] = tokens
        out[~is_token] = self.eos_id

    def block(self, k: int) -> np.ndarray:
        out = np.empty(self.seq_len + 1, np.int64)
        self.block_into(k, out)
        return out

    def batch(self, blocks: Sequence[int]) -> dict[str, torch.Tensor]:
        rows = np.empty((len(blocks), self.seq_len + 1), np.int64)
        for row, k in zip(rows, blocks, strict=True):
            self.block_into(int(k), row)
        return {"input_ids": torch.from_numpy(np.ascontiguousarray(rows[:, :-1])),
                "labels": torch.from_numpy(np.ascontiguousarray(rows[:, 1:]))}


class PaddedDocuments:
    """One document per row: `input_ids` = its first `max_length` tokens, `labels` = the next token at each
    position (the document's end-of-text token after its last one, when there is one), padded to the longest
    row of the batch with `pad_id` / IGNORE_INDEX, and `attention_mask` 1 on real tokens."""

    def __init__(self, store: TokenStore, max_length: int, eos_id: int | None, pad_id: int) -> None:
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

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        if any(not 0 <= int(i) < len(self) for i in indices):
            raise IndexError(f"document index out of range for {len(self)} documents")
        sequences = [self._sequence(int(i)) for i in indices]
        width = max([1, *(len(s) - 1 for s in sequences)])
        input_ids = np.full((len(sequences), width), self.pad_id, np.int64)
        labels = np.full((len(sequences), width), IGNORE_INDEX, np.int64)
        mask = np.zeros((len(sequences), width), np.int64)
        for row, tokens in enumerate(sequences):
            n = max(len(tokens) - 1, 0)
            input_ids[row, :n] = tokens[:n]
            labels[row, :n] = tokens[1:n + 1]
            mask[row, :n] = 1
        return {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask),
                "labels": torch.from_numpy(labels)}


class BucketBatchSampler(EpochBatchSampler):
    """Like EpochBatchSampler, but batches hold documents of similar length: each window of
    `window_batches` batches of the epoch's order is sorted by length and cut into batches, and the batches
    are then shuffled (from seed and epoch). Same batches for any number of workers; same length."""

    def __init__(self, lengths: np.ndarray, batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                 window_batches: int = 64) -> None:
        super().__init__(len(lengths), batch_size, shuffle, seed, drop_last)
        self.lengths = np.asarray(lengths)
        self.window = batch_size * window_batches

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        batches: list[np.ndarray] = []
        for start in range(0, stop, self.window):
            window = order[start:min(start + self.window, stop)]
            window = window[np.argsort(self.lengths[window], kind="stable")]
            batches.extend(window[i:i + self.batch_size] for i in range(0, len(window), self.batch_size))
        if self.shuffle:
            rng = np.random.default_rng((self.seed, self.epoch, 2))
            batches = [batches[i] for i in rng.permutation(len(batches))]
        for chunk in batches:
            yield self.epoch, chunk

