"""WebDataset shards written, flushed to disk and hashed by processes of their own ("assemblers"), so that the
conversion's parent process never touches an image's bytes.

Per image, whatever the parent does caps a conversion however many cores verify images; copying an image's bytes
into the page cache alone costs ~5% of a worker's time per image, and hashing them as much again. So the parent only
decides where each sample goes (the shard and the byte offset: shard boundaries exactly as a writer that copies the
bytes itself would draw them) and hands the places on: the shared-memory file a worker's chunk came in
(`fastdata.convert.engines.messages.SharedMemory`, passed by descriptor) and, per run of samples, where it lies
there and where it goes in the shard. Any assembler may write any run (`os.pwrite` at the given offset: runs of one
shard are written in parallel). Each shard has one assembler that hashes it: as the shard's written bytes grow
without a gap by `_HASH_STEP`, the parent asks it to hash them (read back from the page cache) and to start their
write-back to disk, so that a finished shard costs only its last few megabytes and the wait for the disk, not a pass
over the whole shard after the last image. Once every run of a finished shard is written, its hashing assembler
writes the tar trailer, hashes what is left, flushes the shard to disk, renames it into place and sends its digest
back. The writer (`fastdata.formats.tar_shards.ShardWriter`) holds back a checkpoint that lists a shard until its
digest is in.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import mmap
import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

from fastdata.background import Background
from fastdata.convert.engines.messages import SharedMemory
from fastdata.convert.engines.pool import start_method
from fastdata.errors import WorkerError
from fastdata.formats.libc import start_writeback
from fastdata.processes import exit_description, stop_processes
from fastdata.workers import ctrl_c_held

#: a run of a shard's bytes: (offset in the shared-memory file, length), or the bytes themselves (a sample that
#: came inside the pickle, or one the writer changed)
Piece = tuple[int, int] | bytes

_HASH_BLOCK = 1 << 22
#: a shard's hashing assembler is asked to hash its bytes once this many more are written without a gap
_HASH_STEP = 8 << 20


def assembly_processes(workers: int) -> int:
    """Assemblers that keep up with `workers` conversion workers: writing an image's bytes into the page cache and
    hashing the finished shard are ~10% of verifying the image (~70 of ~700 us per 50 KB photo), so one per 6."""
    return max(1, -(-workers // 6))


class ShardAssembly:
    """`processes` assemblers, started by `start()` (before any thread of the conversion: forked where the
    platform allows) and stopped when the `with` block ends (`fastdata.processes.stop_processes`; at once on an
    error: their work is not wanted)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._connections: list[Connection] = []
        self._workers: list[Any] = []
        self._sent: list[deque[_Run | None]] = []  # per assembler, its unanswered messages: a write's run, or None
        self._runs: dict[str, deque[_Run]] = {}  # shard path -> its runs sent and not yet behind the written prefix
        self._written: dict[str, int] = {}  # shard path -> its bytes written without a gap, from 0
        self._hashing: dict[str, int] = {}  # shard path -> its bytes its hashing assembler was asked to hash
        self._hasher: dict[str, int] = {}  # shard path -> the assembler that hashes and finishes it
        self._shards = 0
        self._finishing: dict[str, tuple[bytes, int]] = {}  # closed shard -> (trailer, size), sent once written
        self._digests: dict[str, str] = {}

    def start(self) -> ShardAssembly:
        context = multiprocessing.get_context(start_method())
        try:
            with ctrl_c_held():  # a Ctrl-C that comes meanwhile is raised once all are started
                for _ in range(self.processes):
                    ours, theirs = context.Pipe(duplex=True)
                    process = context.Process(  # type: ignore[attr-defined]  # every start method's context has it
                        target=_serve, args=(theirs, ours, os.getpid()), daemon=True, name="fastdata-shard-assembler")
                    process.start()
                    theirs.close()
                    self._connections.append(ours)
                    self._workers.append(process)
                    self._sent.append(deque())
        except BaseException:
            self._stop(graceful=False)
            raise
        return self

    def __enter__(self) -> ShardAssembly:
        return self

    def __exit__(self, kind: type | None, *_exc: object) -> None:
        self._stop(graceful=kind is None)

    def begin(self, path: str) -> None:
        """Start shard `path`: its `.tmp` file is created empty (the assemblers only write into it)."""
        os.close(os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666))
        self._runs[path], self._written[path], self._hashing[path] = deque(), 0, 0
        self._hasher[path] = self._shards % max(1, self.processes)
        self._shards += 1

    def write(self, path: str, at: int, pieces: Sequence[Piece], shared: SharedMemory | None) -> None:
        """Have `pieces` written one after the other into shard `path` from byte `at` on; the tuples among them
        are places in `shared`."""
        if not self._connections:
            raise RuntimeError("ShardAssembly.start() first")
        self._collect(block=False)
        worker = min(range(len(self._sent)), key=lambda w: len(self._sent[w]))
        memory = shared if any(isinstance(piece, tuple) for piece in pieces) else None
        run = _Run(at + sum(piece[1] if isinstance(piece, tuple) else len(piece) for piece in pieces))
        self._send(worker, ("write", path, at, list(pieces), memory is not None), run)
        if memory is not None:
            send_handle(self._connections[worker], memory.fileno(), self._workers[worker].pid)
        self._runs[path].append(run)

    def finish(self, path: str, trailer: bytes, size: int) -> _Digest:
        """Shard `path` is complete but for `trailer` (its total `size` bytes with it): once its runs are written,
        have it finished (trailer, flush, sha256, renamed from `.tmp` into place). Returns the future of its
        digest."""
        self._finishing[path] = (trailer, size)
        self._send_finishes()
        return _Digest(self, path)

    def _send(self, worker: int, message: Any, run: _Run | None = None) -> None:
        try:
            self._connections[worker].send(message)
        except OSError:
            self._died(worker)
        self._sent[worker].append(run)

    def _send_finishes(self) -> None:
        for path in [p for p in self._finishing if not self._runs[p]]:
            trailer, size = self._finishing.pop(path)
            del self._runs[path], self._written[path], self._hashing[path]
            self._send(self._hasher.pop(path), ("finish", path, trailer, size))

    def _advance(self, path: str) -> None:
        """Move shard `path`'s written prefix past its runs now written, and have the new bytes hashed once there
        are `_HASH_STEP` of them."""
        runs = self._runs[path]
        while runs and runs[0].written:
            self._written[path] = runs.popleft().end
        if self._written[path] - self._hashing[path] >= _HASH_STEP:
            self._hashing[path] = self._written[path]
            self._send(self._hasher[path], ("hash", path, self._written[path]))

    def _collect(self, block: bool) -> None:
        """Take in the assemblers' answers (with `block`: waiting for at least one)."""
        ready = wait([*self._connections, *(w.sentinel for w in self._workers)], None if block else 0)
        for handle in ready:
            if handle in self._connections:
                worker = self._connections.index(handle)
                while self._connections[worker].poll():
                    self._answer(worker)
        for worker, process in enumerate(self._workers):
            if process.sentinel in ready and not self._connections[worker].poll():
                self._died(worker)
        self._send_finishes()

    def _answer(self, worker: int) -> None:
        try:
            kind, path, value = self._connections[worker].recv()
        except (EOFError, OSError):
            self._died(worker)
        run = self._sent[worker].popleft()
        if kind == "error":
            raise WorkerError(f"{path}: writing the shard failed: {value}; free what is short (disk space?) and run "
                              "the same command again to resume")
        if kind == "written":
            assert run is not None
            run.written = True
            self._advance(path)
        elif kind == "digest":
            self._digests[path] = value

    def digest(self, path: str, wait_for_it: bool) -> str | None:
        """The hex sha256 of finished shard `path` (None while it is not in and `wait_for_it` is false)."""
        self._collect(block=False)
        while wait_for_it and path not in self._digests:
            self._collect(block=True)
        return self._digests.pop(path, None)

    def _died(self, worker: int) -> None:
        process = self._workers[worker]
        raise WorkerError(f"a process writing WebDataset shards (pid {process.pid}) died "
                          f"({exit_description(process)}); out of memory? Run the same command again to resume")

    def _stop(self, graceful: bool) -> None:
        if graceful:
            while self._finishing or any(self._sent):
                self._collect(block=True)
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.send(None)
        stop_processes(self._workers, grace=5.0 if graceful else 0.0)
        for connection in self._connections:
            connection.close()
        self._connections, self._workers, self._sent = [], [], []


class _Run:
    """A run of a shard's bytes ending at `end`, sent to an assembler to write; `written` once it says so."""

    __slots__ = ("end", "written")

    def __init__(self, end: int) -> None:
        self.end, self.written = end, False


class _Digest:
    """The future of a shard's digest (`ready()`, `get()`), as the writer's checkpoints wait for it."""

    def __init__(self, assembly: ShardAssembly, path: str) -> None:
        self._assembly, self._path = assembly, path
        self._value: str | None = None

    def ready(self) -> bool:
        if self._value is None:
            self._value = self._assembly.digest(self._path, wait_for_it=False)
        return self._value is not None

    def get(self) -> str:
        if self._value is None:
            self._value = self._assembly.digest(self._path, wait_for_it=True)
        assert self._value is not None
        return self._value


# ----------------------------------------------------------------------------------------------------
# in an assembler


def _serve(connection: Connection, parent_end: Connection, parent: int) -> None:
    """An assembler's loop: write runs, finish shards, answer each message in order."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if start_method() == "fork":
        parent_end.close()  # held here, a killed parent's end would never close
    with Background(functools.partial(_watch_parent, parent), "fastdata-parent-watch"):
        _answer_all(connection, parent)


def _answer_all(connection: Connection, parent: int) -> None:
    """Answer the parent's messages until it says it is done (None), goes away, or this pipe closes."""
    hashes: dict[str, _ShardHash] = {}  # the shards this assembler hashes -> their hash so far
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None or os.getppid() != parent:  # done, or the parent is gone: its work is not wanted
            return
        kind, path = message[0], message[1]
        memory = recv_handle(connection) if kind == "write" and message[4] else None
        try:
            answer: Any = None
            if kind == "write":
                _write_runs(path + ".tmp", message[2], message[3], memory)
            elif kind == "hash":
                hashes.setdefault(path, _ShardHash()).extend(path + ".tmp", message[2])
            else:
                answer = _finish(path, message[2], message[3], hashes.pop(path) if path in hashes else _ShardHash())
        except OSError as exc:
            connection.send(("error", path, exc.strerror or str(exc)))
            continue
        finally:
            if memory is not None:
                os.close(memory)
        connection.send(({"write": "written", "hash": "hashed"}.get(kind, "digest"), path, answer))


def _watch_parent(parent: int, stopping: threading.Event) -> None:
    """(an assembler's `Background` loop) End this process when the conversion's parent is gone (it holds no end of
    the parent's that would close), looking every half second until the assembler stops it."""
    while os.getppid() == parent:
        if stopping.wait(0.5):
            return
    os._exit(0)


def _write_runs(tmp: str, at: int, pieces: list[Piece], memory: int | None) -> None:
    """Write `pieces` one after the other into `tmp` from byte `at` on; the runs in shared memory go from file to
    file inside the kernel (`sendfile`: neither mapped nor copied through this process)."""
    fd = os.open(tmp, os.O_WRONLY)
    try:
        for piece in pieces:
            if isinstance(piece, bytes):
                at = _pwrite_all(fd, memoryview(piece), at)
                continue
            assert memory is not None
            os.lseek(fd, at, os.SEEK_SET)
            offset, left = piece
            while left:
                sent = os.sendfile(fd, memory, offset, left)
                if not sent:
                    raise OSError(0, "the shared memory of a chunk ended early")
                offset, left, at = offset + sent, left - sent, at + sent
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: memoryview, at: int) -> int:
    """Write all of `data` at `at`; returns where it ends."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], at + done)
    return at + done


class _ShardHash:
    """The sha256 of a shard's first `length` bytes, extended as more are written."""

    def __init__(self) -> None:
        self.digest, self.length = hashlib.sha256(), 0

    def extend(self, tmp: str, end: int) -> None:
        """Hash bytes `length`..`end` of `tmp` (written, so in the page cache) and start writing them to disk."""
        fd = os.open(tmp, os.O_RDONLY)
        try:
            start = self.length
            self.extend_from(fd, end)
            start_writeback(fd, start, end - start)
        finally:
            os.close(fd)

    def extend_from(self, fd: int, end: int) -> None:
        if end <= self.length:
            return
        start = self.length - self.length % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(fd, end - start, offset=start, prot=mmap.PROT_READ,
                       flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)) as mapped:
            view = memoryview(mapped)
            for at in range(self.length - start, end - start, _HASH_BLOCK):
                self.digest.update(view[at:min(at + _HASH_BLOCK, end - start)])
            view.release()
        self.length = end


def _finish(path: str, trailer: bytes, size: int, hashed: _ShardHash) -> str:
    """Write the trailer of the complete shard `path`.tmp, hash what `hashed` has not, put it on disk and rename it
    into place."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_RDWR)
    try:
        os.pwrite(fd, trailer, size - len(trailer))
        actual = os.fstat(fd).st_size
        if actual != size:
            raise OSError(0, f"holds {actual:,} bytes, {size:,} were laid out")
        hashed.extend_from(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return hashed.digest.hexdigest()


