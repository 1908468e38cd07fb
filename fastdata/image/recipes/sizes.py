"""Progressive resizing (FFCV's schedule: low resolution early, higher later): the size each epoch's images are
made at, kept in a few shared-memory integers so that persistent workers read it with each batch.

A loader holds one `ImageSizes`: the size in force and at most one change waiting for its epoch
(`loader.set_image_size(size)` takes effect at the next epoch that starts from its beginning). The change becomes
the size in force when that epoch's pass begins (`begin`). `state()` / `restore()` carry both in a loader's state,
so that a state taken mid-epoch restores into a loader built with the original size and yields the batches the
uninterrupted run yields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fastdata.errors import ConfigError, ResumeError
from fastdata.image.geometry import output_size, stable_size

_NONE = -1


class ImageSizes:
    """The output size per epoch: `built` (height, width) until a change; `set(size, from_epoch)` changes it from
    `from_epoch` on. Shared memory: `size_for(epoch)` reads the same values in every worker."""

    def __init__(self, built: tuple[int, int]) -> None:
        self.built = built
        # [height, width, from epoch of the change (or -1), its height, its width]
        self.cell = torch.tensor([*built, _NONE, 0, 0], dtype=torch.int64).share_memory_()
        self._view: np.ndarray | None = None  # the cell as numpy (read per sample: 1 us, where tolist() takes 50)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_view": None}

    def _values(self) -> list[int]:
        if self._view is None:
            self._view = self.cell.numpy()
        return self._view.tolist()

    def size_for(self, epoch: int) -> tuple[int, int]:
        """(height, width) of epoch `epoch`'s images."""
        height, width, start, next_height, next_width = self._values()
        return (next_height, next_width) if start != _NONE and epoch >= start else (height, width)

    def set(self, size: Any, from_epoch: int) -> bool:
        """Make epochs from `from_epoch` on `size` (a side or (height, width)); True when anything changed."""
        wanted = output_size(size)
        before = self._values()
        current = (before[0], before[1])
        if wanted == current:
            self.cell[2] = _NONE
        else:
            self.cell[3], self.cell[4] = wanted
            self.cell[2] = from_epoch  # last: a worker never pairs this epoch with the old change's size
        return self._values() != before

    def begin(self, epoch: int) -> None:
        """A pass of `epoch` begins: a change due by then becomes the size in force."""
        _, _, start, next_height, next_width = self._values()
        if start != _NONE and epoch >= start:
            self.cell[0], self.cell[1] = next_height, next_width
            self.cell[2] = _NONE

    def state(self) -> dict[str, Any]:
        """The sizes as a loader state carries them (JSON)."""
        height, width, start, next_height, next_width = self._values()
        return {"size": [height, width], "next": None if start == _NONE else [start, next_height, next_width]}

    def parse(self, state: Mapping[str, Any] | None) -> list[int]:
        """The sizes of a loader state, checked, ready for `apply` (None: a state without them, taken at the
        size the loader was built with)."""
        if state is None:
            return [*self.built, _NONE, 0, 0]
        try:
            height, width = output_size(tuple(int(v) for v in state["size"]))
            change = state.get("next")
            if change is None:
                return [height, width, _NONE, 0, 0]
            start, next_height, next_width = (int(v) for v in change)
            output_size((next_height, next_width))
        except (ConfigError, AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"damaged loader state: image sizes {state!r} ({exc})") from exc
        return [height, width, start, next_height, next_width]

    def apply(self, values: list[int]) -> None:
        """Take the sizes `parse` read."""
        self.cell.copy_(torch.tensor(values, dtype=torch.int64))


class ResizableLoader:
    """Mixin for the image loader (before `ResumableLoader` in its bases): `set_image_size`, `image_size`, and the
    sizes carried by `state_dict()` / `load_state_dict()`. The loader sets `_sizes` (None: a transform of its
    own, whose size is its own), calls `_sizes.begin(epoch)` as each pass begins and says in `_sizes_changed` what
    a change drops (the workers' batches made ahead at the size before)."""

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
        (`"image_sizes"`: the size in force and a change waiting for its epoch)."""
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
