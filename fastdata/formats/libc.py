"""A function of the C library this process runs on (ctypes), for the few system calls Python does not expose
(`madvise` on another library's mapping, `sync_file_range`): looked up once, on first use."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from fastdata.config import ctrl_c_held, worker_ignores_ctrl_c


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


class WritebackHelper:
    """A helper process that starts the write-back of a file to disk (`start_writeback`) each time it is poked,
    so that the CPU the kernel spends submitting the writes is not the caller's (a single writer process whose
    CPU per item is what bounds a conversion). Poking is one byte down a pipe; `close` ends the helper."""

    def __init__(self, path: str) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self._reader, self._writer = context.Pipe(duplex=False)
        self._process = context.Process(target=_writeback_loop, args=(path, self._reader, self._writer),
                                        name="fastdata-writeback", daemon=True)
        with ctrl_c_held():  # a Ctrl-C while it starts waits until it ignores Ctrl-C (worker_ignores_ctrl_c)
            self._process.start()
        self._reader.close()

    def poke(self) -> None:
        self._writer.send_bytes(b"w")

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the helper is gone already
            self._writer.send_bytes(b"")
        self._writer.close()
        self._process.join(timeout=30)


def _writeback_loop(path: str, reader: object, writer: object) -> None:
    """The helper's life: start the file's write-back at each poke; end at an empty message or a closed pipe.
    Ctrl-C is the parent's to handle (the terminal sends it to the whole group)."""
    import os

    worker_ignores_ctrl_c()
    writer.close()  # type: ignore[attr-defined]  # the parent's end, inherited: the pipe closes when the parent's does
    fd = os.open(path, os.O_RDONLY)
    try:
        while reader.recv_bytes():  # type: ignore[attr-defined]
            start_writeback(fd)
    except EOFError:
        pass
    finally:
        os.close(fd)
