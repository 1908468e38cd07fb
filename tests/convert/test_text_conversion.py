"""Text conversion and the text dataset: sources, exact ids, storage formats, manifest, errors, CLI.

Every test builds its own small corpus and trains its own tokenizer with the `tokenizers` trainer. Each
corpus document names its index ("doc 17 ..."), so that order mistakes show in the decoded text.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from builders.text import UNICODE, WORDS, make_corpus, reference_ids, train_bytelevel, write_jsonl

import fastdata
from fastdata.cli import main
from fastdata.errors import ConfigError, RejectedFileError, SourceError
from fastdata.formats.lmdb_text import TextLmdbReader, TextLmdbWriter
from fastdata.formats.manifest import partial_path, read_manifest, sha256_file
from fastdata.formats.tokens import stored_dtype
from fastdata.text.blocks import PackedBlocks


def train_wordpiece(path: Path, texts: list[str]) -> Path:
    """A BERT-like tokenizer whose file asks for [CLS]/[SEP], truncation at 8 and padding: none of which may
    reach the stored ids."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=300, show_progress=False,
                                                             special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"]))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    tok.enable_truncation(8)
    tok.enable_padding(length=16, pad_id=3, pad_token="[PAD]")
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return make_corpus()


@pytest.fixture(scope="module")
def bpe(tmp_path_factory, corpus) -> Path:
    return train_bytelevel(tmp_path_factory.mktemp("tok") / "bpe.json", corpus + UNICODE)


@pytest.fixture(scope="module", params=["lmdb", "wds"])
def converted(request, tmp_path_factory, corpus, bpe) -> Path:
    root = tmp_path_factory.mktemp(f"text_{request.param}")
    src = write_jsonl(root / "corpus.jsonl", corpus)
    out = root / ("out.lmdb" if request.param == "lmdb" else "out")
    fastdata.convert_text(
        src,
        out,
        tokenizer=bpe,
        options=fastdata.TextConversionOptions(format=request.param, shard_size="3KB", progress=False),
    )
    return out


# ------------------------------------------------------------------------------------------ round trip


def test_round_trip_exact_ids_and_decoded_text(converted, corpus, bpe):
    ds = fastdata.dataset(converted)
    assert len(ds) == len(corpus)
    for i, text in enumerate(corpus):
        ids = ds[i]["input_ids"]
        assert ids.dtype.is_floating_point is False and str(ids.dtype) == "torch.int64"
        assert ids.tolist() == reference_ids(bpe, text), i
        assert ds.tokenizer.decode(ids.tolist()) == text, i
    assert ds[-1]["input_ids"].tolist() == reference_ids(bpe, corpus[-1])
    assert ds.total_tokens == sum(len(reference_ids(bpe, t)) for t in corpus)
    assert int(ds.document_lengths.sum()) == ds.total_tokens
    with pytest.raises(IndexError):
        ds[len(corpus)]


def test_empty_documents_are_kept_as_zero_tokens(converted, corpus):
    ds = fastdata.dataset(converted)
    empties = [i for i, t in enumerate(corpus) if t == ""]
    assert empties
    for i in empties:
        assert ds[i]["input_ids"].numel() == 0
        assert ds.document_lengths[i] == 0


def test_manifest_describes_the_text_dataset(converted, corpus, bpe):
    m = read_manifest(converted)
    assert m.kind == "text" and m.num_samples == len(corpus) and m.classes == []
    t = m.text
    assert t["dtype"] == "uint16" and t["documents"] == len(corpus)
    assert t["tokenizer_sha256"] == sha256_file(bpe) == sha256_file(converted / t["tokenizer"])
    assert (t["eos_token"], t["pad_token"]) == ("<|endoftext|>", "<pad>")
    assert t["eos_token_id"] == 0 and t["pad_token_id"] == 1
    assert m.source["files"][0]["name"].endswith("corpus.jsonl")
    assert m.rejected == [] and m.stats["rejected_records"] == 0
    text = fastdata.info(converted)
    assert text.text["total_tokens"] == fastdata.dataset(converted).total_tokens
    if m.format == "wds":
        assert len(m.files) > 3  # small shards: documents span several
        for entry in t["index_files"]:
            assert sha256_file(converted / entry["name"]) == entry["sha256"]


def test_dataset_pickles_and_reads_in_another_process(converted, corpus):
    import multiprocessing
    import pickle

    ds = fastdata.dataset(converted)
    ds[3]  # open readers here first: a copy must reopen its own
    clone = pickle.loads(pickle.dumps(ds))
    assert clone[3]["input_ids"].tolist() == ds[3]["input_ids"].tolist()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        lengths = pool.map(_length_of_doc, [(converted, i) for i in (0, 4, len(corpus) - 1)])
    assert lengths == [int(ds.document_lengths[i]) for i in (0, 4, len(corpus) - 1)]


def _length_of_doc(args: tuple[Path, int]) -> int:
    path, i = args
    return int(fastdata.dataset(path)[i]["input_ids"].numel())


def test_any_tokenizer_ids_exact_special_tokens_truncation_and_padding_off(tmp_path, corpus):
    tokenizer = train_wordpiece(tmp_path / "wp.json", corpus)
    src = write_jsonl(tmp_path / "c.jsonl", corpus[:40])
    fastdata.convert_text(
        src,
        tmp_path / "wp.lmdb",
        tokenizer=tokenizer,
        options=fastdata.TextConversionOptions(progress=False),
    )
    ds = fastdata.dataset(tmp_path / "wp.lmdb")
    for i, text in enumerate(corpus[:40]):
        assert ds[i]["input_ids"].tolist() == reference_ids(tokenizer, text)
    long_doc = max(range(40), key=lambda i: len(corpus[i]))
    assert len(ds[long_doc]["input_ids"]) > 8  # the file's truncation at 8 was switched off
    assert read_manifest(tmp_path / "wp.lmdb").text["eos_token"] == "[SEP]"


def test_uint32_when_the_vocabulary_exceeds_65536(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)}
    vocab["[UNK]"] = 70_000
    vocab["</s>"] = 70_001
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["</s>"])
    tok.save(str(tmp_path / "big.json"))
    docs = ["w1 w65535 w65536 w69999", "w0 nope w70000", ""]
    fastdata.convert_text(
        write_jsonl(tmp_path / "c.jsonl", docs),
        tmp_path / "big.lmdb",
        tokenizer=tmp_path / "big.json",
        options=fastdata.TextConversionOptions(progress=False),
    )
    ds = fastdata.dataset(tmp_path / "big.lmdb")
    assert read_manifest(tmp_path / "big.lmdb").text["dtype"] == "uint32"
    assert ds[0]["input_ids"].tolist() == [1, 65535, 65536, 69999]
    assert ds[1]["input_ids"].tolist() == [0, 70_000, 70_000]
    assert ds[2]["input_ids"].tolist() == []
    blocks = fastdata.loader(tmp_path / "big.lmdb", batch_size=2, shuffle=False, num_workers=0,
                             text=fastdata.TextOptions(seq_len=3))
    assert next(iter(blocks))["input_ids"][0].tolist() == [1, 65535, 65536]


def test_single_huge_document_spans_many_chunks(tmp_path, bpe):
    rng = np.random.default_rng(5)
    huge = " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), 270_000)) + " 🎉"
    docs = ["before", huge, "after"]
    fastdata.convert_text(write_jsonl(tmp_path / "h.jsonl", docs), tmp_path / "h.lmdb", tokenizer=bpe,
                          options=fastdata.TextConversionOptions(progress=False))
    ds = fastdata.dataset(tmp_path / "h.lmdb")
    expected = reference_ids(bpe, huge)
    assert len(expected) > read_manifest(tmp_path / "h.lmdb").text["chunk_tokens"]
    assert ds[1]["input_ids"].tolist() == expected
    assert ds.tokenizer.decode(ds[2]["input_ids"].tolist()) == "after"
    assert read_manifest(tmp_path / "h.lmdb").text["max_document_tokens"] == len(expected)


def test_lmdb_token_ranges_across_tiny_chunks(tmp_path):
    dtype = stored_dtype("uint16")
    writer = TextLmdbWriter(tmp_path / "t.lmdb", dtype, chunk_tokens=7)
    docs = [np.arange(n, dtype=dtype) + 100 * i for i, n in enumerate([0, 3, 20, 7, 0, 1, 13])]
    for doc in docs:
        writer.add(doc)
    writer.close()
    stream = np.concatenate(docs)
    reader = TextLmdbReader(tmp_path / "t.lmdb", {"dtype": "uint16", "documents": len(docs),
                                                  "total_tokens": len(stream), "chunk_tokens": 7})
    assert reader.ends.tolist() == np.cumsum([len(d) for d in docs]).tolist()
    for start in range(len(stream) + 1):
        for stop in range(start, len(stream) + 1):
            np.testing.assert_array_equal(reader.read(start, stop), stream[start:stop])
    with pytest.raises(IndexError):
        reader.read(0, len(stream) + 1)
    blocks = PackedBlocks(reader, seq_len=5, eos_id=9999)
    with_eos = np.concatenate([np.append(d, 9999) for d in docs])
    for k in range(len(blocks)):
        np.testing.assert_array_equal(blocks.block(k), with_eos[5 * k:5 * k + 6])
    assert len(blocks) == (len(with_eos) - 1) // 5


# --------------------------------------------------------------------------------------------- sources


def test_sources_in_sorted_order_all_kinds(tmp_path, bpe, corpus):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    write_jsonl(src / "a.jsonl", corpus[:5])
    with gzip.open(src / "b" / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in corpus[5:9])
    (src / "b" / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"text": d}) + "\n" for d in corpus[9:12]).encode()))
    pq.write_table(pa.table({"text": corpus[12:15], "n": [1, 2, 3]}), src / "e.parquet", row_group_size=2)
    (src / "f.txt").write_text("first line ünïcode\n\nsecond paragraph\n", encoding="utf-8")
    (src / "notes.md").write_text("ignored")
    expected = [*corpus[:15], "first line ünïcode\n\nsecond paragraph\n"]
    summary = fastdata.convert_text(
        src,
        tmp_path / "all.lmdb",
        tokenizer=bpe,
        options=fastdata.TextConversionOptions(progress=False),
    )
    assert summary.documents == len(expected) and summary.source_files == 5
    ds = fastdata.dataset(tmp_path / "all.lmdb")
    assert [ds.tokenizer.decode(ds[i]["input_ids"].tolist()) for i in range(len(ds))] == expected

    fastdata.convert_text(
        str(src / "*.txt"),
        tmp_path / "lines.lmdb",
        tokenizer=bpe,
        options=fastdata.TextConversionOptions(txt_mode="line", progress=False),
    )
    lines = fastdata.dataset(tmp_path / "lines.lmdb")
    assert [lines.tokenizer.decode(lines[i]["input_ids"].tolist()) for i in range(len(lines))] == \
        ["first line ünïcode", "second paragraph"]


def test_invalid_records_are_reported_with_file_and_line(tmp_path, bpe):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    lines = [b'{"text": "good one"}', b"not json at all", b'{"body": "wrong field"}', b'{"text": 42}',
             b'["a list"]', b"", b'{"text": "caf\xe9 latin-1"}', b'{"text": "lone \\ud800 surrogate"}',
             b'{"text": "good two"}']
    (src / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (src / "b.txt").write_bytes(b"fine line\nbad \xff byte\n")
    pq.write_table(pa.table({"text": ["p1", None, "p3"]}), src / "c.parquet")
    pq.write_table(pa.table({"other": ["x"]}), src / "d.parquet")
    summary = fastdata.convert_text(
        src,
        tmp_path / "out.lmdb",
        tokenizer=bpe,
        options=fastdata.TextConversionOptions(progress=False, max_rejected="100%"),
    )  # most records are bad, on purpose
    where = {(Path(r.source).name, r.line): r.reason for r in summary.rejected}
    assert "not valid JSON" in where[("a.jsonl", 2)]
    assert "no field 'text'" in where[("a.jsonl", 3)]
    assert "is int, not a string" in where[("a.jsonl", 4)]
    assert "not a JSON object" in where[("a.jsonl", 5)]
    assert "not valid UTF-8" in where[("a.jsonl", 7)]
    assert "cannot be tokenized" in where[("a.jsonl", 8)]
    assert "not valid UTF-8" in where[("b.txt", 2)]
    assert "null" in where[("c.parquet", 2)]
    assert "no column 'text'" in where[("d.parquet", 0)]
    assert summary.rejected_count == len(where) == 9
    assert "a.jsonl:2: not valid JSON" in str(summary)
    ds = fastdata.dataset(tmp_path / "out.lmdb")
    texts = [ds.tokenizer.decode(ds[i]["input_ids"].tolist()) for i in range(len(ds))]
    assert texts == ["good one", "good two", "p1", "p3"]  # whole-file txt with a bad byte: rejected whole
    m = read_manifest(tmp_path / "out.lmdb")
    assert {(Path(r["path"]).name, r["line"]) for r in m.rejected} == set(where)
    from fastdata.tools.info import describe

    assert ":2: not valid JSON" in describe(tmp_path / "out.lmdb")


def test_damaged_compressed_files_are_reported_and_skipped(tmp_path, bpe):
    import zstandard

    src = tmp_path / "src"
    src.mkdir()
    lines = "".join(json.dumps({"text": f"line {i} " + "x" * 50}) + "\n" for i in range(400))
    gz = gzip.compress(lines.encode())
    (src / "a.jsonl.gz").write_bytes(gz[:len(gz) // 2])  # truncated
    zst = bytearray(zstandard.ZstdCompressor().compress(lines.encode()))
    zst[len(zst) // 2:len(zst) // 2 + 16] = b"\xff" * 16  # corrupted
    (src / "b.jsonl.zst").write_bytes(bytes(zst))
    write_jsonl(src / "c.jsonl", ["after"])
    summary = fastdata.convert_text(
        src,
        tmp_path / "o.lmdb",
        tokenizer=bpe,
        options=fastdata.TextConversionOptions(progress=False),
    )
    reasons = {Path(r.source).name: r.reason for r in summary.rejected}
    assert set(reasons) == {"a.jsonl.gz", "b.jsonl.zst"}
    assert all("damaged compressed file" in reason for reason in reasons.values())
    ds = fastdata.dataset(tmp_path / "o.lmdb")
    assert ds.tokenizer.decode(ds[len(ds) - 1]["input_ids"].tolist()) == "after"
    assert 0 < len(ds) < 801


def test_strict_stops_at_first_rejection_and_writes_nothing(tmp_path, bpe):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "ok"}\n{"text": null}\n')
    out = tmp_path / "out.lmdb"
    with pytest.raises(RejectedFileError, match=r"a\.jsonl:2: field 'text' is NoneType"):
        fastdata.convert_text(
            src,
            out,
            tokenizer=bpe,
            options=fastdata.TextConversionOptions(strict=True, progress=False),
        )
    assert not out.exists() and not partial_path(out).exists()


def test_source_and_option_errors(tmp_path, bpe):
    (tmp_path / "x.csv").write_text("a,b\n")
    (tmp_path / "empty").mkdir()
    good = write_jsonl(tmp_path / "g.jsonl", ["x"])
    cases = [
        (SourceError, "no such file", dict(src=tmp_path / "missing.jsonl")),
        (SourceError, "unsupported source file", dict(src=tmp_path / "x.csv")),
        (SourceError, "holds no", dict(src=tmp_path / "empty")),
        (SourceError, "matches no", dict(src=str(tmp_path / "*.nothing"))),
        (ConfigError, "tokenizer file not found", dict(tokenizer=tmp_path / "nope.json")),
        (ConfigError, "not a `tokenizers`", dict(tokenizer=good)),
        (ConfigError, "not in the tokenizer's vocabulary", dict(eos_token="<|nope|>")),
        (ConfigError, "--txt-mode must be one of file, line", dict(txt_mode="para")),
        (ConfigError, "cannot tell the output format", dict(out=tmp_path / "out")),
    ]
    for error, message, change in cases:
        args = {"src": good, "out": tmp_path / "o.lmdb", "tokenizer": bpe, **change}
        with pytest.raises(error, match=message):
            fastdata.convert_text(args.pop("src"), args.pop("out"), tokenizer=args.pop("tokenizer"),
                                  options=fastdata.TextConversionOptions(progress=False, **args))
        assert not (tmp_path / "o.lmdb").exists()


def test_existing_output_needs_overwrite(tmp_path, bpe):
    src = write_jsonl(tmp_path / "a.jsonl", ["one", "two"])
    out = tmp_path / "o.lmdb"
    fastdata.convert_text(
        src,
        out,
        tokenizer=bpe,
        options=fastdata.TextConversionOptions(progress=False),
    )
    with pytest.raises(Exception, match="--overwrite"):
        fastdata.convert_text(
            src,
            out,
            tokenizer=bpe,
            options=fastdata.TextConversionOptions(progress=False),
        )
    write_jsonl(src, ["three"])
    fastdata.convert_text(
        src,
        out,
        tokenizer=bpe,
        options=fastdata.TextConversionOptions(overwrite=True, progress=False),
    )
    assert len(fastdata.dataset(out)) == 1


def test_image_paths_unchanged_and_kinds_kept_apart(solid_lmdb):
    assert read_manifest(solid_lmdb).text is None
    with pytest.raises(ConfigError, match="seq_len: for text datasets only"):
        fastdata.loader(solid_lmdb, num_workers=0, text=fastdata.TextOptions(seq_len=16))
    images, labels = next(iter(fastdata.loader(solid_lmdb, batch_size=8, num_workers=0)))
    assert images.shape == (8, 3, 224, 224) and labels.shape == (8,)


def test_webdataset_library_reads_text_shards(tmp_path, corpus, bpe):
    import webdataset as wds

    out = tmp_path / "shards"
    fastdata.convert_text(
        write_jsonl(tmp_path / "c.jsonl", corpus),
        out,
        tokenizer=bpe,
        options=fastdata.TextConversionOptions(format="wds", shard_size="4KB", progress=False),
    )
    m = read_manifest(out)
    urls = [str(out / f.name) for f in m.files]
    samples = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert [int(s["__key__"]) for s in samples] == list(range(len(corpus)))
    for i, sample in enumerate(samples):
        assert np.frombuffer(sample["ids"], "<u2").tolist() == reference_ids(bpe, corpus[i])
        assert json.loads(sample["json"])["line"] == i + 1


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_convert_text_and_info(tmp_path, capsys, bpe, corpus):
    src = write_jsonl(tmp_path / "c.jsonl", corpus[:30])
    with open(src, "a") as f:
        f.write("broken\n")
    code = main(["convert", "text", str(src), str(tmp_path / "o.lmdb"), "--tokenizer", str(bpe), "-q"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "documents 30" in out and "rejected  1 records" in out and "c.jsonl:31: not valid JSON" in out
    assert main(["info", str(tmp_path / "o.lmdb")]) == 0
    info = capsys.readouterr().out
    assert "kind        text" in info and "documents   30" in info and "<|endoftext|>" in info
    code = main(["convert", "text", str(src), str(tmp_path / "s"), "--tokenizer", str(bpe), "--format", "wds",
                 "--strict", "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "c.jsonl:31" in err and len(err.strip().splitlines()) == 1
    code = main(["convert", "text", str(src), str(tmp_path / "x.lmdb"), "--tokenizer", str(tmp_path / "no.json")])
    err = capsys.readouterr().err
    assert code == 2 and "tokenizer file not found" in err and "Traceback" not in err
    assert main(["convert", "text", "--help"]) == 0
    help_text = capsys.readouterr().out
    for needle in ("--tokenizer", "--field", "--txt-mode", "--eos-token", "--format", "--shard-size",
                   "--overwrite", "--strict", "--batch-size"):
        assert needle in help_text


def test_background_reader_stops_with_its_consumer_and_passes_errors_on():
    import threading

    from fastdata.convert.text_source import in_background

    def endless():
        i = 0
        while True:
            yield i
            i += 1

    before = threading.active_count()
    stream = in_background(endless(), 2)
    assert [next(stream) for _ in range(5)] == [0, 1, 2, 3, 4]
    stream.close()  # returns (does not hang on the full queue) and ends the thread
    assert threading.active_count() == before

    def failing():
        yield "first"
        raise SourceError("x.jsonl: unreadable")

    received = []
    with pytest.raises(SourceError, match=r"x\.jsonl"):
        for item in in_background(failing(), 1):
            received.append(item)
    assert received == ["first"]
