"""Shared-memory batch tensors that DataLoader workers reuse once the main process has let go of them.

A worker hands a batch to the main process as shared memory. A fresh segment per batch costs its page faults every
time: on the 2-core machine, allocating and filling a new [128, 3, 224, 224] uint8 segment took about 20 ms against
1 ms for one already mapped, which is 0.15 ms an image, as much as the whole crop-and-resize. So each worker keeps a
few segments ("slots") and writes its next batch into one the main process no longer holds.

One shared byte per (worker, slot) says whether the slot may still be read. A worker sets it when it fills the slot;
only the main process clears it, and only once the storage it received for that slot is gone (torch's
StorageWeakRef: no tensor or view of it is left anywhere in the main process). A batch the user keeps is therefore
never overwritten; a worker with no free slot allocates a fresh segment, as torch's default_collate does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import get_worker_info

from fastdata.workers import new_shared

FREE, LENT = 0, 1

Slot = tuple[int, int, int]  # (generation of the flags, worker id, slot number)


class BatchBuffers:
    """The slots of `workers` DataLoader workers, `slots` each. Workers call `acquire`; the main process calls
    `received` for every batch it gets and `reset` before a new pass starts."""

    def __init__(self, workers: int, slots: int) -> None:
        if workers < 1 or slots < 1:
            raise ValueError(f"BatchBuffers needs at least one worker and one slot, got {workers} and {slots}")
        self.flags = torch.zeros((workers, slots), dtype=torch.uint8).share_memory_()
        self.generation = 0  # which flags a worker's slots refer to: a new set for each set of new workers
        self.pooled = 0  # main process: batches received in a reused slot ...
        self.fresh = 0  # ... and in a fresh segment (no slot was free)
        self._segments: list[torch.Tensor | None] | None = None  # worker side: this process's slot storages
        self._held: dict[Slot, StorageWeakRef] = {}  # main side: what it received and may still hold

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_segments": None, "_held": {}}

    def acquire(self, shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> tuple[torch.Tensor, Slot | None]:
        """In a worker: an uninitialised tensor of `shape` and `dtype` in shared memory, in a free slot when there
        is one (marked lent until the main process releases it), else fresh (slot None)."""
        info = get_worker_info()
        if info is None or info.id >= self.flags.shape[0]:
            return new_shared(shape, dtype), None
        row = self.flags[info.id].numpy()
        free = np.flatnonzero(row == FREE)
        if not len(free):
            return new_shared(shape, dtype), None
        slot = int(free[0])
        if self._segments is None:
            self._segments = [None] * len(row)
        segment = self._segments[slot]  # bytes, viewed as `dtype`
        size = math.prod(shape) * dtype.itemsize
        if segment is None or segment.numel() < size:
            segment = self._segments[slot] = new_shared((size,))
        row[slot] = LENT
        return segment[:size].view(dtype).view(shape), (self.generation, info.id, slot)

    def received(self, slot: Slot | None, images: torch.Tensor) -> None:
        """In the main process: a batch arrived in `slot` (None: a fresh segment); frees the slots whose
        batches are gone."""
        if slot is None:
            self.fresh += 1
        else:
            self.pooled += 1
            if slot[0] == self.generation:  # else from the workers of a pass since replaced: not our flags now
                self._held[slot] = StorageWeakRef(images.untyped_storage())
        self.release_expired()

    def release_expired(self) -> None:
        """In the main process: mark free every slot whose received storage no longer exists."""
        flags = self.flags.numpy()
        for slot, ref in list(self._held.items()):
            if ref.expired():
                flags[slot[1:]] = FREE
                del self._held[slot]

    def reset(self, new_workers: bool) -> None:
        """In the main process, before a pass starts. `new_workers`: the pass starts its own workers, which get a
        clean set of flags (the last pass's workers, if any are still finishing, keep theirs). Persistent
        workers: slots of batches the main process never received (a pass left early; torch drops them) are
        free again, those it received and may still hold stay lent."""
        if new_workers:
            self.flags = torch.zeros_like(self.flags).share_memory_()
            self.generation += 1
            self._held.clear()
            return
        self.release_expired()
        flags = self.flags.numpy()
        for worker, slot in np.argwhere(flags == LENT).tolist():
            if (self.generation, worker, slot) not in self._held:
                flags[worker, slot] = FREE


def batch_tensor(shape: tuple[int, ...], buffers: BatchBuffers | None, dtype: torch.dtype = torch.uint8
                 ) -> tuple[torch.Tensor, Slot | None]:
    """An uninitialised tensor for a batch, and its slot. In a DataLoader worker it is in shared memory from
    the start, as torch's default_collate does (handing a batch to the main process otherwise copies it into
    shared memory: about a fifth of a worker's time at 3,000 images/s), in a reused slot of `buffers` if given."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype), None
    if buffers is not None:
        return buffers.acquire(shape, dtype)
    return new_shared(shape, dtype), None
