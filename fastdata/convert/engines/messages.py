"""Messages between the conversion parent and its workers, over the socket of a duplex Pipe.

A message is a header (the pickle's length, the number of out-of-band buffers), the buffers' lengths, then the
pickle (protocol 5). The large byte strings of a result (`out_of_band`: the laid-out images of a chunk) do not
travel inside the pickle: the worker writes them once into an anonymous shared-memory file (memfd) whose
descriptor rides along with the header (SCM_RIGHTS), and the parent maps it and unpickles them as read-only
memoryviews of that map. So the parent copies an image's bytes once, into the output, instead of three times
(out of the socket, out of the pickle, into the output): per image, what the parent does is what caps a
conversion on many cores. A receiver that only hands the bytes on (the WebDataset writer, whose shards are
assembled by processes of their own: `fastdata.convert.engines.assembly`) asks for the shared-memory file itself
(`SharedMemory`): it passes the descriptor and the buffers' places in it along, and never touches the bytes.
Where the platform has no memfd (macOS), buffers stay in the pickle; Windows pipes have no file descriptor, so
Connection's own framing is used there.
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
_SHARED = _RAW and hasattr(os, "memfd_create") and sys.platform.startswith("linux")  # sendfile from it: Linux
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


class SharedMemory:
    """The shared-memory file a received message's out-of-band buffers are views of (`receive(..., shared=[])`):
    where each of those views lies in it, so that the receiver can hand the bytes on to another process (the
    descriptor, and places in it) without reading them. The descriptor is closed with `close()` or when this
    object goes."""

    def __init__(self, fd: int, views: list[memoryview], offsets: list[int]) -> None:
        self._fd = fd
        self._views = views  # held, so that the ids below stay theirs
        self._offsets = {id(view): offset for view, offset in zip(views, offsets, strict=True)}

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("the shared memory of a message is closed")
        return self._fd

    def locate(self, view: Any) -> int | None:
        """The byte offset in the file of `view`, one of the message's out-of-band buffers exactly as it was
        received; None for anything else (a byte string that travelled in the pickle, a slice of a view)."""
        return self._offsets.get(id(view)) if isinstance(view, memoryview) else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


def receive(conn: Any, scratch: bytearray | None = None, shared: list[SharedMemory] | None = None) -> Any:
    """The next message from `conn`; read into `scratch` (grown as needed, kept by the caller for the next one:
    a fresh buffer per message would cost its page faults every time). With a list as `shared`, a message that
    came with shared memory appends its `SharedMemory` to it (the descriptor stays open)."""
    if not _RAW:
        return conn.recv()
    scratch = bytearray() if scratch is None else scratch
    fd = conn.fileno()
    head, memory = _read_header(fd)
    size, count = _HEADER.unpack(head)
    if not count:
        return pickle.loads(_read_exactly(fd, size, scratch))
    if memory is None:
        raise EOFError("a conversion worker's message lost its shared memory")
    try:
        lengths = struct.unpack(f"!{count}Q", _read_exactly(fd, 8 * count, scratch))
        total = sum(lengths)
        # a receiver that hands the bytes on reads few of them: its map is not populated ahead
        populate = getattr(mmap, "MAP_POPULATE", 0) if shared is None else 0
        mapped = mmap.mmap(memory, total, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
    except BaseException:
        os.close(memory)
        raise
    if shared is None:
        os.close(memory)  # the map keeps the memory; it goes when the last view of it does
    whole, views, offsets, offset = memoryview(mapped), [], [], 0
    for length in lengths:
        views.append(whole[offset:offset + length])
        offsets.append(offset)
        offset += length
    if shared is not None:
        shared.append(SharedMemory(memory, views, offsets))
    # the views are read-only, so unpickling gives back these very objects (what `SharedMemory.locate` knows)
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
