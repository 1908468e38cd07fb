"""order: epoch permutations and batch splitting are pure functions of (seed, epoch)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata.order.epoch import epoch_order, num_batches, sample_rng, sample_seed, split_batches


@pytest.mark.parametrize("n", [0, 1, 2, 45, 117])
def test_epoch_order_is_a_permutation(n):
    for seed in range(3):
        for epoch in range(3):
            order = epoch_order(n, seed, epoch, shuffle=True)
            assert order.dtype == np.int64
            assert sorted(order.tolist()) == list(range(n))


def test_epoch_order_is_deterministic_and_changes_with_epoch_and_seed():
    assert np.array_equal(epoch_order(117, 3, 5, True), epoch_order(117, 3, 5, True))
    epochs = [epoch_order(117, 3, e, True).tolist() for e in range(6)]
    assert len({tuple(e) for e in epochs}) == 6
    assert epoch_order(117, 4, 5, True).tolist() != epochs[5]
    assert epochs[0] != list(range(117))


def test_unshuffled_order_is_the_identity():
    for epoch in range(3):
        assert epoch_order(45, 9, epoch, shuffle=False).tolist() == list(range(45))


@pytest.mark.parametrize("drop_last", [False, True])
def test_split_batches_and_num_batches_agree(drop_last):
    for n in range(0, 40):
        indices = np.random.default_rng(n).permutation(n)
        for batch_size in range(1, 11):
            batches = split_batches(indices, batch_size, drop_last)
            assert len(batches) == num_batches(n, batch_size, drop_last), (n, batch_size)
            flat = np.concatenate(batches).tolist() if batches else []
            if drop_last:
                assert all(len(b) == batch_size for b in batches)
                assert flat == indices[: len(batches) * batch_size].tolist()
                assert n - len(flat) < batch_size
            else:
                assert flat == indices.tolist()
                assert all(len(b) == batch_size for b in batches[:-1])
                assert all(1 <= len(b) <= batch_size for b in batches)


def test_num_batches_examples():
    assert num_batches(45, 8, False) == 6
    assert num_batches(45, 8, True) == 5
    assert num_batches(48, 8, False) == num_batches(48, 8, True) == 6
    assert num_batches(7, 8, True) == 0
    assert num_batches(0, 8, False) == 0


def test_sample_rng_and_seed_are_functions_of_seed_epoch_position():
    assert sample_rng(1, 2, 3).random() == sample_rng(1, 2, 3).random()
    assert sample_rng(1, 2, 3).random() != sample_rng(1, 2, 4).random()
    assert sample_rng(1, 2, 3).random() != sample_rng(1, 3, 3).random()
    assert sample_rng(1, 2, 3, 0).random() != sample_rng(1, 2, 0, 3).random()
    seeds = {sample_seed(0, 0, i) for i in range(200)}
    assert len(seeds) == 200
    assert all(0 <= s < 2**32 for s in seeds)
    assert sample_seed(5, 1, 7) == sample_seed(5, 1, 7)
