"""Give back a process's mapping of file pages it has copied out of, so that a loader reading an LMDB file through its
memory map does not hold the whole file in its resident set.

LMDB serves reads from a read-only shared mapping of its data file. Every page a DataLoader worker reads stays mapped
in that worker, so over an epoch each worker's RSS grows by the bytes it read: with two workers, the dataset's size
on top of what a loader reading files (torchvision's ImageFolder) holds. Once a sample's bytes are copied out,
`MappedFile.release` drops the mapping of their pages (`madvise(MADV_DONTNEED)`, Linux): the page cache keeps them,
nothing is lost (the mapping is read-only and shared: no private copy to discard), and a later read maps them again.
Only bytes inside the file's own mapping, as /proc/self/maps lists it, are ever released; elsewhere (another OS, a
view into other memory) it does nothing.
"""

from __future__ import annotations

import functools
import mmap
import os
import sys
from typing import Any

import numpy as np

_MADV_DONTNEED = 4  # Linux


@functools.cache
def _madvise() -> Any:
    """libc's `madvise` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def mapped_ranges(path: str) -> list[tuple[int, int]]:
    """The address ranges at which this process maps file `path` read-only and shared (from /proc/self/maps)."""
    real = os.path.realpath(path)
    ranges = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") == real and fields[1].startswith("r-") \
                        and fields[1][3] == "s":
                    start, end = fields[0].split("-")
                    ranges.append((int(start, 16), int(end, 16)))
    except OSError:
        return []
    return ranges


class MappedFile:
    """The read-only shared mapping of file `path` in this process (as a library such as LMDB made it), whose pages
    `release` gives back once their bytes are copied out."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._ranges: list[tuple[int, int]] | None = None  # found on the first release, in this process
        self._pid = -1

    def release(self, view: memoryview) -> bool:
        """Drop this process's mapping of the pages under `view`, bytes of the file's mapping no longer needed
        here. Returns whether it did (False off Linux, or for bytes outside the file's mapping)."""
        madvise = _madvise()
        if madvise is None or not view.nbytes:
            return False
        if self._ranges is None or self._pid != os.getpid():
            self._ranges, self._pid = mapped_ranges(self.path), os.getpid()
        address = np.frombuffer(view, dtype=np.uint8).ctypes.data
        end = address + view.nbytes
        start = address - address % mmap.PAGESIZE
        if not any(low <= start and end <= high for low, high in self._ranges):
            return False
        return madvise(start, end - start, _MADV_DONTNEED) == 0
