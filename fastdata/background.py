"""Background threads, one way for all of them: `Background`, a thread that runs a loop until its owner stops it,
and `Ahead`, a `Background` that runs `work(item)` for each item of a source, at most `depth` results ahead of the
one thread that iterates it (torchdata's `_SingleThreadedMapper` is the model).

Who uses them: the device feeder's decode and resize threads (two `Ahead`s in a row,
fastdata.image.device.feeder), the text conversion's reader (`Ahead`, fastdata.convert.text_source), a conversion
worker's chunk runner (`Ahead`, fastdata.convert.engines.pool), the meter's system sampler and a shard assembler's
watch on its parent (`Background`s). The invariant, each clause checked by tests/test_background.py:

1. Owner. Whoever made it owns the thread and alone stops it. `stop()` only asks (the loop sees its `stopping`
   event; an `Ahead` ends after its current `work` call or the source's current `next`). `close()` asks and waits
   until the thread has ended; it is idempotent, and called on the thread itself (a finaliser the garbage collector
   ran there) it only asks. Every wait of the owner's is timed, so that Ctrl-C reaches an owner that waits.
2. Exit. The thread is a daemon: it never holds up the interpreter's exit (a thread stuck in a read of a stalled
   disk or pipe must not hang it). An owner whose thread holds something that must be given back closes it itself:
   in a `finally`, a `with` block (both classes are context managers: start on entry, close on exit) or an
   `atexit` hook of its own (the feeder's). Ctrl-C stays with the owner: the thread blocks SIGINT (worker
   processes forked from it inherit the block and drop the signal).
3. Errors reach the owner, with their own type and traceback. A `Background` loop's exception ends the thread and
   is raised by the owner's next `close()` (once). An `Ahead` hands an exception of the source or of `work` to the
   consumer: its `next()` raises it after the results before it, and the iteration ends. One the thread hit after
   `stop()` (nobody takes results any more), or one the source's `close()` raised, is raised by `close()`.
4. Bound (`Ahead`). At most `depth` results wait to be taken; the thread then waits for room, and notices `stop()`
   while it waits, so that `close()` returns even when nobody takes anything.
5. Order, nothing lost or duplicated (`Ahead`). Results come in the source's order, each exactly once. Every result
   of `work` is either taken by the consumer or handed to `discard` (one waiting when the iteration ended, or one
   the thread could not put once stopped), so that whatever it holds (a decoder's buffers, a device event) is
   given back. An item the thread took from the source after `stop()` is not worked on (`work` is never called
   once `stop()` was seen).
6. Ending (`Ahead`). After `stop()` the consumer's next `next()` ends the iteration. After `close()` returns, the
   thread has ended and the source was closed on the thread that iterated it (a generator's `finally` ran there).
   A consumer that stops early (a `break` out of a `with` block, an exception) so stops the producer.
7. Accounts (`Ahead`). The thread's seconds in `work` (`busy_s`), waiting for the source (`waited_source_s`) and
   waiting for room (`waited_room_s`), written by the thread alone; `state` says what it does now ("source",
   "work", "room" or "ended").
"""

from __future__ import annotations

import contextlib
import functools
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")

_RESULT, _ERROR, _END = "result", "error", "end"


class Background:
    """`loop(stopping)` on a daemon thread named `name`, once `start()`ed, until it returns; `stopping` is set by
    `stop()` and `close()` (see the module's docstring). `poll_s`: how often a waiting owner lets Ctrl-C in."""

    def __init__(self, loop: Callable[[threading.Event], None], name: str, poll_s: float = 0.1) -> None:
        self.name = name
        self.stopping = threading.Event()
        self._loop = loop
        self._poll_s = poll_s
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Background:
        """Start the thread (once); returns this `Background`."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the loop to end (its `stopping` event); returns at once."""
        self.stopping.set()

    def close(self) -> None:
        """Stop the thread and wait until it has ended; raise what its loop raised (once). Idempotent; on the
        thread itself it only asks."""
        self.stopping.set()
        if self.on_its_thread():
            return
        while self._thread.ident is not None and self._thread.is_alive():  # timed: Ctrl-C reaches the owner
            self._thread.join(timeout=self._poll_s)
        error, self._error = self._error, None
        if error is not None:
            raise error

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def on_its_thread(self) -> bool:
        """Whether the caller runs on this thread."""
        return threading.current_thread() is self._thread

    def __enter__(self) -> Background:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self) -> None:
        block_ctrl_c()
        try:
            self._loop(self.stopping)
        except BaseException as exc:  # kept for the owner's close()
            self._error = exc


class Ahead(Generic[T]):
    """Runs `work` over `source` on a `Background` thread named `name`, up to `depth` results ahead (see the
    module's docstring), once `start()`ed; `discard` gets each result nobody will take. `poll_s`: how often a
    waiting consumer looks whether the thread is still alive (and lets Ctrl-C in)."""

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
        self._ended = False  # the consumer's side: nothing more will be returned
        self._thread = Background(functools.partial(self._run, source), name, poll_s)
        self._stop = self._thread.stopping

    def start(self) -> Ahead[T]:
        """Start the thread (once); returns this `Ahead`."""
        self._thread.start()
        return self

    def __enter__(self) -> Ahead[T]:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        while not self._ended:
            try:
                kind, payload = self._items.get(timeout=self._poll_s)
            except queue.Empty:
                if self._stop.is_set():
                    self._end()
                elif not self._thread.alive and self._items.empty():
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
        """Ask the thread to end (see the module's docstring, 6); returns at once."""
        self._stop.set()

    def close(self) -> None:
        """Stop the thread and wait until it has ended; hand what is left to `discard`; raise what the thread hit
        that nobody took (3). Idempotent; on the thread itself it only asks."""
        if self._thread.on_its_thread():
            self._stop.set()
            return
        try:
            self._thread.close()
        finally:
            self._end()

    @property
    def alive(self) -> bool:
        return self._thread.alive

    @property
    def waiting(self) -> int:
        """Results (or the end) waiting to be taken."""
        return self._items.qsize()

    def on_its_thread(self) -> bool:
        """Whether the caller runs on this `Ahead`'s own thread."""
        return self._thread.on_its_thread()

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

    def _run(self, source: Iterable[Any], stopping: threading.Event) -> None:
        iterator = iter(source)
        try:
            while not stopping.is_set():
                self.state = "source"
                started = time.perf_counter()
                try:
                    item = next(iterator)
                except StopIteration:
                    self._put((_END, None))
                    return
                finally:
                    self.waited_source_s += time.perf_counter() - started
                if stopping.is_set():
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
        except BaseException as exc:  # forwarded: raised by the consumer after the results before it
            if not self._put((_ERROR, exc)):
                raise  # stopped: nobody takes it; the owner's close() raises it
        finally:
            self.state = "ended"
            close = getattr(iterator, "close", None)
            if close is not None:
                close()


def block_ctrl_c() -> None:
    """Block SIGINT on a background thread: Ctrl-C is the owner's; worker processes forked from such a thread
    inherit the block and drop the signal."""
    if threading.current_thread() is not threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
