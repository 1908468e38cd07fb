"""Progressive resizing (FFCV's schedule: low resolution early, higher later): the size each epoch's images are
made at, kept in shared memory so that persistent workers read it with each batch.

A loader holds one `ImageSizes`: a short schedule of (from epoch, size) steps, the first the size the loader was
built with; `loader.set_image_size(size)` adds a step at the next epoch that starts from its beginning. A size is
a function of the epoch, so `state()` / `restore()` carry the schedule in a loader's state, and a state taken
mid-epoch (or before its last `pending` batches: `state_dict(pending=n)`, which may reach back into the epoch
before) restores into a loader built with the original size and yields the batches the uninterrupted run yields.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fastdata.errors import ConfigError, ResumeError
from fastdata.image.geometry import output_size, stable_size

#: steps a schedule keeps: the oldest goes when a new one would not fit (epochs long past: no state reaches them)
CAPACITY = 16


class ImageSizes:
    """The output size per epoch: `built` (height, width) from epoch 0, then each step (from epoch, size).

    Shared memory, read without a lock by the workers: `[version, steps, (from, height, width) * CAPACITY]`; the
    writer makes the version odd while it writes and even again after, and a reader that saw it odd or changed
    reads again (a sequence lock), so no worker reads half a change."""

    def __init__(self, built: tuple[int, int]) -> None:
        self.built = built
        self.cell = torch.zeros(2 + 3 * CAPACITY, dtype=torch.int64).share_memory_()
        self._view: np.ndarray | None = None  # the cell as numpy (read per sample: 1 us, where tolist() takes 50)
        self._write([(0, *built)])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_view": None}

    def _array(self) -> np.ndarray:
        if self._view is None:
            self._view = self.cell.numpy()
        return self._view

    def steps(self) -> list[tuple[int, int, int]]:
        """The schedule: (from epoch, height, width), by epoch."""
        view = self._array()
        while True:
            version = int(view[0])
            count = int(view[1])
            rows = view[2:2 + 3 * count].tolist()
            if version % 2 == 0 and int(view[0]) == version:
                return [(rows[i], rows[i + 1], rows[i + 2]) for i in range(0, len(rows), 3)]

    def _write(self, steps: list[tuple[int, int, int]]) -> None:
        steps = steps[-CAPACITY:]
        view = self._array()
        view[0] += 1  # odd: being written
        view[1] = len(steps)
        view[2:2 + 3 * len(steps)] = [value for step in steps for value in step]
        view[0] += 1

    def size_for(self, epoch: int) -> tuple[int, int]:
        """(height, width) of epoch `epoch`'s images."""
        found = self.built
        for start, height, width in self.steps():
            if start > epoch:
                break
            found = (height, width)
        return found

    def set(self, size: Any, from_epoch: int) -> bool:
        """Make epochs from `from_epoch` on `size` (a side or (height, width)); True when any epoch's size
        changed."""
        wanted = output_size(size)
        before = self.steps()
        steps = [step for step in before if step[0] < from_epoch]
        if not steps or (steps[-1][1], steps[-1][2]) != wanted:
            steps.append((from_epoch, *wanted))
        if steps == before:
            return False
        self._write(steps)
        return True

    def state(self) -> list[list[int]]:
        """The schedule as a loader state carries it (JSON): [from epoch, height, width] per step."""
        return [list(step) for step in self.steps()]

    def parse(self, state: Any) -> list[tuple[int, int, int]]:
        """The schedule of a loader state, checked, for `apply` (None: a state without one, taken at the size the
        loader was built with)."""
        if state is None:
            return [(0, *self.built)]
        try:
            steps = [(int(start), *output_size(tuple(int(v) for v in size))) for start, *size in state]
            if not steps or any(b[0] <= a[0] for a, b in itertools.pairwise(steps)) or steps[0][0] < 0:
                raise ValueError("steps must be in rising epochs from 0 on")
        except (ConfigError, TypeError, ValueError) as exc:
            raise ResumeError(f"damaged loader state: image sizes {state!r} ({exc})") from exc
        return steps

    def apply(self, steps: list[tuple[int, int, int]]) -> None:
        """Take the schedule `parse` read."""
        self._write(steps)


class ResizableLoader:
    """Mixin for the image loader (before `ResumableLoader` in its bases): `set_image_size`, `image_size`, and the
    sizes carried by `state_dict()` / `load_state_dict()`. The loader sets `_sizes` (None: a transform of its
    own, whose size is its own) and says in `_sizes_changed` what a change drops (the workers' batches made ahead
    at the size before)."""

    _sizes: ImageSizes | None
    _current: list[int] | None
    _next: Any  # fastdata.order.state.Position
    epoch: int

    def _sizes_changed(self) -> None:
        raise NotImplementedError

    @property
    def image_size(self) -> int | tuple[int, int] | None:
        """The side (or (height, width)) of the images of the next pass's epoch (`set_image_size`); None with a
        transform of your own."""
        return None if self._sizes is None else stable_size(self._sizes.size_for(self.epoch))

    def set_image_size(self, size: int | tuple[int, int]) -> None:
        """Make the images `size` (a side, or (height, width)) from the next epoch that starts from its beginning
        on: progressive resizing, FFCV's schedule (e.g. 160 px rising to 192 px over the epochs, evaluated at a
        higher resolution by the validation loader). Called before an epoch's pass, it applies to that epoch;
        during a pass, or after a state restored in the middle of an epoch, to the epoch after it.
        `state_dict()` carries the sizes, so a restored loader, whatever size it was built with, continues at the
        sizes of the run the state was taken from."""
        if self._sizes is None:
            raise ConfigError("set_image_size applies to the classification presets (augment='train' / 'val' or "
                              "their objects); a custom transform sets its own size, and detection and "
                              "segmentation canvases are fixed")
        output_size(size)  # ConfigError naming what was given
        if self._current is not None:  # a pass under way: the epoch after it
            epoch = self._current[0] + 1
        else:
            place = self._next
            epoch = place.epoch + 1 if place.start or place.skip or place.complete else place.epoch
        if self._sizes.set(size, epoch):
            self._sizes_changed()

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Where this loader stands (`fastdata.order.state.ResumableLoader.state_dict`), with the image sizes
        (`"image_sizes"`: the schedule, [from epoch, height, width] per step)."""
        state = super().state_dict(*args, **kwargs)  # type: ignore[misc]
        if self._sizes is not None:
            state["image_sizes"] = self._sizes.state()
        return state

    def load_state_dict(self, state: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        """Continue from `state` (`fastdata.order.state.ResumableLoader.load_state_dict`), at its image sizes (a
        state without them: the size this loader was built with)."""
        sizes = None
        if self._sizes is not None and isinstance(state, Mapping):
            sizes = self._sizes.parse(state.get("image_sizes"))
        super().load_state_dict(state, *args, **kwargs)  # type: ignore[misc]
        if self._sizes is not None and sizes is not None:
            self._sizes.apply(sizes)
            self._sizes_changed()
