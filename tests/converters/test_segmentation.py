"""`fastdata convert list --mask-column` (converters/filelist.py, fastdata/convert/masks.py): images with PNG label
maps (8-bit greyscale, VOC's palette PNGs, 16-bit), listed by CSV/parquet lists written with pandas, convert to
exactly their label maps in LMDB and WebDataset; bad label maps are refused in one line naming their row, or
rejected named; `verify --source` sees a changed map; an interrupted conversion resumes. Loading through the
presets: tests/image/targets/test_segmentation_loading.py."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from builders.images import chw, solid_pattern
from builders.lists import write_list
from builders.runs import KILL_WHEN, assert_one_line_error, cli
from builders.segmentation import (
    SEG_CLASSES,
    SEG_COUNT,
    SEG_IGNORE,
    build_segmentation_list,
    seg_ids,
    seg_size,
    write_label_map,
)
from PIL import Image

import fastdata
from fastdata.errors import ConfigError, OutputExistsError, RejectedFileError
from fastdata.tools.info import describe
from fastdata.tools.verify import verify

FORMATS = {"lmdb": ("out.lmdb", {}), "wds": ("out", {"format": "wds", "shard_size": "4KB"})}


def convert(listed, out, **options):
    options.setdefault("workers", 1)
    return fastdata.convert_list(listed, out, fastdata.FileListOptions(mask_column="mask", progress=False, **options))


def sample_id(key: str) -> int:
    return int(key.split("/s")[1][:2])


def source_ids(root, key: str) -> np.ndarray:
    """The label map file's ids as PIL reads them (palette indices for a "P" map)."""
    with Image.open(root / key.replace("img/", "ann/")) as image:
        return np.asarray(image)


def stored(path) -> dict[str, tuple[np.ndarray, torch.Tensor]]:
    """key -> (image, mask) of every sample of the dataset at `path` (in stored order for WebDataset)."""
    ds = fastdata.dataset(path, metadata=True)
    return {meta["note"]: (image.numpy(), mask) for image, mask, meta in ds}


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_label_maps_round_trip_exactly(tmp_path, fmt, suffix):
    listed, frame = build_segmentation_list(tmp_path / "src", suffix)
    name, options = FORMATS[fmt]
    # parquet in forked conversion workers: the class ids they see are counted by the writer all the same
    summary = convert(listed, tmp_path / name, workers=2 if suffix == ".parquet" else 1, **options)
    assert summary.images == SEG_COUNT and not summary.rejected
    samples = stored(tmp_path / name)
    assert len(samples) == SEG_COUNT
    for key in frame["path"]:
        image, mask = samples[f"n{sample_id(key)}"]
        width, height = seg_size(sample_id(key))
        assert mask.dtype == torch.uint8 and mask.shape == (height, width)
        assert np.array_equal(mask.numpy(), source_ids(tmp_path / "src", key))  # palette maps: their indices
        assert np.array_equal(mask.numpy(), seg_ids(sample_id(key), width, height))
        assert np.array_equal(image, chw(solid_pattern(sample_id(key), width, height)))
    info = fastdata.info(tmp_path / name)
    assert info.target_kind == "segmentation" and info.format_version == 3
    assert info.classes == ["unlabelled"] and info.class_counts == [SEG_COUNT]
    assert info.targets == {"masks": "png", "mask_dtype": "uint8", "ignore_index": SEG_IGNORE, "num_classes": None,
                            "classes_seen": SEG_CLASSES, "max_class_id": SEG_CLASSES - 1}
    assert "segmentation: label maps (uint8 masks), 21 class ids seen" in describe(tmp_path / name)
    assert verify(tmp_path / name, source=listed, decode=True).ok


def test_webdataset_reads_the_label_map_members_as_class_ids(tmp_path):
    import webdataset as wds

    listed, _ = build_segmentation_list(tmp_path / "src")
    convert(listed, tmp_path / "out", format="wds")
    shards = sorted(glob.glob(str(tmp_path / "out" / "*.tar")))
    read = list(wds.WebDataset(shards, shardshuffle=False).decode("l8"))
    assert len(read) == SEG_COUNT
    for sample in read:
        key = sample["json"]["path"]
        width, height = seg_size(sample_id(key))
        assert np.array_equal(sample["seg.png"], seg_ids(sample_id(key), width, height))


def test_sixteen_bit_label_maps_load_as_int64(tmp_path):
    listed, _ = build_segmentation_list(tmp_path / "src", ".parquet", wide=True)
    convert(listed, tmp_path / "out.lmdb")
    ds = fastdata.dataset(tmp_path / "out.lmdb")
    for index, (key, _) in enumerate(ds.samples):
        _, mask = ds[index]
        width, height = seg_size(sample_id(key))
        assert mask.dtype == torch.int64
        assert np.array_equal(mask.numpy(), seg_ids(sample_id(key), width, height, wide=True).astype(np.int64))
    targets = fastdata.info(tmp_path / "out.lmdb").targets
    assert targets["mask_dtype"] == "int64" and targets["max_class_id"] == 999


def test_a_label_column_beside_the_masks_gives_the_classes(tmp_path):
    listed, _ = build_segmentation_list(tmp_path / "src", labels=True)
    convert(listed, tmp_path / "out.lmdb", num_classes=SEG_CLASSES)
    ds = fastdata.dataset(tmp_path / "out.lmdb")
    assert ds.classes == ["indoor", "outdoor"]
    assert [label for _, label in ds.samples] == [sample_id(key) % 2 for key, _ in ds.samples]
    assert fastdata.info(tmp_path / "out.lmdb").targets["num_classes"] == SEG_CLASSES


# ------------------------------------------------------------------------------------------- bad input


def _break(root, frame, how: str) -> str:
    """Break the label map of the list's third row; returns what the error must name."""
    key = frame["mask"][2]
    path = root / key
    width, height = seg_size(sample_id(key))
    if how == "missing":
        path.unlink()
        return "does not exist"
    if how == "jpeg":
        write_label_map(path, seg_ids(0, width, height), "JPEG")
        return "JPEG"
    if how == "rgb":
        write_label_map(path, seg_ids(0, width, height), "RGB")
        return "convert its colours to class ids"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["missing", "jpeg", "rgb"])
def test_an_unusable_label_map_is_a_one_line_error_naming_its_row(tmp_path, capsys, how):
    listed, frame = build_segmentation_list(tmp_path / "src")
    needle = _break(tmp_path / "src", frame, how)
    code, _, err = cli(capsys, "convert", "list", listed, tmp_path / "out.lmdb", "--mask-column", "mask", "--quiet")
    assert code != 0
    assert_one_line_error(err, f"{listed} row 3", frame["mask"][2], needle)
    assert not (tmp_path / "out.lmdb").exists()


def test_a_row_without_a_label_map_is_refused(tmp_path, capsys):
    listed, frame = build_segmentation_list(tmp_path / "src")
    frame.loc[4, "mask"] = None
    write_list(frame, listed)
    code, _, err = cli(capsys, "convert", "list", listed, tmp_path / "out.lmdb", "--mask-column", "mask")
    assert code != 0
    assert_one_line_error(err, f"{listed} row 5", "column 'mask' holds no path")


def test_a_label_map_of_another_size_is_rejected_named(tmp_path):
    listed, frame = build_segmentation_list(tmp_path / "src")
    key = frame["mask"][1]
    width, height = seg_size(sample_id(key))
    write_label_map(tmp_path / "src" / key, seg_ids(1, width + 1, height))
    summary = convert(listed, tmp_path / "out.lmdb")
    assert [(r["path"], r["row"]) for r in summary.rejected] == [(frame["path"][1], 2)]
    assert f"its label map is {width + 1}x{height}" in summary.rejected[0]["reason"]
    assert fastdata.info(tmp_path / "out.lmdb").num_samples == SEG_COUNT - 1


def test_class_ids_beyond_num_classes_are_rejected_or_raise_with_strict(tmp_path):
    listed, frame = build_segmentation_list(tmp_path / "src")
    summary = convert(listed, tmp_path / "out.lmdb", num_classes=20, max_rejected="100%")  # most, on purpose
    holding_20 = sorted(key for key in frame["path"]
                        if (seg_ids(sample_id(key), *seg_size(sample_id(key))) == 20).any())
    assert 0 < len(holding_20) < SEG_COUNT
    assert sorted(r["path"] for r in summary.rejected) == holding_20
    assert "holds class id 20, not below --num-classes 20" in summary.rejected[0]["reason"]
    with pytest.raises(RejectedFileError, match=r"row \d+.*holds class id 20"):
        convert(listed, tmp_path / "strict.lmdb", num_classes=20, strict=True)
    assert not (tmp_path / "strict.lmdb").exists()
    # the ignore index is no class: 255 everywhere passes a bound of 21
    assert not convert(listed, tmp_path / "ok.lmdb", num_classes=SEG_CLASSES).rejected


# ------------------------------------------------------------------------------------------- verify, loader


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_against_the_source_sees_a_changed_label_map(tmp_path, fmt):
    listed, frame = build_segmentation_list(tmp_path / "src")
    name, options = FORMATS[fmt]
    convert(listed, tmp_path / name, **options)
    key = frame["mask"][0]
    width, height = seg_size(sample_id(key))
    ids = seg_ids(sample_id(key), width, height)
    ids[5, 5] = (ids[5, 5] + 1) % SEG_CLASSES  # one pixel of one map
    write_label_map(tmp_path / "src" / key, ids, "P" if sample_id(key) % 2 else "L")
    report = verify(tmp_path / name, source=listed)
    assert not report.ok
    assert any("with other targets (label maps)" in p and frame["path"][0] in p for p in report.problems), report


def test_masks_true_is_refused_for_segmentation_whose_samples_carry_their_mask(tmp_path):
    listed, _ = build_segmentation_list(tmp_path / "src")
    convert(listed, tmp_path / "out.lmdb")
    with pytest.raises(ConfigError, match="masks=True applies to detection"):
        fastdata.dataset(tmp_path / "out.lmdb", masks=True)


# ------------------------------------------------------------------------------------------- resuming

KILLER = KILL_WHEN + textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.formats import lmdb as L, wds as W

    listed, out, fmt = sys.argv[1:4]
    kill_when(L.LmdbWriter if fmt == "lmdb" else W.WdsWriter, "add", lambda self: self.count == 5)
    fastdata.convert_list(listed, out, fastdata.FileListOptions(
        mask_column="mask", format=None if fmt == "lmdb" else "wds", shard_size="4KB", workers=1, commit_every=2,
        progress=False))
""")


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_interrupted_segmentation_conversion_resumes_to_the_same_dataset(tmp_path, fmt):
    listed, frame = build_segmentation_list(tmp_path / "src")
    for row, key in enumerate(frame["mask"]):  # one class id of each map's own: each sample's ids must be counted
        width, height = seg_size(sample_id(key))
        ids = seg_ids(sample_id(key), width, height)
        ids[1, 1] = 100 + row
        write_label_map(tmp_path / "src" / key, ids, "P" if sample_id(key) % 2 else "L")
    name, options = FORMATS[fmt]
    convert(listed, tmp_path / "reference" / name, commit_every=2, **options)
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-c", KILLER, str(listed), str(out), fmt], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not out.exists()

    key = frame["mask"][SEG_COUNT - 1]  # a map not yet stored changes: the resumption must see it
    path = tmp_path / "src" / key
    original, times = path.read_bytes(), os.stat(path)
    width, height = seg_size(sample_id(key))
    write_label_map(path, np.zeros((height, width), np.uint8))
    with pytest.raises(OutputExistsError, match="source files changed"):
        convert(listed, out, commit_every=2, **options)
    path.write_bytes(original)
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    summary = convert(listed, out, commit_every=2, **options)
    assert summary.resumed_at
    reference = fastdata.info(tmp_path / "reference" / name)
    assert reference.targets["classes_seen"] == SEG_CLASSES + SEG_COUNT
    assert fastdata.info(out).targets == reference.targets  # the class ids counted before the kill too
    got, want = stored(out), stored(tmp_path / "reference" / name)
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[k][1], want[k][1]) and np.array_equal(got[k][0], want[k][0]) for k in want)
