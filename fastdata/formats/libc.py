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
