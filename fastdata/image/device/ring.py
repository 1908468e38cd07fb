"""`SlotRing`: a few preallocated output slots that the feeder's resize thread fills in turn and the training loop
reads, handed back and forth with events (fastdata.image.device.streams), so that neither side ever waits on the
host for the device.

A slot holds a batch's images and the tensors that go with them (labels, token ids: `place`), each at a fixed
address. It goes round: free -> filled on the resize stream -> ready (an event recorded after its last write) ->
in use by the training loop (whose stream waits for that event: `take`) -> given back when the loop takes the batch
after the next one (an event recorded on the loop's stream: the resize stream waits for it before writing the slot
again). Giving a slot back one batch late means that the loop's variables have moved on to a later batch by then,
so a tensor of the slot that is still referenced (the user kept the batch or its labels, or a view of them) is the
user's: the ring puts a new tensor in its place (`refills`), and the kept tensor's memory is recorded as used by
the loop's stream, so the caching allocator reuses it only after the loop's work on it. Otherwise every batch of a
slot lies at the same addresses, which is what a captured CUDA graph needs.

A feeder that replaces another (a new pass, `set_epoch`) may find slots the old feeder's stream is still writing:
`restart(after=...)` makes the new stream wait for the old one's last write before its first. The ring knows
nothing of images: it holds tensors. On the CPU there are no events; the order of the host's own calls is the
order of the work.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fastdata.image.device.streams import CudaStreams, streams_for


def _storage_users(tensor: torch.Tensor) -> int:
    """How many tensors (views included) share `tensor`'s memory."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


@dataclass
class Held:
    """One tensor of a slot and how many users its storage has when nobody but the slot holds it."""

    tensor: torch.Tensor
    users: int
    handed_out: bool = False  # recorded as used by the loop's stream (once per tensor)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Held:
        return cls(tensor, _storage_users(tensor))

    @property
    def kept(self) -> bool:
        """Whether someone besides the slot holds it (the user kept a batch)."""
        return _storage_users(self.tensor) > self.users


@dataclass
class Slot:
    """One preallocated batch: its images (`tensor`), the other tensors placed in it by name, and its hand-over
    events (None on the CPU)."""

    index: int
    images: Held
    extra: dict[str, Held] = field(default_factory=dict)
    ready: Any = None  # recorded on the resize stream after the slot's last write
    released: Any = None  # recorded on the loop's stream when it gave the slot back

    @property
    def tensor(self) -> torch.Tensor:
        return self.images.tensor

    def held(self) -> list[Held]:
        return [self.images, *self.extra.values()]


class SlotRing:
    """`count` slots whose images `make()` allocates (on the resize stream). The resize thread calls `fill_next()`
    (blocks while every slot is ahead of the loop; returns None once `stop()` was called), writes (`place` for the
    tensors beside the images), then `filled(slot)`; the loop calls `take(slot)` for each batch in order."""

    def __init__(self, count: int, make: Callable[[], torch.Tensor], device: torch.device,
                 streams: CudaStreams | None = None) -> None:
        if count < 3:
            raise ValueError("a SlotRing needs at least 3 slots: the batch in use, the one before it (given back "
                             "one batch late) and one being filled")
        self.device = torch.device(device)
        self.make = make
        self.streams = streams or streams_for(self.device)
        self.count = count
        self.slots: list[Slot] = []
        self._next = 0
        self._free = threading.Semaphore(count)  # given back by the loop when it holds a third (`take`)
        self._held: list[Slot] = []  # taken by the loop, oldest first
        self._stopped = threading.Event()
        self._after: Any = None  # the last write of the feeder before this one (`restart`)
        self.refills = 0  # tensors replaced because their user kept them

    def fill_next(self) -> Slot | None:
        """The next slot to write (the caller is on the stream that will write it), once the loop has given it
        back; None when the ring is stopped."""
        while not self._free.acquire(timeout=0.1):
            if self._stopped.is_set():
                return None
        if self._stopped.is_set():
            return None
        if self._after is not None:  # before this stream's first write: the last feeder's writes are done
            self.streams.wait(self._after)
            self._after = None
        if len(self.slots) < self.count:
            slot = Slot(len(self.slots), Held.of(self.make()))
            self.slots.append(slot)
        else:
            slot = self.slots[self._next]
            if slot.images.kept:  # its user kept the batch: the tensor is theirs now
                slot.images = Held.of(self.make())
                self.refills += 1
            self.streams.wait(slot.released)
        self._next = (self._next + 1) % self.count
        return slot

    def place(self, slot: Slot, value: Any, name: str = "labels") -> Any:
        """`value` (host tensors, or a dataclass / dict / list / tuple holding them; anything else passes as it
        is) copied into `slot`'s own tensors on the device (non-blocking from pinned memory, on the current
        stream), each reused at its address from batch to batch; returns the same structure holding views of
        them."""
        if isinstance(value, torch.Tensor):
            return self._place_tensor(slot, value, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {f.name: self.place(slot, getattr(value, f.name), f"{name}.{f.name}")
                       for f in dataclasses.fields(value) if isinstance(getattr(value, f.name), torch.Tensor)}
            return dataclasses.replace(value, **changes)
        if isinstance(value, dict):
            return {key: self.place(slot, item, f"{name}.{key}") for key, item in value.items()}
        if isinstance(value, list | tuple) and any(isinstance(item, torch.Tensor) for item in value):
            return type(value)(self.place(slot, item, f"{name}.{i}") for i, item in enumerate(value))
        return value

    def _place_tensor(self, slot: Slot, host: torch.Tensor, name: str) -> torch.Tensor:
        rows = host.shape[0]
        held = slot.extra.get(name)
        if held is None or held.tensor.dtype != host.dtype or held.tensor.shape[1:] != host.shape[1:] \
                or held.tensor.shape[0] < rows:
            shape = (max(rows, slot.images.tensor.shape[0]), *host.shape[1:])
            held = slot.extra[name] = Held.of(torch.empty(shape, dtype=host.dtype, device=self.device))
        elif held.kept:  # its user kept it (labels appended to a list, say): theirs now
            held = slot.extra[name] = Held.of(torch.empty_like(held.tensor))
            self.refills += 1
        target = held.tensor[:rows]
        target.copy_(host, non_blocking=self.streams.cuda)
        return target

    def filled(self, slot: Slot) -> None:
        """The resize thread has queued every write of `slot`: record its ready event on the current stream."""
        slot.ready = self.streams.record()

    def take(self, slot: Slot) -> None:
        """The loop takes `slot` (in fill order): its stream waits for the slot's writes, and the slot taken two
        batches ago is given back. O(1) in the batch's size, no host synchronisation."""
        self.streams.wait(slot.ready)
        for held in slot.held():
            if not held.handed_out:  # once per tensor: its memory is the loop stream's too
                self.streams.hand_over(held.tensor)
                held.handed_out = True
        self._held.append(slot)
        if len(self._held) > 2:
            self._give_back(self._held.pop(0))

    def _give_back(self, slot: Slot) -> None:
        slot.released = self.streams.record()
        self._free.release()

    def restart(self, after: Any = None) -> None:
        """Before a new feeder uses the ring: the loop's held slots are given back (their batches stay valid for
        whoever keeps them: a later fill sees them referenced), the count of free slots is reset, and the new
        feeder's stream will wait for `after` (the old feeder's last write) before it writes any slot."""
        for slot in self._held:
            slot.released = self.streams.record()
        self._held = []
        self._free = threading.Semaphore(self.count)
        self._stopped.clear()
        self._after = after if after is not None else self._after

    def stop(self) -> None:
        """Wake a feeder waiting in `fill_next` (it gets None)."""
        self._stopped.set()
