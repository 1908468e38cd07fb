"""Crash-safe, resumable text conversion: a conversion killed with SIGKILL at any point leaves nothing that opens as
a dataset, and rerunning the same command resumes from its last checkpoint, skips the source records already
consumed (without tokenizing them again) and gives what an uninterrupted conversion gives."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from builders.runs import KILL_WHEN
from builders.text import make_corpus, train_bytelevel

import fastdata
from fastdata.cli import main
from fastdata.convert.text import TextConversionSummary, _TextProgress
from fastdata.errors import IncompleteDatasetError, OutputExistsError, RejectedFileError, StagingDamagedError
from fastdata.formats.lmdb_text import TextLmdbWriter
from fastdata.formats.manifest import partial_path, read_manifest
from fastdata.formats.tar_shards import PROGRESS_FILE

# Small chunks, commits, shards and batches: many checkpoints on a tiny corpus.
SETTINGS = {"shard_size": "12KB", "batch_size": "2KB", "chunk_tokens": 64, "commit_every_chunks": 2,
            "progress": False}
BAD_LINES = [b"not json at all", b'{"body": "wrong field"}', b'{"text": "lone \\ud800 surrogate"}']

# Runs a text conversion in a child process that SIGKILLs itself at a chosen point inside the writer: a real,
# abrupt kill (no cleanup, no atexit), placed deterministically.
KILLER = KILL_WHEN + textwrap.dedent("""
    import json, sys
    import fastdata
    from fastdata.formats.manifest import Manifest
    from fastdata.formats.lmdb_text import TextLmdbWriter
    from fastdata.formats.wds_text import TextWdsWriter

    sources, out, fmt, where, at, settings = json.loads(sys.argv[1])
    writer = TextLmdbWriter if fmt == "lmdb" else TextWdsWriter

    if where == "add":           # before document number `at` is added
        kill_when(writer, "add", lambda self: self.count == at)
    elif where == "checkpoint":  # right before checkpoint number `at` (the 1st records the fingerprint)
        calls = []
        kill_when(writer, "checkpoint", lambda self: calls.append(1) or len(calls) == at)
    elif where == "close":       # every document added, data not finalised
        kill_when(writer, "close", lambda self: True)
    elif where == "manifest":    # data complete, manifest not yet written
        kill_when(Manifest, "write", lambda self: True)
    tokenizer = settings.pop("tokenizer")
    fastdata.convert_text(sources, out, fastdata.TextConversionOptions(format=fmt, **settings), tokenizer=tokenizer)
""")


def convert(sources: list[Path], out: Path, fmt: str, tokenizer: Path, **overrides) -> TextConversionSummary:
    return fastdata.convert_text([str(s) for s in sources], out,
                                 fastdata.TextConversionOptions(format=fmt, **{**SETTINGS, **overrides}),
                                 tokenizer=tokenizer)


def killed_conversion(sources: list[Path], out: Path, fmt: str, where: str, at: int, tokenizer: Path,
                      **overrides) -> None:
    args = json.dumps([[str(s) for s in sources], str(out), fmt, where, at,
                       {**SETTINGS, "tokenizer": str(tokenizer), **overrides}])
    proc = subprocess.run([sys.executable, "-c", KILLER, args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not out.exists()
    with pytest.raises(IncompleteDatasetError, match="rerun the same convert command"):
        fastdata.dataset(out)


def saved_progress(out: Path, fmt: str) -> _TextProgress:
    """The progress record an interrupted conversion left in OUT.partial."""
    if fmt == "lmdb":
        writer = TextLmdbWriter(partial_path(out), np.dtype("uint16"))
        raw = writer.saved_progress()
        writer.abort()
    else:
        raw = (partial_path(out) / PROGRESS_FILE).read_bytes()
    assert raw is not None
    progress = _TextProgress.from_json(raw)
    assert progress is not None
    return progress


def documents(out: Path) -> list[list[int]]:
    ds = fastdata.dataset(out)
    return [ds[i]["input_ids"].tolist() for i in range(len(ds))]


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> tuple[list[Path], Path]:
    """Three JSONL sources (with unusable records among the documents) and a tokenizer trained on them."""
    root = tmp_path_factory.mktemp("text_resume")
    docs = make_corpus(150, seed=3)
    sources = []
    for part in range(3):
        lines = [json.dumps({"text": doc}, ensure_ascii=False).encode() for doc in docs[part * 50:(part + 1) * 50]]
        for k, bad in enumerate(BAD_LINES):
            lines.insert(7 + 13 * k + part, bad)
        path = root / f"part{part}.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        sources.append(path)
    return sources, train_bytelevel(root / "bpe.json", docs)


@pytest.fixture(scope="module")
def reference(corpus_files, tmp_path_factory) -> dict[str, Path]:
    sources, tokenizer = corpus_files
    root = tmp_path_factory.mktemp("text_reference")
    refs = {"lmdb": root / "ref.lmdb", "wds": root / "ref-shards"}
    for fmt, out in refs.items():
        convert(sources, out, fmt, tokenizer=tokenizer)
    return refs


@pytest.fixture
def tokenized(monkeypatch) -> list[str]:
    """Every text the conversion in this process hands to the tokenizer (the real `_encode` still runs)."""
    module = importlib.import_module("fastdata.convert.text")
    seen: list[str] = []
    original = module._encode

    def spy(tokenizer, texts):
        seen.extend(texts)
        return original(tokenizer, texts)

    monkeypatch.setattr(module, "_encode", spy)
    return seen


def test_reference_has_several_checkpoints_and_rejections(reference):
    lmdb, wds = read_manifest(reference["lmdb"]), read_manifest(reference["wds"])
    assert lmdb.text["total_tokens"] > 10 * 2 * SETTINGS["chunk_tokens"]  # > 10 LMDB checkpoints
    assert len(wds.files) >= 5  # one checkpoint per shard
    assert lmdb.num_samples == wds.num_samples == 150
    assert lmdb.stats["rejected_records"] == len(lmdb.rejected) == 3 * len(BAD_LINES)


@pytest.mark.parametrize(("fmt", "where", "at"), [
    ("lmdb", "add", 0), ("lmdb", "checkpoint", 2), ("lmdb", "checkpoint", 7), ("lmdb", "add", 120),
    ("lmdb", "close", 0), ("lmdb", "manifest", 0),
    ("wds", "add", 0), ("wds", "checkpoint", 2), ("wds", "checkpoint", 4), ("wds", "add", 120),
    ("wds", "close", 0), ("wds", "manifest", 0),
])
def test_sigkill_then_rerun_resumes_to_the_same_dataset(corpus_files, reference, tokenized, tmp_path, fmt, where,
                                                        at):
    sources, tokenizer = corpus_files
    out = tmp_path / ("out.lmdb" if fmt == "lmdb" else "shards")
    killed_conversion(sources, out, fmt, where, at, tokenizer)

    saved = saved_progress(out, fmt)
    summary = convert(sources, out, fmt, tokenizer=tokenizer)
    ref = read_manifest(reference[fmt])
    assert summary.documents == ref.num_samples
    assert summary.resumed_at == saved.records
    if (where in ("close", "manifest", "add") and at != 0) or (where == "checkpoint" and at > 2):
        assert saved.documents > 0, "a checkpoint was passed before the kill, so the rerun must resume"
    # only the records after the checkpoint are tokenized again (150 documents and 3 untokenizable texts)
    assert len(tokenized) <= 153 - saved.documents
    if where == "manifest":
        assert tokenized == [] and saved.documents == ref.num_samples
    assert documents(out) == documents(reference[fmt])
    manifest = read_manifest(out)
    assert manifest.text == ref.text
    assert manifest.options == ref.options
    assert manifest.rejected == ref.rejected
    assert manifest.stats["rejected_records"] == ref.stats["rejected_records"]
    assert [r.reason for r in summary.rejected] == [r["reason"] for r in ref.rejected]
    if fmt == "wds":  # deterministic: the very same shard bytes
        assert [(f.name, f.sha256) for f in manifest.files] == [(f.name, f.sha256) for f in ref.files]
        assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference[fmt].iterdir())
    assert not partial_path(out).exists()


def test_resume_with_other_options_tokenizer_or_source_is_refused(corpus_files, reference, tmp_path):
    files, tokenizer = corpus_files
    folder = [files[0].parent]  # the sources as one folder: its files are listed anew by each run
    out = tmp_path / "out.lmdb"
    killed_conversion(folder, out, "lmdb", "checkpoint", 5, tokenizer)
    with pytest.raises(OutputExistsError, match=r"batch_size 2000 -> 4000"):
        convert(folder, out, "lmdb", tokenizer=tokenizer, batch_size="4KB")
    with pytest.raises(OutputExistsError, match=r"chunk_tokens 64 -> 128"):
        convert(folder, out, "lmdb", tokenizer=tokenizer, chunk_tokens=128)
    changed = tmp_path / "bpe-changed.json"
    changed.write_bytes(tokenizer.read_bytes() + b"\n")  # same tokenizer, other bytes
    with pytest.raises(OutputExistsError, match=r"tokenizer changed \(sha256 "):
        convert(folder, out, "lmdb", tokenizer=changed)
    with pytest.raises(OutputExistsError, match=r"source \[.*\] -> \["):
        convert(files, out, "lmdb", tokenizer=tokenizer)
    extra = folder[0] / "part3.jsonl"
    stat = files[1].stat()
    try:
        extra.write_bytes(files[0].read_bytes())
        with pytest.raises(OutputExistsError, match=r"source files changed \(3 -> 4 files"):
            convert(folder, out, "lmdb", tokenizer=tokenizer)
        extra.unlink()
        os.utime(files[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        with pytest.raises(OutputExistsError, match=r"source files changed \(3 -> 3 files"):
            convert(folder, out, "lmdb", tokenizer=tokenizer)
    finally:
        extra.unlink(missing_ok=True)
        os.utime(files[1], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert partial_path(out).exists()  # refusals keep the interrupted conversion
    summary = convert(folder, out, "lmdb", tokenizer=tokenizer)  # the same command still resumes
    assert summary.resumed_at and documents(out) == documents(reference["lmdb"])


def test_overwrite_starts_again(corpus_files, reference, tmp_path):
    sources, tokenizer = corpus_files
    out = tmp_path / "shards"
    killed_conversion(sources, out, "wds", "checkpoint", 4, tokenizer)
    summary = convert(sources, out, "wds", tokenizer=tokenizer, shard_size="24KB", overwrite=True)
    assert not summary.resumed_at
    assert documents(out) == documents(reference["wds"])
    assert read_manifest(out).options["shard_size"] == 24_000


def test_strict_rejection_removes_the_partial_output(corpus_files, tmp_path):
    sources, tokenizer = corpus_files
    out = tmp_path / "out.lmdb"
    with pytest.raises(RejectedFileError, match="not valid JSON"):
        convert(sources, out, "lmdb", tokenizer=tokenizer, strict=True)
    assert not out.exists() and not partial_path(out).exists()


def test_lmdb_writer_reopens_after_its_last_checkpoint(tmp_path):
    """Unfilled chunks committed at a checkpoint are taken back on reopening; later additions are dropped."""
    from fastdata.formats.lmdb_text import TextLmdbReader

    dtype = np.dtype("uint16")
    docs = [np.arange(n, dtype=dtype) + n for n in (5, 0, 9, 3, 11)]
    writer = TextLmdbWriter(tmp_path / "t.lmdb", dtype, chunk_tokens=7)
    for ids in docs[:3]:
        writer.add(ids)
    writer.checkpoint(b"three")
    writer.add(docs[3])
    writer.abort()  # what a kill does: the open transaction is lost
    writer = TextLmdbWriter(tmp_path / "t.lmdb", dtype, chunk_tokens=7)
    assert (writer.count, writer.total_tokens, writer.saved_progress()) == (3, 14, b"three")
    for ids in docs[3:]:
        writer.add(ids)
    files, layout = writer.close()
    stream = np.concatenate(docs)
    reader = TextLmdbReader(tmp_path / "t.lmdb", {"dtype": "uint16", "documents": len(docs),
                                                  "total_tokens": len(stream), **layout})
    assert files[0].samples == len(docs)
    assert reader.ends.tolist() == np.cumsum([len(d) for d in docs]).tolist()
    for start in range(len(stream) + 1):
        np.testing.assert_array_equal(reader.read(start, len(stream)), stream[start:])


# Default chunk, commit and shard sizes: the whole corpus is one chunk group or one shard, so that only
# `checkpoint_every` (source bytes read) makes checkpoints.
CADENCE = {"batch_size": "2KB", "checkpoint_every": "4KB", "progress": False}


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_checkpoints_follow_the_source_read_and_the_rerun_says_how_many_documents_it_kept(
        corpus_files, tmp_path, capsys, fmt):
    """A corpus far smaller than a chunk group or a shard still gets checkpoints every `checkpoint_every` of
    source: killed after some of them, the rerun resumes after N > 0 documents, says so (summary and CLI), and
    gives what an uninterrupted conversion gives (WebDataset: the same shard bytes, the unfinished shard
    continued where its last checkpoint left it)."""
    sources, tokenizer = corpus_files
    reference = fastdata.convert_text([str(s) for s in sources], tmp_path / "ref",
                                      fastdata.TextConversionOptions(format=fmt, **CADENCE), tokenizer=tokenizer)
    assert len(reference.files) == 1  # no shard was finished, no chunk group filled: no other checkpoint
    out = tmp_path / ("out.lmdb" if fmt == "lmdb" else "shards")
    args = json.dumps([[str(s) for s in sources], str(out), fmt, "checkpoint", 4,
                       {**CADENCE, "tokenizer": str(tokenizer)}])
    proc = subprocess.run([sys.executable, "-c", KILLER, args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # killed at the 4th checkpoint: 3 were recorded
    saved = saved_progress(out, fmt)
    assert 0 < saved.documents < reference.documents
    if fmt == "wds":
        assert saved.open_shard is not None and saved.open_shard["documents"] == saved.documents

    code = main(["convert", "text", *map(str, sources), str(out), "--tokenizer", str(tokenizer), "--format", fmt,
                 "--batch-size", CADENCE["batch_size"], "--checkpoint-every", "1MB", "-q"])
    assert code == 0
    printed = capsys.readouterr().out
    assert f"resumed an interrupted conversion after {saved.documents:,} documents ({saved.records:,} source " \
           "records)" in printed
    assert documents(out) == documents(tmp_path / "ref")
    if fmt == "wds":
        assert [(f.name, f.sha256) for f in read_manifest(out).files] == \
            [(f.name, f.sha256) for f in read_manifest(tmp_path / "ref").files]


@pytest.mark.parametrize("at", range(3, 9))
def test_wds_checkpoints_inside_and_between_shards_resume_to_the_same_shards(corpus_files, reference, tmp_path,
                                                                             at):
    """Small shards and checkpoints inside them: a kill at any checkpoint (inside a shard, or right after a shard
    was finished while the last recorded checkpoint was inside it) resumes to the very same shard bytes."""
    sources, tokenizer = corpus_files
    out = tmp_path / "shards"
    killed_conversion(sources, out, "wds", "checkpoint", at, tokenizer, checkpoint_every="3KB")
    saved = saved_progress(out, "wds")
    summary = convert(sources, out, "wds", tokenizer=tokenizer)
    assert summary.resumed_documents == saved.documents > 0
    ref = read_manifest(reference["wds"])
    assert [(f.name, f.sha256) for f in read_manifest(out).files] == [(f.name, f.sha256) for f in ref.files]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference["wds"].iterdir())


def test_damaged_text_leftovers_are_an_error_never_a_silent_restart(corpus_files, reference, tmp_path):
    """The progress record inside the LMDB file damaged, or the unfinished shard cut shorter than its last
    checkpoint recorded: refused with the cause and --overwrite named, the leftovers kept."""
    sources, tokenizer = corpus_files
    out = tmp_path / "out.lmdb"
    killed_conversion(sources, out, "lmdb", "checkpoint", 4, tokenizer)
    saved = TextLmdbWriter(partial_path(out), np.dtype("uint16"))
    record = saved.saved_progress()
    saved.abort()
    data = partial_path(out) / "data.mdb"
    raw = data.read_bytes()
    assert record and raw.count(record) >= 1
    data.write_bytes(raw.replace(record, b"\xff" * 16 + record[16:]))  # its first bytes, in the file itself
    with pytest.raises(StagingDamagedError, match=r"the progress record of an interrupted conversion cannot be "
                                                  r"read \(ValueError: not JSON .+\); .*--overwrite"):
        convert(sources, out, "lmdb", tokenizer=tokenizer)
    assert data.is_file()
    summary = convert(sources, out, "lmdb", tokenizer=tokenizer, overwrite=True)
    assert summary.resumed_at is None and documents(out) == documents(reference["lmdb"])

    out = tmp_path / "shards"
    killed_conversion(sources, out, "wds", "checkpoint", 4, tokenizer, checkpoint_every="3KB", shard_size="1MB")
    open_shard = saved_progress(out, "wds").open_shard  # one shard for the corpus: every checkpoint is inside it
    assert open_shard is not None
    tmp = partial_path(out) / (open_shard["name"] + ".tmp")
    os.truncate(tmp, open_shard["bytes"] - 512)
    with pytest.raises(StagingDamagedError, match=rf"{open_shard['name']}\.tmp: holds {open_shard['bytes'] - 512:,} "
                                                  rf"bytes, the last checkpoint recorded {open_shard['bytes']:,}; "
                                                  ".*--overwrite"):
        convert(sources, out, "wds", tokenizer=tokenizer, shard_size="1MB")
    assert tmp.is_file()
