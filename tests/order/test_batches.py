"""An epoch's batches made lazily (`Batches`): the same arrays, lengths and slices as the list of consecutive
batches they replace, with or without the short tail."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata.order.epoch import Batches, split_batches


def as_list(indices: np.ndarray, size: int, drop_last: bool) -> list[list[int]]:
    stop = len(indices) - len(indices) % size if drop_last else len(indices)
    return [indices[i:i + size].tolist() for i in range(0, stop, size)]


@pytest.mark.parametrize("count", [0, 1, 7, 20, 23])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_are_the_list_of_consecutive_batches(count, drop_last):
    indices = np.random.default_rng(count).permutation(count)
    batches, expected = split_batches(indices, 5, drop_last), as_list(indices, 5, drop_last)
    assert isinstance(batches, Batches) and len(batches) == len(expected)
    assert [b.tolist() for b in batches] == expected
    assert [batches[j].tolist() for j in range(-len(expected), len(expected))] == expected * 2
    for skip in range(len(expected) + 2):
        assert [b.tolist() for b in batches[skip:]] == expected[skip:]
    assert [b.tolist() for b in batches[1::2]] == expected[1::2]
    with pytest.raises(IndexError, match=f"batch {len(expected)} out of range"):
        batches[len(expected)]


def test_a_batch_is_a_view_made_when_asked_for():
    indices = np.arange(1_000_000)
    batches = split_batches(indices, 8, False)
    assert len(batches) == 125_000 and np.shares_memory(batches[7], indices)
