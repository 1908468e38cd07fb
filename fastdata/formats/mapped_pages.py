"""Read values out of a memory-mapped file (LMDB's) without mapping their pages, so that a loader's workers do not
hold in their resident set the part of the file they read over an epoch.

LMDB serves reads from a read-only shared mapping of its data file. Every page a reader touches stays mapped in that
process, and a touch maps the whole page-cache folio around it (on Linux 6.x, folios of up to 2 MB for a file
written in large writes, as LMDB's are): over an epoch each DataLoader worker's RSS grows by about the file's size
(measured: 200 random 53 kB values mapped 65 MB; 200 keys of a few bytes, 49 MB). So `MappedFile.copy` takes only
the *address* of a value from LMDB (finding it touches the B-tree's pages, not the value's), and reads the value
with `os.pread` from the page cache, unmapped; every `RELEASE_EVERY` copies, and when the caller says a batch is
done, `release` drops this process's mapping of the whole file (`madvise(MADV_DONTNEED)`: the mapping is read-only
and shared, so nothing is lost; the page cache keeps the pages; the B-tree's few pages map again on the next
lookup). Elsewhere than Linux, or for a view outside the file's mapping (as /proc/self/maps lists it), `copy` is
`bytes(view)` and `release` does nothing.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from fastdata.formats.libc import libc_function

_MADV_DONTNEED = 4  # Linux
#: copies between two releases of the whole mapping (the B-tree pages the lookups mapped meanwhile). Measured on
#: 4,000 random reads of 53 kB values: 16 us a read (20 with the key's lookup) against 24 through the map when its
#: pages are not yet mapped and 5 once they are; releasing after every copy costs 24.
RELEASE_EVERY = 8


def _madvise() -> Any:
    """libc's `madvise` (Linux only: elsewhere its advice values differ), or None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return libc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int)


def mapped_ranges(path: str) -> list[tuple[int, int, int]]:
    """(start, end, file offset) of each read-only shared mapping of file `path` in this process
    (/proc/self/maps); [] where there is no such file."""
    real = os.path.realpath(path)
    ranges = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") == real and fields[1].startswith("r-") \
                        and fields[1][3] == "s":
                    start, end = fields[0].split("-")
                    ranges.append((int(start, 16), int(end, 16), int(fields[2], 16)))
    except OSError:
        return []
    return ranges


class MappedFile:
    """File `path` as a library (LMDB) maps it read-only and shared in this process: values copied out of it
    without being mapped (`copy`), and its mapping given back (`release`). Found again in a forked child."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._pid = -1
        self._ranges: list[tuple[int, int, int]] = []
        self._fd = -1
        self._copies = 0

    def __del__(self) -> None:
        self._close()

    def _close(self, close: Any = os.close) -> None:
        """Close this process's descriptor of the file (a forked child's is its own copy of its parent's). Needs
        no module global (`close` is bound at definition): at interpreter exit, when this may run from `__del__`,
        the modules' globals may already be gone."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                close(fd)
            except OSError:  # already closed: nothing to give back
                return

    def _here(self) -> bool:
        """Whether values can be read unmapped here: found the mapping (once per process) and opened the file."""
        if self._pid != os.getpid():
            self._close()
            self._pid, self._copies = os.getpid(), 0
            self._ranges = mapped_ranges(self.path) if _madvise() is not None else []
            if self._ranges:
                self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return self._fd >= 0

    def copy(self, view: memoryview) -> bytes:
        """The bytes under `view` (a value in the file's mapping), read from the file rather than through the
        mapping; `bytes(view)` where that cannot be done."""
        if not view.nbytes or not self._here():
            return bytes(view)
        address = np.frombuffer(view, dtype=np.uint8).ctypes.data
        for low, high, offset in self._ranges:
            if low <= address and address + view.nbytes <= high:
                data = os.pread(self._fd, view.nbytes, offset + address - low)
                if len(data) != view.nbytes:
                    raise OSError(0, f"{self.path}: {len(data):,} bytes where {view.nbytes:,} were expected "
                                     "(the file is shorter than its own index says)")
                self._copies += 1
                if self._copies % RELEASE_EVERY == 0:
                    self.release()
                return data
        return bytes(view)

    def release(self) -> None:
        """Drop this process's mapping of the whole file (what lookups mapped); it maps again as it is read."""
        if self._here():
            madvise = _madvise()
            for low, high, _ in self._ranges:
                madvise(low, high - low, _MADV_DONTNEED)
