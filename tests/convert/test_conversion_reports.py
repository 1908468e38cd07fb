"""What a conversion reports is the same on every run and agrees with itself: rejection reasons carry no memory
addresses (two conversions of the same bad tree write identical `rejected` lists), and the progress bar is left
showing the rejected count the summary gives."""

from __future__ import annotations

import json
import re

import pytest
from builders.images import BAD_FILES, build_bad_tree
from builders.text import make_corpus, train_bytelevel, write_jsonl

import fastdata
from fastdata.formats.manifest import MANIFEST_NAME
from fastdata.formats.records import exception_text

ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def rejected_json(out) -> str:
    """The manifest's `rejected` list as the file holds it (re-serialised the same way for both runs)."""
    return json.dumps(json.loads((out / MANIFEST_NAME).read_text())["rejected"], indent=1)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_two_conversions_of_a_bad_tree_reject_with_identical_reasons(tmp_path, fmt):
    tree = build_bad_tree(tmp_path / "src")
    (tree.root / "more/garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 30)  # a signature, then nothing
    (tree.root / "more/noise.tif").write_bytes(b"II*\x00" + bytes(range(40)))
    outs = [tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"]
    for out, workers in zip(outs, (1, 2), strict=True):  # in this process, then in pool workers
        fastdata.convert_imagefolder(
            tree.root,
            out,
            fastdata.ImageFolderOptions(format=fmt, workers=workers, progress=False, max_rejected="100%"),
        )  # most of the tree is bad, on purpose
    first, second = (rejected_json(out) for out in outs)
    assert first == second
    reasons = {r["path"]: r["reason"] for r in json.loads(first)}
    assert set(reasons) == {*BAD_FILES, "more/garbage.png", "more/noise.tif"}
    assert not ADDRESS.search(first), first
    assert reasons["more/text.jpg"] == "not a decodable image (cannot identify image file)"


def test_exception_text_drops_object_addresses():
    pillow = OSError("cannot identify image file <_io.BytesIO object at 0x7f807ca94b80>")
    assert exception_text(pillow) == "cannot identify image file"
    assert exception_text(ValueError("bad <PIL.PngImagePlugin.PngImageFile image mode=RGB size=3x2 at 0x7F1A2B3C>"
                                     " data")) == "bad data"
    assert exception_text(RuntimeError("handle 0x00007f807ca94b80 closed")) == "handle <address> closed"
    assert exception_text(OSError("image file is truncated (6 bytes not processed)")) == \
        "image file is truncated (6 bytes not processed)"  # nothing run-dependent: unchanged
    assert exception_text(EOFError()) == "EOFError"


def last_rejected_count(progress_output: str) -> int:
    """The rejected count in the last frame of a tqdm bar's output."""
    counts = re.findall(r"(\d+) rejected", progress_output)
    assert counts, progress_output
    return int(counts[-1])


def test_the_progress_bar_ends_with_the_summarys_rejected_count(tmp_path, capsys):
    tree = build_bad_tree(tmp_path / "src")
    summary = fastdata.convert_imagefolder(
        tree.root, tmp_path / "out.lmdb", fastdata.ImageFolderOptions(workers=1, progress=True)
    )
    err = capsys.readouterr().err
    assert len(summary.rejected) == len(BAD_FILES)
    assert last_rejected_count(err) == len(summary.rejected)


def test_the_text_progress_bar_ends_with_the_summarys_rejected_count(tmp_path, capsys):
    corpus = make_corpus(20)
    tokenizer = train_bytelevel(tmp_path / "tok.json", corpus)
    src = write_jsonl(tmp_path / "corpus.jsonl", corpus)
    with src.open("a") as f:
        f.write("not json\n{\"body\": \"no text field\"}\n")
    summary = fastdata.convert_text(
        src,
        tmp_path / "out.lmdb",
        tokenizer=tokenizer,
        options=fastdata.TextConversionOptions(progress=True),
    )
    err = capsys.readouterr().err
    assert summary.rejected_count == 2
    assert last_rejected_count(err) == summary.rejected_count
