"""`Ahead`: the device path's one background-thread primitive. `work(item)` runs for each item of a source on a
thread of its own, at most `depth` results ahead of the one thread that iterates the `Ahead`.

The feeder is two of them in a row (fastdata.image.device.feeder): the decode thread over the workers' batches,
the resize thread over the decode thread's results. Every guarantee the feeder relies on is here, once, and is
what tests/image/device/test_device_ahead.py checks:

1. Order. Results come in the source's order, each exactly once. An exception raised by the source or by `work`
   comes after the results before it, with its own type and traceback, and ends the iteration.
2. Bound. At most `depth` results wait to be taken; the thread then waits to put the next one (and notices
   `stop()` while it waits).
3. Ending. `stop()` only asks: the caller's next `next()` ends the iteration, and the thread ends after its current
   `work` call (or the source's current `next`). After `close()` returns, the thread has ended: `work` is never
   called again, and the source was closed on the thread that iterated it (a generator's `finally` ran there).
   `close()` called on the thread itself (a finaliser the garbage collector ran there) only asks.
4. Nothing is lost. Every result of `work` is either taken by the caller or handed to `discard` (a result that was
   waiting when the iteration ended, or that the thread could not put once stopped), so that whatever it holds
   (a decoder's buffers, a device event) is given back.
5. Accounts. The thread's seconds in `work` (`busy_s`), waiting for the source (`waited_source_s`) and waiting for
   room to put (`waited_room_s`), written by the thread alone; `state` says what it is doing now ("source",
   "work", "room" or "ended").

Ctrl-C stays with the caller's thread: the thread blocks SIGINT, and the caller's waits are timed, so that a
KeyboardInterrupt raised in the caller reaches it while it waits.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")

_RESULT, _ERROR, _END = "result", "error", "end"


class Ahead(Generic[T]):
    """Runs `work` over `source` on a thread named `name`, up to `depth` results ahead (see the module's docstring),
    once `start()`ed. `poll_s`: how often a waiting caller looks whether the thread is still alive (and lets
    Ctrl-C in)."""

    def __init__(self, source: Iterable[S], work: Callable[[S], T], depth: int, name: str,
                 discard: Callable[[T], None] | None = None, poll_s: float = 0.1) -> None:
        if depth < 1:
            raise ValueError(f"Ahead needs a depth of at least 1, got {depth}")
        self.name = name
        self.busy_s = self.waited_source_s = self.waited_room_s = 0.0
        self.state = "source"
        self._work = work
        self._discard = discard
        self._poll_s = poll_s
        self._items: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._ended = False  # the caller's side: nothing more will be returned
        self._thread = threading.Thread(target=self._run, args=(source,), name=name, daemon=True)

    def start(self) -> Ahead[T]:
        """Start the thread (once); returns this `Ahead`."""
        self._thread.start()
        return self

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        while not self._ended:
            try:
                kind, payload = self._items.get(timeout=self._poll_s)
            except queue.Empty:
                if self._stop.is_set():
                    self._end()
                elif not self._thread.is_alive() and self._items.empty():
                    self._end()
                    raise RuntimeError(f"the {self.name} thread ended without a word") from None
                continue
            if self._stop.is_set() and kind == _RESULT:
                self._give_up(payload)
                self._end()
            elif kind == _RESULT:
                return payload
            elif kind == _ERROR:
                self._end()
                raise payload
            else:
                self._end()
        raise StopIteration

    def stop(self) -> None:
        """Ask the thread to end (see the module's docstring, 3); returns at once."""
        self._stop.set()

    def close(self) -> None:
        """Stop the thread and wait until it has ended; hand what is left to `discard`. Idempotent."""
        self._stop.set()
        if threading.current_thread() is self._thread:
            return
        while self._thread.ident is not None and self._thread.is_alive():  # timed: Ctrl-C reaches the caller
            self._thread.join(timeout=self._poll_s)
        self._end()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def waiting(self) -> int:
        """Results (or the end) waiting to be taken."""
        return self._items.qsize()

    def on_its_thread(self) -> bool:
        """Whether the caller runs on this `Ahead`'s own thread."""
        return threading.current_thread() is self._thread

    def _end(self) -> None:
        self._ended = True
        while True:  # the results nobody will take now
            try:
                kind, payload = self._items.get_nowait()
            except queue.Empty:
                return
            if kind == _RESULT:
                self._give_up(payload)

    def _give_up(self, result: Any) -> None:
        if self._discard is not None:
            self._discard(result)

    def _put(self, item: tuple[str, Any]) -> bool:
        """Put `item`, waiting for room; False when stopped first."""
        self.state = "room"
        started = time.perf_counter()
        try:
            while not self._stop.is_set():
                with contextlib.suppress(queue.Full):
                    self._items.put(item, timeout=self._poll_s)
                    return True
            return False
        finally:
            self.waited_room_s += time.perf_counter() - started

    def _run(self, source: Iterable[Any]) -> None:
        block_ctrl_c()
        iterator = iter(source)
        try:
            while not self._stop.is_set():
                self.state = "source"
                started = time.perf_counter()
                try:
                    item = next(iterator)
                except StopIteration:
                    self._put((_END, None))
                    return
                finally:
                    self.waited_source_s += time.perf_counter() - started
                if self._stop.is_set():
                    return
                self.state = "work"
                started = time.perf_counter()
                try:
                    result = self._work(item)
                finally:
                    self.busy_s += time.perf_counter() - started
                del item
                if not self._put((_RESULT, result)):
                    self._give_up(result)
                    return
                del result
        except BaseException as exc:  # forwarded: raised by the caller after the results before it
            self._put((_ERROR, exc))
        finally:
            self.state = "ended"
            close = getattr(iterator, "close", None)
            if close is not None:
                close()


def block_ctrl_c() -> None:
    """Block SIGINT on a background thread: Ctrl-C is the training thread's; worker processes forked from such a
    thread inherit the block and drop the signal."""
    if threading.current_thread() is not threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
