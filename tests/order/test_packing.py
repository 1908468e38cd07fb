"""Best-fit packing plans (fastdata.order.packing): the class-wise best-fit decreasing is exactly best-fit decreasing
(a one-item-at-a-time reference), every document's pieces are planned once per epoch with no document shorter than
a row cut, the plan is a function of (seed, epoch) alone, its padding is low, and the planned batches split evenly
over ranks."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata.order.packing import Pieces, PlannedBatchSampler, RowPlanner, best_fit, plan_rows


def reference_best_fit(sizes: list[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing one item at a time: longest first (ties: input order), each into the bin with the least
    room that holds it (ties: the bin that reached that room first), else a new bin. The bins' items, by bin."""
    rooms: list[int] = []
    reached: list[int] = []
    bins: list[list[int]] = []
    for step, item in enumerate(sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))):
        fits = [b for b, room in enumerate(rooms) if room >= sizes[item]]
        if fits:
            best = min(fits, key=lambda b: (rooms[b], reached[b]))
            rooms[best] -= sizes[item]
            reached[best] = step
            bins[best].append(item)
        else:
            rooms.append(capacity - sizes[item])
            reached.append(step)
            bins.append([item])
    return bins


def test_best_fit_is_best_fit_decreasing_bin_for_bin():
    rng = np.random.default_rng(0)
    for _ in range(300):
        capacity = int(rng.integers(1, 50))
        sizes = rng.integers(1, capacity + 1, int(rng.integers(0, 80)))
        members, counts = best_fit(sizes, capacity)
        bins = np.split(members, np.cumsum(counts)[:-1]) if len(counts) else []
        assert [sorted(b.tolist()) for b in bins] == [sorted(b) for b in reference_best_fit(sizes.tolist(), capacity)]
        assert all(sizes[b].sum() <= capacity for b in bins)


def test_best_fit_refuses_items_that_do_not_fit():
    with pytest.raises(ValueError, match=r"1\.\.8"):
        best_fit(np.array([3, 9]), 8)


def ends_of(lengths) -> np.ndarray:
    return np.cumsum(np.asarray(lengths, np.int64))


@pytest.mark.parametrize("seq_len", [1, 7, 64])
def test_pieces_cover_every_document_and_cut_only_those_a_row_cannot_hold(seq_len):
    lengths = np.array([0, 1, 5, 6, 7, 8, 13, 14, 200, 63, 64, 65])
    pieces = Pieces(ends_of(lengths), seq_len)
    docs, start, size = pieces.locate(np.arange(len(pieces)))
    for doc, length in enumerate(lengths):
        mine = docs == doc
        covered = np.concatenate([np.arange(s, s + n) for s, n in zip(start[mine], size[mine], strict=True)])
        assert covered.tolist() == list(range(length + 1))  # its tokens and its end-of-text token, once, in order
        assert mine.sum() == (1 if length < seq_len else -(-(length + 1) // seq_len))
    assert pieces.cut_documents == int((lengths >= seq_len).sum())
    assert pieces.sizes.tolist() == size.tolist() and pieces.tokens == int(lengths.sum()) + len(lengths)


def test_a_plan_holds_every_piece_once_in_rows_that_fit():
    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 300, 5000)
    pieces = Pieces(ends_of(lengths), 128)
    plan = plan_rows(pieces, seed=3, epoch=0, shuffle=True, window=1000)
    members, row_of = plan.rows(np.arange(len(plan)))
    assert sorted(members.tolist()) == list(range(len(pieces)))
    used = np.bincount(row_of, weights=pieces.sizes[members].astype(np.int64))
    assert used.max() <= 128 and (used > 0).all()
    assert plan.padding == pytest.approx(1 - used.sum() / (len(plan) * 128))


def test_the_plan_is_a_function_of_seed_and_epoch():
    lengths = np.random.default_rng(2).integers(0, 100, 3000)
    pieces = Pieces(ends_of(lengths), 64)

    def rows(seed, epoch, shuffle=True):
        plan = plan_rows(pieces, seed, epoch, shuffle, window=500)
        members, row_of = plan.rows(np.arange(len(plan)))
        return [tuple(members[row_of == r]) for r in range(len(plan))]

    assert rows(0, 0) == rows(0, 0)
    assert rows(0, 0) != rows(0, 1) and rows(0, 0) != rows(1, 0)
    assert rows(0, 0, False) == rows(0, 1, False)  # unshuffled: every epoch the same rows, in the same order


def test_padding_is_low_on_a_long_tailed_corpus():
    """seq_len 1024 over 200k documents of log-normal length (median ~245 tokens, a long tail): next-fit in source
    order pads a lot, best-fit decreasing almost nothing (a deterministic figure)."""
    lengths = np.random.default_rng(0).lognormal(5.5, 1.0, 200_000).astype(np.int64)
    pieces = Pieces(ends_of(lengths), 1024)
    plan = plan_rows(pieces, seed=0, epoch=0, shuffle=True)
    assert plan.padding <= 0.02
    rows, room = 0, 0  # next-fit: a piece that does not fit in the open row opens the next one
    for size in pieces.sizes.tolist():
        if size > room:
            rows, room = rows + 1, 1024
        room -= size
    assert 1 - pieces.tokens / (rows * 1024) > 5 * plan.padding


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_planned_batches_split_evenly_over_ranks(uneven):
    lengths = np.random.default_rng(4).integers(0, 90, 400)
    planner = RowPlanner(Pieces(ends_of(lengths), 32), seed=5, shuffle=True, window=100)
    rows = planner.rows(0)
    parts = []
    for rank in range(3):
        sampler = PlannedBatchSampler(planner, 4, True, 5, False, rank=rank, world_size=3, uneven=uneven)
        batches = [b for _, b in sampler]
        assert len(batches) == len(sampler) == sampler.pass_length(0, 0)
        parts.append(np.concatenate(batches))
    assert len({len(p) for p in parts}) == 1
    together = np.concatenate(parts)
    if uneven == "pad":
        assert set(together.tolist()) == set(range(rows)) and len(together) - rows < 3
    else:
        assert len(set(together.tolist())) == len(together) == rows - rows % 3


def test_each_epoch_has_its_own_number_of_rows_and_batches():
    lengths = np.random.default_rng(6).integers(0, 60, 300)
    planner = RowPlanner(Pieces(ends_of(lengths), 64), seed=0, shuffle=True, window=50)
    sampler = PlannedBatchSampler(planner, 3, True, 0, False)
    counts = []
    for epoch in range(6):
        sampler.epoch = epoch
        counts.append(planner.rows(epoch))
        assert sum(1 for _ in sampler) == sampler.pass_length(0, epoch) == -(-counts[-1] // 3)
    assert len(set(counts)) > 1 and min(counts) >= planner.least_rows
