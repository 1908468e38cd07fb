"""The local conversion engine: worker processes, forked where the platform allows (so they start in milliseconds,
inheriting the job instead of unpickling it, and import nothing the parent has not), each sent ranges of
positions ("chunks") whose size follows the measured cost per item, their results handed back in position order.

Each worker keeps two chunks in hand (one in work, one queued) and runs them on a thread of its own while its main
thread sends the results, so it never waits for the parent; the parent only reads results and gives out the next
chunk, and measures how long it waited for the next result in order (`PoolStats.waited`): the share of the run its
writer stood idle.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Protocol

from fastdata.background import Ahead
from fastdata.convert.engines.messages import out_of_band, receive, send
from fastdata.errors import WorkerError
from fastdata.processes import exit_description, stop_processes
from fastdata.workers import ctrl_c_held


class ChunkJob(Protocol):
    """What the workers run: positions start..stop-1 -> a result whose `results` has one entry per position."""

    def run_chunk(self, start: int, stop: int) -> Any:
        ...


class TaskJob(Protocol):
    """What `Workers` run: `run_chunk(*task)` for each task, a tuple of arguments of the job's own choosing."""

    def run_chunk(self, *task: Any, **_: Any) -> Any:
        ...


@dataclass
class PoolStats:
    """What a run of the pool measured: items done, the seconds the consumer waited for the next chunk in order,
    and the workers' own seconds (wall and CPU) on the items."""

    items: int = 0
    waited: float = 0.0
    worker_seconds: float = 0.0
    worker_cpu_seconds: float = 0.0
    seconds: float = 0.0  # the writing's wall time (what `waited` is a share of, as the progress bar shows it)


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
                  sizer: ChunkSizer | None = None, worker_init: Callable[[], None] | None = None,
                  keep_shared: bool = False) -> Iterator[Any]:
    """`job.run_chunk` over positions start..stop-1 in chunks, on `workers` processes (1: in this process), the
    results in position order. With `keep_shared`, a result that came through shared memory gets it as its
    `shared` attribute (`fastdata.convert.engines.messages.SharedMemory`), for a writer that hands its bytes on."""
    sizer = sizer or ChunkSizer(workers)

    def ranges() -> Iterator[tuple[int, int]]:
        position = start
        while position < stop:  # sized when given out, from what the chunks done so far measured
            size = sizer.next_size(stop - position)
            yield position, position + size
            position += size

    if workers <= 1:
        for task in ranges():
            result = job.run_chunk(*task)
            _count(stats, sizer, result, task[1] - task[0])
            yield result
        return
    with Workers(job, workers, worker_init, keep_shared=keep_shared) as pool:
        for (chunk_start, chunk_stop), result in pool.results(ranges(), stats, ahead=8):
            sizer.observe(chunk_stop - chunk_start, result.seconds)
            yield result


def _count(stats: PoolStats, sizer: ChunkSizer | None, result: Any, items: int) -> None:
    if sizer is not None:
        sizer.observe(items, result.seconds)
    stats.items += items
    stats.worker_seconds += result.seconds
    stats.worker_cpu_seconds += result.cpu_seconds


@dataclass
class _Failure:
    """A chunk that raised: the exception (when it pickles) and its traceback text."""

    error: BaseException | None
    text: str


def _serve(job: TaskJob, conn: Any, worker_init: Callable[[], None] | None, parent_end: Any = None) -> None:
    """A worker's loop: run each chunk it is sent, on a thread (`fastdata.background.Ahead`) up to two chunks ahead
    of this one, which sends the results, so the next chunk runs while the parent has not read the last one yet."""
    # Ctrl-C reaches every process of the terminal's process group: the parent handles it (it stops the workers and
    # says how to resume); a worker left to it would print its own traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if parent_end is not None:  # forked: the parent's end of this worker's pipe came along; held here, a killed
        parent_end.close()      # parent's end would never close, and the worker would wait for it forever
    if worker_init is not None:
        worker_init()

    def tasks() -> Iterator[tuple[int, tuple]]:
        while (message := receive(conn)) is not None:  # None: the parent has no more
            yield message

    def run(message: tuple[int, tuple]) -> tuple[int, Any]:
        sequence, task = message
        try:
            result = job.run_chunk(*task)
        except BaseException as exc:  # handed to the parent, which raises it
            text = traceback.format_exc()
            error: BaseException | None = exc
            try:
                pickle.dumps(exc)
            except Exception:
                error = None
            return sequence, _Failure(error, text)
        if isinstance(getattr(result, "results", None), list):  # the large byte strings go out of band
            result.results = out_of_band(result.results)
        return sequence, result

    with Ahead(tasks(), run, depth=2, name="fastdata-chunk-runner") as results:
        try:
            for message in results:
                send(conn, message)
        except (EOFError, OSError):  # the parent went away
            pass


class Workers:
    """`workers` processes serving one job, each sent tasks (tuples of arguments of `job.run_chunk`)."""

    def __init__(self, job: TaskJob, workers: int, worker_init: Callable[[], None] | None = None,
                 describe: Callable[[tuple], str] = lambda task: f"write positions {task[0]}..{task[1] - 1}",
                 keep_shared: bool = False, role: str = "conversion",
                 after_death: str = "Run the same command again to resume") -> None:
        self.describe = describe
        self.role, self.after_death = role, after_death  # what the workers are, in errors; what to do after one died
        self.keep_shared = keep_shared
        context = multiprocessing.get_context(start_method())
        self.connections: list[Any] = []
        self.processes: list[Any] = []
        self.scratch = [bytearray() for _ in range(workers)]  # each worker's receive buffer
        # Ctrl-C is held back while the workers start: one that came in the middle would leave the workers
        # started so far running on, and a worker it reached before it ignores SIGINT would die
        try:
            with ctrl_c_held():  # a Ctrl-C that comes meanwhile is raised once all are started
                for _ in range(workers):
                    parent_end, child_end = context.Pipe(duplex=True)
                    inherited = parent_end if context.get_start_method() == "fork" else None
                    process = context.Process(  # type: ignore[attr-defined]  # every start method's context has it
                        target=_serve, args=(job, child_end, worker_init, inherited), daemon=True)
                    process.start()
                    child_end.close()
                    self.connections.append(parent_end)
                    self.processes.append(process)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        self.close(graceful=kind is None)

    def results(self, tasks: Iterator[tuple], stats: PoolStats, ahead: int = 8) -> Iterator[tuple[tuple, Any]]:
        """(task, `job.run_chunk(*task)`) for every task, in task order. Each worker holds two tasks; at most
        `ahead` tasks per worker are given out beyond the oldest one not yet handed back (which a slow task
        holds up), bounding the results kept waiting for it."""
        tasks = iter(tasks)
        in_hand: list[deque[int]] = [deque() for _ in self.connections]
        given: dict[int, tuple] = {}  # sequence number -> task, until handed back
        done: dict[int, Any] = {}
        owner = {conn: i for i, conn in enumerate(self.connections)}
        owner.update({process.sentinel: i for i, process in enumerate(self.processes)})
        next_sequence = emit = 0
        exhausted = False
        budget = ahead * len(self.connections)

        def refill() -> None:
            nonlocal next_sequence, exhausted
            for worker, held in enumerate(in_hand):
                while not exhausted and len(held) < 2 and next_sequence - emit < budget:
                    task = next(tasks, None)
                    if task is None:
                        exhausted = True
                        break
                    send(self.connections[worker], (next_sequence, task))
                    held.append(next_sequence)
                    given[next_sequence] = task
                    next_sequence += 1

        refill()
        while emit < next_sequence or not exhausted:
            if emit in done:
                result = done.pop(emit)
                task = given.pop(emit)
                emit += 1
                refill()
                yield task, result
                continue
            if emit == next_sequence:  # nothing given out (an empty task list)
                refill()
                continue
            waiting_since = time.perf_counter()
            ready = wait([*self.connections, *(p.sentinel for p in self.processes)])
            stats.waited += time.perf_counter() - waiting_since
            for handle in ready:
                worker = owner[handle]
                if handle is not self.connections[worker]:
                    if not self.connections[worker].poll():  # died (its last words, if any, are read first)
                        self._died(worker, [given[n] for n in in_hand[worker]])
                    continue
                shared: list[Any] | None = [] if self.keep_shared else None
                try:
                    sequence, message = receive(self.connections[worker], self.scratch[worker], shared)
                except (EOFError, OSError):  # its end closed: it died
                    self._died(worker, [given[n] for n in in_hand[worker]])
                if shared and hasattr(message, "shared"):
                    message.shared = shared[0]
                if isinstance(message, _Failure):
                    if message.error is not None:
                        raise message.error
                    raise WorkerError(f"a {self.role} worker failed:\n{message.text}")
                in_hand[worker].remove(sequence)
                _count(stats, None, message, len(message.results))
                done[sequence] = message
            refill()

    def _died(self, worker: int, in_hand: list[tuple]) -> None:
        process = self.processes[worker]
        how = exit_description(process)
        where = f" while working on {self.describe(in_hand[0])}" if in_hand else ""
        raise WorkerError(f"a {self.role} worker (pid {process.pid}) died ({how}){where}; out of memory, or a "
                          f"crash in a library. {self.after_death}")

    def close(self, graceful: bool = False) -> None:
        """Stop the workers (`fastdata.processes.stop_processes`): asked to end when all went well (stopped if they
        have not within 2 s), stopped at once otherwise (an error, Ctrl-C: results they may still be sending are
        not wanted)."""
        if graceful:
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    send(conn, None)
        stop_processes(self.processes, grace=2.0 if graceful else 0.0)
        for conn in self.connections:
            conn.close()
