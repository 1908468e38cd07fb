"""Messages between the conversion parent and its workers, over the socket of a duplex Pipe.

A message is a header (the pickle's length, the number of out-of-band buffers), the buffers' lengths, then the
pickle (protocol 5). The large byte strings of a result (`out_of_band`: the laid-out images of a chunk) do not
travel inside the pickle: the worker writes them once into an anonymous shared-memory file (memfd) whose
descriptor rides along with the header (SCM_RIGHTS), and the parent maps it and unpickles them as read-only
memoryviews of that map. So the parent copies an image's bytes once, into the output, instead of three times
(out of the socket, out of the pickle, into the output): per image, what the parent does is what caps a
conversion on many cores. Where the platform has no memfd (macOS), buffers stay in the pickle; Windows pipes
have no file descriptor, so Connection's own framing is used there.
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import struct
import sys
from typing import Any

_RAW = sys.platform != "win32"
_SHARED = _RAW and hasattr(os, "memfd_create")
_HEADER = struct.Struct("!QQ")  # pickle bytes, out-of-band buffers
_LENGTH = struct.Struct("!Q")
OUT_OF_BAND_MIN = 4096  # byte strings at least this long travel out of band (the pickle copies smaller ones)
_IOV_MAX = 512  # buffers per writev call (the system's limit is 1024)


def out_of_band(value: Any) -> Any:
    """`value` with its byte strings of `OUT_OF_BAND_MIN` bytes or more, inside nested tuples and lists, marked to
    travel out of band (`pickle.PickleBuffer`); the receiver gets them as read-only memoryviews."""
    if isinstance(value, bytes):
        return pickle.PickleBuffer(value) if _SHARED and len(value) >= OUT_OF_BAND_MIN else value
    if isinstance(value, tuple):
        return tuple(out_of_band(item) for item in value)
    if isinstance(value, list):
        return [out_of_band(item) for item in value]
    return value


def send(conn: Any, message: Any) -> None:
    """Send `message` over `conn` (a multiprocessing Connection)."""
    if not _RAW:
        conn.send(message)
        return
    buffers: list[pickle.PickleBuffer] = []

    def collect(buffer: pickle.PickleBuffer) -> bool:
        if isinstance(buffer.raw().obj, bytes):  # ours (`out_of_band`); numpy's arrays stay in the pickle
            buffers.append(buffer)
            return False
        return True

    data = pickle.dumps(message, protocol=5, buffer_callback=collect if _SHARED else None)
    fd = conn.fileno()
    if not buffers:
        head = _HEADER.pack(len(data), 0)
        if len(data) < 1 << 16:
            _write_all(fd, memoryview(head + data))
        else:  # large: no concatenated copy
            _write_all(fd, memoryview(head))
            _write_all(fd, memoryview(data))
        return
    views = [buffer.raw() for buffer in buffers]
    shared = os.memfd_create("fastdata-chunk", os.MFD_CLOEXEC)
    try:
        for first in range(0, len(views), _IOV_MAX):
            _writev_all(shared, views[first:first + _IOV_MAX])
        head = _HEADER.pack(len(data), len(views)) + struct.pack(f"!{len(views)}Q", *(len(v) for v in views))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd)
        try:
            sent = socket.send_fds(sock, [head], [shared])
        finally:
            sock.detach()  # the descriptor stays the Connection's
        _write_all(fd, memoryview(head)[sent:])
        _write_all(fd, memoryview(data))
    finally:
        os.close(shared)  # the receiver holds its own descriptor of it


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def _writev_all(fd: int, views: list[memoryview]) -> None:
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views = views[1:]
        if views and written:
            views = [views[0][written:], *views[1:]]


def receive(conn: Any, scratch: bytearray | None = None) -> Any:
    """The next message from `conn`; read into `scratch` (grown as needed, kept by the caller for the next one:
    a fresh buffer per message would cost its page faults every time)."""
    if not _RAW:
        return conn.recv()
    scratch = bytearray() if scratch is None else scratch
    fd = conn.fileno()
    head, shared = _read_header(fd)
    size, count = _HEADER.unpack(head)
    if not count:
        return pickle.loads(_read_exactly(fd, size, scratch))
    if shared is None:
        raise EOFError("a conversion worker's message lost its shared memory")
    try:
        lengths = struct.unpack(f"!{count}Q", _read_exactly(fd, 8 * count, scratch))
        total = sum(lengths)
        mapped = mmap.mmap(shared, total, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ)
    finally:
        os.close(shared)  # the map keeps the memory; it goes when the last view of it does
    whole, views, offset = memoryview(mapped), [], 0
    for length in lengths:
        views.append(whole[offset:offset + length])
        offset += length
    return pickle.loads(_read_exactly(fd, size, scratch), buffers=views)


def _read_header(fd: int) -> tuple[bytes, int | None]:
    """The header of the next message, and the shared-memory descriptor that came with it (None: none)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd)
    head, shared = b"", None
    try:
        while len(head) < _HEADER.size:
            data, fds, _flags, _address = socket.recv_fds(sock, _HEADER.size - len(head), 1)
            if not data:
                raise EOFError("the other end of a conversion worker's pipe closed")
            head += data
            for extra in fds:
                if shared is None:
                    shared = extra
                else:
                    os.close(extra)
    except BaseException:
        if shared is not None:
            os.close(shared)
        raise
    finally:
        sock.detach()
    return head, shared


def _read_exactly(fd: int, size: int, scratch: bytearray) -> memoryview:
    """The next `size` bytes of `fd`, read into the start of `scratch`."""
    if len(scratch) < size:
        scratch.extend(bytes(size - len(scratch)))
    view, got = memoryview(scratch)[:size], 0
    while got < size:
        count = os.readv(fd, [view[got:]])
        if not count:
            raise EOFError("the other end of a conversion worker's pipe closed")
        got += count
    return view
