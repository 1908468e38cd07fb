"""The text loader: packed token blocks (default) or padded documents, as dicts of int64 tensors, with whole
batches built inside DataLoader workers from a batch order drawn in the main process (so the order depends
on (seed, epoch) only, never on the number of workers)."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastdata.config import LoaderOptions, check_optional_bool, check_optional_int
from fastdata.errors import ConfigError
from fastdata.order.packing import PlannedBatchSampler
from fastdata.order.samplers import BucketBatchSampler, EpochBatchSampler
from fastdata.order.state import ResumableLoader, dataset_fingerprint
from fastdata.text.bestfit import BestFitRows
from fastdata.text.blocks import PackedBlocks
from fastdata.text.dataset import TextBatches, TextDataset, TextRows, unpack_batches
from fastdata.text.handover import HandOver
from fastdata.workers import ClosesWorkers, WorkerPass, prepare_worker

DEFAULT_SEQ_LEN = 1024
DEFAULT_MAX_LENGTH = 1024
BEST_FIT = "best-fit"
GROUP_BYTES = 2 << 20  # batches a worker hands over at once: about this many bytes of rows (one item)
MAX_GROUP = 16


def _worker_init(_worker_id: int) -> None:
    prepare_worker()


def as_made(item: Any) -> Any:
    """The DataLoader's `collate_fn`: a worker's item (`TextBatches`) as it was made. Its shared-memory tensor is
    handed over as a tensor; the few small numpy arrays beside it (a batch's segments) are pickled with the item.
    torch's default (`default_convert`) would make each of them a tensor, which a worker hands over in a
    shared-memory segment of its own: a segment, a file descriptor and a socket handshake per batch, on both sides
    costlier than the whole batch's rows."""
    return item


class GroupedBatches:
    """Yields `(epoch, [up to `group` consecutive batches])` from an epoch batch sampler: each batch its indices,
    or what `describe(epoch, [indices, ...])` makes of the group's batches of each epoch at once (best-fit rows:
    the token ranges they hold). `numbered`: each item also has its number, counted over every pass (`sent`: the
    next one's), which names its hand-over slot (`fastdata.text.handover`)."""

    def __init__(self, sampler: EpochBatchSampler, group: int,
                 describe: Callable[[int, list[np.ndarray]], list[Any]] | None = None, numbered: bool = False
                 ) -> None:
        self.sampler, self.group, self.describe, self.numbered = sampler, group, describe, numbered
        self.sent = 0

    def __iter__(self) -> Iterator[tuple]:
        pending: list[tuple[int, np.ndarray]] = []
        for epoch, indices in self.sampler:
            pending.append((epoch, indices))
            if len(pending) == self.group:
                yield self._item(pending)
                pending = []
        if pending:
            yield self._item(pending)

    def _item(self, pending: list[tuple[int, np.ndarray]]) -> tuple:
        batches: list[Any] = []
        for epoch, run in itertools.groupby(pending, key=lambda batch: batch[0]):
            indices = [batch[1] for batch in run]
            batches += indices if self.describe is None else self.describe(epoch, indices)
        if not self.numbered:
            return pending[-1][0], batches
        self.sent += 1
        return pending[-1][0], batches, self.sent - 1

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.group)


def group_size(batch_bytes: int) -> int:
    """How many batches of `batch_bytes` make one worker hand-over of about GROUP_BYTES."""
    return max(1, min(MAX_GROUP, GROUP_BYTES // max(1, batch_bytes)))


class PassEpoch:
    """`loader.dataset`'s view of its loader's epoch (the pass under way, else the next one), holding the loader
    weakly: a loader dropped without `close()` is freed, and its workers end, at once, rather than at the next
    garbage collection (which may run in a process forked from this one, where the DataLoader's clean-up fails).
    Once the loader is gone, the epoch it last said."""

    def __init__(self, loader: TextLoader) -> None:
        self._loader = weakref.ref(loader)
        self._last = 0

    def __call__(self) -> int:
        loader = self._loader()
        if loader is not None:
            self._last = loader._pass_epoch()
        return self._last


class TextLoader(ClosesWorkers, ResumableLoader):
    """Iterable of batch dicts. Packed: `{"input_ids", "labels"}` [B, seq_len]; best-fit: `{"input_ids",
    "attention_mask", "labels"}` [B, seq_len]; padded: `{"input_ids", "attention_mask", "labels"}` [B, longest
    row]; with `boundaries`, packed and best-fit batches also hold `position_ids`, `cu_seqlens` and `max_seqlen`.
    Each new pass is the next epoch (reshuffled from (seed, epoch)); `set_epoch(e)` sets it; `len()` is the exact
    number of batches of the epoch (per rank: each rank of the sampler's world gets its own part; best-fit: the
    epoch under way, else the next one, has its own number of rows); `state_dict()` / `load_state_dict()` resume
    exactly (`state_dict(pending=n)` for a loop that holds n batches not yet trained on); `close()` (or `with`)
    ends the worker processes. As a DataLoader has them: `loader.dataset` the rows batches are made of
    (`TextRows`: `len` rows in the whole dataset, `.tokenizer`, `.documents`; best-fit: the rows of the epoch under
    way, else the next one), `loader.sampler` this rank's rows per epoch."""

    def __init__(self, data: TextDataset, batcher: Any, sampler: EpochBatchSampler, options: LoaderOptions,
                 documents: Any = None) -> None:
        """`documents`: what `loader.dataset.documents` is (default `data`; a mixture's: all its documents)."""
        self._data = data
        self.dataset = TextRows(batcher, data if documents is None else documents, data, PassEpoch(self))
        self.options = options
        self.batcher = batcher
        self.batch_size = sampler.batch_size
        self.num_workers = num_workers = options.num_workers
        self.pin_memory = options.pin_memory
        self._sampler = sampler
        self.rank, self.world_size = sampler.rank, sampler.world_size
        self._repartitions = sampler.repartitions
        self._init_progress()
        form = getattr(batcher, "form", None)
        row_ints = form.row_ints() if form is not None else 3 * batcher.max_length  # in the hand-over
        tokens = form.seq_len + 1 if form is not None else row_ints  # a row's tokens alone: what sets the group,
        self.group = group_size(4 * self.batch_size * tokens) if num_workers else 1  # so that every packing ...
        self._item_ints = self.group * self.batch_size * row_ints  # ... hands over as many batches at once
        describe = batcher.describe_batches if isinstance(batcher, BestFitRows) else None
        self._batches = TextBatches(batcher)
        self._grouped = GroupedBatches(sampler, self.group, describe, numbered=num_workers > 0)
        self._loader = DataLoader(self._batches, sampler=self._grouped, collate_fn=as_made,
                                  **options.dataloader_kwargs(worker_init_fn=_worker_init))
        self._workers = WorkerPass(self._loader)

    @property
    def packed(self) -> bool:
        """Packed blocks of the document stream (not best-fit rows, not padded documents)."""
        return isinstance(self.batcher, PackedBlocks)

    @property
    def packing(self) -> bool | str:
        """How the documents are cut into rows: True (packed blocks), "best-fit", or False (padded documents)."""
        return BEST_FIT if isinstance(self.batcher, BestFitRows) else self.packed

    @property
    def padding(self) -> float | None:
        """The fraction of padded positions in the rows of the epoch under way (else the next one): best-fit rows'
        (planned), 0.0 for packed blocks, None for padded documents (it depends on each batch's longest row)."""
        if isinstance(self.batcher, BestFitRows):
            assert self.batcher.planner is not None, "a best-fit loader's rows are planned in its process"
            return self.batcher.planner.plan(self._pass_epoch()).padding
        return 0.0 if self.packed else None

    def _resume_config(self) -> dict[str, Any]:
        s = self._sampler
        config = {"format": f"text-{self._data.manifest.format}",
                  "dataset": dataset_fingerprint(self._data.manifest), "samples": s.num_samples,
                  "batch_size": s.batch_size, "shuffle": s.shuffle, "seed": s.seed, "drop_last": s.drop_last,
                  "uneven": s.uneven, "packing": self.packing, "bucketing": isinstance(s, BucketBatchSampler),
                  "length": self.batcher.max_length if self.packing is False else self.batcher.seq_len}
        if isinstance(self.batcher, BestFitRows):  # each epoch's rows are planned anew: count the documents
            config.update(samples=len(self._data), window=self.batcher.window)
        return config

    def _pass_epoch(self) -> int:
        """The epoch of the pass under way, else of the next one."""
        return self._current[0] if self._current is not None else self._next.epoch

    def _pass_length(self, start: int) -> int:
        return self._sampler.pass_length(start, self._pass_epoch())

    def __len__(self) -> int:
        return self._sampler.pass_length(0, self._pass_epoch())

    def _sampling(self) -> tuple[int, bool, int, str]:
        s = self._sampler
        rows = s.planner.rows(self.epoch) if isinstance(s, PlannedBatchSampler) else s.num_samples
        return rows, s.shuffle, s.seed, s.uneven

    def _rank_order(self, epoch: int) -> np.ndarray:
        return self._sampler.rank_indices_for(epoch, 0)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        here = self._begin_pass()
        if here.complete:  # restored after the last batch of its epoch: nothing of it is left
            self._end_pass()
            return
        self._sampler.epoch, self._sampler.start, self._sampler.skip = here.epoch, here.start, here.skip
        for batch in self._pass():
            self._count_batch()
            yield batch
        self._end_pass()

    def _pass(self) -> Iterator[dict[str, torch.Tensor]]:
        """The batches of one pass; after a failure the workers are stopped and our own errors raised as they
        were raised in the worker (`fastdata.errors.from_worker`)."""
        self._prepare_hand_over()
        with self._workers.running():
            for handed, layouts in self._workers.start():
                yield from self._unpack(handed, layouts)

    def _prepare_hand_over(self) -> None:
        """Before a pass: the slots its items come in (`fastdata.text.handover`), new ones for new workers (the
        first pass's, each pass's when they do not persist, after `close()`), which those inherit; the items of an
        earlier pass are done with."""
        if not self.num_workers:
            return
        handover = self._batches.handover
        if handover is None or getattr(self._loader, "_iterator", None) is None:
            slots = (self._loader.prefetch_factor or 2) * self.num_workers + 1  # the items in flight, and one unpacked
            self._batches.handover = HandOver(slots, self._item_ints, self._grouped.sent)
        else:
            handover.begin(self._grouped.sent)

    def _unpack(self, handed: torch.Tensor | int, layouts: list) -> Iterator[dict[str, torch.Tensor]]:
        """The batch dicts of one item, each copied out of its slot as it is asked for; the slot is free once this
        generator is done with it (finished or closed)."""
        handover = self._batches.handover
        if handover is None:
            assert isinstance(handed, torch.Tensor)  # no slots: the item is its tensor
            yield from unpack_batches(handed, layouts, self.batcher)
            return
        try:
            yield from unpack_batches(handover.received(handed), layouts, self.batcher)
        finally:
            handover.copied(handed)


@dataclass(frozen=True)
class TextOptions:
    """How a text dataset is cut into batches: packed blocks of `seq_len` tokens (default); with
    `packing="best-fit"` rows of `seq_len` tokens holding whole documents, best-fit packed, padded; or with
    `packing=False` one document per row of at most `max_length` tokens, optionally length-`bucketing`;
    `eos_token` overrides the end-of-text token. `boundaries=True` adds where each packed row's documents start
    (`position_ids`, `cu_seqlens`, `max_seqlen`); `mask_cross_document=True` sets the labels that would predict
    the next document's first token (at each end-of-text token) to -100. None leaves an option at its default."""

    seq_len: int | None = None
    packing: bool | str | None = None
    max_length: int | None = None
    bucketing: bool | None = None
    eos_token: str | None = None
    boundaries: bool | None = None
    mask_cross_document: bool | None = None

    def __post_init__(self) -> None:
        check_optional_int("seq_len", self.seq_len, minimum=1)
        check_optional_int("max_length", self.max_length, minimum=1)
        if self.packing is not None and not (isinstance(self.packing, bool) or self.packing == BEST_FIT):
            raise ConfigError(f"packing must be True, False or {BEST_FIT!r}, got {self.packing!r} "
                              f"({type(self.packing).__name__})")
        check_optional_bool("bucketing", self.bucketing)
        check_optional_bool("boundaries", self.boundaries)
        check_optional_bool("mask_cross_document", self.mask_cross_document)
        if self.eos_token is not None and not isinstance(self.eos_token, str):
            raise ConfigError(f"eos_token must be a str (a token of the tokenizer), got {self.eos_token!r} "
                              f"({type(self.eos_token).__name__})")
        padded_only = [name for name in ("max_length", "bucketing") if getattr(self, name)]
        if (self.packing is True or self.packing == BEST_FIT) and padded_only:
            raise ConfigError(f"{' and '.join(padded_only)}: for padded batches (packing=False); packed blocks are "
                              "seq_len tokens long")
        packed_only = [name for name in ("boundaries", "mask_cross_document") if getattr(self, name)]
        if self.packing is False and packed_only:
            raise ConfigError(f"{', '.join(packed_only)} apply to packed rows (packing=True or {BEST_FIT!r}); "
                              "padded batches (packing=False) hold one document per row")
        if self.seq_len is not None and (self.packing is False or padded_only):
            raise ConfigError("seq_len applies to packed blocks; padded batches (packing=False) take max_length")

    def given(self) -> list[str]:
        """The names of the options that were set (for the error when the dataset holds images)."""
        return [name for name, value in vars(self).items() if value is not None]


def text_loader(data: TextDataset, options: LoaderOptions, text: TextOptions | None = None) -> TextLoader:
    """Build the text loader over `data` (called by `fastdata.loader`, which validated the options)."""
    text = text or TextOptions()
    batch_size, shuffle, seed, drop_last = options.batch_size, options.shuffle, options.seed, options.drop_last
    sharded: dict[str, Any] = {"rank": options.rank, "world_size": options.world_size, "uneven": options.uneven}
    seq_len, max_length, bucketing, eos_token = text.seq_len, text.max_length, text.bucketing, text.eos_token
    packing = True if text.packing is None else text.packing
    check_packing_options(text)
    seq_len = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    if packing == BEST_FIT:
        if not len(data):
            raise ConfigError(f"{data.root}: holds no documents to pack")
        batcher: Any = data.best_fit(seq_len, seed, shuffle, eos_token)
        sampler: EpochBatchSampler = PlannedBatchSampler(batcher.planner, batch_size, shuffle, seed, drop_last,
                                                         **sharded)
    elif packing:
        batcher = data.packed(seq_len, eos_token)
        if len(batcher) == 0:
            raise ConfigError(f"{data.root}: {batcher.stream_tokens} tokens make no whole block of "
                              f"seq_len={batcher.seq_len} (+1) tokens; use a smaller seq_len")
        sampler = EpochBatchSampler(len(batcher), batch_size, shuffle, seed, drop_last, **sharded)
    else:
        batcher = data.padded(DEFAULT_MAX_LENGTH if max_length is None else max_length, eos_token)
        if bucketing:
            sampler = BucketBatchSampler(batcher.lengths(), batch_size, shuffle, seed, drop_last, **sharded)
        else:
            sampler = EpochBatchSampler(len(batcher), batch_size, shuffle, seed, drop_last, **sharded)
    if packing is not False:
        batcher.shaped(bool(text.boundaries), bool(text.mask_cross_document))
    return TextLoader(data, batcher, sampler, options)


def check_packing_options(text: TextOptions) -> None:
    """ConfigError for options that do not apply to the chosen packing."""
    packing = True if text.packing is None else text.packing
    if packing is False:
        if text.seq_len is not None:
            raise ConfigError("seq_len applies to packed blocks; padded batches (packing=False) take max_length")
        given = [name for name in ("boundaries", "mask_cross_document") if getattr(text, name)]
        if given:
            raise ConfigError(f"{', '.join(given)} apply to packed rows (packing=True or {BEST_FIT!r}); padded "
                              "batches (packing=False) hold one document per row")
    elif text.max_length is not None or text.bucketing:
        raise ConfigError("max_length and bucketing apply to padded batches (packing=False); packed blocks "
                          "are seq_len tokens long")
