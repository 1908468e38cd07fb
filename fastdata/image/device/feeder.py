"""`DeviceFeeder`: the two threads that make device batches beside the training step, on two streams.

    decode thread   the workers' EncodedBatches, in passes; `stage.decode` on the DECODE stream, which nothing
                    else is queued on (nvImageCodec orders each decode after what its stream holds: here only the
                    decodes before it); an event "decoded" recorded behind each batch
                    -> up to `depth` (2) decoded batches wait
    resize thread   a free slot of the ring (its stream waits for the loop's release of it); the RESIZE stream
                    waits for "decoded"; `stage.finish` writes the images AND the labels into the slot; "ready"
                    recorded; the decoder's buffers handed back with "ready" (reused once it has completed)
                    -> the ring's slots
    training thread `next()`: take a ready slot (its stream waits for "ready"): O(1) Python, no host
                    synchronisation

Both threads are `Ahead`s (fastdata.background), whose invariant (order, bound, errors in order, ending)
is what the feeder relies on. Nothing touches the device before the workers have forked: the decode thread opens
the first pass (forking the workers), then makes its stream and the decoder (`setup`); the resize thread makes its
stream and the slots when its first decoded batch comes.

Passes: the feeder runs the pass it was started for, then (when `follow` names one) the pass after it, so that the
next epoch's first batches are made while the last ones train. The loader adopts that pass when the user's next
`iter()` asks for it (`offers`) and otherwise closes the feeder and starts another, whose stream waits for this
one's last write before writing any slot (`last_write`, `SlotRing.restart`). Whatever fails on either thread (a
worker's error, a damaged sample with on_error="raise", a device error) is raised at the training thread's
`next()`, with its own type and traceback, after the batches before it. `close()` stops both threads (it is also
called at interpreter exit).
"""

from __future__ import annotations

import atexit
import functools
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from fastdata.background import Ahead
from fastdata.image.device.ring import SlotRing
from fastdata.image.device.stage import DecodedBatch, DeviceBatch, DeviceStage
from fastdata.image.device.streams import CudaStreams

T = TypeVar("T")
Reference = Callable[[], T | None]  # weakref.WeakMethod / weakref.ref, or `strong(f)`

#: Decoded batches that may wait for the resize thread (DALI's queue depth; covers a decoder's p99 of ~1.6 x p50)
DECODED_AHEAD = 2


@dataclass(frozen=True)
class PassKey:
    """Which pass: the epoch, the first batch of it (a resumed or rank-repartitioned start) and batches skipped."""

    epoch: int
    start: int = 0
    skip: int = 0


_END = "end"
_BATCH = "batch"


class DeviceFeeder:
    """Runs `stage` over the batches of `open_pass()(key)` on a decode and a resize thread, into `ring`'s slots.

    `setup()()` runs once on the decode thread after the first pass opened (the workers forked): the decoder is
    made there. `follow(key)` is the pass to prepare after `key` (None: stop after it). `open_pass` and `setup` are
    references (a `weakref.WeakMethod` of the loader's methods, or `strong(f)`): the threads must not keep the
    loader alive, so that a loader its user dropped is collected and its finaliser closes the feeder."""

    def __init__(self, stage: DeviceStage, ring: SlotRing, open_pass: Reference[Callable[[PassKey], Iterator[Any]]],
                 first: PassKey, follow: Callable[[PassKey], PassKey | None],
                 setup: Reference[Callable[[], None]] | None = None, streams: CudaStreams | None = None,
                 depth: int = DECODED_AHEAD) -> None:
        self.stage = stage
        self.ring = ring
        self.streams = streams or stage.streams
        self._open_pass = open_pass
        self._follow = follow
        self._setup = setup
        self._upcoming = [first]  # passes the threads have started or will start, in order, not yet taken
        self._set_up = False  # the decode thread made its stream and ran `setup`
        self._decode_stream: Any = None
        self._resize_stream: Any = None
        self._resize_ready = False
        self._seen = {"decoded_full": 0.0, "decode_wait": 0.0}  # the threads' waits already added to the timings
        self.last_write: Any = None  # the resize stream's event behind its last write into a slot
        self._closer = functools.partial(_close_if_alive, weakref.ref(self))
        atexit.register(self._closer)
        self._decoded: Ahead[tuple[str, PassKey, Any]] = Ahead(
            self._passes(first), self._decode_one, depth, "fastdata-device-decode", discard=self._drop_decoded)
        self._made: Ahead[tuple[str, PassKey, Any]] = Ahead(
            self._decoded, self._resize_one, ring.count, "fastdata-device-resize", poll_s=0.5)
        self._decoded.start()
        self._made.start()

    def offers(self, key: PassKey) -> bool:
        """Whether the next pass this feeder delivers is `key` (and it is still running)."""
        return self._made.alive and bool(self._upcoming) and self._upcoming[0] == key

    def batches(self, key: PassKey) -> Iterator[DeviceBatch]:
        """The training thread's side: pass `key`'s batches, each taken from its slot (its stream waits for it)."""
        if not self._upcoming or self._upcoming[0] != key:
            raise RuntimeError(f"this feeder does not deliver pass {key} next")
        timings = self.stage.timings
        while True:
            started = time.perf_counter()
            try:
                kind, _, payload = next(self._made)
            except StopIteration:
                self._upcoming.clear()
                raise RuntimeError("the device feeder was closed while a pass was read from it") from None
            except BaseException:
                self._upcoming.clear()
                raise
            finally:
                timings["starved"] += time.perf_counter() - started
            if kind == _END:
                self._upcoming.pop(0)
                return
            result, slot = payload
            self.ring.take(slot)
            yield result

    def threads(self) -> dict[str, Ahead]:
        """The feeder's two threads (their busy and waiting seconds: fastdata.background)."""
        return {"decode": self._decoded, "resize": self._made}

    def _passes(self, first: PassKey) -> Iterator[tuple[str, PassKey, Any]]:
        """The decode thread's source: each pass's worker batches, then its end; the pass after it, and so on."""
        key: PassKey | None = first
        timings = self.stage.timings
        while key is not None:
            open_pass = self._open_pass()
            if open_pass is None:  # the loader is gone
                return
            batches = iter(open_pass(key))  # the first pass of persistent workers forks them here
            del open_pass
            try:
                if not self._set_up:  # after the fork: the device's first use
                    self._set_up = True
                    self._decode_stream = self.streams.new_stream()
                    with self.streams.using(self._decode_stream):
                        setup = self._setup() if self._setup is not None else None
                        if setup is not None:
                            setup()
                        del setup
                while True:
                    started = time.perf_counter()
                    try:
                        batch = next(batches)
                    except StopIteration:
                        break
                    finally:
                        timings["workers"] += time.perf_counter() - started
                    yield _BATCH, key, batch
                    del batch
            finally:  # the workers' iterator is this pass's alone: closed before another pass opens them
                close = getattr(batches, "close", None)
                if close is not None:
                    close()
            yield _END, key, None
            key = self._follow(key)
            if key is not None:
                self._upcoming.append(key)

    def _decode_one(self, item: tuple[str, PassKey, Any]) -> tuple[str, PassKey, Any]:
        kind, key, batch = item
        if kind != _BATCH:
            return item
        with self.streams.using(self._decode_stream):
            decoded = self.stage.decode(batch)
            decoded.event = self.streams.record()  # behind the decode: the crop waits for it
        self._add_wait("decoded_full", self._decoded.waited_room_s)
        return kind, key, decoded

    def _resize_one(self, item: tuple[str, PassKey, Any]) -> tuple[str, PassKey, Any]:
        kind, key, decoded = item
        timings = self.stage.timings
        self._add_wait("decode_wait", self._made.waited_source_s)
        if kind != _BATCH:
            return item
        if not self._resize_ready:  # after the fork: a decoded batch came
            self._resize_ready = True
            self._resize_stream = self.streams.new_stream()
        started = time.perf_counter()
        with self.streams.using(self._resize_stream):
            slot = self.ring.fill_next()  # the resize stream waits for the loop's release of the slot
            timings["slot_wait"] += time.perf_counter() - started
            if slot is None:  # stopped
                self._drop_decoded(item)
                return item
            guard = decoded.event
            try:
                self.streams.wait(decoded.event)
                result = self.stage.finish(decoded, out=slot.tensor, place=functools.partial(self.ring.place, slot))
            finally:
                self.ring.filled(slot)
                self.last_write = guard = slot.ready if slot.ready is not None else guard
                self.stage.release(decoded, guard)
        return kind, key, (result, slot)

    def _add_wait(self, part: str, total: float) -> None:
        """Add what a thread's wait counter (`total`, since this feeder started) grew by to the stage's timings."""
        self.stage.timings[part] += total - self._seen[part]
        self._seen[part] = total

    def _drop_decoded(self, item: tuple[str, PassKey, Any]) -> None:
        """A decoded batch nobody will crop: its buffers go back once its decode has run."""
        kind, _, decoded = item
        if kind == _BATCH and isinstance(decoded, DecodedBatch):
            self.stage.release(decoded, decoded.event)

    def close(self) -> None:
        """Stop both threads and wait for them (each finishes the batch it is on, or the workers' next batch).
        Called on one of them (a finaliser the garbage collector ran there), it only asks them to stop."""
        self._made.stop()
        self._decoded.stop()
        self.ring.stop()
        if self._made.on_its_thread() or self._decoded.on_its_thread():
            return
        try:  # an error either thread hit after the stop is raised here (fastdata.background, 3)
            self._made.close()  # the resize thread closes the decode thread (its source) as it ends
            self._decoded.close()
        finally:
            self._upcoming.clear()
            atexit.unregister(self._closer)


def strong(target: Any) -> Callable[[], Any]:
    """A reference to `target` that always holds (for callers without a loader to keep collectable)."""
    return lambda: target


def _close_if_alive(feeder: weakref.ref[DeviceFeeder]) -> None:
    alive = feeder()
    if alive is not None:
        alive.close()
