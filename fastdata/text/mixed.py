"""A weighted mixture of text datasets read as one: packed blocks (or padded documents) of every source, one
source after the other in a global index space (`fastdata.order.mixing` says which index each slot takes).
Every source must share one tokenizer (its sha256), end-of-text and padding token, so that ids mean the same."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from fastdata.config import LoaderOptions
from fastdata.errors import ConfigError
from fastdata.formats.tokens import TOKENIZER_FILE
from fastdata.order.mixing import MixedBatchSampler, MixedResumable, MixPlan
from fastdata.order.state import dataset_fingerprint
from fastdata.text.blocks import PackedBlocks, PaddedDocuments
from fastdata.text.dataset import TextDataset
from fastdata.text.forms import RowsForm
from fastdata.text.loader import (
    BEST_FIT,
    DEFAULT_MAX_LENGTH,
    DEFAULT_SEQ_LEN,
    TextLoader,
    TextOptions,
    check_packing_options,
)


def tokenizer_sha256(data: TextDataset) -> str:
    """The sha256 of the tokenizer file a text dataset was made with (the manifest's, else computed)."""
    known = (data.manifest.text or {}).get("tokenizer_sha256")
    if known:
        return str(known)
    path = data.root / (data.manifest.text or {}).get("tokenizer", TOKENIZER_FILE)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_same_tokenizer(paths: list[str], sources: list[TextDataset]) -> None:
    """ConfigError naming the first two sources whose tokenizers differ."""
    first = tokenizer_sha256(sources[0])
    for path, data in zip(paths[1:], sources[1:], strict=True):
        other = tokenizer_sha256(data)
        if other != first:
            raise ConfigError(f"{paths[0]} and {path} were tokenized with different tokenizers (sha256 "
                              f"{first[:12]}... and {other[:12]}...), so their ids mean different tokens; mix "
                              "datasets converted with the same tokenizer.json")


def _offsets(sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


class MixedPackedBlocks(PackedBlocks):
    """Block k of the concatenated sources' blocks (each source packs its own documents)."""

    def __init__(self, sources: list[PackedBlocks], paths: list[str]) -> None:
        eos = {s.eos_id for s in sources}
        if len(eos) > 1:
            raise ConfigError(f"{', '.join(paths)}: the datasets end documents with different end-of-text ids "
                              f"({sorted(eos)}); pass eos_token=... so that they share one")
        self.sources = sources
        self.seq_len, self.eos_id = sources[0].seq_len, sources[0].eos_id
        self.form = RowsForm(self.seq_len, self.eos_id)
        self.offsets = _offsets([len(s) for s in sources])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def stream_tokens(self) -> int:
        return sum(s.stream_tokens for s in self.sources)

    def rows(self, blocks: Any, out: np.ndarray | None = None) -> np.ndarray:
        ks = np.asarray(blocks, dtype=np.int64).reshape(-1)
        if len(ks) and (ks.min() < 0 or ks.max() >= len(self)):
            raise IndexError(f"block index out of range for {len(self)} blocks")
        rows = np.empty((len(ks), self.seq_len + 1), np.int64) if out is None else out
        which = np.searchsorted(self.offsets, ks, side="right") - 1
        for source in np.unique(which):
            mine = which == source
            rows[mine] = self.sources[source].rows(ks[mine] - self.offsets[source])
        return rows


class MixedPaddedDocuments(PaddedDocuments):
    """Document k of the concatenated sources' documents, one per row."""

    def __init__(self, sources: list[PaddedDocuments], paths: list[str]) -> None:
        ids = {(s.eos_id, s.pad_id) for s in sources}
        if len(ids) > 1:
            raise ConfigError(f"{', '.join(paths)}: the datasets have different end-of-text / padding ids "
                              f"({sorted(ids, key=str)}); pass eos_token=... so that they share them")
        self.sources = sources
        self.max_length, self.eos_id, self.pad_id = sources[0].max_length, sources[0].eos_id, sources[0].pad_id
        self.offsets = _offsets([len(s) for s in sources])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def lengths(self) -> np.ndarray:
        return np.concatenate([s.lengths() for s in self.sources])

    def _sequence(self, index: int) -> np.ndarray:
        source = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.sources[source]._sequence(index - int(self.offsets[source]))


class MixedTextLoader(MixedResumable, TextLoader):
    """`TextLoader` over a mixture: batches drawn by the mixing schedule; `loader.datasets` are the sources,
    `loader.dataset` the rows of all of them (`TextRows`; `.documents` every source's documents, one source after
    the other)."""

    def __init__(self, sources: list[TextDataset], names: list[str], batcher: Any, plan: MixPlan,
                 options: LoaderOptions) -> None:
        self.plan, self.datasets, self.names = plan, sources, names
        sampler = MixedBatchSampler(plan, options.batch_size, options.shuffle, options.seed, options.drop_last,
                                    options.rank, options.world_size, options.uneven)
        super().__init__(sources[0], batcher, sampler, options, documents=MixedTextDataset(sources))

    def _resume_config(self) -> dict[str, Any]:
        s = self._sampler
        config = {"format": "text-mix", "batch_size": s.batch_size, "shuffle": s.shuffle, "seed": s.seed,
                  "drop_last": s.drop_last, "uneven": s.uneven, "packing": self.packed,
                  "length": self.batcher.seq_len if self.packed else self.batcher.max_length}
        return {**config, **self._mix_config(self.names, [dataset_fingerprint(d.manifest) for d in self.datasets])}


def mixed_text_loader(paths: list[str], names: list[str], sources: list[TextDataset], weights: Any,
                      options: LoaderOptions, text: TextOptions, samples_per_epoch: int | None, epoch_end: str,
                      exhausted: str) -> MixedTextLoader:
    """The text loader over a mixture (called by `fastdata.loader` with validated options): every source cut
    the same way (packed blocks of `seq_len`, or padded documents), weighted per block or document."""
    check_same_tokenizer(paths, sources)
    if text.bucketing:
        raise ConfigError("bucketing reorders a dataset's documents by length, which a mixture's schedule fixes "
                          "already; leave bucketing out when mixing")
    packing = True if text.packing is None else text.packing
    if packing == BEST_FIT:
        raise ConfigError(f"packing={BEST_FIT!r} plans each dataset's rows from its own documents, which a "
                          "mixture's schedule does not follow; mix packed blocks (packing=True) or padded documents")
    check_packing_options(text)
    batcher: PackedBlocks | PaddedDocuments
    if packing:
        seq_len = DEFAULT_SEQ_LEN if text.seq_len is None else text.seq_len
        batcher = MixedPackedBlocks([d.packed(seq_len, text.eos_token) for d in sources], paths)
        batcher.shaped(bool(text.boundaries), bool(text.mask_cross_document))
        sizes = [len(s) for s in batcher.sources]
    else:
        max_length = DEFAULT_MAX_LENGTH if text.max_length is None else text.max_length
        batcher = MixedPaddedDocuments([d.padded(max_length, text.eos_token) for d in sources], paths)
        sizes = [len(s) for s in batcher.sources]
    plan = MixPlan.make(sizes, weights, samples_per_epoch, epoch_end, exhausted, paths)
    return MixedTextLoader(sources, names, batcher, plan, options)


class MixedTextDataset:
    """Map-style dataset over several text datasets one after the other: `ds[i]` is document `i - offsets[s]`
    of source s, `{"input_ids": int64 tensor}`."""

    def __init__(self, sources: list[TextDataset]) -> None:
        self.sources = sources
        self.offsets = _offsets([len(d) for d in sources])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"document {index} out of range for {len(self)} documents")
        source = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.sources[source][index - int(self.offsets[source])]

    @property
    def tokenizer(self) -> Any:
        return self.sources[0].tokenizer
