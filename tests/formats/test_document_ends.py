"""Document ends read a chunk at a time (`DocumentEnds`): the same answers as numpy over the whole array, with
chunks of any size (empty documents included) and a cache smaller than the index; LMDB text datasets of many
stored index chunks read back exactly."""

from __future__ import annotations

import numpy as np
import pytest
from builders.many import many_document, write_many_documents

import fastdata
from fastdata.formats import lmdb_text, wds_text
from fastdata.formats.tokens import DocumentEnds
from fastdata.text.blocks import PackedBlocks


def chunked(ends: np.ndarray, sizes: list[int], cache_bytes: int = 1 << 20) -> tuple[DocumentEnds, list[int]]:
    """`ends` cut into chunks of `sizes`, and the list of the chunks loaded (in order)."""
    first = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    loaded: list[int] = []

    def load(k: int) -> np.ndarray:
        loaded.append(k)
        return ends[first[k]:first[k + 1]].copy()

    return DocumentEnds(first, ends[first[1:] - 1], load, cache_bytes), loaded


@pytest.fixture
def ends() -> np.ndarray:
    lengths = np.random.default_rng(4).integers(0, 5, 300)  # zero-length documents too
    return np.cumsum(lengths).astype(np.int64)


@pytest.mark.parametrize("sizes", [[300], [1] * 300, [7] * 42 + [6], [100, 1, 150, 49]])
def test_lookups_match_numpy_over_the_whole_array(ends, sizes):
    index, _ = chunked(ends, sizes)
    assert len(index) == len(ends)
    docs = np.arange(-1, len(ends))
    np.testing.assert_array_equal(index.take(docs), np.concatenate([[0], ends]))
    assert [index[i] for i in (0, 150, 299)] == [int(ends[i]) for i in (0, 150, 299)]
    positions = np.arange(-2, int(ends[-1]) + len(ends) + 3)
    eos = ends + np.arange(len(ends))
    for side in ("left", "right"):
        np.testing.assert_array_equal(index.searchsorted(positions, side), np.searchsorted(ends, positions, side))
        np.testing.assert_array_equal(index.searchsorted(positions, side, per_doc=1),
                                      np.searchsorted(eos, positions, side))
    with pytest.raises(IndexError, match="document 300 out of range for 300 documents"):
        index[300]


def test_the_cache_keeps_at_most_its_bytes_and_reloads_what_it_dropped(ends):
    index, loaded = chunked(ends, [10] * 30, cache_bytes=3 * 10 * 8)  # three chunks of ten int64
    index.take(np.arange(len(ends)))
    assert loaded == list(range(30))
    assert len(index._cache) == 3 and index._cached_bytes == 240
    index.take(np.array([295, 5]))  # chunk 29 is cached, chunk 0 was dropped
    assert loaded[30:] == [0]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_dataset_of_many_index_chunks_reads_back_exactly(tmp_path, monkeypatch, fmt):
    monkeypatch.setattr(lmdb_text, "ENDS_PER_CHUNK", 13)  # LMDB: 77 documents in 6 stored chunks of ends
    out = write_many_documents(tmp_path / f"d.{fmt}", 77, fmt, shard_bytes=2048)
    ds = fastdata.dataset(out)
    index = ds.store.document_ends
    assert len(index.first_docs) - 1 > 3
    np.testing.assert_array_equal(index.take(np.arange(77)), ds.store.ends)
    assert [ds[i]["input_ids"].tolist() for i in range(77)] == [many_document(i).tolist() for i in range(77)]
    stream = np.concatenate([np.append(many_document(i), 0) for i in range(77)]).astype(np.int64)
    blocks = PackedBlocks(ds.store, 5, 0)
    expected = [stream[k * 5:k * 5 + 6] for k in range(len(blocks))]
    np.testing.assert_array_equal(blocks.rows(np.arange(len(blocks))[::-1]), np.array(expected[::-1]))


def test_a_damaged_lmdb_document_index_is_refused_naming_the_dataset(tmp_path, monkeypatch):
    monkeypatch.setattr(lmdb_text, "ENDS_PER_CHUNK", 13)
    out = write_many_documents(tmp_path / "d.lmdb", 40, "lmdb")
    manifest = fastdata.info(out)
    manifest.text["documents"] = 41
    reader = lmdb_text.TextLmdbReader(out, manifest.text)
    with pytest.raises(fastdata.errors.NotADatasetError, match="document index holds 40 documents"):
        reader.document_ends  # noqa: B018


def test_wds_shard_token_counts_come_from_the_manifest_else_from_the_indexes(tmp_path):
    out = write_many_documents(tmp_path / "d", 60, "wds", shard_bytes=2048)
    manifest = fastdata.info(out)
    listed = manifest.text["index_files"]
    assert len(listed) > 3 and all(isinstance(entry["tokens"], int) for entry in listed)
    expected = fastdata.dataset(out).store.ends
    older = {**manifest.text, "index_files": [{k: v for k, v in e.items() if k != "tokens"} for e in listed]}
    reader = wds_text.TextWdsReader(out, manifest.files, older)  # converted before the counts were listed
    np.testing.assert_array_equal(reader.document_ends.take(np.arange(60)), expected)
    wrong = [dict(e) for e in listed]
    wrong[1]["tokens"] += 1
    wrong[2]["tokens"] -= 1  # the total still agrees: only the shards' own index tells
    reader = wds_text.TextWdsReader(out, manifest.files, {**manifest.text, "index_files": wrong})
    np.testing.assert_array_equal(reader.document_ends.take(np.arange(manifest.files[0].samples)),
                                  expected[:manifest.files[0].samples])
    with pytest.raises(fastdata.errors.CorruptSampleError, match=f"{wrong[1]['name']}: holds .* tokens, the manifest"):
        reader.read(0, int(expected[-1]))
