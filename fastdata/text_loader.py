"""The text loader: packed token blocks (default) or padded documents, as dicts of int64 tensors, with whole
batches built inside DataLoader workers from a batch order drawn in the main process (so the order depends
on (seed, epoch) only, never on the number of workers)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastdata.datasets import EpochBatchSampler
from fastdata.errors import ConfigError
from fastdata.text_blocks import BucketBatchSampler, PackedBlocks
from fastdata.text_dataset import TextBatches, TextDataset

DEFAULT_SEQ_LEN = 1024
DEFAULT_MAX_LENGTH = 1024


class TextLoader:
    """Iterable of batch dicts. Packed: `{"input_ids", "labels"}` [B, seq_len]; padded: `{"input_ids",
    "attention_mask", "labels"}` [B, longest row]. Each new pass is the next epoch (reshuffled from
    (seed, epoch)); `set_epoch(e)` sets it; `len()` is the exact number of batches per epoch."""

    def __init__(self, data: TextDataset, batcher: Any, sampler: EpochBatchSampler, *, num_workers: int,
                 pin_memory: bool, prefetch_factor: int | None, persistent_workers: bool,
                 multiprocessing_context: Any) -> None:
        self.dataset = data
        self.batcher = batcher
        self.batch_size = sampler.batch_size
        self.num_workers = num_workers
        self._sampler = sampler
        self._epoch = 0
        self._loader = DataLoader(TextBatches(batcher), sampler=sampler, batch_size=None, num_workers=num_workers,
                                  pin_memory=pin_memory, persistent_workers=persistent_workers and num_workers > 0,
                                  prefetch_factor=prefetch_factor if num_workers else None,
                                  multiprocessing_context=multiprocessing_context if num_workers else None)

    @property
    def packed(self) -> bool:
        return isinstance(self.batcher, PackedBlocks)

    @property
    def epoch(self) -> int:
        """The epoch the next pass will yield."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass yield epoch `epoch` (as DistributedSampler.set_epoch does)."""
        self._epoch = int(epoch)

    def __len__(self) -> int:
        return len(self._sampler)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self._sampler.epoch = self._epoch
        self._epoch += 1
        yield from self._loader


def text_loader(data: TextDataset, *, batch_size: int, shuffle: bool, num_workers: int, seed: int,
                drop_last: bool, pin_memory: bool, prefetch_factor: int, persistent_workers: bool,
                multiprocessing_context: Any, seq_len: int | None, packing: bool | None,
                max_length: int | None, bucketing: bool | None, eos_token: str | None) -> TextLoader:
    """Build the text loader over `data` (called by `fastdata.loader`, which checks the common arguments)."""
    packing = True if packing is None else packing
    if packing:
        if max_length is not None or bucketing:
            raise ConfigError("max_length and bucketing apply to padded batches (packing=False); packed blocks "
                              "are seq_len tokens long")
        batcher: Any = data.packed(DEFAULT_SEQ_LEN if seq_len is None else seq_len, eos_token)
        if len(batcher) == 0:
            raise ConfigError(f"{data.root}: {batcher.stream_tokens} tokens make no whole block of "
                              f"seq_len={batcher.seq_len} (+1) tokens; use a smaller seq_len")
        sampler = EpochBatchSampler(len(batcher), batch_size, shuffle, seed, drop_last)
    else:
        if seq_len is not None:
            raise ConfigError("seq_len applies to packed blocks; padded batches (packing=False) take max_length")
        batcher = data.padded(DEFAULT_MAX_LENGTH if max_length is None else max_length, eos_token)
        if bucketing:
            sampler = BucketBatchSampler(batcher.lengths(), batch_size, shuffle, seed, drop_last)
        else:
            sampler = EpochBatchSampler(len(batcher), batch_size, shuffle, seed, drop_last)
    return TextLoader(data, batcher, sampler, num_workers=num_workers, pin_memory=pin_memory,
                      prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                      multiprocessing_context=multiprocessing_context)
