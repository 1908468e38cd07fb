"""`fastdata convert pairs` (converters/pairs.py) and loading image-text pairs: each caption names the solid id
its image's pixels encode, so a caption that travels with the wrong image shows."""

from __future__ import annotations

import json
import re

import pytest
import torch
from builders.damaged import corrupt_ids_copy
from builders.images import sample_id_of, solid_id_of_path
from builders.lists import write_list
from builders.pairs import caption_id, pair_caption, pair_shard_sample, pairs_frame, reference_rows
from builders.runs import assert_one_line_error, cli, seeded_loader
from builders.webdataset import webdataset_reading, write_wds_shards
from contracts import check_resumes

import fastdata
from fastdata.errors import ConfigError, ResumeError

COUNT = 45  # the solid tree's samples


def _epoch_ids(loader) -> list[int]:
    """The ids of one pass's samples, each image's checked against its caption's."""
    ids = []
    for batch in loader:
        images, captions = batch["images"], batch["captions"]
        assert len(images) == len(captions)
        for image, caption in zip(images, captions, strict=True):
            assert sample_id_of(image) == caption_id(caption), caption
            ids.append(caption_id(caption))
        if "input_ids" in batch:
            expected = reference_rows(batch_tokenizer(loader), list(captions), batch["input_ids"].shape[1])
            assert batch["input_ids"].tolist() == expected[0]
            assert batch["attention_mask"].tolist() == expected[1]
    return ids


def batch_tokenizer(loader):
    return loader.dataset.root / "tokenizer.json"


# ------------------------------------------------------------------------------------------------ loading


@pytest.mark.parametrize("workers", [0, 2])
def test_each_caption_comes_with_its_image_shuffled_on_any_worker_count(pairs, workers):
    loader = seeded_loader(pairs, num_workers=workers, shuffle=True)
    first, second = _epoch_ids(loader), _epoch_ids(loader)
    assert sorted(first) == sorted(second) == list(range(COUNT))
    assert first != second  # reshuffled each epoch


def test_token_rows_equal_the_tokenizers_own_truncation_and_padding(pairs, pair_tokenizer):
    """max_length 9 truncates the long captions (keeping <|endoftext|> last, as `tokenizers` does) and pads the
    short ones with <|endoftext|>: row for row what the tokenizer itself gives."""
    loader = seeded_loader(pairs, shuffle=False, text=fastdata.TextOptions(max_length=9))
    truncated = 0
    for batch in loader:
        ids, mask = reference_rows(pair_tokenizer, batch["captions"], 9)
        assert batch["input_ids"].dtype == batch["attention_mask"].dtype == torch.int64
        assert batch["input_ids"].tolist() == ids
        assert batch["attention_mask"].tolist() == mask
        truncated += sum(all(row) for row in mask)
    assert truncated > 5  # the long captions were cut


def test_default_rows_are_clips_77_tokens(pairs_lmdb, pair_tokenizer):
    batch = next(iter(seeded_loader(pairs_lmdb)))
    assert batch["input_ids"].shape == (8, 77)
    assert batch["input_ids"].tolist() == reference_rows(pair_tokenizer, batch["captions"], 77)[0]


def test_captions_without_a_tokenizer_are_text(pairs_from_shards):
    loader = seeded_loader(pairs_from_shards, num_workers=2)
    batch = next(iter(loader))
    assert set(batch) == {"images", "captions"}
    assert sorted(_epoch_ids(loader)) == list(range(COUNT))
    with pytest.raises(ConfigError, match="max_length applies to pairs stored with token ids"):
        fastdata.loader(pairs_from_shards, text=fastdata.TextOptions(max_length=16))


@pytest.mark.parametrize("workers", [0, 2])
def test_resumes_exactly_mid_epoch(pairs, workers):
    check_resumes(lambda w: seeded_loader(pairs, num_workers=w, text=fastdata.TextOptions(max_length=12)),
                  lambda n: [2, n - 1], workers)


def test_resume_refuses_another_max_length(pairs_lmdb):
    loader = seeded_loader(pairs_lmdb, text=fastdata.TextOptions(max_length=12))
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    with pytest.raises(ResumeError, match="max_length"):
        seeded_loader(pairs_lmdb, text=fastdata.TextOptions(max_length=20)).load_state_dict(state)


def test_two_ranks_split_the_pairs(pairs):
    seen = []
    for rank in range(2):
        loader = seeded_loader(pairs, rank=rank, world_size=2, num_workers=2)
        seen.append(_epoch_ids(loader))
    assert len(seen[0]) == len(seen[1]) == (COUNT + 1) // 2
    assert set(seen[0]) | set(seen[1]) == set(range(COUNT))  # uneven="pad": one sample twice


def test_a_skipped_image_drops_its_caption(pairs, tmp_path):
    broken = {4, 17, 30}
    copy = corrupt_ids_copy(pairs, tmp_path, broken)
    loader = seeded_loader(copy, on_error="skip", num_workers=2)
    ids = _epoch_ids(loader)
    assert sorted(ids) == sorted(set(range(COUNT)) - broken)
    assert {solid_id_of_path(key) for key, _ in loader.skipped} == broken


def test_an_all_skipped_batch_borrows_a_pair(pairs_lmdb, tmp_path):
    copy = corrupt_ids_copy(pairs_lmdb, tmp_path, set(range(0, COUNT, 2)))
    loader = seeded_loader(copy, on_error="skip", batch_size=1, shuffle=False)
    with pytest.warns(UserWarning, match="borrowed"):
        ids = _epoch_ids(loader)
    assert loader.borrowed and len(ids) == COUNT


def test_dataset_gives_image_and_caption(pairs_lmdb, pairs_from_shards):
    ds = fastdata.dataset(pairs_from_shards)
    for index in (0, 7, COUNT - 1):
        image, caption = ds[index]
        assert isinstance(caption, str) and sample_id_of(image) == caption_id(caption)
    tokens = fastdata.dataset(pairs_lmdb, text=fastdata.TextOptions(max_length=10))
    image, target = tokens[3]
    assert sample_id_of(image) == caption_id(target["caption"])
    assert target["input_ids"].shape == target["attention_mask"].shape == (10,)


def test_meter_counts_pair_batches(pairs_lmdb):
    meter = fastdata.meter(seeded_loader(pairs_lmdb))
    assert sum(1 for _ in meter) == 6
    assert meter.report().samples == COUNT


# ------------------------------------------------------------------------------------------------ storage


def test_manifest_and_tokenizer_copy(pairs_lmdb, pair_tokenizer):
    manifest = json.loads((pairs_lmdb / "manifest.json").read_text())
    assert manifest["format_version"] == 2 and manifest["target_kind"] == "pairs"
    assert manifest["pairs"]["tokens"] and manifest["pairs"]["dtype"] == "uint16"
    assert manifest["pairs"]["closing_tokens"] == 1 and manifest["pairs"]["empty_captions"] == 0
    assert (pairs_lmdb / "tokenizer.json").read_bytes() == pair_tokenizer.read_bytes()
    assert fastdata.info(pairs_lmdb).metadata_fields == ["id"]


def test_wds_output_is_what_img2dataset_readers_expect(pairs_wds, pair_tokenizer):
    """The webdataset library reads the shards: `.txt` is the caption, the `.json` holds it and its whole token ids
    (`tokenizer.encode(caption).ids`)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(pair_tokenizer))
    samples = webdataset_reading(sorted(pairs_wds.glob("*.tar")))
    assert len(samples) == COUNT
    for sample in samples:
        meta = json.loads(sample["json"])
        caption = sample["txt"].decode()
        assert meta["caption"] == caption and "cls" not in sample
        assert caption_id(caption) == solid_id_of_path(meta["path"])
        assert meta["tokens"] == tok.encode(caption).ids


def test_shards_in_json_or_txt(pair_shards, pairs_from_shards):
    ds = fastdata.dataset(pairs_from_shards, metadata=True)
    assert len(ds) == COUNT
    for index in range(COUNT):
        image, caption, meta = ds[index]
        assert caption == pair_caption(sample_id_of(image))
        assert meta["url"].endswith(f"/{sample_id_of(image)}.jpg") and "caption" not in meta


def test_empty_caption_is_kept_and_counted(solid_tree, tmp_path):
    frame = pairs_frame(solid_tree)
    frame.loc[3, "caption"] = ""
    listed = write_list(frame, tmp_path / "pairs.csv")
    with pytest.warns(UserWarning, match=r"1 empty caption\(s\) kept \(the first: .*pairs.csv row 4\)"):
        fastdata.convert_pairs(
            listed, tmp_path / "out.lmdb", fastdata.PairsOptions(root=solid_tree.root, workers=1, progress=False)
        )
    assert fastdata.info(tmp_path / "out.lmdb").pairs["empty_captions"] == 1
    captions = [fastdata.dataset(tmp_path / "out.lmdb")[i][1] for i in range(COUNT)]
    assert captions.count("") == 1


def test_the_empty_caption_note_is_said_once_by_the_conversion_not_again_by_verify(solid_tree, tmp_path):
    """The conversion says that it kept an empty caption (and the manifest counts it); `fastdata verify --source
    --decode`, which lists the source again (here for two checks: the JPEG layout's and the source's), does not
    say it again."""
    import subprocess
    import sys

    frame = pairs_frame(solid_tree)
    frame.loc[3, "caption"] = ""
    listed = write_list(frame, tmp_path / "pairs.csv")
    with pytest.warns(UserWarning, match="1 empty caption"):
        fastdata.convert_pairs(
            listed,
            tmp_path / "out.lmdb",
            fastdata.PairsOptions(root=solid_tree.root, workers=1, progress=False, jpeg_layout="baseline"),
        )
    run = subprocess.run([sys.executable, "-m", "fastdata", "verify", str(tmp_path / "out.lmdb"), "--source",
                          str(listed), "--decode"], capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0 and run.stdout.startswith("OK:"), run.stdout + run.stderr
    assert "empty caption" not in run.stderr, run.stderr


def test_csv_cells_are_captions_as_written(solid_tree, tmp_path):
    """In a CSV every cell is text: "NA" and "null" are captions, not missing values."""
    frame = pairs_frame(solid_tree).iloc[:4].copy()
    frame["caption"] = ["NA", "null", "nan", "a photo"]
    listed = write_list(frame, tmp_path / "pairs.csv")
    fastdata.convert_pairs(
        listed, tmp_path / "out.lmdb", fastdata.PairsOptions(root=solid_tree.root, workers=1, progress=False)
    )
    assert sorted(fastdata.dataset(tmp_path / "out.lmdb")[i][1] for i in range(4)) == ["NA", "a photo", "nan",
                                                                                      "null"]


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("suffix", "value", "says"), [
    (".jsonl", None, "holds no caption (null)"),
    (".parquet", None, "holds no caption (null)"),
    (".parquet", 17, "holds an integer (17), not a caption (text)"),
    (".parquet", ["a", "b"], "holds a list (['a', 'b']), not a caption (text)"),
])
def test_a_caption_that_is_not_text_is_refused_naming_its_row(capsys, solid_tree, tmp_path, suffix, value, says):
    frame = pairs_frame(solid_tree).iloc[:6].copy()
    if isinstance(value, list):
        frame["caption"] = [["x"]] * 6
    elif isinstance(value, int):
        frame["caption"] = list(range(6))
    frame.at[frame.index[4], "caption"] = value
    listed = write_list(frame, tmp_path / f"pairs{suffix}")
    code, _, err = cli(capsys, "convert", "pairs", listed, tmp_path / "out.lmdb", "--root", solid_tree.root, "-q")
    assert code == 2
    row = 1 if value is not None and suffix == ".parquet" else 5  # a whole column of numbers/lists: its first row
    assert_one_line_error(err, f"pairs{suffix} row {row}: column 'caption' holds")
    assert says.split(" (")[0] in err
    assert not (tmp_path / "out.lmdb").exists()


def test_jsonl_caption_of_another_type_is_refused_naming_rows(capsys, solid_tree, tmp_path):
    frame = pairs_frame(solid_tree).iloc[:6].copy().astype({"caption": object})
    frame.at[frame.index[2], "caption"] = 42
    listed = write_list(frame, tmp_path / "pairs.jsonl")
    code, _, err = cli(capsys, "convert", "pairs", listed, tmp_path / "out.lmdb", "--root", solid_tree.root, "-q")
    assert code == 2
    assert_one_line_error(err, "column 'caption' mixes types", "row 3 an integer (42)")


def test_a_missing_caption_column_names_the_columns(capsys, solid_tree, tmp_path):
    listed = write_list(pairs_frame(solid_tree).rename(columns={"caption": "text"}), tmp_path / "pairs.csv")
    code, _, err = cli(capsys, "convert", "pairs", listed, tmp_path / "out.lmdb", "--root", solid_tree.root, "-q")
    assert code == 2
    assert_one_line_error(err, "no column 'caption' (its columns: path, text, id)", "--caption-column")
    code, _, _ = cli(capsys, "convert", "pairs", listed, tmp_path / "out.lmdb", "--root", solid_tree.root,
                     "--caption-column", "text", "-q")
    assert code == 0


def _shards(tree, directory, change):
    samples = [pair_shard_sample(tree, relative) for relative in tree.images[:12]]
    change(samples[8])
    return write_wds_shards(directory, samples)


@pytest.mark.parametrize(("change", "says"), [
    (lambda s: (s.pop("txt"), s["json"].pop("caption")), "no caption: no .txt member and no 'caption' field in "
                                                         "its .json (members: "),
    (lambda s: (s.pop("txt"), s["json"].update(caption=12.5)), "its .json field 'caption' holds a number (12.5)"),
    (lambda s: (s.pop("txt"), s["json"].update(caption=None)), "its .json field 'caption' holds no caption (null)"),
    (lambda s: s.update(txt=b"\xff\xfe caption"), "its .txt caption is not UTF-8 text"),
])
def test_a_bad_shard_caption_is_refused_naming_shard_and_key(capsys, solid_tree, tmp_path, change, says):
    _shards(solid_tree, tmp_path / "src", change)
    key = re.escape("sample")  # the 9th sample, in the second shard (6 a shard)
    code, _, err = cli(capsys, "convert", "pairs", tmp_path / "src", tmp_path / "out.lmdb", "-q")
    assert code == 2
    assert_one_line_error(err, "part-000001.tar!sample", says)
    assert re.search(key, err)


def test_list_and_shard_options_do_not_mix(capsys, pair_shards, pairs_csv, tmp_path):
    code, _, err = cli(capsys, "convert", "pairs", pair_shards, tmp_path / "a.lmdb", "--root", tmp_path, "-q")
    assert code == 2
    assert_one_line_error(err, "--root, --image-column and --allow-outside-root apply to file lists")
    code, _, err = cli(capsys, "convert", "pairs", pairs_csv, tmp_path / "b.lmdb", "--image-ext", "jpg", "-q")
    assert code == 2
    assert_one_line_error(err, "--image-ext applies to WebDataset shards")



def test_verify_checks_captions_and_tokens_against_the_source(capsys, solid_tree, pairs, pairs_csv, tmp_path):
    code, out, _ = cli(capsys, "verify", pairs, "--source", pairs_csv, "--decode")
    assert code == 0, out
    frame = pairs_frame(solid_tree)
    frame.loc[2, "caption"] = "another caption"
    changed = write_list(frame, tmp_path / "pairs.csv")
    code, out, _ = cli(capsys, "verify", pairs, "--source", changed)
    assert code == 1 and f"1 sample(s) with another caption or other token ids: {frame.loc[2, 'path']}" in out


@pytest.mark.parametrize("decode", ["worker", "device"])
def test_captions_follow_images_to_the_device(pairs, solid_tree, tmp_path, decode):
    """On a device (the CPU here: the path is the same), with the JPEGs decoded in the workers or on the device,
    and one undecodable JPEG dropped with its caption (its header intact, so that decode="device" ships it and the
    device drops it from the batch)."""
    jpeg = solid_tree.path(next(p for p in solid_tree.images if solid_id_of_path(p) == 4)).read_bytes()
    copy = corrupt_ids_copy(pairs, tmp_path, {4}, jpeg[:jpeg.index(b"\xff\xda") + 20])  # cut inside the scan
    loader = seeded_loader(copy, device="cpu", decode=decode, num_workers=2, on_error="skip")
    assert sorted(_epoch_ids(loader)) == sorted(set(range(COUNT)) - {4})
