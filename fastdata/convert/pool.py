"""The local conversion engine: worker processes, forked where the platform allows (so they start in milliseconds,
inheriting the job instead of unpickling it, and import nothing the parent has not), each sent ranges of
positions ("chunks") whose size follows the measured cost per item, their results handed back in position order.

Each worker keeps two chunks in hand (one in work, one queued) and sends its results from a thread of its own, so it
never waits for the parent; the parent only reads results and gives out the next chunk, and measures how long it
waited for the next result in order (`PoolStats.waited`): the share of the run its writer stood idle.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Protocol

from fastdata.errors import WorkerError


class ChunkJob(Protocol):
    """What the workers run: positions start..stop-1 -> a result whose `results` has one entry per position."""

    def run_chunk(self, start: int, stop: int) -> Any:
        ...


@dataclass
class PoolStats:
    """What a run of the pool measured: items done, the seconds the consumer waited for the next chunk in order,
    and the workers' own seconds (wall and CPU) on the items."""

    items: int = 0
    waited: float = 0.0
    worker_seconds: float = 0.0
    worker_cpu_seconds: float = 0.0


class ChunkSizer:
    """Chunk sizes from the measured time per item: a probe of `probe` items first, then chunks of about
    `target_seconds` of work (never above `largest`), and never more than an even share of what is left among the
    workers' queues, so that the last chunks end together rather than one worker finishing alone."""

    def __init__(self, workers: int, target_seconds: float = 0.03, probe: int = 2, largest: int = 1024) -> None:
        self.workers = workers
        self.target_seconds = target_seconds
        self.probe = probe
        self.largest = largest
        self.items = 0
        self.seconds = 0.0

    def observe(self, items: int, seconds: float) -> None:
        self.items += items
        self.seconds += seconds

    def next_size(self, remaining: int) -> int:
        if not self.items:
            size = self.probe
        else:
            per_item = max(self.seconds / self.items, 1e-6)
            size = min(self.largest, max(1, round(self.target_seconds / per_item)))
        fair_share = -(-remaining // (2 * self.workers))  # two chunks in hand per worker
        return max(1, min(size, fair_share, remaining))


def start_method() -> str:
    """"fork" where the platform offers it (not macOS, whose system libraries may not survive a fork), else the
    platform's default."""
    methods = multiprocessing.get_all_start_methods()
    return "fork" if "fork" in methods and sys.platform != "darwin" else methods[0]


def chunk_results(job: ChunkJob, start: int, stop: int, workers: int, stats: PoolStats,
                  sizer: ChunkSizer | None = None, worker_init: Callable[[], None] | None = None
                  ) -> Iterator[Any]:
    """`job.run_chunk` over positions start..stop-1 in chunks, on `workers` processes (1: in this process), the
    results in position order."""
    sizer = sizer or ChunkSizer(workers)
    if workers <= 1:
        position = start
        while position < stop:
            result = job.run_chunk(position, position + (size := sizer.next_size(stop - position)))
            _count(stats, sizer, result, size)
            position += size
            yield result
        return
    with _Workers(job, workers, worker_init) as pool:
        yield from pool.results(start, stop, sizer, stats)


def _count(stats: PoolStats, sizer: ChunkSizer, result: Any, items: int) -> None:
    sizer.observe(items, result.seconds)
    stats.items += items
    stats.worker_seconds += result.seconds
    stats.worker_cpu_seconds += result.cpu_seconds


@dataclass
class _Failure:
    """A chunk that raised: the exception (when it pickles) and its traceback text."""

    error: BaseException | None
    text: str


def _serve(job: ChunkJob, conn: Any, worker_init: Callable[[], None] | None) -> None:
    """A worker's loop: run each chunk it is sent; a thread sends the results, so the next chunk starts while the
    parent has not read the last one yet."""
    # Ctrl-C reaches every process of the terminal's process group: the parent handles it (it stops the workers and
    # says how to resume); a worker left to it would print its own traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if worker_init is not None:
        worker_init()
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def send_all() -> None:
        while (message := outbox.get()) is not None:
            conn.send(message)

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    try:
        while (task := conn.recv()) is not None:
            try:
                outbox.put(job.run_chunk(*task))
            except BaseException as exc:  # handed to the parent, which raises it
                text = traceback.format_exc()
                try:
                    pickle.dumps(exc)
                except Exception:
                    exc = None
                outbox.put(_Failure(exc, text))
    except (EOFError, OSError):  # the parent went away
        pass
    finally:
        outbox.put(None)
        sender.join()


class _Workers:
    """`workers` processes serving one job."""

    def __init__(self, job: ChunkJob, workers: int, worker_init: Callable[[], None] | None) -> None:
        context = multiprocessing.get_context(start_method())
        self.connections: list[Any] = []
        self.processes: list[Any] = []
        # Ctrl-C is held back while the workers start: one that came in the middle would leave the workers
        # started so far running on, and a worker it reached before it ignores SIGINT would die
        interactive = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for _ in range(workers):
                parent_end, child_end = context.Pipe(duplex=True)
                process = context.Process(target=_serve, args=(job, child_end, worker_init), daemon=True)
                process.start()
                child_end.close()
                self.connections.append(parent_end)
                self.processes.append(process)
        except BaseException:
            self.close()
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, interactive)  # a Ctrl-C that came meanwhile lands here

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        self.close(graceful=kind is None)

    def results(self, start: int, stop: int, sizer: ChunkSizer, stats: PoolStats) -> Iterator[Any]:
        next_position, emit = start, start
        in_hand: list[deque[tuple[int, int]]] = [deque() for _ in self.connections]
        done: dict[int, Any] = {}
        owner = {conn: i for i, conn in enumerate(self.connections)}
        owner.update({process.sentinel: i for i, process in enumerate(self.processes)})

        def give_out(worker: int) -> None:
            nonlocal next_position
            size = sizer.next_size(stop - next_position)
            self.connections[worker].send((next_position, next_position + size))
            in_hand[worker].append((next_position, next_position + size))
            next_position += size

        for _ in range(2):
            for worker in range(len(self.connections)):
                if next_position < stop:
                    give_out(worker)
        while emit < stop:
            if emit in done:
                result = done.pop(emit)
                emit += len(result.results)
                yield result
                continue
            waiting_since = time.perf_counter()
            ready = wait([*self.connections, *(p.sentinel for p in self.processes)])
            stats.waited += time.perf_counter() - waiting_since
            for handle in ready:
                worker = owner[handle]
                if handle is not self.connections[worker]:
                    if not self.connections[worker].poll():  # died (its last words, if any, are read first)
                        self._died(worker, in_hand[worker])
                    continue
                message = self.connections[worker].recv()
                if isinstance(message, _Failure):
                    if message.error is not None:
                        raise message.error
                    raise WorkerError(f"a conversion worker failed:\n{message.text}")
                chunk_start, chunk_stop = in_hand[worker].popleft()
                _count(stats, sizer, message, chunk_stop - chunk_start)
                done[message.start] = message
                if next_position < stop:
                    give_out(worker)

    def _died(self, worker: int, in_hand: deque[tuple[int, int]]) -> None:
        process = self.processes[worker]
        process.join(1)
        code = process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        where = f" while converting write positions {in_hand[0][0]}..{in_hand[0][1] - 1}" if in_hand else ""
        raise WorkerError(f"a conversion worker (pid {process.pid}) died ({how}){where}; out of memory, or a "
                          "crash in an image library. Run the same command again to resume")

    def close(self, graceful: bool = False) -> None:
        """Stop the workers: asked to end when all went well (terminated if they do not), terminated at once
        otherwise (an error, Ctrl-C: results they may still be sending are not wanted)."""
        if graceful:
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.send(None)
        deadline = time.monotonic() + (2.0 if graceful else 0.0)
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join()
        for conn in self.connections:
            conn.close()
