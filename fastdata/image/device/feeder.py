"""`DeviceFeeder`: the thread that makes device batches beside the training step.

The training thread only takes finished batches: `next()` is a queue get, a stream wait on the batch's event and
the ring's bookkeeping (fastdata.image.device.ring): O(1) Python, no host synchronisation. The feeder thread, in the
main process, takes the workers' `EncodedBatch`es, runs the device stage (fastdata.image.device.stage: decode,
batched crop-resize-flip, normalise) on a CUDA stream of its own into the next free slot, records the slot's
event and queues the batch. CUDA's stream priorities go from the default stream's (the lowest) upwards, so the
feeder's stream takes the lowest, as the default: the training step's kernels are never put behind it. With
`decode_ahead` (DeviceDecode(decode_ahead=True)) the decode half of the stage runs on a second thread, on the same
stream, one batch ahead of the crop-resize half (`DeviceStage.decode` / `finish`, in batch order).

Passes: the feeder runs the pass it was started for, then (when `follow` names one) the pass after it, so that the
next epoch's first batches are made while the last ones train. The loader adopts that pass when the user's next
`iter()` asks for it (`offers`) and otherwise closes the feeder and starts another. Whatever fails in the thread
(a worker's error, a damaged sample with on_error="raise", a device error) is raised at the training thread's
`next()`, with its own type and traceback. `close()` stops the thread (it is also called at interpreter exit).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from fastdata.image.device.ring import SlotRing
from fastdata.image.device.stage import DecodedBatch, DeviceBatch, DeviceStage

T = TypeVar("T")
Reference = Callable[[], T | None]  # weakref.WeakMethod / weakref.ref, or `strong(f)`


@dataclass(frozen=True)
class PassKey:
    """Which pass: the epoch, the first batch of it (a resumed or rank-repartitioned start) and batches skipped."""

    epoch: int
    start: int = 0
    skip: int = 0


_END = "end"
_BATCH = "batch"
_ERROR = "error"


class DeviceFeeder:
    """Runs `stage` over the batches of `open_pass()(key)` on its own thread and stream, into `ring`'s slots.

    `setup()()` runs first on the thread (the decoder is made there, after the workers started); `follow(key)` is
    the pass to prepare after `key` (None: stop after it). `open_pass` and `setup` are references (a
    `weakref.WeakMethod` of the loader's methods, or `strong(f)`): the thread must not keep the loader alive, so
    that a loader its user dropped is collected and its finaliser closes the feeder."""

    def __init__(self, stage: DeviceStage, ring: SlotRing, open_pass: Reference[Callable[[PassKey], Iterator[Any]]],
                 first: PassKey, follow: Callable[[PassKey], PassKey | None],
                 setup: Reference[Callable[[], None]] | None = None, decode_ahead: bool = False) -> None:
        self.stage = stage
        self.decode_ahead = decode_ahead
        self.ring = ring
        self._open_pass = open_pass
        self._follow = follow
        self._setup = setup
        self._items: queue.SimpleQueue[tuple[str, PassKey, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._upcoming = [first]  # passes the thread has started or will start, in order, not yet taken
        self.cuda = stage.device.type == "cuda"
        self.stream = torch.cuda.Stream(stage.device) if self.cuda else None
        self._closer = functools.partial(_close_if_alive, weakref.ref(self))
        atexit.register(self._closer)
        self._thread = threading.Thread(target=self._run, args=(first,), name="fastdata-device-feeder", daemon=True)
        self._thread.start()

    def offers(self, key: PassKey) -> bool:
        """Whether the next pass this feeder delivers is `key` (and it is still running)."""
        return self._thread.is_alive() and bool(self._upcoming) and self._upcoming[0] == key

    def batches(self, key: PassKey) -> Iterator[DeviceBatch]:
        """The training thread's side: pass `key`'s batches, each taken from its slot (its stream waits for it)."""
        if not self._upcoming or self._upcoming[0] != key:
            raise RuntimeError(f"this feeder does not deliver pass {key} next")
        timings = self.stage.timings
        while True:
            started = time.perf_counter()
            kind, _, payload = self._get()
            timings["starved"] += time.perf_counter() - started
            if kind == _ERROR:
                self._upcoming.clear()
                raise payload
            if kind == _END:
                self._upcoming.pop(0)
                return
            result, slot = payload
            self.ring.take(slot)
            yield result

    def _get(self) -> tuple[str, PassKey, Any]:
        while True:  # a timed wait, so that Ctrl-C reaches the training thread while it waits
            try:
                return self._items.get(timeout=0.5)
            except queue.Empty:
                if not self._thread.is_alive():
                    try:
                        return self._items.get_nowait()
                    except queue.Empty:
                        raise RuntimeError("the device feeder thread ended without a word") from None

    def _run(self, first: PassKey) -> None:
        _block_ctrl_c()
        key: PassKey | None = first
        try:
            with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
                setup = self._setup() if self._setup is not None else None
                if setup is not None:
                    setup()
                del setup
                while key is not None and not self._stop.is_set():
                    if not self._feed(key):
                        return
                    self._items.put((_END, key, None))
                    key = self._follow(key)
                    if key is not None:
                        self._upcoming.append(key)
        except BaseException as exc:  # forwarded to the training thread, which raises it
            self._items.put((_ERROR, key or first, exc))

    def _feed(self, key: PassKey) -> bool:
        """Make every batch of pass `key`; False when stopped on the way."""
        open_pass = self._open_pass()
        if open_pass is None:  # the loader is gone
            return False
        batches = _timed(open_pass(key), self.stage.timings)
        del open_pass
        decoded = self._decoded_ahead(batches) if self.decode_ahead else map(self.stage.decode, batches)
        for one in decoded:
            slot = self.ring.fill_next()
            if slot is None or self._stop.is_set():
                return False
            result = self.stage.finish(one, out=slot.tensor)
            self.ring.filled(slot)
            self._items.put((_BATCH, key, (result, slot)))
        return not self._stop.is_set()

    def _decoded_ahead(self, batches: Iterator[Any]) -> Iterator[DecodedBatch]:
        """`stage.decode` of `batches`, run on a second thread (on this feeder's stream) one batch ahead of the
        caller, which crops and resizes: the decoder's call for batch n+1 (the GIL released) overlaps the crop of
        batch n and the taking of the workers' batches. Its errors are raised here, in batch order."""
        ahead: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
        done = threading.Event()  # the caller is gone (its pass ended, failed or was stopped)

        def put(item: tuple[str, Any]) -> bool:
            while not (done.is_set() or self._stop.is_set()):
                with contextlib.suppress(queue.Full):
                    ahead.put(item, timeout=0.1)
                    return True
            return False

        def run() -> None:
            _block_ctrl_c()
            try:
                with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
                    for batch in batches:
                        if not put((_BATCH, self.stage.decode(batch))):
                            return
            except BaseException as exc:  # raised by the caller, after the batches decoded before it
                put((_ERROR, exc))
                return
            put((_END, None))

        thread = threading.Thread(target=run, name="fastdata-device-decode", daemon=True)
        thread.start()
        try:
            while not self._stop.is_set():
                try:
                    kind, payload = ahead.get(timeout=0.1)
                except queue.Empty:
                    if not thread.is_alive() and ahead.empty() and not self._stop.is_set():
                        raise RuntimeError("the device decode thread ended without a word") from None
                    continue
                if kind == _ERROR:
                    raise payload
                if kind == _END:
                    return
                yield payload
        finally:  # the workers' iterator is this pass's alone: the thread is gone before another pass opens it
            done.set()
            thread.join()

    def close(self) -> None:
        """Stop the thread and wait for it (it finishes the batch it is making, or the workers' next batch)."""
        self._stop.set()
        self.ring.stop()
        if threading.current_thread() is self._thread:  # a finaliser run by the garbage collector on this thread
            return
        while self._thread.is_alive():
            self._thread.join(timeout=0.1)
        self._upcoming.clear()
        atexit.unregister(self._closer)


def _timed(batches: Iterator[T], timings: dict[str, float]) -> Iterator[T]:
    """`batches`, adding the seconds each `next` waited (for the workers) to `timings["workers"]`; closes
    `batches` when closed itself."""
    iterator = iter(batches)
    try:
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                timings["workers"] += time.perf_counter() - started
            yield batch
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _block_ctrl_c() -> None:
    """Block SIGINT on a feeder thread: Ctrl-C is the training thread's; workers forked from here inherit the block
    and drop the signal."""
    if threading.current_thread() is not threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def strong(target: Any) -> Callable[[], Any]:
    """A reference to `target` that always holds (for callers without a loader to keep collectable)."""
    return lambda: target


def _close_if_alive(feeder: weakref.ref[DeviceFeeder]) -> None:
    alive = feeder()
    if alive is not None:
        alive.close()
