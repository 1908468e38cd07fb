"""A size-bounded local cache of verified remote shards, shared by the workers and processes of a node.

Entries are named by their sha256 (content-addressed: a changed remote dataset never reads a stale entry).
A shard is downloaded once: the first process takes the entry's exclusive lock (`flock`), writes a hidden
temporary file, verifies it, fsyncs it and renames it into place; the others wait on the lock and then open
the finished file. So no partial file is ever visible under an entry's name, and a download killed half-way
leaves only a hidden temporary file, removed by the next download of that shard. Over `max_bytes`, the least
recently used entries that nobody is opening or writing are removed (readers that have one open keep reading
it: POSIX keeps unlinked files alive).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

ENTRY_SUFFIX = ".shard"


class ShardCache:
    """Cache directory `directory` holding at most `max_bytes` of shards (None: unbounded)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes

    def entry(self, sha256: str) -> Path:
        return self.directory / f"{sha256}{ENTRY_SUFFIX}"

    def open(self, sha256: str, size: int, fetch: Callable[[BinaryIO], None]) -> BinaryIO:
        """The cached shard with this hash, opened for reading; on a miss `fetch(file)` writes it (and must
        raise if what it wrote is not the shard) before it is renamed into the cache."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.entry(sha256)
        with self._lock(sha256, fcntl.LOCK_SH):
            found = self._open_valid(path, size)
        if found is not None:
            return found
        with self._lock(sha256, fcntl.LOCK_EX):
            found = self._open_valid(path, size)  # another process may have fetched it meanwhile
            if found is None:
                self._download(sha256, path, fetch)
                found = open(path, "rb")  # noqa: SIM115 (the caller closes it)
        self.evict(keep=path)
        return found

    @staticmethod
    def _open_valid(path: Path, size: int) -> BinaryIO | None:
        try:
            f = open(path, "rb")  # noqa: SIM115 (the caller closes it)
        except FileNotFoundError:
            return None
        if os.fstat(f.fileno()).st_size != size:  # not what the manifest says: fetch it again
            f.close()
            path.unlink(missing_ok=True)
            return None
        with suppress(OSError):
            os.utime(path)  # most recently used
        return f

    def _download(self, sha256: str, path: Path, fetch: Callable[[BinaryIO], None]) -> None:
        for stale in self.directory.glob(f".{sha256}.*.tmp"):  # left by a download that was killed
            stale.unlink(missing_ok=True)
        tmp = self.directory / f".{sha256}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as out:
                fetch(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def entries(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{ENTRY_SUFFIX}"))

    def evict(self, keep: Path | None = None) -> None:
        """Remove least recently used entries until the cache holds at most `max_bytes`."""
        if self.max_bytes is None:
            return
        stats = []
        for path in self.entries():
            with suppress(FileNotFoundError):
                stats.append((path.stat().st_mtime, path.stat().st_size, path))
        total = sum(size for _, size, _ in stats)
        for _, size, path in sorted(stats):
            if total <= self.max_bytes:
                return
            if path == keep:
                continue
            sha256 = path.name[:-len(ENTRY_SUFFIX)]
            with self._lock(sha256, fcntl.LOCK_EX | fcntl.LOCK_NB) as locked:
                if locked:
                    path.unlink(missing_ok=True)
                    total -= size

    @contextmanager
    def _lock(self, sha256: str, mode: int) -> Iterator[bool]:
        """Hold the entry's lock in `mode`; yields False when LOCK_NB was asked and the lock is busy."""
        fd = os.open(self.directory / f".{sha256}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, mode)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
