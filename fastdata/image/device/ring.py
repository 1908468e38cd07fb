"""`SlotRing`: a few preallocated output tensors (slots) that the feeder fills in turn and the training loop reads,
handed back and forth with CUDA events, so that neither side ever waits on the host for the device.

A slot goes round: free -> filled by the feeder (on its stream) -> ready (an event recorded after its last write)
-> in use by the training loop (whose stream waits for that event: `take`) -> given back when the loop takes the
batch after the next one (an event recorded on the loop's stream: the feeder's stream waits for it before
writing the slot again). Giving a slot back one batch late means that the loop's variable has moved on to a later
batch by then, so a slot that is still referenced (the user kept the batch, or a view of it) is kept by its user:
the ring puts a new tensor in its place (`refills`), and the kept tensor's memory is recorded as used by the loop's
stream, so the caching allocator reuses it only after the loop's work on it. Otherwise every batch of a slot lies
at the same address, which is what a captured CUDA graph needs. The ring knows nothing of images: it holds tensors.
On the CPU there are no events; the order of the host's own calls is the order of the work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def _storage_users(tensor: torch.Tensor) -> int:
    """How many tensors (views included) share `tensor`'s memory."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


@dataclass
class Slot:
    """One preallocated output tensor and its hand-over events (None on the CPU)."""

    index: int
    tensor: torch.Tensor
    users: int  # _storage_users(tensor) when nobody else holds it
    ready: torch.cuda.Event | None = None  # recorded by the feeder after it wrote the slot
    released: torch.cuda.Event | None = None  # recorded on the loop's stream when it gave the slot back
    handed_out: bool = field(default=False)  # record_stream(loop's stream) done for this tensor


class SlotRing:
    """`count` slots made by `make()` (on the feeder's stream when CUDA). The feeder calls `fill_next()` (blocks
    while every slot is ahead of the loop; returns None once `stop()` was called), writes, then `filled(slot)`; the
    loop calls `take(slot)` for each batch in order."""

    def __init__(self, count: int, make: Callable[[], torch.Tensor], device: torch.device) -> None:
        if count < 3:
            raise ValueError("a SlotRing needs at least 3 slots: the batch in use, the one before it (given back "
                             "one batch late) and one being filled")
        self.device = torch.device(device)
        self.make = make
        self.cuda = self.device.type == "cuda"
        self.slots: list[Slot] = []
        self._count = count
        self._next = 0
        self._free = threading.Semaphore(count)  # given back by the loop when it holds a third (`take`)
        self._held: list[Slot] = []  # taken by the loop, oldest first
        self._stopped = threading.Event()
        self.refills = 0  # slots replaced because their user kept the batch

    def fill_next(self) -> Slot | None:
        """The next slot to write (the caller is on the stream that will write it), once the loop has given it
        back; None when the ring is stopped."""
        while not self._free.acquire(timeout=0.1):
            if self._stopped.is_set():
                return None
        if self._stopped.is_set():
            return None
        if len(self.slots) < self._count:
            tensor = self.make()
            slot = Slot(len(self.slots), tensor, _storage_users(tensor))
            self.slots.append(slot)
        else:
            slot = self.slots[self._next]
            if _storage_users(slot.tensor) > slot.users:  # its user kept it: it is theirs now
                slot.tensor = self.make()
                slot.users = _storage_users(slot.tensor)
                slot.handed_out = False
                self.refills += 1
            elif slot.released is not None:
                torch.cuda.current_stream(self.device).wait_event(slot.released)
        self._next = (self._next + 1) % self._count
        return slot

    def filled(self, slot: Slot) -> None:
        """The feeder has queued every write of `slot`: record its ready event on the feeder's stream."""
        if self.cuda:
            slot.ready = slot.ready or torch.cuda.Event()
            slot.ready.record(torch.cuda.current_stream(self.device))

    def take(self, slot: Slot) -> None:
        """The loop takes `slot` (in fill order): its stream waits for the slot's writes, and the slot taken two
        batches ago is given back. O(1), no host synchronisation."""
        if self.cuda:
            stream = torch.cuda.current_stream(self.device)
            if slot.ready is not None:
                stream.wait_event(slot.ready)
            if not slot.handed_out:
                slot.tensor.record_stream(stream)
                slot.handed_out = True
        self._held.append(slot)
        if len(self._held) > 2:
            self._give_back(self._held.pop(0))

    def _give_back(self, slot: Slot) -> None:
        if self.cuda:
            slot.released = slot.released or torch.cuda.Event()
            slot.released.record(torch.cuda.current_stream(self.device))
        self._free.release()

    def restart(self) -> None:
        """Before a new feeder uses the ring: the loop's held slots are given back (their batches stay valid for
        whoever keeps them: a later fill sees them referenced) and the count of free slots is reset."""
        for slot in self._held:
            if self.cuda:
                slot.released = slot.released or torch.cuda.Event()
                slot.released.record(torch.cuda.current_stream(self.device))
        self._held = []
        self._free = threading.Semaphore(self._count)
        self._stopped.clear()

    def stop(self) -> None:
        """Wake a feeder waiting in `fill_next` (it gets None)."""
        self._stopped.set()
