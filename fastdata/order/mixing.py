"""Weighted mixing of several datasets: which source every slot of an epoch's sample stream takes, and which of
that source's samples, as pure functions of (weights, sizes, seed, epoch), no IO.

The schedule. Source i (weight w_i, normalised to sum 1) emits its k-th sample at virtual time (k + 1/2) / w_i;
the epoch's stream is every emission in time order (ties: lower source first), the weights taken as exact
ratios of integers so that ties are exact. This is the Sainte-Laguë / Webster apportionment as a sequence: with
two sources every window of m consecutive slots holds floor(w_i * m) or ceil(w_i * m) of source i (the in-batch
shuffle keeps this for every batch and run of batches); with more, each source stays within about one of
w_i * t over the first t slots and about two in any window (measured: 1.3 and 2.4 at most for six sources).
The shares do not drift over the epoch. The k-th sample of source i is element k mod n_i of its permutation
for cycle k // n_i, drawn from (seed, epoch, i): each epoch, and each time round a source, a fresh order.
A weight of 0 never emits: that source is never read and never ends an epoch.

How long an epoch is (`length` = samples_per_epoch; else `end`):
- `length=N`: N slots (fewer with `exhausted="stop"` when every source has run out before).
- `end="first"`: the stream stops when the first source (of weight > 0) has given every sample once.
- `end="last"`: it stops when the last one has; the others run out before it and are then, per `exhausted`,
  "cycle"d (a fresh permutation, from the same epoch, the next cycle) or "stop"ped (they emit no more, so the
  other sources share their slots: the remaining weights renormalised).

Rank split (`mixed_part`): the stream is cut in batches of `batch_size` consecutive slots; rank r of W takes
batch r of every W, so that each rank's batch is one such window, and all ranks together have always taken a
prefix of the stream (an epoch can resume on another world size). With `shuffle` and two sources or more, the
order inside each window is shuffled from (seed, epoch), so that a batch's position does not tell its source.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np

from fastdata.config import check_int, check_number
from fastdata.errors import ConfigError, ResumeError
from fastdata.order.ranks import check_not_empty, check_uneven, make_even
from fastdata.order.samplers import EpochBatchSampler

EPOCH_ENDS = ("first", "last")
EXHAUSTED = ("cycle", "stop")
PARTS = 10**6  # weights are exact ratios of integer parts summing to at most this
#: "mix": the random streams of the schedule are (seed, epoch, _TAG, 0) for the in-batch shuffle and (seed, epoch,
#: _TAG, 1 + i) for source i, apart from the augmentation's (seed, epoch, sample index)
_TAG = 0x6D6978


def check_weights(weights: Sequence[float] | None, count: int) -> tuple[int, ...]:
    """The weights as integer parts (None: equal): exact ratios (0.7 and 0.3 give 7 and 3) when their common
    denominator keeps the parts' sum at most PARTS, else rounded to parts of PARTS (largest remainders). Integer
    parts are what make the schedule's ties, hence its rounding, exact. ConfigError saying what is wrong."""
    if weights is None:
        return (1,) * count
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ConfigError(f"weights must be a list of numbers, one per dataset, got {weights!r}")
    if len(weights) != count:
        raise ConfigError(f"weights has {len(weights)} number{'s' * (len(weights) != 1)} for {count} "
                          f"dataset{'s' * (count != 1)}; give one per dataset")
    values = [check_number("weights", w, minimum=0) for w in weights]
    if not all(math.isfinite(v) for v in values) or sum(values) <= 0:
        raise ConfigError(f"weights must be finite and not all 0, got {list(weights)!r}")
    fractions = [Fraction(v).limit_denominator(PARTS) for v in values]
    common = math.lcm(*(f.denominator for f in fractions))
    parts = [int(f * common) for f in fractions]
    divisor = math.gcd(*parts)
    parts = [p // divisor for p in parts]
    total, given = sum(parts), sum(values)
    if total <= PARTS and all(abs(p / total - v / given) < 1e-9 for p, v in zip(parts, values, strict=True)):
        return tuple(parts)
    exact = np.asarray(values, dtype=np.float64) / sum(values) * PARTS
    rounded = np.floor(exact).astype(np.int64)
    rest = np.argsort(-(exact - rounded), kind="stable")[:PARTS - int(rounded.sum())]
    rounded[rest] += 1
    return tuple(int(p) for p in rounded)


def check_epoch_rule(samples_per_epoch: int | None, epoch_end: str, exhausted: str) -> int | None:
    """A mixture's epoch options checked (ConfigError naming the one that is wrong): `samples_per_epoch` None or
    an int of at least 1 (returned), `epoch_end` one of EPOCH_ENDS, `exhausted` one of EXHAUSTED."""
    if epoch_end not in EPOCH_ENDS:
        raise ConfigError(f"epoch_end must be one of {EPOCH_ENDS}, got {epoch_end!r}")
    if exhausted not in EXHAUSTED:
        raise ConfigError(f"exhausted must be one of {EXHAUSTED}, got {exhausted!r}")
    return None if samples_per_epoch is None else check_int("samples_per_epoch", samples_per_epoch, minimum=1)


@dataclass(frozen=True)
class MixPlan:
    """What fixes a mixture's schedule besides (seed, epoch): the sources' sizes and weights (integer parts), and the
    epoch's length: `length` slots (samples_per_epoch), else `end` ("first" / "last" source to run out);
    `exhausted` ("cycle" / "stop") for sources that run out before the epoch ends."""

    sizes: tuple[int, ...]
    parts: tuple[int, ...]
    length: int | None = None
    end: str = "first"
    exhausted: str = "cycle"

    @classmethod
    def make(cls, sizes: Sequence[int], weights: Sequence[float] | None = None, length: int | None = None,
             end: str = "first", exhausted: str = "cycle", paths: Sequence[str] | None = None) -> MixPlan:
        """A checked plan (ConfigError naming the option that is wrong; `paths` name the sources in it)."""
        length = check_epoch_rule(length, end, exhausted)
        sizes = tuple(check_int("dataset size", n, minimum=0) for n in sizes)
        if not sizes:
            raise ConfigError("mixing needs at least one dataset")
        parts = check_weights(weights, len(sizes))
        empty = [i for i, n in enumerate(sizes) if n == 0 and parts[i] > 0]
        if empty:
            which = paths[empty[0]] if paths else f"dataset {empty[0]} of the mixture"
            raise ConfigError(f"{which} has no samples (with these options) but a weight above 0; give it weight 0 "
                              "or leave it out")
        return cls(sizes, parts, length, end, exhausted)

    @property
    def weights(self) -> np.ndarray:
        """The weights normalised to sum 1."""
        return np.asarray(self.parts, dtype=np.float64) / sum(self.parts)

    @property
    def active(self) -> np.ndarray:
        """The sources of weight > 0."""
        return np.flatnonzero(np.asarray(self.parts) > 0)

    @property
    def offsets(self) -> np.ndarray:
        """Where each source's samples start in the concatenated index space."""
        return np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)

    def _emission_counts(self) -> tuple[np.ndarray, float]:
        """How many samples each source may emit at most this epoch, and the latest virtual time that counts."""
        w, n = self.weights, np.asarray(self.sizes, dtype=np.int64)
        a = np.asarray(self.parts, dtype=np.float64)
        counts = np.zeros(len(n), dtype=np.int64)
        act = self.active
        if self.length is not None:
            counts[act] = np.ceil(w[act] * (self.length + len(n))).astype(np.int64) + 2
            if self.exhausted == "stop":
                counts = np.minimum(counts, n)
            return counts, math.inf
        last_times = (2 * n[act] - 1) / a[act]  # emission times, as sources_and_draws computes them
        horizon = float(last_times.min() if self.end == "first" else last_times.max())
        counts[act] = np.floor((a[act] * horizon + 1) / 2).astype(np.int64) + 1
        if self.end == "first" or self.exhausted == "stop":
            counts = np.minimum(counts, n)
        return counts, horizon

    def sources_and_draws(self) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's stream before any shuffle: per slot its source, and which of that source's draws it is
        (0, 1, ... : draw k is element k % n of the source's permutation for cycle k // n). Same every epoch,
        so computed once (read-only arrays)."""
        return self._stream

    @cached_property
    def _stream(self) -> tuple[np.ndarray, np.ndarray]:
        counts, horizon = self._emission_counts()
        times, sources, draws = [], [], []
        for i in self.active:
            k = np.arange(counts[i], dtype=np.int64)
            # (k + 1/2) / w_i, scaled: an exact quotient of integers, so equal times are equal floats
            t = (2 * k + 1) / np.float64(self.parts[i])
            keep = t <= horizon
            times.append(t[keep])
            draws.append(k[keep])
            sources.append(np.full(int(keep.sum()), i, dtype=np.int64))
        time = np.concatenate(times)
        order = np.argsort(time, kind="stable")  # sources were concatenated in index order: ties go to the lower
        if self.length is not None:
            order = order[:self.length]
        stream = np.concatenate(sources)[order], np.concatenate(draws)[order]
        for array in stream:
            array.flags.writeable = False
        return stream

    def epoch_length(self) -> int:
        """Slots (samples, all ranks together) in one epoch of this plan."""
        return len(self.sources_and_draws()[0])


def source_order(size: int, seed: int, epoch: int, source: int, cycles: int, shuffle: bool) -> np.ndarray:
    """Source `source`'s samples for `cycles` passes over it, one after the other: pass c is the permutation
    that sorts row c of the random numbers drawn from (seed, epoch, source) (so a small source cycled many times
    costs one draw), or 0..n-1 each time unshuffled."""
    if not shuffle:
        return np.tile(np.arange(size, dtype=np.int64), cycles)
    keys = np.random.default_rng((seed, epoch, _TAG, 1 + source)).random((cycles, size))
    return np.argsort(keys, axis=1, kind="stable").reshape(-1).astype(np.int64)


@dataclass(frozen=True)
class MixedEpoch:
    """One epoch of a mixture: per slot of its stream the global index (source offset + the source's sample),
    the source, and the source's draw number (how many of that source's samples came before it)."""

    indices: np.ndarray
    sources: np.ndarray
    draws: np.ndarray

    def consumed(self, slots: int, sizes: Sequence[int]) -> list[dict[str, int]]:
        """Per source, what the first `slots` slots took from it: samples drawn (`consumed`) and the passes over
        the source completed (`cycle`: the cycle its next draw belongs to, counted from 0)."""
        counts = np.bincount(self.sources[:slots], minlength=len(sizes))
        return [{"consumed": int(c), "cycle": int(c) // n if n else 0} for c, n in zip(counts, sizes, strict=True)]


def mixed_epoch(plan: MixPlan, seed: int, epoch: int, shuffle: bool, batch_size: int) -> MixedEpoch:
    """The whole stream of one epoch (all ranks together), vectorised: no Python object per sample."""
    sources, draws = plan.sources_and_draws()
    indices = np.empty(len(sources), dtype=np.int64)
    offsets = plan.offsets
    for i in plan.active:
        mine = sources == i
        n = plan.sizes[i]
        k = draws[mine]
        cycles = int(k.max()) // n + 1 if len(k) else 0
        indices[mine] = offsets[i] + source_order(n, seed, epoch, int(i), cycles, shuffle)[k]
    if shuffle and len(plan.active) > 1 and len(sources):
        keys = np.random.default_rng((seed, epoch, _TAG, 0)).random(len(sources))
        whole = len(keys) - len(keys) % batch_size  # each window of batch_size slots reordered by its keys
        heads = np.argsort(keys[:whole].reshape(-1, batch_size), axis=1, kind="stable")
        heads += np.arange(0, whole, batch_size, dtype=np.int64)[:, None]
        order = np.concatenate([heads.reshape(-1), whole + np.argsort(keys[whole:], kind="stable")])
        indices, sources, draws = indices[order], sources[order], draws[order]
    return MixedEpoch(indices, sources, draws)


def mixed_part(order: np.ndarray, rank: int, world_size: int, uneven: str, batch_size: int,
               start: int = 0) -> np.ndarray:
    """Rank `rank`'s samples of an epoch's stream (from `start`): the stream, padded by wrapping or cut to a
    multiple of the world size (`uneven`), is cut into rounds of world_size * batch_size slots, of which rank r
    takes the r-th batch_size; the last, short round is cut in world_size equal parts. Every rank gets the same
    count, each of its batches is one window of the stream, and after b batches each the ranks have together
    taken its first b * batch_size * world_size slots."""
    even = make_even(order, start, world_size, uneven)
    per_round = batch_size * world_size
    rounds = len(even) // per_round
    head = even[:rounds * per_round].reshape(rounds, world_size, batch_size)[:, rank].reshape(-1)
    tail = even[rounds * per_round:]
    share = len(tail) // world_size
    return np.concatenate([head, tail[rank * share:(rank + 1) * share]])


class MixedBatchSampler(EpochBatchSampler):
    """EpochBatchSampler over a mixture: yields `(epoch, global indices)` per batch of this rank's part of the
    epoch (`mixed_part`); `start` / `skip` say where a resumed epoch continues. Runs in the main process; the
    epoch's stream is computed once per epoch (cached)."""

    repartitions = True  # all ranks together always hold a prefix of the stream
    can_roll_over = False  # its epochs are streams of their own (`stream`)

    def __init__(self, plan: MixPlan, batch_size: int, shuffle: bool, seed: int, drop_last: bool,
                 rank: int = 0, world_size: int = 1, uneven: str = "pad") -> None:
        self.plan = plan
        check_not_empty(plan.epoch_length(), world_size, check_uneven(uneven), "the mixture's epoch")  # cached
        super().__init__(plan.epoch_length(), batch_size, shuffle, seed, drop_last, rank, world_size, uneven)
        self._cached: tuple[int, MixedEpoch] | None = None

    def stream(self, epoch: int | None = None) -> MixedEpoch:
        """The whole stream of `epoch` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, mixed_epoch(self.plan, self.seed, epoch, self.shuffle, self.batch_size))
        return self._cached[1]

    def rank_indices_for(self, epoch: int, start: int) -> np.ndarray:
        return mixed_part(self.stream(epoch).indices, self.rank, self.world_size, self.uneven, self.batch_size,
                          start)

    def consumed(self, epoch: int, slots: int) -> list[dict[str, int]]:
        """Per source, what the first `slots` slots of `epoch`'s stream took (see MixedEpoch.consumed)."""
        return self.stream(epoch).consumed(min(slots, self.num_samples), self.plan.sizes)


class MixedResumable:
    """For loaders over a mixture (before ResumableLoader in the bases): the resume config names the mixture
    (its sources' fingerprints, weights and epoch rule), and the state records each source's position at the
    state's place (`positions`: samples consumed this epoch, all ranks together, and the cycle), checked when
    restored."""

    plan: MixPlan
    _sampler: Any

    def _mix_config(self, names: list[str], fingerprints: list[str]) -> dict[str, Any]:
        plan = self.plan
        return {"mix": names, "sources": fingerprints, "weights": list(plan.parts), "sizes": list(plan.sizes),
                "samples_per_epoch": plan.length, "epoch_end": plan.end, "exhausted": plan.exhausted}

    def _positions(self, epoch: int, start: int, done: int, complete: bool) -> list[dict[str, int]]:
        sampler = self._sampler
        slots = sampler.num_samples if complete else start + done * sampler.batch_size * sampler.world_size
        return sampler.consumed(epoch, slots)

    def state_dict(self, pending: int = 0) -> dict[str, Any]:
        state = super().state_dict(pending)  # type: ignore[misc]
        state["positions"] = self._positions(state["epoch"], state["start"], state["batches"], state["complete"])
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)  # type: ignore[misc]
        here = self._next  # type: ignore[attr-defined]
        ours = self._positions(here.epoch, here.start, here.skip, here.complete)
        if state.get("positions") is not None and state["positions"] != ours:
            raise ResumeError(f"the state's per-source positions {state['positions']} are not where this mixture's "
                              f"schedule stands at the same place ({ours}): it was saved by another fastdata "
                              "version's schedule; resume from an epoch boundary with that version")
