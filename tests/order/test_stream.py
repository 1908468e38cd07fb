"""fastdata.order.stream: the shard-stream plan of an epoch is a pure function: the ranks together cover the epoch,
shuffling stays inside windows, and the batches of a worker split never depend on the number of workers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fastdata.order.stream import StreamPlanner, window_order


def test_window_order_shuffles_inside_windows_only():
    order = window_order(100, seed=1, epoch=2, shuffle=True, window=16)
    assert sorted(order.tolist()) == list(range(100))
    for start in range(0, 100, 16):
        assert sorted(order[start:start + 16].tolist()) == list(range(start, min(start + 16, 100)))
    assert order.tolist() != list(range(100))
    assert np.array_equal(order, window_order(100, 1, 2, True, 16))
    assert not np.array_equal(order, window_order(100, 1, 3, True, 16))
    assert window_order(100, 1, 2, False, 16).tolist() == list(range(100))


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_stream_plan_covers_the_epoch_and_workers_only_split_it(world_size):
    counts = [11, 0, 12, 5]  # fewer shards than ranks x workers, one empty
    plans = [StreamPlanner(counts, batch_size=4, shuffle=True, seed=2, drop_last=False, rank=r,
                           world_size=world_size, window=8).plan(epoch=1) for r in range(world_size)]
    positions = Counter(int(p) for plan in plans for batch in plan.batches for p in batch)
    assert set(positions) == set(range(sum(counts)))
    assert {len(plan.batches) for plan in plans} == {StreamPlanner(counts, batch_size=4, shuffle=True, seed=2,
                                                                   drop_last=False, world_size=world_size
                                                                   ).num_batches()}
    plan = plans[0]
    slots, offsets = plan.locate(np.arange(sum(counts)))
    for slot, offset in zip(slots, offsets, strict=True):
        assert 0 <= offset < counts[int(plan.shard_order[slot])]
    for workers in (1, 2, 3, 5):
        for skip in (0, 1, 3):
            dealt = sorted((n, b.tolist()) for w in range(workers) for n, b in plan.worker_batches(skip, w, workers))
            assert dealt == [(n, b.tolist()) for n, b in enumerate(plan.batches)][skip:]
