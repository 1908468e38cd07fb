"""A conversion that keeps nothing fails and leaves nothing behind; one that rejects most of its input says so
first, naming the absolute folder (or the field) it looked in. For every source kind the issue met: a file list
with a wrong --root, COCO with a wrong images folder, text with a wrong --field."""

from __future__ import annotations

import json
import warnings

import pytest

import fastdata
from fastdata.cli import main
from fastdata.errors import SourceError
from tests.builders import make_corpus, photo_like, train_bytelevel, write_image


@pytest.fixture
def listed(tmp_path):
    """Six JPEGs under images/ and a CSV list of them."""
    images = tmp_path / "images"
    images.mkdir()
    rows = ["path,label"]
    for i in range(6):
        write_image(images / f"img{i}.jpg", photo_like(i, 40, 30), "jpeg")
        rows.append(f"img{i}.jpg,{'cat' if i % 2 else 'dog'}")
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    return tmp_path


def test_a_list_converted_with_a_wrong_root_fails_naming_the_absolute_folder(listed, tmp_path, capsys):
    wrong = tmp_path / "elsewhere"
    wrong.mkdir()
    out = tmp_path / "out.lmdb"
    code = main(["convert", "list", str(listed / "list.csv"), str(out), "--root", str(wrong), "--workers", "1"])
    assert code != 0
    err = capsys.readouterr().err
    assert "no images kept: all 6 were rejected" in err and str(wrong.resolve()) in err
    assert not out.exists() and not (tmp_path / "out.lmdb.partial").exists()


def test_a_conversion_that_rejects_most_of_its_input_says_so_first(listed, tmp_path):
    for i in range(4):  # 4 of 6 files missing
        (listed / "images" / f"img{i}.jpg").unlink()
    with pytest.warns(UserWarning, match=r"4 of 6 images \(67%\) were rejected, looking for files under"):
        summary = fastdata.convert_list(listed / "list.csv", tmp_path / "out.lmdb", root=listed / "images",
                                        workers=1, progress=False)
    first = str(summary).splitlines()[0]
    assert first.startswith("WARNING: 4 of 6 images") and str((listed / "images").resolve()) in first
    assert summary.images == 2 and (tmp_path / "out.lmdb" / "manifest.json").exists()


def test_a_few_rejections_are_no_warning(listed, tmp_path):
    (listed / "images" / "img0.jpg").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = fastdata.convert_list(listed / "list.csv", tmp_path / "out.lmdb", root=listed / "images",
                                        workers=1, progress=False)
    assert summary.images == 5 and not str(summary).startswith("WARNING")


def test_coco_with_a_wrong_images_folder_fails(tmp_path):
    pytest.importorskip("pycocotools")
    images = tmp_path / "images"
    images.mkdir()
    annotations = {"images": [], "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    for i in range(3):
        write_image(images / f"{i}.jpg", photo_like(i, 40, 30), "jpeg")
        annotations["images"].append({"id": i + 1, "file_name": f"{i}.jpg", "width": 40, "height": 30})
        annotations["annotations"].append({"id": i + 1, "image_id": i + 1, "category_id": 1, "bbox": [1, 1, 10, 10],
                                           "area": 100, "iscrowd": 0})
    (tmp_path / "instances.json").write_text(json.dumps(annotations))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError, match="no images kept: all 3 were rejected") as caught:
        fastdata.convert_coco(tmp_path / "instances.json", empty, tmp_path / "coco.lmdb", workers=1,
                              progress=False)
    assert str(empty.resolve()) in str(caught.value) and not (tmp_path / "coco.lmdb").exists()


def test_text_with_a_wrong_field_warns_naming_the_field(tmp_path):
    tokenizer_json = train_bytelevel(tmp_path / "bpe.json", make_corpus(40))
    corpus = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": f"document {i} " * 5}) for i in range(10)]
    lines.append(json.dumps({"body": "the one document that has a body"}))
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"10 of 11 documents \(91%\) were rejected, looking in field 'body'"):
        summary = fastdata.convert_text(corpus, tmp_path / "c.lmdb", tokenizer=tokenizer_json, field="body",
                                        progress=False)
    assert str(summary).startswith("WARNING: 10 of 11 documents")
    with pytest.raises(SourceError, match="no documents kept"):
        fastdata.convert_text(corpus, tmp_path / "d.lmdb", tokenizer=tokenizer_json, field="title", progress=False)
    assert not (tmp_path / "d.lmdb").exists()


def test_the_command_line_prints_warnings_as_its_own_one_line_notes(listed, tmp_path, capsys):
    """No "file.py:123: UserWarning" and no source line: the warning's text, as a note."""
    for i in range(4):
        (listed / "images" / f"img{i}.jpg").unlink()
    code = main(["convert", "list", str(listed / "list.csv"), str(tmp_path / "out.lmdb"), "--root",
                 str(listed / "images"), "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 0
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "4 of 6 images (67%) were rejected" in notes[0]
    assert "UserWarning" not in err and ".py:" not in err and "warnings.warn" not in err


def test_options_that_do_not_apply_are_not_offered_or_are_refused(listed, tmp_path, capsys):
    """`convert coco --help` offers no --max-size (always refused there), but --quality for --non-jpeg jpeg (which
    keeps each image's size); --shard-size with LMDB is said to be ignored; a shard size without its unit (256
    bytes) warns."""
    from click.testing import CliRunner

    from fastdata.cli import cli

    coco_help = CliRunner().invoke(cli, ["convert", "coco", "--help"]).output
    assert "--max-size" not in coco_help and "--skip-empty" in coco_help
    assert "--quality" in coco_help and "--non-jpeg" in coco_help
    assert "--max-size" in CliRunner().invoke(cli, ["convert", "list", "--help"]).output
    code = main(["convert", "list", str(listed / "list.csv"), str(tmp_path / "o.lmdb"), "--shard-size", "64MB",
                 "--root", str(listed / "images"), "--workers", "1"])
    assert code == 0 and "note: --shard-size 64MB applies to WebDataset shards" in capsys.readouterr().err
    with pytest.warns(UserWarning, match="256 bytes: nearly every sample will close a shard"):
        summary = fastdata.convert_list(listed / "list.csv", tmp_path / "shards", root=listed / "images",
                                        format="wds", shard_size=256, workers=1, progress=False)
    assert len(summary.files) == 6
