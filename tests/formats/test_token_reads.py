"""Reading many token ranges at once (fastdata.formats.tokens.TokenReader.read_many / read_into): the LMDB reader's
gather over the mapped data file, its slice per long range, and its copy from the values where the file's mapping
is unknown all give the stream's own tokens, across chunk ends; `read_into` puts each range at its place, in either
format."""

from __future__ import annotations

import numpy as np
import pytest

import fastdata
from fastdata.formats import lmdb_text
from fastdata.formats.lmdb_text import TextLmdbReader, TextLmdbWriter
from fastdata.formats.tokens import stored_dtype

CHUNK = 7


@pytest.fixture(scope="module")
def tiny_chunks(tmp_path_factory) -> tuple[TextLmdbReader, np.ndarray]:
    """A stream of 300 tokens in chunks of 7 (most ranges cross a chunk's end), and the stream itself."""
    dtype = stored_dtype("uint16")
    path = tmp_path_factory.mktemp("tiny_chunks") / "t.lmdb"
    writer = TextLmdbWriter(path, dtype, chunk_tokens=CHUNK)
    docs = [(np.arange(n) * 7 + 100 * i).astype(dtype) for i, n in enumerate([0, 3, 40, 7, 0, 1, 113, 60, 76])]
    for doc in docs:
        writer.add(doc)
    writer.close()
    stream = np.concatenate(docs)
    return TextLmdbReader(path, {"dtype": "uint16", "documents": len(docs), "total_tokens": len(stream),
                                 "chunk_tokens": CHUNK}), stream


def random_ranges(rng: np.random.Generator, total: int, count: int, longest: int) -> tuple[np.ndarray, np.ndarray]:
    starts = rng.integers(0, total + 1, count)
    return starts, np.minimum(rng.integers(0, longest + 1, count), total - starts)


@pytest.mark.parametrize("how", ["gather", "slices", "unmapped"])
def test_many_ranges_read_the_stream_itself(tiny_chunks, monkeypatch, how):
    reader, stream = tiny_chunks
    reader = TextLmdbReader(reader.directory, {"dtype": "uint16", "documents": 9, "total_tokens": len(stream),
                                               "chunk_tokens": CHUNK})  # its own chunk places
    if how == "unmapped":  # as where /proc/self/maps does not exist
        monkeypatch.setattr(lmdb_text, "mapped_ranges", lambda path: [])
    monkeypatch.setattr(lmdb_text, "GATHER_BELOW", 1 << 30 if how == "gather" else 0)
    rng = np.random.default_rng(1)
    for count in (0, 1, 2, 5, 40, 300):
        starts, counts = random_ranges(rng, len(stream), count, 30)
        expected = np.concatenate([stream[s:s + n] for s, n in zip(starts, counts, strict=True)] or [stream[:0]])
        np.testing.assert_array_equal(reader.read_many(starts, counts), expected)
    assert (reader._file is None) == (how == "unmapped")


@pytest.mark.parametrize("how", ["gather", "slices", "unmapped"])
def test_ranges_go_to_their_places(tiny_chunks, monkeypatch, how):
    """Ranges written at ascending places with gaps between them (into int32, as a batch's rows): at each place its
    range, whatever the gaps hold."""
    reader, stream = tiny_chunks
    if how == "unmapped":
        monkeypatch.setattr(lmdb_text, "mapped_ranges", lambda path: [])
        reader = TextLmdbReader(reader.directory, {"dtype": "uint16", "documents": 9, "total_tokens": len(stream),
                                                   "chunk_tokens": CHUNK})
    monkeypatch.setattr(lmdb_text, "GATHER_BELOW", 1 << 30 if how == "gather" else 0)
    rng = np.random.default_rng(2)
    for count in (1, 3, 50):
        starts, counts = random_ranges(rng, len(stream), count, 25)
        places = np.cumsum(counts + rng.integers(0, 4, count)) - counts
        out = np.full(int(places[-1] + counts[-1]) + 3, -7, np.int32)
        reader.read_into(out, starts, counts, places)
        for s, n, p in zip(starts, counts, places, strict=True):
            np.testing.assert_array_equal(out[p:p + n], stream[s:s + n])
        assert (out[-3:] == -7).all()  # nothing after the last range
    with pytest.raises(IndexError):
        reader.read_into(np.zeros(4, np.int32), np.array([0]), np.array([5]), np.array([0]))


def test_read_into_in_either_format(loader_text):
    store = fastdata.dataset(loader_text).store
    stream = store.read(0, store.total_tokens)
    starts = np.array([0, 5, 300, store.total_tokens - 9])
    counts = np.array([3, 0, 40, 9])
    places = np.array([2, 5, 10, 60])
    out = np.zeros(80, np.int64)
    store.read_into(out, starts, counts, places)
    for s, n, p in zip(starts, counts, places, strict=True):
        np.testing.assert_array_equal(out[p:p + n], stream[s:s + n])
