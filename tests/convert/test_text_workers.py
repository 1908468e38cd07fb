"""`fastdata convert text --workers N` (`fastdata.convert.text_work`): documents tokenized on worker processes
give the dataset tokenizing in one process gives, byte for byte, whatever the number of workers, with a huge
document and an untokenizable record among the others; tasks are cut by size, a huge document alone; one big .txt
file is cut into pieces tokenized on every worker into exactly the ids of one whole encode (kept whole, and said
so, for a tokenizer where the cut cannot be shown safe)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from builders.runs import cli
from builders.text import make_corpus, reference_ids, train_bytelevel, train_tokenizer, tricky_text

import fastdata
from fastdata.convert import text_work
from fastdata.errors import ConfigError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("text_workers")
    docs = make_corpus(400, seed=3)
    docs.insert(50, " ".join(docs[:120]) * 8)  # a huge document among small ones
    tokenizer = train_bytelevel(root / "tokenizer.json", docs[:200])
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            if i == 200:
                f.write('{"text": "a lone surrogate \\ud800 cannot be tokenized"}\n')
    return root, docs, tokenizer


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_workers_give_the_same_dataset_byte_for_byte(corpus, tmp_path, monkeypatch, fmt):
    root, docs, tokenizer = corpus
    monkeypatch.setattr(text_work, "TASK_CHARS", 2000)  # many tasks, the huge document one of its own
    digests = {}
    for workers in (0, None, 1, 2, 4):  # 0: in this process; None: the default, a worker per core
        out = tmp_path / f"w{workers}" / ("out.lmdb" if fmt == "lmdb" else "out")
        summary = fastdata.convert_text(
            root / "corpus.jsonl",
            out,
            tokenizer=tokenizer,
            options=fastdata.TextConversionOptions(
                format=fmt, shard_size="16KB", batch_size="8KB", workers=workers, progress=False
            ),
        )
        assert summary.documents == len(docs) and summary.rejected_count == 1
        assert "cannot be tokenized" in summary.rejected[0].reason
        files = fastdata.info(out).files
        if fmt == "lmdb":  # LMDB leaves unused page bytes as they were: compare what it stores
            data = fastdata.dataset(out)
            digests[workers] = [data.tokens(i).tolist() for i in range(len(docs))]
        else:
            digests[workers] = [(f.name, f.sha256) for f in files]
    assert digests[0] == digests[1] == digests[2] == digests[4] == digests[None]
    if fmt == "lmdb":
        assert digests[2][50] == reference_ids(tokenizer, docs[50])


def test_tasks_are_cut_by_size_and_a_huge_text_goes_alone(monkeypatch):
    monkeypatch.setattr(text_work, "TASK_CHARS", 10)
    assert text_work._cut(["aaaa", "bbbb", "cc", "d" * 50, "e", "ff"]) == [["aaaa", "bbbb", "cc"], ["d" * 50],
                                                                         ["e", "ff"]]
    assert text_work._cut([]) == [[]]  # a batch of rejections only still has its place in the order


def test_workers_option(corpus, tmp_path, capsys):
    root, _, tokenizer = corpus
    code, out, err = cli(capsys, "convert", "text", root / "corpus.jsonl", tmp_path / "o.lmdb", "--tokenizer",
                         tokenizer, "--workers", "2", "-q")
    assert code == 0, err
    assert "the writer waited for the workers" in out
    with pytest.raises(ConfigError, match="--workers must be 0 \\(this process\\) or more"):
        fastdata.convert_text(
            root / "corpus.jsonl",
            tmp_path / "x.lmdb",
            tokenizer=tokenizer,
            options=fastdata.TextConversionOptions(workers=-1),
        )
    # by default the cores tokenize, in worker processes, as an image conversion uses them
    code, out, err = cli(capsys, "convert", "text", root / "corpus.jsonl", tmp_path / "d.lmdb", "--tokenizer",
                         tokenizer, "-q")
    assert code == 0 and "the writer waited for the workers" in out, err
    code, out, err = cli(capsys, "convert", "text", root / "corpus.jsonl", tmp_path / "z.lmdb", "--tokenizer",
                         tokenizer, "--workers", "0", "-q")
    assert code == 0 and "the writer waited for the workers" not in out, err


@pytest.mark.parametrize(("kind", "workers"), [("bytelevel", 2), ("llama3-split", 2), ("wordpiece", 0),
                                               ("llama2-prepend", 2)])
def test_one_big_text_file_is_tokenized_on_every_worker_into_the_ids_of_the_whole(tmp_path, monkeypatch, kind,
                                                                                  workers):
    monkeypatch.setattr(text_work, "TASK_CHARS", 3000)
    text = tricky_text(40_000, seed=11)
    source = tmp_path / "input.txt"
    source.write_text(text, encoding="utf-8")
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", [tricky_text(400, s) for s in range(20)], kind)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = fastdata.convert_text(
            source,
            tmp_path / "out.lmdb",
            tokenizer=tokenizer,
            options=fastdata.TextConversionOptions(workers=workers, progress=False),
        )
    stored = fastdata.dataset(tmp_path / "out.lmdb")[0]["input_ids"].numpy()
    np.testing.assert_array_equal(stored, reference_ids(tokenizer, text))
    said = [note for note in summary.notes if "long document" in note or "tokenized whole" in note]
    if kind == "llama2-prepend":
        assert said == ["1 document over 3,000 characters tokenized whole, on one core: cutting them cannot be "
                        "shown to keep this tokenizer's ids (its normalizer has a Prepend step, which is not "
                        "character by character)"]
        assert sum("tokenized whole, on one core" in str(w.message) for w in caught) == 1
    else:
        pieces = int(said[0].split("cut into ")[1].split(" pieces")[0])
        assert said == [f"1 long document cut into {pieces} pieces tokenized in parallel (the ids of the whole "
                        "document)"] and pieces > len(text) // 3000 // 2
        assert f"note      {said[0]}" in str(summary)


def test_split_documents_false_keeps_documents_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(text_work, "TASK_CHARS", 3000)
    text = tricky_text(20_000, seed=12)
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", [tricky_text(400, s) for s in range(20)], "bytelevel")
    summary = fastdata.convert_text(
        tmp_path / "input.txt",
        tmp_path / "out.lmdb",
        tokenizer=tokenizer,
        options=fastdata.TextConversionOptions(workers=2, progress=False, split_documents=False),
    )
    assert not [note for note in summary.notes if "long document" in note]
    np.testing.assert_array_equal(fastdata.dataset(tmp_path / "out.lmdb")[0]["input_ids"].numpy(),
                                  reference_ids(tokenizer, text))
