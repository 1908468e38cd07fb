"""`fastdata convert coco` (converters/coco.py): a COCO instances file, written as users have it and read back with
pycocotools' own COCO class, converts to exactly its annotations (ids, categories, boxes, labels, iscrowd, areas,
masks), in LMDB and WebDataset; resumes; refuses bad annotations in one line before writing anything; and the
read side gives `(image, target dict)` (loading with augmentation: tests/image/targets/test_detection_loading.py)."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest
import torch
from builders.coco import COCO_CLASSES, COCO_IMAGES, coco_dict, write_coco
from builders.images import chw, rgb_of_file
from builders.runs import KILL_WHEN, assert_one_line_error, cli

import fastdata
from fastdata.errors import ConfigError, OutputExistsError
from fastdata.formats.lmdb import shared_environment
from fastdata.formats.targets import decode_detection
from fastdata.tools.info import describe

pycocotools = pytest.importorskip("pycocotools")
from pycocotools import mask as mask_api  # noqa: E402
from pycocotools.coco import COCO  # noqa: E402

FORMATS = {"lmdb": ("out.lmdb", {"seed": 1}), "wds": ("out-wds", {"format": "wds", "shard_size": "8KB", "seed": 1})}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_coco(tmp_path_factory.mktemp("coco"))


@pytest.fixture(scope="module")
def reference(source):
    return COCO(str(source.annotations))


def convert(source, out, **options):
    return fastdata.convert_coco(
        source.annotations, source.images, out, fastdata.CocoOptions(workers=1, progress=False, **options)
    )


def samples_by_image(path, masks=False) -> dict[int, tuple[torch.Tensor, dict]]:
    """image id -> (image, target) of every sample of a converted dataset (either format)."""
    return {target["image_id"]: (image, target) for image, target in fastdata.dataset(path, masks=masks)}


def stored_rles(path) -> dict[int, list[bytes]]:
    """image id -> the RLE counts each stored record holds (read from the storage itself, LMDB or shards)."""
    raw = []
    if path.suffix == ".lmdb":
        env, dbs = shared_environment(path, ("targets",))
        with env.begin() as txn:
            raw = [bytes(v) for _, v in txn.cursor(db=dbs["targets"])]
    else:
        for shard in sorted(path.glob("*.tar")):
            with tarfile.open(shard) as tar:
                raw += [tar.extractfile(m).read() for m in tar if m.name.endswith(".det")]
    records = [decode_detection(r, "test") for r in raw]
    return {r.image_id: r.rles for r in records}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_conversion_holds_exactly_the_annotations(source, reference, tmp_path, fmt):
    name, options = FORMATS[fmt]
    summary = convert(source, tmp_path / name, **options)
    assert summary.images == len(COCO_IMAGES) and summary.rejected == []
    info = fastdata.info(tmp_path / name)
    category_ids = sorted(reference.getCatIds())
    assert info.classes == COCO_CLASSES == [reference.loadCats(i)[0]["name"] for i in category_ids]
    assert info.target_kind == "detection" and info.format_version == 3 and info.label_kind == "multi"
    assert info.targets["category_ids"] == category_ids == [3, 7, 90]
    assert info.targets["annotations"] == len(reference.getAnnIds()) and info.targets["masks"] is True
    label_of = {category: label for label, category in enumerate(category_ids)}

    samples = samples_by_image(tmp_path / name, masks=True)
    rles = stored_rles(tmp_path / name)
    assert sorted(samples) == sorted(reference.getImgIds())
    images_per_class = [0] * len(COCO_CLASSES)
    for image_id, (image, target) in samples.items():
        entry = reference.loadImgs(image_id)[0]
        assert torch.equal(image, torch.from_numpy(chw(rgb_of_file(source.images / entry["file_name"]))))
        anns = reference.loadAnns(reference.getAnnIds(imgIds=image_id))
        assert target["annotation_ids"].tolist() == [a["id"] for a in anns]
        assert target["labels"].tolist() == [label_of[a["category_id"]] for a in anns]
        assert target["labels"].dtype == torch.int64 and target["boxes"].dtype == torch.float32
        expected_boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)], np.float32)
        assert np.array_equal(target["boxes"].numpy(), expected_boxes.reshape(-1, 4))
        assert target["iscrowd"].tolist() == [a["iscrowd"] for a in anns]
        assert np.array_equal(target["area"].numpy(), np.array([a["area"] for a in anns], np.float32))
        assert target["masks"].dtype == torch.uint8
        assert target["masks"].shape == (len(anns), entry["height"], entry["width"])
        for ann, decoded, rle in zip(anns, target["masks"], rles[image_id], strict=True):
            assert np.array_equal(decoded.numpy(), reference.annToMask(ann))
            stored = {"size": [entry["height"], entry["width"]], "counts": rle}
            assert mask_api.area(stored) == mask_api.area(reference.annToRLE(ann))
        for label in set(target["labels"].tolist()):
            images_per_class[label] += 1
    assert info.class_counts == images_per_class
    assert "targets     detection: 13 annotations (4 crowd), with masks" in describe(tmp_path / name)
    assert f"source      {source.annotations.absolute()} (images under" in describe(tmp_path / name)
    assert sum(a["iscrowd"] for a in reference.dataset["annotations"]) == info.targets["crowd"] == 4
    empty = samples[200][1]
    assert empty["boxes"].shape == (0, 4) and empty["masks"].shape == (0, 20, 30)


def test_a_sample_without_masks_asked_has_none_and_metadata_still_comes(source, tmp_path):
    convert(source, tmp_path / "out.lmdb")
    ds = fastdata.dataset(tmp_path / "out.lmdb")
    image, target = ds[0]
    assert image.shape == (3, COCO_IMAGES[0][3], COCO_IMAGES[0][2])
    assert "masks" not in target and target["image_id"] == COCO_IMAGES[0][0]
    assert ds.target_kind == "detection"
    assert fastdata.dataset(tmp_path / "out.lmdb", metadata=True)[0][2] == {}


def test_images_without_annotations_are_kept_unless_skip_empty(source, tmp_path, capsys):
    code, _, err = cli(capsys, "convert", "coco", source.annotations, source.images, tmp_path / "skip.lmdb", "-q",
                       "--skip-empty", "--workers", "1")
    assert code == 0, err
    kept = samples_by_image(tmp_path / "skip.lmdb")
    assert sorted(kept) == sorted(i for i, *_ in COCO_IMAGES[:-1])
    assert fastdata.info(tmp_path / "skip.lmdb").source["images_without_annotations"] == 1


def test_boxes_only_annotations_make_a_dataset_without_masks(tmp_path):
    files = write_coco(tmp_path, coco_dict(masks=False))
    convert(files, tmp_path / "out.lmdb")
    assert fastdata.info(tmp_path / "out.lmdb").targets["masks"] is False
    _, target = fastdata.dataset(tmp_path / "out.lmdb")[0]
    first = [a for a in files.data["annotations"] if a["image_id"] == COCO_IMAGES[0][0]]
    assert target["annotation_ids"].tolist() == [a["id"] for a in first]
    with pytest.raises(ConfigError, match="holds no masks"):
        fastdata.dataset(tmp_path / "out.lmdb", masks=True)


def test_classification_datasets_stay_as_they_were(solid_lmdb, solid_wds):
    raw = json.loads((solid_lmdb / "manifest.json").read_text())
    assert "target_kind" not in raw and "targets" not in raw and raw["format_version"] == 1
    env, _ = shared_environment(solid_lmdb)
    with env.begin() as txn:
        assert {bytes(k) for k, _ in txn.cursor()} == {b"digests", b"images", b"keys", b"meta", b"metadata", b"records"}
    for shard in solid_wds.glob("*.tar"):
        with tarfile.open(shard) as tar:
            assert not [m.name for m in tar if m.name.endswith(".det")]
    with pytest.raises(ConfigError, match="masks=True applies to detection datasets"):
        fastdata.dataset(solid_lmdb, masks=True)


def test_verify_checks_the_dataset_against_its_annotations(source, tmp_path, capsys):
    convert(source, tmp_path / "out.lmdb")
    code, out, err = cli(capsys, "verify", tmp_path / "out.lmdb", "--source", source.annotations, "--decode")
    assert code == 0, (out, err)
    changed = copy.deepcopy(source.data)
    moved = next(a for a in changed["annotations"] if a["image_id"] == 55 and a["category_id"] == 3)
    moved["category_id"] = 90
    other = write_coco(tmp_path / "changed", changed)
    code, out, err = cli(capsys, "verify", tmp_path / "out.lmdb", "--source", other.annotations)
    assert code == 1 and "labelled differently: val/000055.jpg" in out + err

    moved = copy.deepcopy(source.data)
    _first(moved, 7)["bbox"][1] += 0.5  # a box only: the labels stay the same
    other = write_coco(tmp_path / "moved", moved)
    for dataset in (tmp_path / "out.lmdb", tmp_path / "wds"):
        if not dataset.exists():
            convert(source, dataset, format="wds")
        code, out, err = cli(capsys, "verify", dataset, "--source", other.annotations)
        assert code == 1 and "1 sample(s) with other targets (boxes, labels, masks, ...): train/sub/000007.png" in out
        assert "labelled differently" not in out
        assert cli(capsys, "verify", dataset, "--source", source.annotations)[0] == 0


# ------------------------------------------------------------------------------------------- rejected images


def test_missing_and_missized_images_are_rejected_with_their_image_id(tmp_path, capsys):
    data = coco_dict()
    data["images"][4]["width"] += 1  # the file is 30 pixels wide (and the image has no annotations to refuse)
    files = write_coco(tmp_path, data)
    (files.images / COCO_IMAGES[2][1]).unlink()
    summary = convert(files, tmp_path / "out.lmdb")
    assert summary.rejected == [
        {"path": COCO_IMAGES[2][1], "reason": "unreadable (No such file or directory)",
         "annotations": str(files.annotations), "image_id": 55},
        {"path": COCO_IMAGES[4][1], "reason": "decodes to 30x20 pixels, its annotations say 31x20 (boxes and masks "
         "would not fit the image)", "annotations": str(files.annotations), "image_id": 200}]
    assert f"{files.annotations} image 55: {COCO_IMAGES[2][1]}: unreadable" in str(summary)
    assert sorted(samples_by_image(tmp_path / "out.lmdb")) == [3, 7, 101]

    code, _, err = cli(capsys, "convert", "coco", files.annotations, files.images, tmp_path / "strict.lmdb",
                       "--strict", "-q")
    assert code == 1
    assert_one_line_error(err, f"{files.annotations} image 55", "--strict: nothing written")
    assert not (tmp_path / "strict.lmdb").exists() and not (tmp_path / "strict.lmdb.partial").exists()


# ------------------------------------------------------------------------------------------- bad annotations


def _first(data, image_id=101, iscrowd=0):
    return next(a for a in data["annotations"] if a["image_id"] == image_id and a["iscrowd"] == iscrowd)


def bad_annotations(case: str) -> tuple[dict, list[str]]:
    """A COCO dict with one problem, and what its one-line error must say."""
    data = coco_dict()
    ann = _first(data)
    if case == "box outside":
        ann["bbox"] = [60.0, 10.0, 5.5, 4.0]  # reaches x = 65.5 in a 64-wide image
        return data, [f"annotation {ann['id']} (image 101", "reaches outside the 64x48 image"]
    if case == "box above":
        ann["bbox"] = [3.0, -1.5, 5.0, 4.0]
        return data, [f"annotation {ann['id']}", "outside the 64x48 image"]
    if case == "negative side":
        ann["bbox"] = [3.0, 3.0, -2.0, 4.0]
        return data, [f"annotation {ann['id']}", "negative width or height"]
    if case == "unknown category":
        ann["category_id"] = 42
        return data, [f"annotation {ann['id']} (image 101) has category id 42", "not in 'categories'"]
    if case == "unknown image":
        ann["image_id"] = 999
        return data, [f"annotation {ann['id']} is for image id 999", "not in 'images'"]
    if case == "rle size":
        crowd = _first(data, 7, iscrowd=1)
        crowd["segmentation"]["size"] = [40, 56]
        return data, [f"annotation {crowd['id']} (image 7", "size [40, 56]", "40x56 image's [56, 40]"]
    if case == "duplicate annotation id":
        data["annotations"][3]["id"] = data["annotations"][0]["id"]
        return data, [f"annotation id {data['annotations'][0]['id']} appears twice"]
    if case == "some without masks":
        del ann["segmentation"]
        return data, [f"annotation {ann['id']} has no segmentation", "all have masks or none has"]
    if case == "no bbox":
        del ann["bbox"]
        return data, [f"annotation {ann['id']}", "bbox must be 4 finite numbers"]
    if case == "no categories":
        del data["categories"]
        return data, ["no 'categories' list"]
    if case == "image without size":
        del data["images"][1]["height"]
        return data, ["image 7 has no valid 'height'"]
    if case == "category without name":
        del data["categories"][1]["name"]
        return data, ["category 3 has no valid 'name'"]
    if case == "rle counts short":
        crowd = _first(data, 7, iscrowd=1)  # image 7's crowd mask is uncompressed RLE
        crowd["segmentation"]["counts"][-1] -= 1
        return data, [f"annotation {crowd['id']} (image 7", "adding up to the image's 2240 pixels"]
    raise AssertionError(case)


BAD_CASES = ["box outside", "box above", "negative side", "unknown category", "unknown image", "rle size",
             "duplicate annotation id", "some without masks", "no bbox", "no categories", "image without size",
             "category without name", "rle counts short"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_annotations_are_one_line_naming_the_id_and_write_nothing(tmp_path, capsys, case):
    data, needles = bad_annotations(case)
    files = write_coco(tmp_path, data)
    out = tmp_path / "out.lmdb"
    code, stdout, err = cli(capsys, "convert", "coco", files.annotations, files.images, out, "-q")
    assert code == 2, (stdout, err)
    assert_one_line_error(err, str(files.annotations), *needles)
    assert not out.exists() and not (tmp_path / "out.lmdb.partial").exists()


def test_degenerate_polygons_are_left_out_of_masks_counted_and_warned(tmp_path):
    data = coco_dict()
    whole = _first(data, 7)
    whole["segmentation"] = [[1.0, 1.0, 5.0, 1.0]]  # two points: no area
    part = _first(data, 55)
    part["segmentation"] = [*part["segmentation"], [30.0, 2.0, 45.0, 4.0, 40.0, 30.0, 9.0]]  # odd, beside a good one
    files = write_coco(tmp_path, data)
    with pytest.warns(UserWarning, match=r"2 polygon\(s\) of fewer than 3 points or an odd number"):
        convert(files, tmp_path / "out.lmdb")
    assert fastdata.info(tmp_path / "out.lmdb").targets["degenerate_polygons"] == 2
    samples = samples_by_image(tmp_path / "out.lmdb", masks=True)
    reference = coco_dict()
    for image_id, ann, expected in ((7, whole, None), (55, part, _first(reference, 55))):
        target = samples[image_id][1]
        row = target["annotation_ids"].tolist().index(ann["id"])
        assert target["boxes"][row].tolist() == [ann["bbox"][0], ann["bbox"][1], ann["bbox"][0] + ann["bbox"][2],
                                                 ann["bbox"][1] + ann["bbox"][3]]
        decoded = target["masks"][row].numpy()
        if expected is None:
            assert decoded.sum() == 0
        else:  # the good polygons' mask, as pycocotools makes it without the odd one
            coco = COCO()
            coco.dataset = reference
            coco.createIndex()
            assert np.array_equal(decoded, coco.annToMask(expected))


def test_max_size_is_refused(source, tmp_path, capsys):
    """Not offered on the command line (`--help` does not list it: no such option), refused by the API."""
    code, _, err = cli(capsys, "convert", "coco", source.annotations, source.images, tmp_path / "o.lmdb", "-q",
                       "--max-size", "32")
    assert code == 2 and "No such option '--max-size'" in err
    with pytest.raises(ConfigError, match=r"--max-size.*source pixels"):
        fastdata.convert_coco(
            source.annotations, source.images, tmp_path / "o.lmdb", fastdata.CocoOptions(max_size=32, progress=False)
        )


# ------------------------------------------------------------------------------------------- resuming

KILLER = KILL_WHEN + textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.formats import lmdb as L, wds as W

    annotations, images, out, fmt = sys.argv[1:5]
    kill_when(L.LmdbWriter if fmt == "lmdb" else W.WdsWriter, "add", lambda self: self.count == 3)
    fastdata.convert_coco(annotations, images, out, fastdata.CocoOptions(
        format=None if fmt == "lmdb" else "wds", shard_size="8KB", seed=1, workers=1, commit_every=2, progress=False))
""")


def stored_targets(path) -> dict[int, tuple[str, bytes]]:
    ds = fastdata.dataset(path)
    return {t["image_id"]: (t["boxes"].numpy().tobytes(), t["labels"].numpy().tobytes()) for _, t in ds}


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_interrupted_coco_conversion_resumes_to_the_same_dataset(source, tmp_path, fmt):
    name, options = FORMATS[fmt]
    convert(source, tmp_path / "reference" / name, commit_every=2, **options)
    files = write_coco(tmp_path / "src")
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-c", KILLER, str(files.annotations), str(files.images), str(out), fmt],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not out.exists()

    changed = copy.deepcopy(files.data)
    _first(changed)["bbox"][0] += 1.0  # only a box moves: the image files are the same
    files.annotations.write_text(json.dumps(changed))
    with pytest.raises(OutputExistsError, match="source files changed"):
        convert(files, out, commit_every=2, **options)
    files.annotations.write_text(json.dumps(files.data))
    summary = convert(files, out, commit_every=2, **options)
    assert summary.resumed_at
    assert stored_targets(out) == stored_targets(tmp_path / "reference" / name)
    if fmt == "wds":
        reference = fastdata.info(tmp_path / "reference" / name)
        assert [f.sha256 for f in fastdata.info(out).files] == [f.sha256 for f in reference.files]
