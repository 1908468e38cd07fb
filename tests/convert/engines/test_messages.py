"""The conversion pool's messages: large byte strings travel through shared memory and come back whole, as
read-only views; everything else round-trips as pickle gives it."""

from __future__ import annotations

import multiprocessing
import os
import sys

import numpy as np
import pytest

from fastdata.convert.engines.messages import OUT_OF_BAND_MIN, out_of_band, receive, send

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the raw socket framing is for POSIX")


def _echo_from_child(conn, message) -> None:
    send(conn, message)
    conn.close()


def _round_trip(message):
    """`message` sent by a forked process, received here."""
    parent, child = multiprocessing.get_context("fork").Pipe(duplex=True)
    process = multiprocessing.get_context("fork").Process(target=_echo_from_child, args=(child, message))
    process.start()
    child.close()
    try:
        return receive(parent, bytearray())
    finally:
        process.join(10)
        parent.close()


def test_large_byte_strings_come_back_whole_as_read_only_views():
    images = [os.urandom(OUT_OF_BAND_MIN + n * 977) for n in range(40)]
    small = b"label-7"
    tokens = np.arange(5000, dtype=np.uint32)
    message = (3, [(("images", image), ("keys", small)) for image in images] + [tokens])
    got = _round_trip((message[0], out_of_band(message[1])))
    assert got[0] == 3
    records, arrays = got[1][:-1], got[1][-1]
    for (db, value), (key_db, key), image in zip((r[0] for r in records), (r[1] for r in records), images,
                                                 strict=True):
        assert db == "images" and key_db == "keys"
        if hasattr(os, "memfd_create"):
            assert isinstance(value, memoryview) and value.readonly
        assert bytes(value) == image
        assert key == small and isinstance(key, bytes)  # small ones stay in the pickle
    assert np.array_equal(arrays, tokens) and arrays.flags.writeable  # numpy's buffers stay in band


def test_messages_without_large_bytes_and_many_in_a_row():
    parent, child = multiprocessing.get_context("fork").Pipe(duplex=True)
    sizes = [0, 10, OUT_OF_BAND_MIN - 1, OUT_OF_BAND_MIN, 3 * 2**20]

    def sender() -> None:
        for size in sizes:
            send(child, (size, out_of_band([b"x" * size])))
        send(child, None)

    process = multiprocessing.get_context("fork").Process(target=sender)
    process.start()
    child.close()
    scratch = bytearray()
    try:
        for size in sizes:
            got_size, (payload,) = receive(parent, scratch)
            assert got_size == size and bytes(payload) == b"x" * size
        assert receive(parent, scratch) is None
    finally:
        process.join(10)
        parent.close()


def test_a_closed_pipe_is_an_eof_error():
    parent, child = multiprocessing.get_context("fork").Pipe(duplex=True)
    child.close()
    with pytest.raises(EOFError):
        receive(parent, bytearray())
    parent.close()
