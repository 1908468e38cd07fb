"""A conversion that keeps nothing fails and leaves nothing behind; one that rejects most of its input says so
first, naming the absolute folder (or the field) it looked in. For every source kind the issue met: a file list
with a wrong --root, COCO with a wrong images folder, text with a wrong --field."""

from __future__ import annotations

import json
import warnings

import pytest

import fastdata
from fastdata.cli import main
from fastdata.errors import ConfigError, SourceError, TooManyRejectedError
from tests.builders.images import photo_like, write_image
from tests.builders.runs import assert_one_line_error
from tests.builders.text import make_corpus, train_bytelevel


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


def test_a_conversion_that_rejects_most_of_its_input_fails_and_keeps_its_work(listed, tmp_path):
    """More rejections than --max-rejected (default: half the input) fail the conversion, naming the absolute folder
    it looked in; nothing is committed, OUT.partial keeps the work; a rerun that allows them commits it without
    converting again, the warning first, once."""
    for i in range(4):  # 4 of 6 files missing
        (listed / "images" / f"img{i}.jpg").unlink()
    out = tmp_path / "out.lmdb"
    with pytest.raises(TooManyRejectedError, match=r"4 of 6 images \(67%\) were rejected, more than --max-rejected "
                                                   r"50% allows, looking for files under") as caught:
        fastdata.convert_list(
            listed / "list.csv", out, fastdata.FileListOptions(root=listed / "images", workers=1, progress=False)
        )
    assert str((listed / "images").resolve()) in str(caught.value) and "--max-rejected 100%" in str(caught.value)
    assert not out.exists() and (tmp_path / "out.lmdb.partial").is_dir()
    with pytest.warns(UserWarning, match=r"4 of 6 images \(67%\) were rejected, looking for files under"):
        summary = fastdata.convert_list(
            listed / "list.csv",
            out,
            fastdata.FileListOptions(root=listed / "images", workers=1, progress=False, max_rejected="100%"),
        )
    first = str(summary).splitlines()[0]
    assert first.startswith("WARNING: 4 of 6 images") and str((listed / "images").resolve()) in first
    assert summary.images == 2 and (out / "manifest.json").exists()
    assert summary.resumed_at == 6  # every image was read by the first run: none again


@pytest.mark.parametrize(("limit", "fails"), [("0", True), ("1", False), ("10%", True), ("20%", False),
                                              ("50%", False)])
def test_max_rejected_is_a_count_or_a_share_of_the_input(listed, tmp_path, limit, fails):
    (listed / "images" / "img0.jpg").unlink()  # 1 of 6 rejected (17%)
    convert = lambda: fastdata.convert_list(  # noqa: E731
        listed / "list.csv", tmp_path / "out.lmdb",
        fastdata.FileListOptions(root=listed / "images", workers=1, progress=False, max_rejected=limit))
    if fails:
        with pytest.raises(TooManyRejectedError, match=f"1 of 6 images \\(17%\\) were rejected, more than "
                                                       f"--max-rejected {limit} allows"):
            convert()
    else:
        assert convert().images == 5


@pytest.mark.parametrize("value", ["half", "-1", "101%", "5 %%", True])
def test_a_max_rejected_that_is_neither_count_nor_share_is_refused_before_any_work(listed, tmp_path, value):
    with pytest.raises(ConfigError, match="--max-rejected"):
        fastdata.convert_list(
            listed / "list.csv",
            tmp_path / "out.lmdb",
            fastdata.FileListOptions(root=listed / "images", workers=1, progress=False, max_rejected=value),
        )
    assert not any(p.name.startswith("out.lmdb") for p in tmp_path.iterdir())


def test_a_few_rejections_are_no_warning(listed, tmp_path):
    (listed / "images" / "img0.jpg").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = fastdata.convert_list(
            listed / "list.csv",
            tmp_path / "out.lmdb",
            fastdata.FileListOptions(root=listed / "images", workers=1, progress=False),
        )
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
        fastdata.convert_coco(
            tmp_path / "instances.json", empty, tmp_path / "coco.lmdb", fastdata.CocoOptions(workers=1, progress=False)
        )
    assert str(empty.resolve()) in str(caught.value) and not (tmp_path / "coco.lmdb").exists()


def test_text_with_a_wrong_field_fails_naming_the_field(tmp_path):
    tokenizer_json = train_bytelevel(tmp_path / "bpe.json", make_corpus(40))
    corpus = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": f"document {i} " * 5}) for i in range(10)]
    lines.append(json.dumps({"body": "the one document that has a body"}))
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(TooManyRejectedError, match=r"10 of 11 documents \(91%\) were rejected, more than "
                                                   r"--max-rejected 50% allows, looking in field 'body'"):
        fastdata.convert_text(
            corpus,
            tmp_path / "c.lmdb",
            tokenizer=tokenizer_json,
            options=fastdata.TextConversionOptions(field="body", progress=False),
        )
    with pytest.warns(UserWarning, match=r"10 of 11 documents \(91%\) were rejected, looking in field 'body'"):
        summary = fastdata.convert_text(
            corpus,
            tmp_path / "c.lmdb",
            tokenizer=tokenizer_json,
            options=fastdata.TextConversionOptions(field="body", progress=False, max_rejected="100%"),
        )
    assert str(summary).startswith("WARNING: 10 of 11 documents")
    with pytest.raises(SourceError, match="no documents kept"):
        fastdata.convert_text(
            corpus,
            tmp_path / "d.lmdb",
            tokenizer=tokenizer_json,
            options=fastdata.TextConversionOptions(field="title", progress=False, max_rejected="100%"),
        )
    assert not (tmp_path / "d.lmdb").exists()


def test_a_text_conversion_that_loses_nearly_everything_exits_1_and_says_it_once(tmp_path, capsys):
    """The trial: 401 of 402 documents rejected. The command fails (exit 1, one line; ">99%", never "100%" for less
    than all); allowed with --max-rejected 100%, it commits and its warning is printed once."""
    tokenizer_json = train_bytelevel(tmp_path / "bpe.json", make_corpus(40))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"text": "hello world"}) + "\n" + "not json\n" * 401)
    out = tmp_path / "c.lmdb"
    argv = ["convert", "text", str(corpus), str(out), "--tokenizer", str(tokenizer_json), "-q"]
    code = main(argv)
    captured = capsys.readouterr()
    assert (code, captured.out) == (1, "")
    assert_one_line_error(captured.err, "401 of 402 documents (>99%) were rejected", "--max-rejected 100%")
    assert not out.exists()
    code = main([*argv, "--max-rejected", "100%"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert (captured.out + captured.err).count("401 of 402 documents (>99%) were rejected") == 1
    assert captured.out.startswith("WARNING: 401 of 402 documents") and captured.err == ""


def test_the_command_line_prints_warnings_as_its_own_one_line_notes(listed, tmp_path, capsys):
    """No "file.py:123: UserWarning" and no source line: the warning's text, as a note; and the mostly-rejected
    warning once, as the summary's first line (not a second time as a note)."""
    for i in range(4):
        (listed / "images" / f"img{i}.jpg").unlink()
    code = main(["convert", "list", str(listed / "list.csv"), str(tmp_path / "out.lmdb"), "--root",
                 str(listed / "images"), "--workers", "1", "--max-rejected", "100%", "--shard-size", "64MB"])
    captured = capsys.readouterr()
    assert code == 0
    notes = [line for line in captured.err.splitlines() if line.startswith("note: ")]
    assert notes == ["note: --shard-size 64MB applies to WebDataset shards (--format wds); an lmdb dataset is one "
                     "file: ignored"]
    assert (captured.out + captured.err).count("4 of 6 images (67%) were rejected") == 1
    assert captured.out.startswith("WARNING: 4 of 6 images (67%) were rejected")
    assert "UserWarning" not in captured.err and ".py:" not in captured.err and "warnings.warn" not in captured.err


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
    with pytest.warns(UserWarning) as caught:
        summary = fastdata.convert_list(
            listed / "list.csv",
            tmp_path / "shards",
            fastdata.FileListOptions(root=listed / "images", format="wds", shard_size=256, workers=1, progress=False),
        )
    assert len(summary.files) == 6
    assert [str(w.message) for w in caught] == [
        "--shard-size 256 has no unit: it is read as 256 bytes; sizes take a unit, e.g. 256MB",
        "--shard-size 256 made 6 shards for 6 samples (1.0 per shard): nearly every sample closed a shard of its "
        "own; a larger size (e.g. 256MB) makes fewer, fuller shards"]


def test_a_small_shard_size_warns_only_when_the_shards_hold_a_sample_or_so(listed, tmp_path):
    """The trial's `--shard-size 1MB` wrote 9 shards for 219 images and said "nearly every sample will close a shard
    of its own": the warning comes from the shards written, and only when it is true."""
    sizes = [(tmp_path / "images" / f"img{i}.jpg").stat().st_size for i in range(6)]
    # a sample takes its image and at most 3 KB of tar headers, padding and small members: a shard of this size
    # closes after 2 samples at the earliest, so 6 samples make 3 shards at most, of 2 samples each on average
    two = f"{2 * (max(sizes) + 3 * 1024)}B"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = fastdata.convert_list(
            listed / "list.csv",
            tmp_path / "few",
            fastdata.FileListOptions(root=listed / "images", format="wds", shard_size=two, workers=1, progress=False),
        )
    assert 2 <= len(summary.files) <= 3  # a few shards of a few samples each: nothing said
    one = f"{min(sizes) // 2}B"  # smaller than any sample: each sample closes its shard
    with pytest.warns(UserWarning, match=r"--shard-size \d+B made 6 shards for 6 samples \(1.0 per shard\)"):
        summary = fastdata.convert_list(
            listed / "list.csv",
            tmp_path / "one",
            fastdata.FileListOptions(root=listed / "images", format="wds", shard_size=one, workers=1, progress=False),
        )
    assert len(summary.files) == 6
