"""fastdata.order.ranks: the rank split of an epoch is a pure function: every rank gets the same count, and the
ranks together cover the order (padding or dropping only what is documented). Plus the loader's rank arguments."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from builders.images import SOLID_COUNT, sample_id_of

import fastdata
from fastdata.errors import ConfigError
from fastdata.order.ranks import contiguous_part, interleaved_part, rank_count, resolve_world


@pytest.mark.parametrize("split", [interleaved_part, contiguous_part])
@pytest.mark.parametrize("n", [0, 1, 5, 7, 45])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_rank_parts_are_even_and_cover_the_order(split, n, world_size):
    order = np.random.default_rng(n).permutation(n)
    for uneven in ("pad", "drop"):
        parts = [split(order, r, world_size, uneven) for r in range(world_size)]
        assert {len(p) for p in parts} == {rank_count(n, world_size, uneven)}
        taken = Counter(np.concatenate(parts).tolist())
        if uneven == "pad":
            assert set(taken) == set(range(n))
            assert sum(taken.values()) == n + (-n) % world_size  # only the padding repeats
        else:
            assert all(c == 1 for c in taken.values())
            assert len(taken) == n - n % world_size


def test_interleaved_ranks_take_a_prefix_together():
    order = np.random.default_rng(0).permutation(45)
    parts = [interleaved_part(order, r, 4, "pad") for r in range(4)]
    first = sorted(np.concatenate([p[:5] for p in parts]).tolist())
    assert first == sorted(order[:20].tolist())
    rest = np.concatenate([interleaved_part(order, r, 3, "pad", start=20) for r in range(3)]).tolist()
    assert len(rest) == 27 and Counter(rest) == Counter(order[20:].tolist() + order[:2].tolist())  # 2 padding


def test_resolve_world():
    assert resolve_world(None, None) == (0, 1)  # no process group here
    assert resolve_world(2, 3) == (2, 3)
    for rank, world_size, match in [(3, 3, "rank must be"), (0, 0, "world_size"), (1, None, "together")]:
        with pytest.raises(ConfigError, match=match):
            resolve_world(rank, world_size)


def ids_per_rank(path, world_size, **options):
    result = []
    for rank in range(world_size):
        loader = fastdata.loader(path, batch_size=4, augment="val", image_size=16, num_workers=0, seed=5,
                                 rank=rank, world_size=world_size, **options)
        batches = [[sample_id_of(image) for image in images] for images, _ in loader]
        assert len(batches) == len(loader)
        result.append(batches)
    return result


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_explicit_ranks_split_the_epoch(fmt, uneven, solid_lmdb, solid_wds):
    path = solid_lmdb if fmt == "lmdb" else solid_wds
    ranks = ids_per_rank(path, 4, uneven=uneven)
    assert len({len(batches) for batches in ranks}) == 1
    ids = [i for batches in ranks for batch in batches for i in batch]
    if uneven == "pad":
        assert set(ids) == set(range(SOLID_COUNT)) and len(ids) == 48
    else:
        assert len(ids) == len(set(ids)) == 44


def test_drop_that_leaves_ranks_empty_is_refused(solid_wds, solid_lmdb):
    for path in (solid_wds, solid_lmdb):
        with pytest.raises(ConfigError, match="uneven='drop'"):
            fastdata.loader(path, rank=0, world_size=64, uneven="drop", num_workers=0)
    with pytest.raises(ConfigError, match="uneven must be"):
        fastdata.loader(solid_lmdb, uneven="wrap", num_workers=0)
