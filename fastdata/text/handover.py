"""Shared-memory slots that the text loader's workers write their items into, reused for the whole run.

A worker's item (`fastdata.text.dataset.TextBatches`: a group of batches as int32) reaches the main process as
shared memory. A fresh segment per item costs its creation and page faults in the worker, a file-descriptor
handshake with the worker's resource-sharer thread on both sides, and the mapping and page faults again in the main
process: per batch of 32 x 1024 tokens more than reading the batch's tokens, and twice as much for a batch twice the
size. The main process copies every batch out as it unpacks it (int32 -> int64), so a
slot is free again as soon as its item is unpacked: slots made once, written in turn, need none of that, and the
item that travels names its slot instead of carrying a tensor.

Which slot: the main process numbers the items as its DataLoader takes them from the batch sampler
(`fastdata.text.loader.GroupedBatches`); item n goes to slot n % slots. A DataLoader sends a worker a new item only
when it returns one (in order), at most prefetch_factor x workers ahead, and the loader copies out every batch of an
item before it asks for the next: with one slot more than the items in flight, item n's slot is not written again
before item n is copied out. A worker checks it anyway (the main process keeps the number of items it has copied
out in shared memory): should the slot still be in use, the item comes in a fresh segment, counted and said once.
"""

from __future__ import annotations

import warnings

import torch

from fastdata.workers import new_shared


class HandOver:
    """`slots` shared int32 slots of `capacity` each, and the items the main process has copied out. Made in the
    main process before the workers start (they inherit it, or get it pickled as shared memory)."""

    def __init__(self, slots: int, capacity: int, first: int = 0) -> None:
        """`first`: the number of the first item to come (item numbers continue across passes)."""
        self.buffers = new_shared((slots, capacity), torch.int32)
        self._copied = torch.full((1,), first, dtype=torch.int64).share_memory_()  # items below it are copied out
        self._done = first  # main process: items below it are copied out, or dropped, but for those ...
        self._reading: set[int] = set()  # ... the main process is still copying out of their slots
        self.fresh = 0  # main process: items that came in a fresh segment, their slot still in use
        self._warned = False

    def slot(self, number: int | None, size: int) -> torch.Tensor | None:
        """In a worker: where item `number` (None: unnumbered) of `size` int32 goes, None where it goes in a fresh
        segment (too big, unnumbered, or its slot still holds an item not copied out)."""
        slots, capacity = self.buffers.shape
        if number is None or size > capacity or number - slots >= int(self._copied[0]):
            return None
        return self.buffers[number % slots, :size]

    def received(self, handed: torch.Tensor | int) -> torch.Tensor:
        """In the main process: an item's int32 data from what its worker handed over (a slot's item number, or the
        item's own tensor); call `copied` once done with it."""
        if isinstance(handed, int):
            self._reading.add(handed)
            return self.buffers[handed % self.buffers.shape[0]]
        self.fresh += 1
        if not self._warned:
            self._warned = True
            warnings.warn("a text loader worker handed a batch over in a fresh shared-memory segment, its slot still "
                          "being read (more items in flight than the DataLoader's prefetch_factor x num_workers, or "
                          "an earlier pass's batches still being taken); loading goes on, slower", RuntimeWarning,
                          stacklevel=2)
        return handed

    def copied(self, handed: torch.Tensor | int) -> None:
        """In the main process: done with an item (every batch copied out, or the rest left): its slot may be
        written again."""
        if isinstance(handed, int):
            self._reading.discard(handed)
            self.begin(handed + 1)

    def begin(self, number: int) -> None:
        """In the main process: items numbered below `number` are done with (copied out, or of a pass left early,
        which the DataLoader drops before it sends the next pass's first item), but for those still being read."""
        self._done = max(self._done, number)
        self._copied.numpy()[0] = min([self._done, *self._reading])
