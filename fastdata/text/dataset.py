"""The map-style dataset over a converted text dataset (LMDB or WebDataset shards, same interface), and the
DataLoader adapter that builds whole batches inside the workers."""

from __future__ import annotations

from collections.abc import Iterator
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
from fastdata.text.blocks import PackedBlocks, PaddedDocuments
from fastdata.text.tokenizer import load_tokenizer, resolve_eos


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

    def packed(self, seq_len: int, eos_token: str | None = None) -> PackedBlocks:
        """Fixed-length blocks over the document stream, each document followed by the end-of-text token
        (the dataset's, or `eos_token`)."""
        eos_id = self._eos(eos_token)
        if eos_id is None:
            raise ConfigError(
                f"{self.root}: no end-of-text token to separate packed documents (the tokenizer has none of the "
                "usual special tokens and none was given); convert again with --eos-token TOKEN, pass "
                "eos_token=... to the loader, or load with packing=False")
        return PackedBlocks(self.store, seq_len, eos_id)

    def padded(self, max_length: int, eos_token: str | None = None) -> PaddedDocuments:
        """One document per row, truncated to `max_length` tokens and padded per batch."""
        eos_id = self._eos(eos_token)
        pad_id = self._text.get("pad_token_id")
        pad_id = pad_id if pad_id is not None else (eos_id if eos_id is not None else 0)
        return PaddedDocuments(self.store, max_length, eos_id, pad_id)


class TextRows(Dataset):
    """What a text loader's `loader.dataset` is: the rows its batches are made of, as DataLoader users expect of
    `loader.dataset`: `len()` rows in the whole dataset (packed: blocks of seq_len + 1 tokens; padded: documents),
    all ranks together, and `ds[i]` row i as a batch holds it (`{"input_ids", "labels"}` int64 [seq_len], padded:
    also `attention_mask`, the row's own length, without the padding to a batch's longest row); the indices
    `loader.sampler` gives index it. `tokenizer`, `root` and `manifest` are the dataset's (a mixture's: its first
    dataset's, which all share one tokenizer), `documents` the documents themselves (`fastdata.dataset`'s)."""

    def __init__(self, batcher: PackedBlocks | PaddedDocuments, documents: Any, first: TextDataset) -> None:
        self.batcher, self.documents, self._first = batcher, documents, first

    def __len__(self) -> int:
        return len(self.batcher)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} rows")
        return {name: values[0] for name, values in self.batcher.batch([index]).items()}

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
    """DataLoader adapter: item `(epoch, [indices, ...])` -> those whole batches, built inside the worker and
    handed over in a compact form (int32; packed blocks as rows of L + 1 tokens) in one flat shared-memory
    tensor plus each batch's shape: one small transfer per group is what makes moving batches between
    processes cheap. `unpack_batches` turns an item back into batch dicts."""

    def __init__(self, batcher: PackedBlocks | PaddedDocuments) -> None:
        self.batcher = batcher

    def __len__(self) -> int:
        return len(self.batcher)

    def __getitem__(self, item: tuple[int, list[np.ndarray]]) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
        _epoch, group = item
        if isinstance(self.batcher, PackedBlocks):
            shapes = [self.batcher.transfer_shape(len(indices)) for indices in group]
            flat = torch.empty(sum(int(np.prod(shape)) for shape in shapes), dtype=torch.int32)
            if get_worker_info() is not None:  # filled in shared memory: nothing to copy when it is sent
                flat.share_memory_()
            view, pos = flat.numpy(), 0
            for indices, shape in zip(group, shapes, strict=True):
                size = int(np.prod(shape))
                self.batcher.transfer_array(indices, view[pos:pos + size].reshape(shape))
                pos += size
            return flat, shapes
        arrays = [self.batcher.batch_array(indices) for indices in group]
        ids = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.int32)
        return torch.from_numpy(ids), [a.shape for a in arrays]


def unpack_batches(flat: torch.Tensor, shapes: list[tuple[int, ...]], batcher: PackedBlocks | PaddedDocuments
                   ) -> Iterator[dict[str, torch.Tensor]]:
    """The batch dicts (contiguous int64 tensors) of one TextBatches item."""
    pos = 0
    for shape in shapes:
        size = int(np.prod(shape))
        yield batcher.to_batch(flat[pos:pos + size].view(shape))
        pos += size
