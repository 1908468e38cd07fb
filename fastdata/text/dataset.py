"""The map-style dataset over a converted text dataset (LMDB or WebDataset shards, same interface), and the
DataLoader adapter that builds whole batches inside the workers."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from fastdata.errors import ConfigError
from fastdata.formats.lmdb_text import TextLmdbReader
from fastdata.formats.manifest import Manifest
from fastdata.formats.registry import storage
from fastdata.formats.tokens import TOKENIZER_FILE
from fastdata.formats.wds_text import TextWdsReader
from fastdata.order.packing import DEFAULT_WINDOW
from fastdata.text.bestfit import BestFitRows
from fastdata.text.blocks import PackedBlocks, PaddedDocuments
from fastdata.text.handover import HandOver
from fastdata.text.tokenizer import load_tokenizer, resolve_eos
from fastdata.workers import new_shared

Batcher = PackedBlocks | PaddedDocuments | BestFitRows


def open_store(root: Path, manifest: Manifest) -> TextLmdbReader | TextWdsReader:
    """The token reader for a text dataset's storage format."""
    return storage("text", manifest.format, root).open_reader(root, manifest)


class TextDataset(Dataset):
    """Documents in source order: `len(ds)` documents, `ds[i]` -> `{"input_ids": int64 tensor}` (exactly the
    stored ids), `ds.tokenizer` (the `tokenizers.Tokenizer` the dataset was made with), `ds.total_tokens`."""

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self.store = open_store(self.root, manifest)
        self._tokenizer: Any = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokenizer": None}

    def __len__(self) -> int:
        return self.store.num_documents

    @property
    def _text(self) -> dict[str, Any]:
        assert self.manifest.text is not None  # open_store refuses a manifest without its text section
        return self.manifest.text

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"document {index} out of range for {len(self)} documents")
        return {"input_ids": torch.from_numpy(self.tokens(index).astype(np.int64))}

    def tokens(self, index: int) -> np.ndarray:
        """Document `index`'s token ids in the stored dtype."""
        ends = self.store.ends
        return self.store.read(int(ends[index - 1]) if index else 0, int(ends[index]))

    @property
    def total_tokens(self) -> int:
        return self.store.total_tokens

    @property
    def dtype(self) -> np.dtype:
        return self.store.dtype

    @property
    def document_lengths(self) -> np.ndarray:
        """Token count of every document (int64)."""
        return np.diff(self.store.ends, prepend=np.int64(0))

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the dataset was made with (its copy beside the data), truncation and padding off."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.root / self._text.get("tokenizer", TOKENIZER_FILE))
        return self._tokenizer

    @property
    def eos_token(self) -> str | None:
        return self._text.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._text.get("eos_token_id")

    def _eos(self, eos_token: str | None) -> int | None:
        if eos_token is None:
            return self.eos_token_id
        found = resolve_eos(self.tokenizer, eos_token, str(self.root / TOKENIZER_FILE))
        return None if found is None else found[1]

    def _packing_eos(self, eos_token: str | None) -> int:
        eos_id = self._eos(eos_token)
        if eos_id is None:
            raise ConfigError(
                f"{self.root}: no end-of-text token to separate packed documents (the tokenizer has none of the "
                "usual special tokens and none was given); convert again with --eos-token TOKEN, pass "
                "eos_token=... to the loader, or load with packing=False")
        return eos_id

    def _pad_id(self, eos_id: int | None) -> int:
        """The padding id: the tokenizer's padding token, else the end-of-text token, else 0."""
        pad_id = self._text.get("pad_token_id")
        return pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)

    def packed(self, seq_len: int, eos_token: str | None = None) -> PackedBlocks:
        """Fixed-length blocks over the document stream, each document followed by the end-of-text token
        (the dataset's, or `eos_token`)."""
        return PackedBlocks(self.store, seq_len, self._packing_eos(eos_token))

    def best_fit(self, seq_len: int, seed: int, shuffle: bool, eos_token: str | None = None,
                 window: int = DEFAULT_WINDOW) -> BestFitRows:
        """Rows of `seq_len` tokens holding whole documents (each followed by the end-of-text token), best-fit
        packed per epoch from (seed, epoch), padded."""
        eos_id = self._packing_eos(eos_token)
        return BestFitRows(self.store, seq_len, eos_id, self._pad_id(eos_id), seed, shuffle, window)

    def padded(self, max_length: int, eos_token: str | None = None) -> PaddedDocuments:
        """One document per row, truncated to `max_length` tokens and padded per batch."""
        eos_id = self._eos(eos_token)
        return PaddedDocuments(self.store, max_length, eos_id, self._pad_id(eos_id))


class TextRows(Dataset):
    """What a text loader's `loader.dataset` is: the rows its batches are made of, as DataLoader users expect of
    `loader.dataset`: `len()` rows in the whole dataset (packed: blocks of seq_len + 1 tokens; padded: documents;
    best-fit: the rows of the loader's epoch under way, else of its next one), all ranks together, and `ds[i]` row
    i as a batch holds it (`{"input_ids", "labels"}` int64 [seq_len], padded and best-fit: also `attention_mask`,
    a padded row its own length, without the padding to a batch's longest row; with boundaries its
    `position_ids`, and `cu_seqlens` and `max_seqlen` of the row alone); the indices `loader.sampler` gives index
    it. `tokenizer`, `root` and `manifest` are the dataset's (a mixture's: its first dataset's, which all share
    one tokenizer), `documents` the documents themselves (`fastdata.dataset`'s)."""

    def __init__(self, batcher: Batcher, documents: Any, first: TextDataset,
                 epoch: Callable[[], int] | None = None) -> None:
        self.batcher, self.documents, self._first, self._epoch = batcher, documents, first, epoch

    def _rows_epoch(self) -> int:
        return self._epoch() if self._epoch is not None else 0

    def __len__(self) -> int:
        if isinstance(self.batcher, BestFitRows):
            assert self.batcher.planner is not None, "a best-fit loader's rows are planned in its process"
            return self.batcher.planner.rows(self._rows_epoch())
        return len(self.batcher)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} rows")
        batch: Mapping[str, torch.Tensor | int]
        if isinstance(self.batcher, BestFitRows):
            batch = self.batcher.batch(self._rows_epoch(), np.array([index]))
        else:
            batch = self.batcher.batch([index])
        whole = ("cu_seqlens", "max_seqlen")  # of the row alone already
        return {name: values if name in whole else values[0]  # type: ignore[index]  # max_seqlen (int): whole
                for name, values in batch.items()}

    @property
    def tokenizer(self) -> Any:
        return self._first.tokenizer

    @property
    def root(self) -> Path:
        return self._first.root

    @property
    def manifest(self) -> Manifest:
        return self._first.manifest


class TextBatches(Dataset):
    """DataLoader adapter: item `(epoch, [batch, ...])`, or `(epoch, [batch, ...], number)` -> those whole batches
    (each given as the batcher takes it: indices, or a best-fit batch's description), built inside the worker and
    handed over in a compact form (int32 arrays: packed blocks as rows of L + 1 tokens, written in place) in one
    flat shared-memory tensor, plus each batch's arrays' shapes and the little that travels beside them (a batch's
    segments): one small transfer per group is what makes moving batches between processes cheap. A numbered item
    goes into its slot of `handover` (`fastdata.text.handover`, set by the loader before its workers start) and is
    handed over as its number instead of the tensor. `unpack_batches` turns an item back into batch dicts."""

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher
        self.handover: HandOver | None = None

    def __getitem__(self, item: tuple) -> tuple[torch.Tensor | int, list[tuple[list, Any]]]:
        _epoch, group, *numbered = item
        number = numbered[0] if numbered else None
        if isinstance(self.batcher, (PackedBlocks, BestFitRows)):  # written in place
            layouts = [self.batcher.transfer_shapes(batch) for batch in group]
            flat, handed = self._flat(sum(math.prod(shape) for shapes in layouts for shape in shapes), number)
            view, pos, extras = flat.numpy(), 0, []
            for batch, shapes in zip(group, layouts, strict=True):
                parts = []
                for shape in shapes:
                    size = math.prod(shape)
                    parts.append(view[pos:pos + size].reshape(shape))
                    pos += size
                extras.append(self.batcher.transfer(batch, parts))
            return handed, list(zip(layouts, extras, strict=True))
        arrays = [self.batcher.parts(batch) for batch in group]  # padded documents: sized by what they hold
        flat, handed = self._flat(sum(part.size for parts in arrays for part in parts), number)
        view, pos = flat.numpy(), 0
        for parts in arrays:
            for part in parts:
                view[pos:pos + part.size] = part.reshape(-1)
                pos += part.size
        return handed, [([part.shape for part in parts], None) for parts in arrays]

    def _flat(self, size: int, number: int | None) -> tuple[torch.Tensor, torch.Tensor | int]:
        """Where an item of `size` int32 goes, and what names it in the handed-over item: its slot's number, else
        the tensor itself (in a worker made in shared memory directly: nothing to copy when it is sent)."""
        if get_worker_info() is None:
            flat = torch.empty(size, dtype=torch.int32)
            return flat, flat
        slot = self.handover.slot(number, size) if self.handover is not None else None
        if slot is not None:
            assert number is not None  # a slot is numbered
            return slot, number
        flat = new_shared((size,), torch.int32)
        return flat, flat


def unpack_batches(flat: torch.Tensor, layouts: list[tuple[list, Any]], batcher: Batcher
                   ) -> Iterator[dict[str, Any]]:
    """The batch dicts (contiguous int64 tensors) of one TextBatches item: each batch's arrays' shapes, and what
    travelled beside them."""
    view, pos = flat.numpy(), 0
    for shapes, extra in layouts:
        parts = []
        for shape in shapes:
            size = math.prod(shape)
            parts.append(view[pos:pos + size].reshape(shape))
            pos += size
        yield batcher.to_batch(parts, extra)
