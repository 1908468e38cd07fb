"""A function of the C library this process runs on (ctypes), for the few system calls Python does not expose
(`madvise` on another library's mapping, `sync_file_range`): looked up once, on first use."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def libc_function(name: str, argtypes: tuple[Any, ...], restype: Any) -> Any:
    """libc's `name` with its argument and result types set, or None where this C library has none."""
    import ctypes

    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError, TypeError):  # TypeError: no CDLL(None) (Windows)
        return None
    function.argtypes, function.restype = list(argtypes), restype
    return function


_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, start: int = 0, length: int = 0) -> None:
    """Start writing bytes `start`.. (`length` 0: to the end) of `fd` to disk without waiting (Linux's
    `sync_file_range`; elsewhere the final fsync does it all), so that a later fsync waits for the last bytes
    only."""
    import ctypes

    sync_file_range = libc_function("sync_file_range", (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint),
                                    ctypes.c_int)
    if sync_file_range is not None:
        sync_file_range(fd, start, length, _SYNC_FILE_RANGE_WRITE)
