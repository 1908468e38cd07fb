"""Exact mid-epoch resume: where a loader stands (epoch, batches yielded), as a small JSON-serialisable,
versioned state, and the checks that refuse to restore it into a loader that would yield other batches.

A loader's order is a pure function of (seed, epoch, rank, world size), so "epoch e, k batches done" is all it
takes to continue exactly: the restored loader starts epoch e at its batch k. On another world size, an
epoch over a map-style dataset continues from the same position in the epoch's order (ranks together have
taken a prefix of it); where that cannot hold (shard streams, length buckets) the state is refused mid-epoch
and accepted at an epoch boundary.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastdata.errors import ResumeError
from fastdata.formats.manifest import Manifest

STATE_VERSION = 1
STATE_KIND = "fastdata.loader"


@dataclass(frozen=True)
class Position:
    """Where a pass starts: `epoch`, from position `start` of the epoch's order, after `skip` batches."""

    epoch: int
    start: int = 0
    skip: int = 0


def dataset_fingerprint(manifest: Manifest) -> str:
    """A short id of a dataset's content (its data files' hashes and counts), to refuse another dataset's
    state."""
    files = [[f.name, f.sha256, f.samples] for f in manifest.files]
    return hashlib.sha256(json.dumps([manifest.num_samples, files]).encode()).hexdigest()[:16]


class ResumableLoader:
    """Mixin for loaders: epochs, `set_epoch`, progress counting, `state_dict()` / `load_state_dict()`.

    The loader provides `batch_size`, `num_workers`, `rank`, `world_size`, `_resume_config()` (options that
    must match to resume), `_repartitions` (whether an epoch can continue on another world size) and
    `_pass_length(start)` (batches in a pass that begins at `start`). Its `__iter__` calls `_begin_pass()`,
    `_count_batch()` before yielding each batch, and `_end_pass()` when the epoch is complete."""

    batch_size: int
    num_workers: int
    rank: int
    world_size: int
    _repartitions: bool

    def _init_progress(self) -> None:
        self._next = Position(0)
        self._current: list[int] | None = None  # [epoch, start, batches done] of the pass under way

    def _resume_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def _pass_length(self, start: int) -> int:
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """The epoch the next pass will yield."""
        return self._next.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass yield epoch `epoch` (as DistributedSampler.set_epoch does). Setting the epoch a
        restored state is in keeps its place in that epoch."""
        epoch = int(epoch)
        if epoch != self._next.epoch or self._current is not None:
            self._next = Position(epoch)
        self._current = None

    def _begin_pass(self) -> Position:
        here = self._next
        self._next = Position(here.epoch + 1)
        self._current = [here.epoch, here.start, here.skip]
        return here

    def _count_batch(self) -> None:
        if self._current is not None:
            self._current[2] += 1

    def _end_pass(self) -> None:
        self._current = None

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: restore it with `load_state_dict` into a new loader over the same dataset
        with the same options (any `num_workers`) to get exactly the batches this one would yield next. Small
        and JSON-serialisable; take it on any rank (all ranks of a DDP job are at the same batch)."""
        if self._current is not None:
            epoch, start, done = self._current
            if done >= self._pass_length(start):  # the epoch is complete: the next batch is the next epoch's
                epoch, start, done = epoch + 1, 0, 0
        else:
            epoch, start, done = self._next.epoch, self._next.start, self._next.skip
        return {"kind": STATE_KIND, "version": STATE_VERSION, "epoch": epoch, "batches": done, "start": start,
                "rank": self.rank, "world_size": self.world_size, "num_workers": self.num_workers,
                "config": self._resume_config()}

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
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"damaged loader state: {exc!r}") from exc
        ours = self._resume_config()
        differences = [f"{key}={config.get(key)!r} in the state, {value!r} here" for key, value in ours.items()
                       if config.get(key) != value]
        differences += [f"{key}={value!r} in the state, not set here" for key, value in config.items()
                        if key not in ours]
        if differences:
            raise ResumeError("the loader state was saved from another dataset or with other options, so resuming "
                              f"would not continue the same order: {'; '.join(differences)}")
        if min(epoch, done, start) < 0:
            raise ResumeError(f"damaged loader state: negative position (epoch {epoch}, batches {done})")
        if saved_world != self.world_size and (done or start):
            if not self._repartitions:
                raise ResumeError(
                    f"the state was saved in the middle of epoch {epoch} with world_size={saved_world}; this loader "
                    f"has world_size={self.world_size}, and its ranks read contiguous parts of the epoch, so the "
                    "samples left cannot be split again without repeating or dropping some. Resume with "
                    f"world_size={saved_world}, or from a state taken at the end of an epoch")
            start, done = start + done * self.batch_size * saved_world, 0
        self._next = Position(epoch, start, done)
        self._current = None
