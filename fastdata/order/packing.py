"""Best-fit packing of whole documents into rows of `seq_len` tokens, as pure functions of the documents' lengths
and (seed, epoch): no IO, no token read, so the plan is the same in every process and on every rank.

Each document is followed by its end-of-text token: it takes `length + 1` positions. One that does not fit in a
row (`length + 1 > seq_len`) is cut into pieces of `seq_len` positions and a last, shorter piece; every other
document is one piece, never cut. An epoch's pieces are put in an order drawn from (seed, epoch), cut into
windows of `window` pieces, and each window is packed by best-fit decreasing (Ding et al., "Fewer Truncations
Improve Language Modeling", ICML 2024): the pieces, longest first, each go into the open row with the least room
that holds it, or open a new row. The rows of the epoch are then shuffled from (seed, epoch) too.

Best-fit decreasing is computed over *classes* of rows rather than one piece at a time: all pieces of one length
are placed together, and all rows with the same room left form one class (kept in the order they were opened).
The first piece of length s goes into the smallest class with room >= s; every later piece of that length goes
into the same row as long as it still has room >= s (nothing smaller with room exists), so each row of class c
takes `c // s` pieces in turn. This is exactly best-fit decreasing (ties: the earlier piece, the row opened
first), in a number of numpy steps that grows with the number of distinct lengths and rooms, not of pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastdata.order.epoch import epoch_order, num_batches
from fastdata.order.ranks import interleaved_part, rank_count
from fastdata.order.samplers import EpochBatchSampler

#: Pieces per best-fit window: big enough that a window's pieces fill its rows almost exactly.
DEFAULT_WINDOW = 1 << 20
#: "bfit": the row shuffle's random stream is (seed, epoch, _TAG), apart from the pieces' order (seed, epoch)
_TAG = 0x62666974


def best_fit(sizes: np.ndarray, capacity: int, known: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing of items of `sizes` (each 1..capacity) into bins of `capacity`: (the items, as indices
    into `sizes`, bin after bin; the number of items in each bin), bins in the order they were opened.

    Where each item goes depends on the sizes' histogram alone (their order only breaks ties among equal sizes):
    `known` keeps the latest histogram's placement, so that packing the same sizes again in another order (an
    epoch's shuffle of the same pieces) is a sort and a gather, without placing anything."""
    sizes = np.asarray(sizes)
    if not len(sizes):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if int(sizes.min()) < 1 or int(sizes.max()) > capacity:
        raise ValueError(f"item sizes must be in 1..{capacity}")
    # longest first, ties in input order: a stable sort of the room each leaves (a radix sort when it fits 16 bits)
    key = (capacity - sizes).astype(np.uint16 if capacity < 1 << 16 else np.int64)
    order = np.argsort(key, kind="stable")
    ordered = sizes[order]
    group_starts = np.flatnonzero(np.diff(ordered, prepend=ordered[0] + 1))
    group_sizes = ordered[group_starts].astype(np.int64)
    group_counts = np.diff(np.append(group_starts, len(ordered)))
    histogram = (capacity, group_sizes.tobytes(), group_counts.tobytes())
    placed = known.get(histogram) if known is not None else None
    if placed is None:
        placed = _place(group_sizes.tolist(), group_counts.tolist(), capacity)
        if known is not None:
            known.clear()
            known[histogram] = placed
    grouped, per_bin = placed
    return order[grouped], per_bin


def _place(group_sizes: list[int], group_counts: list[int], capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing of items sorted longest first, given as runs of one size (`group_sizes`, each
    `group_counts` long): (the items, as positions in that order, bin after bin; the number in each bin)."""
    bins = np.empty(sum(group_counts), np.int64)  # bin of each item, in sorted order
    rooms: dict[int, list[np.ndarray]] = {}  # room left -> the bins with that room, in the order they got it
    nonempty = 0  # bit c set: some bin has room c

    def put(ids: np.ndarray, room: int) -> None:
        nonlocal nonempty
        if room and len(ids):  # a full bin takes nothing more
            rooms.setdefault(room, []).append(ids)
            nonempty |= 1 << room

    opened = pos = 0
    for size, count in zip(group_sizes, group_counts, strict=True):
        while count:
            above = nonempty >> size
            if not above:  # no bin holds one more: open new ones, each taking `capacity // size`
                each = capacity // size
                new = -(-count // each)
                ids = np.arange(opened, opened + new, dtype=np.int64)
                bins[pos:pos + count] = (ids.repeat(each) if each > 1 else ids)[:count]
                full, left = divmod(count, each)
                put(ids[:full], capacity - each * size)
                if left:
                    put(ids[full:], capacity - left * size)
                opened, pos, count = opened + new, pos + count, 0
                continue
            room = size + (above & -above).bit_length() - 1  # the least room that holds one
            parts = rooms.pop(room)
            nonempty &= ~(1 << room)
            here = parts[0] if len(parts) == 1 else np.concatenate(parts)
            each = room // size
            filled = min(len(here), count // each)
            if filled:
                bins[pos:pos + filled * each] = here[:filled].repeat(each) if each > 1 else here[:filled]
                pos, count = pos + filled * each, count - filled * each
                put(here[:filled], room - each * size)
            rest = here[filled:]
            if count and len(rest):  # fewer left than one bin takes: the next bin takes them all
                bins[pos:pos + count] = rest[0]
                put(rest[:1], room - count * size)
                pos, count, rest = pos + count, 0, rest[1:]
            put(rest, room)
    grouped = np.argsort(bins, kind="stable")  # mostly runs already: new bins are numbered in order
    return grouped, np.bincount(bins, minlength=opened)


class Pieces:
    """The pieces of every document for rows of `seq_len`, from the documents' `ends` (the cumulative token count
    at the end of each, as stored): document d (its tokens + its end-of-text token) is pieces `first[d]` to
    `first[d + 1] - 1`, each `seq_len` positions but the last."""

    def __init__(self, ends: np.ndarray, seq_len: int) -> None:
        self.ends = np.asarray(ends, np.int64)
        self.seq_len = int(seq_len)
        lengths = np.diff(self.ends, prepend=np.int64(0))
        self.first = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum((lengths + seq_len) // seq_len, out=self.first[1:])  # ceil((length + 1) / seq_len) each
        self.cut_documents = int(np.count_nonzero(lengths >= seq_len))  # those cut into several pieces
        self.tokens = int(self.ends[-1]) + len(self.ends) if len(self.ends) else 0  # with end-of-text tokens
        self._sizes: np.ndarray | None = None
        self._documents: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.first[-1])

    @property
    def documents(self) -> int:
        return len(self.ends)

    def length_of(self, docs: np.ndarray) -> np.ndarray:
        """Tokens of documents `docs` (int64)."""
        docs = np.asarray(docs, np.int64)
        return self.ends[docs] - np.where(docs > 0, self.ends[np.maximum(docs - 1, 0)], 0)

    @property
    def sizes(self) -> np.ndarray:
        """Positions each piece takes: `seq_len`, but the last piece of a document takes what is left (made once;
        uint16 when seq_len fits)."""
        if self._sizes is None:
            sizes = np.full(len(self), self.seq_len, np.uint16 if self.seq_len < 1 << 16 else np.int64)
            last = self.first[1:] - 1
            lengths = np.diff(self.ends, prepend=np.int64(0))
            sizes[last] = lengths + 1 - (last - self.first[:-1]) * self.seq_len
            self._sizes = sizes
        return self._sizes

    @property
    def document_of(self) -> np.ndarray:
        """The document of each piece (made once; int32 when it fits): a gather where `locate` searches."""
        if self._documents is None:
            dtype = np.int32 if len(self.ends) < 1 << 31 else np.int64
            self._documents = np.repeat(np.arange(len(self.ends), dtype=dtype), np.diff(self.first))
        return self._documents

    def locate(self, pieces: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(document, first position in the document's tokens + end-of-text, positions) of each piece."""
        pieces = np.asarray(pieces, np.int64)
        docs = np.searchsorted(self.first, pieces, side="right") - 1
        start = (pieces - self.first[docs]) * self.seq_len
        return docs, start, np.minimum(self.seq_len, self.length_of(docs) + 1 - start)


@dataclass(frozen=True)
class RowPlan:
    """One epoch's rows: the r-th row of the epoch is planned row `order[r]`, which holds pieces
    `pieces[offsets[k]:offsets[k + 1]]` (k = order[r]), in that order."""

    pieces: np.ndarray
    offsets: np.ndarray
    order: np.ndarray
    seq_len: int
    tokens: int  # positions that hold a token (documents + end-of-text tokens), all rows together

    def __len__(self) -> int:
        return len(self.order)

    @property
    def padding(self) -> float:
        """The fraction of the epoch's positions that are padding."""
        return 1 - self.tokens / (len(self) * self.seq_len) if len(self) else 0.0

    def rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the pieces of the epoch's rows `rows`, one row after the other; the row of each, as a position in
        `rows`)."""
        pieces, row_of, _ = self.members(rows)
        return pieces, row_of

    def members(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`rows(rows)`, and where each row's first piece is among them."""
        planned = self.order[np.asarray(rows, np.int64)]
        starts = self.offsets[planned]
        counts = self.offsets[planned + 1] - starts
        first = np.cumsum(counts) - counts
        row_of = np.repeat(np.arange(len(planned)), counts)
        return self.pieces[np.repeat(starts - first, counts) + np.arange(len(row_of))], row_of, first


def plan_rows(pieces: Pieces, seed: int, epoch: int, shuffle: bool, window: int = DEFAULT_WINDOW,
              known: dict | None = None) -> RowPlan:
    """The rows of `epoch`: the pieces in an order drawn from (seed, epoch) (source order unshuffled), best-fit
    decreasing in windows of `window` pieces, the rows shuffled from (seed, epoch) (unshuffled: window after
    window, in the order they were opened). `known`: `best_fit`'s, kept from epoch to epoch (a corpus of one window
    is placed once)."""
    sizes = pieces.sizes
    order = epoch_order(len(sizes), seed, epoch, shuffle)
    members, counts = [], []
    for at in range(0, len(order), window):
        here = order[at:at + window]
        grouped, per_bin = best_fit(sizes[here], pieces.seq_len, known)
        members.append(here[grouped])
        counts.append(per_bin)
    row_sizes = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    offsets = np.zeros(len(row_sizes) + 1, np.int64)
    np.cumsum(row_sizes, out=offsets[1:])
    rows = len(row_sizes)
    row_order = (np.random.default_rng((seed, epoch, _TAG)).permutation(rows) if shuffle
                 else np.arange(rows, dtype=np.int64))
    return RowPlan(np.concatenate(members) if members else np.zeros(0, np.int64), offsets, row_order,
                   pieces.seq_len, pieces.tokens)


class RowPlanner:
    """The row plans of a dataset's epochs (`plan_rows`), the latest one kept, and every planned epoch's number of
    rows (what `len()` and resuming ask for)."""

    def __init__(self, pieces: Pieces, seed: int, shuffle: bool, window: int = DEFAULT_WINDOW) -> None:
        self.pieces, self.seed, self.shuffle, self.window = pieces, seed, shuffle, window
        self._latest: tuple[int, RowPlan] | None = None
        self._rows: dict[int, int] = {}
        self._known: dict = {}  # best_fit's latest placement: the next epoch's, when the corpus is one window

    def plan(self, epoch: int) -> RowPlan:
        if self._latest is None or self._latest[0] != epoch:
            plan = plan_rows(self.pieces, self.seed, epoch, self.shuffle, self.window, self._known)
            self._latest, self._rows[epoch] = (epoch, plan), len(plan)
        return self._latest[1]

    def rows(self, epoch: int) -> int:
        """Rows of `epoch` (planned when it was not yet)."""
        found = self._rows.get(epoch)
        return len(self.plan(epoch)) if found is None else found

    @property
    def least_rows(self) -> int:
        """A lower bound of any epoch's number of rows: the pieces' positions in whole rows."""
        return -(-self.pieces.tokens // self.pieces.seq_len)


class PlannedBatchSampler(EpochBatchSampler):
    """Batches of an epoch's planned rows (`RowPlanner`): the plan's rows are already in the epoch's order, so
    each rank takes every world_size-th of them (padded or cut, per `uneven`) as EpochBatchSampler does, and an
    epoch resumes on another world size from its position. The number of rows, hence of batches, is the
    epoch's own."""

    def __init__(self, planner: RowPlanner, batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                 rank: int = 0, world_size: int = 1, uneven: str = "pad") -> None:
        super().__init__(planner.least_rows, batch_size, shuffle, seed, drop_last, rank, world_size, uneven)
        self.planner = planner

    def rank_indices_for(self, epoch: int, start: int) -> np.ndarray:
        order = np.arange(self.planner.rows(epoch), dtype=np.int64)
        return interleaved_part(order, self.rank, self.world_size, self.uneven, start)

    def pass_length(self, start: int, epoch: int | None = None) -> int:
        rows = self.planner.rows(self.epoch if epoch is None else epoch)
        return num_batches(rank_count(rows - start, self.world_size, self.uneven), self.batch_size, self.drop_last)
