"""The life of a loader's worker processes, shared by the image and the text loader (and the conversion pools for
Ctrl-C): how a pass starts them with Ctrl-C held back (`ctrl_c_held`), how a worker leaves Ctrl-C to the main
process (`worker_ignores_ctrl_c`), and how a failed pass stops them and raises the worker's own error
(`WorkerPass`, `failed_pass`).

Why it matters: a Ctrl-C reaches every process of the terminal's group; a worker's traceback, a start-up broken
in the middle or a failed iterator left to the garbage collector each print noise or leave processes behind.
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastdata.errors import FastdataError, from_worker


class WorkerPass:
    """The passes of a torch DataLoader's workers, for a loader's pass loop:

        workers = WorkerPass(dataloader)          # once per loader
        with workers.running():                   # each pass
            for batch in workers.start():
                ...

    `start` starts the workers with Ctrl-C held (`ctrl_c_held`; the first pass of persistent workers forks them).
    A failure inside `running` stops them (`stop_workers`) and is raised as the worker raised our own error (its
    one-line message first, torch's wrapper as the cause); a caller that stops early (GeneratorExit) keeps
    persistent workers for the next pass. `start` may run on another thread than `running` (the device path's
    feeder starts the next pass ahead)."""

    def __init__(self, dataloader: Any) -> None:
        self.dataloader = dataloader
        self.iterator: Any = None  # the DataLoader iterator of the latest pass started

    def start(self) -> Iterator[Any]:
        """The workers' batches of a new pass, the workers started with Ctrl-C held."""
        with ctrl_c_held():  # workers start here (the first pass of persistent ones)
            self.iterator = iter(self.dataloader)
        return self.iterator

    @contextmanager
    def running(self, cleanup: Callable[[], None] | None = None) -> Iterator[WorkerPass]:
        """One pass's failures handled as above; `cleanup` runs first whenever the pass ends by an exception,
        early stops included (the device path stops its feeder thread, which reads the workers' batches)."""
        try:
            yield self
        except GeneratorExit:
            if cleanup is not None:
                cleanup()
            raise
        except BaseException as exc:
            if cleanup is not None:
                cleanup()
            original = failed_pass(self.dataloader, self.iterator, exc)
            if original is not exc:
                raise original from exc  # our own message first, the worker's traceback as the cause
            raise

    def close(self) -> None:
        """End the worker processes (persistent ones stay between passes otherwise); a later pass starts new ones."""
        for batches in {getattr(self.dataloader, "_iterator", None), self.iterator} - {None}:
            stop_workers(self.dataloader, batches)
        self.iterator = None


class ClosesWorkers:
    """Mixin for loaders that own a `WorkerPass` (`_workers`): `close()` ends their worker processes (and what
    else the loader runs beside them), and `with fastdata.loader(...) as loader:` closes at the block's end. A
    closed loader may still be iterated: its next pass starts new workers."""

    _workers: WorkerPass

    def close(self) -> None:
        """End the worker processes now, rather than when the loader is collected or the interpreter exits."""
        self._workers.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def stop_workers(dataloader: Any, batches: Any) -> None:
    """End the worker processes behind `batches` (an iterator of `dataloader`, a torch DataLoader) after a pass
    failed, and drop the iterator the DataLoader keeps for persistent workers; the next pass starts new ones.
    Left to the garbage collector instead, the failed iterator may be collected inside the worker processes of a
    loader made later (they inherit it when they fork), where its shutdown prints "Exception ignored in ...
    can only test a child process"."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    if getattr(dataloader, "_iterator", None) is batches:
        dataloader._iterator = None


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back while worker processes start (a loader's first `iter()`, a conversion's pool): a
    Ctrl-C reaches every process of the terminal's group, and one that reached a worker before it entered its loop
    would print the worker's own traceback, or one that broke into the start-up would leave some workers started.
    Two holds, because one alone leaks: the mask, which the workers inherit and clear once they ignore SIGINT
    (`worker_ignores_ctrl_c`); and, in this process, a handler that only notes the signal (any native thread that
    does not block SIGINT, such as torch's or OpenMP's, takes it despite the main thread's mask, and Python runs
    its handler in the main thread all the same). When the block ends, a Ctrl-C that came meanwhile is raised here,
    through the handler that was in place before (and the workers started are then stopped, as after any failed
    start or pass). In a thread other than the main one, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous_handler = signal.getsignal(signal.SIGINT)
    noting = previous_handler is not None  # None: a handler set outside Python, which cannot be put back
    if noting:
        signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if noting:
            signal.signal(signal.SIGINT, previous_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)  # one pending for this thread lands here
        if came:
            signal.raise_signal(signal.SIGINT)


def worker_ignores_ctrl_c() -> None:
    """In a DataLoader worker: leave Ctrl-C to the main process, which stops the workers (a SIGINT held back while
    the worker started is dropped here)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    sys.excepthook = functools.partial(_quiet_hand_over, sys.excepthook)


#: The GIL switch interval of fastdata's DataLoader workers, seconds (Python's default: 0.005).
WORKER_SWITCH_INTERVAL = 0.0005


def prepare_worker() -> None:
    """What every fastdata DataLoader worker does first (the loaders' `worker_init_fn`): leave Ctrl-C to the main
    process and hand batches over quickly."""
    worker_ignores_ctrl_c()
    worker_hands_over_quickly()


def worker_hands_over_quickly() -> None:
    """In a DataLoader worker: let the worker's other threads take the GIL within half a millisecond instead of
    five. A batch's shared memory reaches the main process through a handshake with the worker's resource sharer
    thread (a few GIL hand-offs each), which otherwise waits for the worker's main thread to give up the GIL while
    it makes the next batch in Python: the main process's thread that takes batches (the device path's feeder)
    waits with it (benchmarks/device_handover.py). The interval matters only while another thread of the worker
    wants the GIL."""
    sys.setswitchinterval(WORKER_SWITCH_INTERVAL)


def _quiet_hand_over(previous: Callable[..., None], kind: type[BaseException], value: BaseException,
                     trace: Any) -> None:
    """A worker's `sys.excepthook`: a batch's shared memory is handed to the main process by multiprocessing's
    resource sharer (a thread of the worker, which reports its errors through this hook); when Ctrl-C stops the
    main process in the middle of taking one, that thread's connection breaks, which is no error of the run (the
    main process says it was interrupted): nothing is printed for it. Anything else goes to the `previous` hook."""
    if issubclass(kind, (EOFError, ConnectionError)) and any(
            frame.filename.endswith("resource_sharer.py") for frame in traceback.extract_tb(trace)):
        return
    previous(kind, value, trace)


def new_shared(shape: tuple[int, ...], dtype: Any = None) -> Any:
    """An uninitialised tensor (uint8 unless `dtype`) in a fresh shared-memory segment, made there directly (the
    private call torch's default_collate makes; share_memory_() would fill an ordinary tensor first and copy it)."""
    import math

    import torch

    dtype = torch.uint8 if dtype is None else dtype
    try:
        storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(math.prod(shape))
        return torch.empty(0, dtype=dtype).set_(storage).view(shape)
    except AttributeError:  # pragma: no cover
        return torch.empty(shape, dtype=dtype).share_memory_()


def failed_pass(dataloader: Any, batches: Any, exc: BaseException) -> BaseException:
    """After `exc` ended a pass over `batches`: stop the workers (`stop_workers`) and return what to raise, our
    own error as the worker raised it (`fastdata.errors.from_worker`: its one-line message, not torch's wrapper),
    or `exc` itself."""
    stop_workers(dataloader, batches)
    return from_worker(exc) if isinstance(exc, FastdataError) else exc
