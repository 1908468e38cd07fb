"""Exact mid-epoch resume: where a loader stands (epoch, batches yielded), as a small JSON-serialisable,
versioned state, and the checks that refuse to restore it into a loader that would yield other batches.

A loader's order is a pure function of (seed, epoch, rank, world size), so "epoch e, k batches done" is all it
takes to continue exactly: the restored loader starts epoch e at its batch k. A state taken after the last batch
of an epoch stays in that epoch, marked complete: the restored loader's next pass yields nothing more of it, and
the pass after that is the next epoch, which is what the uninterrupted loop would see next whether it counts
epochs itself (`set_epoch(saved_epoch)`) or follows `loader.epoch`. A loop that takes its next batch before it
checkpoints (nanoGPT's) asks for `state_dict(pending=n)`: the state as it stood before the last n batches were
taken, so that the resumed run gives them again. On another world size, an
epoch over a map-style dataset continues from the same position in the epoch's order (ranks together have
taken a prefix of it); where that cannot hold (shard streams, length buckets) the state is refused mid-epoch
and accepted at an epoch boundary.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.config import check_epoch, check_int
from fastdata.errors import ConfigError, ResumeError
from fastdata.formats.manifest import Manifest
from fastdata.order.rank_sampler import RankSampler

STATE_VERSION = 1
STATE_KIND = "fastdata.loader"
#: Passes whose batches `state_dict(pending=...)` can count back over (the one under way and those before it)
PENDING_PASSES = 4


#: Options added to the resume config after the first release of the state format: a state saved without them
#: cannot be checked against them, so they are compared only when the state has them.
CHECKED_WHEN_PRESENT = ("augment", "image_size", "output", "classes")


@dataclass(frozen=True)
class Position:
    """Where a pass starts: `epoch`, from position `start` of the epoch's order, after `skip` batches;
    `complete` when every batch of the epoch has been yielded already (the pass yields nothing)."""

    epoch: int
    start: int = 0
    skip: int = 0
    complete: bool = False


def dataset_fingerprint(manifest: Manifest) -> str:
    """A short id of a dataset's content (its data files' hashes and counts), to refuse another dataset's
    state."""
    files = [[f.name, f.sha256, f.samples] for f in manifest.files]
    return hashlib.sha256(json.dumps([manifest.num_samples, files]).encode()).hexdigest()[:16]


class ResumableLoader:
    """Mixin for loaders: epochs, `set_epoch`, progress counting, `state_dict()` / `load_state_dict()`.

    The loader provides `batch_size`, `num_workers`, `rank`, `world_size`, `_resume_config()` (options that
    must match to resume), `_repartitions` (whether an epoch can continue on another world size),
    `_pass_length(start)` (batches in a pass that begins at `start`), and for `sampler` `_sampling()` (the
    epoch's samples, all ranks together, shuffle, seed, uneven) and `_rank_order(epoch)` (this rank's samples of
    `epoch`, as indices into `loader.dataset`). Its `__iter__` calls `_begin_pass()`, `_count_batch()` before
    yielding each batch, and `_end_pass()` when the epoch is complete."""

    batch_size: int
    num_workers: int
    rank: int
    world_size: int
    _repartitions: bool
    #: As a DataLoader's with `batch_size=None`: the loader makes whole batches itself, so there is no batch
    #: sampler (code that looks for one, e.g. Lightning's checks, then reads `sampler`).
    batch_sampler: None = None
    tuned: Any = None  # set by fastdata.loader(): what "auto" chose (fastdata.loader.tuning.Tuned), or None

    def _init_progress(self) -> None:
        self._next = Position(0)
        self._current: list[int] | None = None  # [epoch, start, batches done] of the pass under way
        self._restored = False  # `_next` came from load_state_dict and no pass has started since
        # the latest passes, each ([epoch, start, batches done], batches done when it began): what
        # `state_dict(pending=...)` counts back over; the last one's list is `_current` while it is under way
        self._passes: list[tuple[list[int], int]] = []

    def _resume_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def _pass_length(self, start: int) -> int:
        raise NotImplementedError

    def _sampling(self) -> tuple[int, bool, int, str]:
        raise NotImplementedError

    def _rank_order(self, epoch: int) -> np.ndarray:
        raise NotImplementedError

    @property
    def sampler(self) -> RankSampler:
        """This rank's part of each epoch, as a DataLoader's DistributedSampler describes it (`len()`: this rank's
        samples per epoch; `set_epoch`; `fastdata.order.rank_sampler.RankSampler`), for code written against a
        DataLoader, such as `len(val_loader.sampler) * world_size < len(val_loader.dataset)`."""
        return RankSampler(self, *self._sampling(), order=self._rank_order)

    @property
    def epoch(self) -> int:
        """The epoch the next pass will yield."""
        return self._next.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass yield epoch `epoch` (as DistributedSampler.set_epoch does). Setting the epoch a
        restored state is in keeps its place in that epoch; setting another one drops the restored place, with a
        warning (the usual cause is a loop that restored its own epoch counter from another checkpoint)."""
        epoch = check_epoch(epoch)
        if self._restored and epoch != self._next.epoch:
            where = self._next
            done = "all its batches" if where.complete else f"{where.skip} batches"
            warnings.warn(f"set_epoch({epoch}) drops the place restored by load_state_dict (epoch {where.epoch}, "
                          f"after {done}): the next pass yields epoch {epoch} from its start. Call "
                          f"set_epoch({where.epoch}) (or follow loader.epoch) to continue where the state was "
                          "taken", stacklevel=2)
        if epoch != self._next.epoch or self._current is not None:
            self._next = Position(epoch)
            self._restored = False
        self._current = None

    def _begin_pass(self) -> Position:
        """Start a pass: where it begins. A `complete` position yields no batch (the loader skips the pass)."""
        here = self._next
        self._next = Position(here.epoch + 1)
        self._current = [here.epoch, here.start, here.skip]
        self._restored = False
        if here.complete:
            self._current[2] = self._pass_length(here.start)
        self._passes = [*self._passes[1 - PENDING_PASSES:], (self._current, self._current[2])]
        return here

    def _count_batch(self) -> None:
        if self._current is not None:
            self._current[2] += 1

    def _end_pass(self) -> None:
        self._current = None

    def state_dict(self, pending: int = 0) -> dict[str, Any]:
        """Where this loader stands: restore it with `load_state_dict` into a new loader over the same dataset
        with the same options (any `num_workers`) to get exactly the batches this one would yield next. Small
        and JSON-serialisable; take it on any rank (all ranks of a DDP job are at the same batch).

        `pending`: how many of the batches this loader has yielded the training has not used yet: a loop that
        takes its next batch before it checkpoints (nanoGPT's `X, Y = get_batch(...)` ahead of the step, or a
        prefetcher that keeps batches in flight) passes the number it holds, and the state is the one before
        those were taken, so that the resumed run yields them again (across the end of an epoch too). At most
        the batches yielded since the loader was made or restored (ConfigError otherwise)."""
        pending = check_int("pending", pending, minimum=0)
        if pending:
            epoch, start, done, complete = self._before(pending)
        elif self._current is not None:
            epoch, start, done = self._current
            complete = done >= self._pass_length(start)  # after the last batch: the epoch stays, marked complete
        else:
            epoch, start, done, complete = self._next.epoch, self._next.start, self._next.skip, self._next.complete
        return {"kind": STATE_KIND, "version": STATE_VERSION, "epoch": epoch, "batches": done, "start": start,
                "complete": complete, "rank": self.rank, "world_size": self.world_size,
                "num_workers": self.num_workers, "config": self._resume_config()}

    def _before(self, pending: int) -> tuple[int, int, int, bool]:
        """(epoch, start, batches done, complete) as they stood `pending` yielded batches ago (`state_dict`)."""
        left = pending
        for progress, began_at in reversed(self._passes):
            epoch, start, done = progress
            taken = done - began_at
            if left <= taken:
                return epoch, start, done - left, False
            left -= taken
        taken = pending - left
        raise ConfigError(f"state_dict(pending={pending}): this loader has yielded {taken} "
                          f"batch{'es' * (taken != 1)} since it was made or restored (over its last "
                          f"{PENDING_PASSES} passes at most), so {pending} cannot be waiting to be trained on")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state` (from `state_dict()`): the next pass yields the rest of its epoch, and later
        passes the epochs after it."""
        if not isinstance(state, Mapping) or state.get("kind") != STATE_KIND:
            raise ResumeError(f"not a fastdata loader state (expected a dict with kind={STATE_KIND!r})")
        if state.get("version") != STATE_VERSION:
            raise ResumeError(f"loader state version {state.get('version')!r} cannot be read by this fastdata "
                              f"(it reads version {STATE_VERSION})")
        try:
            epoch, done, start = int(state["epoch"]), int(state["batches"]), int(state["start"])
            saved_world, config = int(state["world_size"]), dict(state["config"])
            complete = bool(state.get("complete", False))
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"damaged loader state: {exc!r}") from exc
        ours = self._resume_config()
        differences = [f"{key}={config.get(key)!r} in the state, {value!r} here" for key, value in ours.items()
                       if config.get(key) != value and (key in config or key not in CHECKED_WHEN_PRESENT)]
        differences += [f"{key}={value!r} in the state, not set here" for key, value in config.items()
                        if key not in ours]
        if differences:
            raise ResumeError("the loader state was saved from another dataset or with other options, so resuming "
                              f"would not continue the same order: {'; '.join(differences)}")
        if min(epoch, done, start) < 0:
            raise ResumeError(f"damaged loader state: negative position (epoch {epoch}, batches {done})")
        if complete:  # the end of an epoch continues on any world size: nothing of it is left
            self._next = Position(epoch, complete=True)
            self._current, self._restored, self._passes = None, True, []
            return
        if saved_world != self.world_size and (done or start):
            if not self._repartitions:
                raise ResumeError(
                    f"the state was saved in the middle of epoch {epoch} with world_size={saved_world}; this loader "
                    f"has world_size={self.world_size}, and its ranks read contiguous parts of the epoch, so the "
                    "samples left cannot be split again without repeating or dropping some. Resume with "
                    f"world_size={saved_world}, or from a state taken at the end of an epoch")
            start, done = start + done * self.batch_size * saved_world, 0
        self._next = Position(epoch, start, done)
        self._current, self._restored, self._passes = None, True, []
