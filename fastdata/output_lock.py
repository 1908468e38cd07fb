"""One writer per output: the lock a conversion holds on its OUT, and what a reader learns from it.

A conversion into OUT holds an exclusive `flock` on the file `OUT.lock` beside it, from before it looks at OUT to
after its dataset is in place (or it stops). The operating system releases the lock when the process ends,
however it ends (`kill -9` included), so a conversion that was killed leaves nothing that stops its rerun, and the
rerun resumes. A second conversion into the same OUT (with `--overwrite` too) finds the lock taken and stops at
once, naming the holder, before it has changed anything (not even `OUT.partial`).

The file holds the holder's pid, command line and start time (JSON), so that the refusal can say who holds OUT,
and a reader of an incomplete dataset (only `OUT.partial` exists) can tell a conversion that is running now from
one that was interrupted: a reader never takes the lock, it reads the holder and asks whether that process still
lives (the same process: its own start time must match, so a reused pid does not count). The holder removes the
file before it lets the lock go; a lock file left by a killed conversion is stale, and the next conversion takes
it over. Processes the holder forks (its conversion workers) share its lock, so a conversion whose main process was
killed holds OUT until its workers have exited too (they stop at once, their parent gone).

`flock` (POSIX) is advisory and local: it works between processes of one machine (and on NFS only where the server
keeps it); a conversion from another machine into the same shared folder is named by host, not excluded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastdata.errors import OutputBusyError

LOCK_SUFFIX = ".lock"
#: How long a conversion waits for a lock whose holder is gone (its workers exiting) or has not written its name
#: yet, before it says so: a lock held by a live conversion is refused at once.
SETTLE_S = 2.0
_INFO_BYTES = 4096  # the holder's description is written as one block of this size (padded): read whole or not


def lock_path(out: str | os.PathLike[str]) -> Path:
    """The lock file of the output `out` (beside it: `OUT.lock`)."""
    out = Path(os.path.abspath(out))
    return out.with_name(out.name + LOCK_SUFFIX)


@dataclass(frozen=True)
class Holder:
    """The process that holds (or held) an output's lock, as its lock file says."""

    pid: int
    command: str
    since: float  # when it took the lock (seconds since the epoch)
    host: str
    process_started: float | None  # the process's own start time (psutil), to tell a reused pid

    def describe(self) -> str:
        """`pid 1234 on host (fastdata convert ...), since 2025-01-02 10:11:12`."""
        host = "" if self.host == socket.gethostname() else f" on {self.host}"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid}{host} (`{self.command}`), since {when}"

    def alive(self) -> bool:
        """Whether this process still runs (a process of another host is taken to run: it cannot be asked)."""
        if self.host != socket.gethostname():
            return True
        import psutil

        try:
            started = psutil.Process(self.pid).create_time()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError):
            return False
        except psutil.AccessDenied:  # it exists, and its start time is not ours to read: taken to be it
            return True
        return self.process_started is None or abs(started - self.process_started) < 1.0


def _this_process() -> Holder:
    import psutil

    process = psutil.Process()
    try:
        argv = process.cmdline() or sys.argv
    except psutil.Error:
        argv = sys.argv
    # a program given inline (`python -c '...'`) stands as "..."
    shown = [Path(argv[0]).name, *("..." if "\n" in arg else arg for arg in argv[1:])] if argv else ["python"]
    command = shlex.join(shown)
    if len(command) > 300:
        command = command[:297] + "..."
    return Holder(os.getpid(), command, time.time(), socket.gethostname(), process.create_time())


def _parse(raw: bytes) -> Holder | None:
    try:
        data = json.loads(raw.decode().strip() or "null")
        return Holder(int(data["pid"]), str(data["command"]), float(data["since"]), str(data["host"]),
                      None if data.get("process_started") is None else float(data["process_started"]))
    except (ValueError, TypeError, KeyError):
        return None


def read_holder(out: str | os.PathLike[str]) -> Holder | None:
    """The process the lock file of `out` names (None: no lock file, or one that names nobody yet)."""
    try:
        return _parse(lock_path(out).read_bytes())
    except OSError:
        return None


def running_conversion(out: str | os.PathLike[str]) -> Holder | None:
    """The conversion writing `out` now, if one is (a stale lock file, left by a killed one, names nobody)."""
    holder = read_holder(out)
    return holder if holder is not None and holder.alive() else None


def check_free(out: str | os.PathLike[str]) -> None:
    """Raise OutputBusyError, naming it, when a conversion that still runs holds `out` (what its lock file says,
    read without taking the lock): a conversion calls it before the long work that precedes taking the lock
    (listing its source), so that it stops at once. Taking the lock (`OutputLock`) is what decides."""
    holder = running_conversion(out)
    if holder is not None:
        raise OutputBusyError(OutputLock(out)._busy(holder))


class OutputLock:
    """The exclusive lock on an output: `with OutputLock(out): ...` (or `acquire()` / `release()`). Raises
    OutputBusyError, naming the holder, when another conversion holds it (in this process too)."""

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.out = Path(out)
        self.path = lock_path(out)
        self._fd: int | None = None
        self._made: list[Path] = []  # the folders `acquire` made for the lock file, removed again if left empty

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        import fcntl

        if self._fd is not None:
            raise RuntimeError(f"{self.path}: already held by this lock")
        self._make_folders()
        try:
            self._take(fcntl)
        except BaseException:
            self._remove_folders()
            raise

    def _make_folders(self) -> None:
        """Make the folders of OUT that do not exist yet, remembering which (a refused or failed conversion
        leaves none behind)."""
        missing, folder = [], self.path.parent
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        self._made = []
        for folder in reversed(missing):
            folder.mkdir(exist_ok=True)
            self._made.append(folder)

    def _remove_folders(self) -> None:
        for folder in reversed(self._made):  # the deepest first; one that holds anything (OUT) stays
            try:
                folder.rmdir()
            except OSError:
                break
        self._made = []

    def _take(self, fcntl: Any) -> None:
        deadline = None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the holder before us removed the folder it had made: make it again
                self.path.parent.mkdir(parents=True, exist_ok=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _parse(os.pread(fd, _INFO_BYTES, 0))
                os.close(fd)
                if holder is not None and holder.alive():
                    raise OutputBusyError(self._busy(holder)) from None
                # its holder is gone (its workers still exiting) or has not written its name yet: a moment
                deadline = deadline or time.monotonic() + SETTLE_S
                if time.monotonic() > deadline:
                    raise OutputBusyError(self._busy(holder)) from None
                time.sleep(0.05)
                continue
            except BaseException:
                os.close(fd)
                raise
            if self._same_file(fd):
                break
            os.close(fd)  # the holder before us removed the file it locked: lock the one at the path now
        self._fd = fd
        data = json.dumps(asdict(_this_process())).encode().ljust(_INFO_BYTES - 1) + b"\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)

    def _same_file(self, fd: int) -> bool:
        try:
            here = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)

    def _busy(self, holder: Holder | None) -> str:
        if holder is None:
            return (f"{self.out}: another conversion is writing it (its lock {self.path} is held, by a process that "
                    "has not named itself); wait for it to finish, or stop it")
        if not holder.alive():
            return (f"{self.out}: the conversion {holder.describe()} was stopped, but its worker processes still "
                    f"hold {self.path}; try again once they have exited")
        return (f"{self.out}: another conversion is writing it: {holder.describe()}; wait for it to finish, or stop "
                "it (running it again resumes it)")

    def release(self) -> None:
        """Remove the lock file, then let the lock go (nothing to do when not held)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            if self._same_file(fd):
                os.unlink(self.path)
        os.close(fd)
        self._remove_folders()

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
