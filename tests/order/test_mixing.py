"""The mixing schedule as pure functions: every window of the stream holds each source's share, rounded; the epoch
rules ("first" / "last" source to run out, samples_per_epoch; "cycle" / "stop"); each source drawn without
repeats within a cycle; a weight of 0; the batch-window rank split (equal batches, a prefix of the stream)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata.errors import ConfigError
from fastdata.order.mixing import MixedBatchSampler, MixPlan, check_weights, mixed_epoch, mixed_part


def window_counts(sources: np.ndarray, source: int, m: int) -> np.ndarray:
    """How many of the slots of every window of `m` consecutive slots come from `source`."""
    cumulative = np.concatenate([[0], np.cumsum(sources == source)])
    return cumulative[m:] - cumulative[:-m]


@pytest.mark.parametrize("weights", [[0.7, 0.3], [2, 1], [0.55, 0.45], [0.123, 0.877], [1, 9]])
def test_two_sources_every_window_holds_the_share_exactly_rounded(weights):
    plan = MixPlan.make([10**6, 10**6], weights, length=1500)
    sources = mixed_epoch(plan, seed=3, epoch=0, shuffle=False, batch_size=8).sources
    share = weights[0] / sum(weights)
    for m in range(1, 301):
        counts = window_counts(sources, 0, m)
        assert counts.min() >= np.floor(share * m - 1e-9) and counts.max() <= np.ceil(share * m + 1e-9), m


def test_two_sources_batches_and_runs_of_batches_hold_the_share_after_the_in_batch_shuffle():
    batch = 10
    plan = MixPlan.make([10**6, 10**6], [0.7, 0.3], length=2000)
    stream = mixed_epoch(plan, seed=5, epoch=2, shuffle=True, batch_size=batch)
    per_batch = (stream.sources.reshape(-1, batch) == 0).sum(axis=1)
    assert set(per_batch.tolist()) == {7}
    for n in range(1, 20):  # every window of n whole batches
        runs = np.convolve(per_batch, np.ones(n, dtype=int), mode="valid")
        assert set(runs.tolist()) == {7 * n}


def test_more_sources_stay_within_two_of_their_share_and_within_one_from_the_epoch_start():
    weights = [0.5, 0.3, 0.15, 0.05]
    plan = MixPlan.make([10**6] * 4, weights, length=3000)
    sources = mixed_epoch(plan, seed=0, epoch=0, shuffle=False, batch_size=8).sources
    for source, w in enumerate(weights):
        prefix = np.cumsum(sources == source)
        assert np.abs(prefix - w * np.arange(1, len(sources) + 1)).max() < 1.01
        for m in (1, 7, 20, 64, 300):
            assert np.abs(window_counts(sources, source, m) - w * m).max() < 2


def test_weights_are_exact_integer_ratios():
    assert check_weights([0.7, 0.3], 2) == (7, 3)
    assert check_weights([2, 1, 1], 3) == (2, 1, 1)
    assert check_weights(None, 3) == (1, 1, 1)
    assert check_weights([1, 0], 2) == (1, 0)
    parts = check_weights([0.1234567, 1.0], 2)
    assert abs(parts[0] / sum(parts) - 0.1234567 / 1.1234567) < 1e-6


@pytest.mark.parametrize("weights, message", [([1], "1 number for 2 datasets"), ([0, 0], "not all 0"),
                                              ([1, -1], "at least 0"), ("ab", "a list of numbers"),
                                              ([1, "2"], "must be a number")])
def test_bad_weights_are_refused(weights, message):
    with pytest.raises(ConfigError, match=message):
        MixPlan.make([5, 5], weights)


def test_bad_epoch_options_are_refused():
    with pytest.raises(ConfigError, match="epoch_end must be one of"):
        MixPlan.make([5, 5], end="middle")
    with pytest.raises(ConfigError, match="exhausted must be one of"):
        MixPlan.make([5, 5], exhausted="never")
    with pytest.raises(ConfigError, match="samples_per_epoch must be at least 1"):
        MixPlan.make([5, 5], length=0)
    with pytest.raises(ConfigError, match="dataset 1 of the mixture has no samples"):
        MixPlan.make([5, 0])


def per_source(plan: MixPlan, stream) -> list[np.ndarray]:
    """Each source's samples (its own indices) in the order they were drawn from it (within a batch the stream
    is shuffled)."""
    out = []
    for i, offset in enumerate(plan.offsets[:-1]):
        mine = stream.sources == i
        out.append(stream.indices[mine][np.argsort(stream.draws[mine], kind="stable")] - offset)
    return out


def test_epoch_ends_when_the_first_source_runs_out():
    plan = MixPlan.make([100, 13], [0.5, 0.5])
    stream = mixed_epoch(plan, seed=1, epoch=0, shuffle=True, batch_size=4)
    big, small = per_source(plan, stream)
    assert sorted(small.tolist()) == list(range(13))  # the first to run out: every sample once
    assert len(big) == 13 and len(set(big.tolist())) == 13  # the other: its share, no repeat
    assert len(stream.indices) == plan.epoch_length() == 26


def test_epoch_ends_when_the_last_source_runs_out_the_others_cycling():
    plan = MixPlan.make([100, 13], [0.5, 0.5], end="last", exhausted="cycle")
    stream = mixed_epoch(plan, seed=1, epoch=0, shuffle=True, batch_size=4)
    big, small = per_source(plan, stream)
    assert sorted(big.tolist()) == list(range(100))
    assert len(small) == 100
    cycles = [small[c * 13:(c + 1) * 13] for c in range(len(small) // 13)]
    assert all(sorted(c.tolist()) == list(range(13)) for c in cycles)  # each cycle: every sample once
    assert not all(np.array_equal(cycles[0], c) for c in cycles[1:])  # reshuffled each cycle
    assert stream.consumed(len(stream.indices), plan.sizes) == [{"consumed": 100, "cycle": 1},
                                                               {"consumed": 100, "cycle": 7}]


def test_stop_drops_an_exhausted_source_and_renormalises_the_rest():
    plan = MixPlan.make([100, 13, 50], [0.4, 0.4, 0.2], end="last", exhausted="stop")
    stream = mixed_epoch(plan, seed=2, epoch=0, shuffle=False, batch_size=4)
    for size, samples in zip(plan.sizes, per_source(plan, stream), strict=True):
        assert sorted(samples.tolist()) == list(range(size))  # every sample of every source exactly once
    after = stream.sources[np.flatnonzero(stream.sources == 1)[-1] + 1:]  # once source 1 has stopped
    remaining = after[:np.flatnonzero(after == 2)[-1]]  # while sources 0 and 2 both run
    assert abs((remaining == 0).mean() - 2 / 3) < 0.02


def test_samples_per_epoch_fixes_the_length_cycle_and_stop():
    cycle = MixPlan.make([7, 5], [0.5, 0.5], length=40)
    stream = mixed_epoch(cycle, seed=0, epoch=0, shuffle=True, batch_size=8)
    assert len(stream.indices) == 40 and np.bincount(stream.sources).tolist() == [20, 20]
    stop = MixPlan.make([7, 5], [0.5, 0.5], length=40, exhausted="stop")
    assert stop.epoch_length() == 12  # everything once: the stream ran dry before 40


def test_a_weight_of_zero_never_appears_nor_ends_the_epoch():
    plan = MixPlan.make([3, 20], [0, 1])
    stream = mixed_epoch(plan, seed=0, epoch=0, shuffle=True, batch_size=8)
    assert (stream.sources == 1).all() and sorted(stream.indices.tolist()) == list(range(3, 23))


def test_the_schedule_is_a_function_of_seed_and_epoch():
    plan = MixPlan.make([30, 20], [0.6, 0.4], end="last")
    one, again = (mixed_epoch(plan, 4, 1, True, 8) for _ in range(2))
    assert np.array_equal(one.indices, again.indices)
    assert not np.array_equal(one.indices, mixed_epoch(plan, 4, 2, True, 8).indices)
    assert not np.array_equal(one.indices, mixed_epoch(plan, 5, 1, True, 8).indices)
    assert np.array_equal(np.sort(one.sources.reshape(-1)), np.sort(mixed_epoch(plan, 4, 2, True, 8).sources))


@pytest.mark.parametrize("uneven", ["pad", "drop"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_gets_as_many_batches_and_whole_windows_of_the_stream(world_size, uneven):
    plan = MixPlan.make([50, 23], [0.7, 0.3], end="last")
    samplers = [MixedBatchSampler(plan, 10, True, 0, False, rank, world_size, uneven) for rank in range(world_size)]
    batches = [[b for _e, b in s] for s in samplers]
    assert len({len(b) for b in batches}) == 1 and all(len(b) == len(s) for b, s in zip(batches, samplers,
                                                                                         strict=True))
    stream = samplers[0].stream().indices
    full_rounds = len(stream) // (10 * world_size)
    for b in range(full_rounds):  # batch b of rank r is window b * world_size + r of the stream
        for rank in range(world_size):
            window = stream[(b * world_size + rank) * 10:(b * world_size + rank + 1) * 10]
            assert np.array_equal(batches[rank][b], window)
    taken = np.concatenate([np.concatenate(b) for b in batches])
    if uneven == "drop":  # the stream less its last len % world_size slots, each taken once
        assert sorted(taken.tolist()) == sorted(stream[:len(stream) - len(stream) % world_size].tolist())
    else:  # all of it, and the padding repeats the stream's first slots
        padding = -len(stream) % world_size
        assert sorted(taken.tolist()) == sorted(np.concatenate([stream, stream[:padding]]).tolist())


def test_ranks_together_have_taken_a_prefix_so_an_epoch_resumes_on_another_world_size():
    order = np.arange(103)
    two = [mixed_part(order, r, 2, "pad", 8) for r in range(2)]
    done = 3  # batches each
    taken = np.concatenate([p[:done * 8] for p in two])
    assert sorted(taken.tolist()) == list(range(done * 8 * 2))
    rest = [mixed_part(order, r, 3, "pad", 8, start=done * 8 * 2) for r in range(3)]
    assert len({len(p) for p in rest}) == 1
    assert sorted(np.concatenate(rest).tolist()) == [0, 1, *range(done * 16, 103)]  # padded from the start
