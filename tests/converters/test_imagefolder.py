"""ImageFolder conversion through the API: torchvision's classes/labels/order, pixels, stored bytes,
--max-size, bad sources, existing outputs, rejected files, --strict and atomicity."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from builders.images import (
    BAD_FILES,
    NON_UTF8_LAYOUT,
    build_non_utf8_tree,
    build_solid_tree,
    chw,
    pattern,
    rgb_of_file,
    sample_id_of,
    write_image,
)
from fastdata.converters import imagefolder as imagefolder_converter
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS as TV_IMG_EXTENSIONS

import fastdata
import fastdata.tools.verify
from fastdata.errors import (
    ConfigError,
    FastdataError,
    IncompleteDatasetError,
    NotADatasetError,
    OutputError,
    OutputExistsError,
    RejectedFileError,
    SourceError,
    StagingDamagedError,
)


def torchvision_view(root):
    """(classes, class_to_idx, [(relative posix path, label)]) as torchvision's ImageFolder has them."""
    folder = ImageFolder(str(root))
    samples = [(Path(p).relative_to(root).as_posix(), label) for p, label in folder.samples]
    return folder.classes, folder.class_to_idx, samples


def test_img_extensions_equal_torchvision():
    assert tuple(imagefolder_converter.IMAGE_EXTENSIONS) == tuple(TV_IMG_EXTENSIONS)


def test_classes_labels_and_order_match_torchvision(tricky_tree, tricky_lmdb):
    classes, class_to_idx, samples = torchvision_view(tricky_tree.root)
    ds = fastdata.dataset(tricky_lmdb)
    assert ds.classes == classes == ["Bird", "cat", "dog.v2"]
    assert ds.class_to_idx == class_to_idx
    assert ds.samples == samples
    # what docs/images.md says: ImageFolder's paths are the keys joined to the source folder
    from torchvision.datasets import ImageFolder

    assert [(os.path.join(tricky_tree.root, key), label) for key, label in ds.samples] == \
        ImageFolder(str(tricky_tree.root), allow_empty=True).samples
    assert ds.targets == [label for _, label in samples]
    assert len(ds) == len(samples) == len(tricky_tree.images)
    # every image file of the tree is a sample, no ignored file is
    assert sorted(p for p, _ in ds.samples) == sorted(tricky_tree.images)
    manifest = fastdata.info(tricky_lmdb)
    assert manifest.classes == classes
    assert manifest.class_counts == [sum(1 for _, lab in samples if lab == i) for i in range(len(classes))]
    assert manifest.num_samples == len(samples)


def test_summary_counts_ignored_files(tricky_tree, tmp_path):
    summary = fastdata.convert_imagefolder(
        tricky_tree.root, tmp_path / "out.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False)
    )
    assert summary.ignored == len(tricky_tree.ignored) == 5
    assert summary.images == len(tricky_tree.images)
    assert summary.classes == 3
    assert summary.rejected == []
    assert summary.format == "lmdb"
    assert "5 non-image files" in str(summary)
    manifest = fastdata.info(tmp_path / "out.lmdb")
    assert manifest.source["ignored"] == 5
    assert sorted(manifest.source["ignored_examples"]) == sorted(tricky_tree.ignored)


def test_decoded_pixels_equal_pil_convert_rgb(tricky_tree, tricky_lmdb):
    ds = fastdata.dataset(tricky_lmdb)
    assert len(ds.samples) == len(tricky_tree.images)
    for i, (relative, label) in enumerate(ds.samples):
        image, got_label = ds[i]
        assert isinstance(image, torch.Tensor) and image.dtype == torch.uint8
        assert isinstance(got_label, int) and got_label == label
        expected = chw(rgb_of_file(tricky_tree.path(relative)))
        assert tuple(image.shape) == expected.shape, relative
        diff = np.abs(image.numpy().astype(np.int16) - expected.astype(np.int16)).max()
        if relative in tricky_tree.exact:
            assert diff == 0, relative
        else:  # JPEG: OpenCV's and Pillow's libjpeg agree up to rounding (observed: exactly)
            assert diff <= 1, (relative, diff)


def test_stored_bytes_are_the_source_file_bytes(tricky_tree, tricky_lmdb):
    ds = fastdata.dataset(tricky_lmdb)
    for i, (relative, _) in enumerate(ds.samples):
        assert bytes(ds.reader.read(i)) == tricky_tree.path(relative).read_bytes(), relative
        assert ds.reader.key(i) == relative


def test_max_size_reencodes_only_larger_images(tricky_tree, tmp_path):
    out = tmp_path / "small.lmdb"
    fastdata.convert_imagefolder(
        tricky_tree.root, out, fastdata.ImageFolderOptions(max_size=40, quality=95, workers=1, progress=False)
    )
    ds = fastdata.dataset(out)
    assert fastdata.info(out).options["max_size"] == 40
    reencoded = 0
    for i, (relative, _) in enumerate(ds.samples):
        source = tricky_tree.path(relative)
        with Image.open(source) as im:
            width, height = im.size
        stored = bytes(ds.reader.read(i))
        image, _ = ds[i]
        if max(width, height) > 40:
            reencoded += 1
            assert stored[:3] == b"\xff\xd8\xff", f"{relative} was not re-encoded to JPEG"
            with Image.open(io.BytesIO(stored)) as im:
                assert im.format == "JPEG"
                assert max(im.size) == 40, (relative, im.size)
                expected_size = im.size
            assert tuple(image.shape) == (3, expected_size[1], expected_size[0])
            # aspect ratio kept (to the pixel)
            scale = 40 / max(width, height)
            assert abs(expected_size[0] - width * scale) <= 1 and abs(expected_size[1] - height * scale) <= 1
            # it is still the same picture: compare against PIL's own resize of the source
            reference = rgb_of_file(source)
            reference = np.asarray(Image.fromarray(reference).resize(expected_size, Image.Resampling.BICUBIC))
            mean_diff = np.abs(image.numpy().transpose(1, 2, 0).astype(np.int16) - reference).mean()
            assert mean_diff < 12, (relative, mean_diff)
        else:
            assert stored == source.read_bytes(), f"{relative} is small and must be stored untouched"
    assert 0 < reencoded < len(ds)


def test_conversion_with_workers_gives_the_same_dataset(tricky_tree, tricky_lmdb, tmp_path):
    out = tmp_path / "parallel.lmdb"
    fastdata.convert_imagefolder(tricky_tree.root, out, fastdata.ImageFolderOptions(workers=2, progress=False))
    one, two = fastdata.dataset(tricky_lmdb), fastdata.dataset(out)
    assert one.samples == two.samples
    for i in range(len(one)):
        assert bytes(one.reader.read(i)) == bytes(two.reader.read(i))


# ---------------------------------------------------------------------------------------------- bad sources


def test_missing_source_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(SourceError, match="does not exist") as info:
        fastdata.convert_imagefolder(
            missing, tmp_path / "out.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False)
        )
    assert str(missing) in str(info.value)
    assert not (tmp_path / "out.lmdb").exists()


def test_empty_source_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError, match="empty") as info:
        fastdata.convert_imagefolder(
            empty, tmp_path / "out.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False)
        )
    assert str(empty) in str(info.value)


def test_source_with_files_but_no_class_folders(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    write_image(flat / "a.png", pattern(0, 21, 23), "png")
    write_image(flat / "b.jpg", pattern(1, 21, 23), "jpeg")
    with pytest.raises(SourceError, match="class folder") as info:
        fastdata.convert_imagefolder(
            flat, tmp_path / "out.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False)
        )
    assert str(flat) in str(info.value)
    assert not (tmp_path / "out.lmdb").exists()


def test_source_with_class_folders_but_no_images(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "notes.txt").write_text("x")
    with pytest.raises(SourceError, match="no image files") as info:
        fastdata.convert_imagefolder(src, tmp_path / "out.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    assert str(src) in str(info.value)


def test_source_that_is_a_file(tmp_path):
    src = tmp_path / "file.png"
    write_image(src, pattern(0, 21, 21), "png")
    with pytest.raises(SourceError, match="not a folder"):
        fastdata.convert_imagefolder(src, tmp_path / "out.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))


def test_output_format_must_be_known(tricky_tree, tmp_path):
    with pytest.raises(ConfigError, match=r"\.lmdb") as info:
        fastdata.convert_imagefolder(
            tricky_tree.root, tmp_path / "out", fastdata.ImageFolderOptions(workers=1, progress=False)
        )
    assert str(tmp_path / "out") in str(info.value)
    with pytest.raises(ConfigError, match="unknown format"):
        fastdata.convert_imagefolder(
            tricky_tree.root, tmp_path / "out", fastdata.ImageFolderOptions(format="zip", workers=1, progress=False)
        )
    with pytest.raises(ConfigError):
        fastdata.convert_imagefolder(
            tricky_tree.root,
            tmp_path / "out",
            fastdata.ImageFolderOptions(format="wds", shard_size="lots", workers=1, progress=False),
        )
    with pytest.raises(ConfigError):
        fastdata.convert_imagefolder(
            tricky_tree.root, tmp_path / "o.lmdb", fastdata.ImageFolderOptions(workers=0, progress=False)
        )
    with pytest.raises(ConfigError):
        fastdata.convert_imagefolder(
            tricky_tree.root, tmp_path / "o.lmdb", fastdata.ImageFolderOptions(quality=0, workers=1, progress=False)
        )
    with pytest.raises(ConfigError):
        fastdata.convert_imagefolder(
            tricky_tree.root, tmp_path / "o.lmdb", fastdata.ImageFolderOptions(max_size=0, workers=1, progress=False)
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_all_errors_are_fastdata_errors():
    for cls in (SourceError, OutputExistsError, NotADatasetError, IncompleteDatasetError, ConfigError,
                RejectedFileError):
        assert issubclass(cls, FastdataError)
    assert issubclass(RejectedFileError, SourceError)
    assert issubclass(ConfigError, ValueError)


# ----------------------------------------------------------------------------------------- existing outputs


def test_existing_dataset_is_refused_and_overwrite_replaces_it(tmp_path):
    small = build_solid_tree(tmp_path / "small", count=6)
    large = build_solid_tree(tmp_path / "large", count=9)
    out = tmp_path / "out.lmdb"
    fastdata.convert_imagefolder(small.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    with pytest.raises(OutputExistsError, match="overwrite") as info:
        fastdata.convert_imagefolder(large.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    assert str(out) in str(info.value)
    assert fastdata.info(out).num_samples == 6  # untouched
    fastdata.convert_imagefolder(
        large.root, out, fastdata.ImageFolderOptions(overwrite=True, workers=1, progress=False)
    )
    assert fastdata.info(out).num_samples == 9
    assert len(fastdata.dataset(out)) == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["large", "out.lmdb", "small"]  # no .old / .partial


def test_existing_non_dataset_is_refused_even_with_overwrite(tricky_tree, tmp_path):
    out = tmp_path / "precious.lmdb"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    file_out = tmp_path / "file.lmdb"
    file_out.write_text("a file")
    for target in (out, file_out):
        for overwrite in (False, True):
            with pytest.raises(OutputExistsError, match="not a fastdata dataset") as info:
                fastdata.convert_imagefolder(
                    tricky_tree.root,
                    target,
                    fastdata.ImageFolderOptions(overwrite=overwrite, workers=1, progress=False),
                )
            assert str(target) in str(info.value)
    assert (out / "thesis.tex").read_text() == "do not delete"
    assert file_out.read_text() == "a file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.lmdb", "precious.lmdb"]


def test_empty_existing_directory_is_used(tmp_path):
    src = build_solid_tree(tmp_path / "src", count=4)
    out = tmp_path / "out.lmdb"
    out.mkdir()
    fastdata.convert_imagefolder(src.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    assert len(fastdata.dataset(out)) == 4


def test_partial_leftovers_are_reported_and_unusable_ones_are_replaced_only_with_overwrite(tmp_path):
    src = build_solid_tree(tmp_path / "src", count=5)
    out = tmp_path / "out.lmdb"
    partial = tmp_path / "out.lmdb.partial"
    partial.mkdir()
    (partial / "data.mdb").write_bytes(b"half a database")
    # the leftovers are not a dataset
    with pytest.raises(IncompleteDatasetError, match="incomplete conversion"):
        fastdata.dataset(out)
    with pytest.raises(IncompleteDatasetError):
        fastdata.info(out)
    # they cannot be reopened: the same command says so, and discards nothing until --overwrite
    with pytest.raises(StagingDamagedError, match=r"data cannot be reopened .*MDB_INVALID.*--overwrite"):
        fastdata.convert_imagefolder(src.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    assert (partial / "data.mdb").read_bytes() == b"half a database"
    fastdata.convert_imagefolder(src.root, out, fastdata.ImageFolderOptions(workers=1, progress=False, overwrite=True))
    assert not partial.exists()
    assert len(fastdata.dataset(out)) == 5


def test_successful_conversion_leaves_no_partial(tricky_tree, tmp_path):
    for name, fmt in (("a.lmdb", None), ("shards", "wds")):
        out = tmp_path / name
        fastdata.convert_imagefolder(
            tricky_tree.root, out, fastdata.ImageFolderOptions(format=fmt, shard_size="8KB", workers=1, progress=False)
        )
        assert (out / "manifest.json").is_file()
        assert not (tmp_path / f"{name}.partial").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.lmdb", "shards"]


def test_not_a_dataset_is_refused_by_dataset_and_info(tmp_path, tricky_tree):
    for path in (tmp_path / "missing", tricky_tree.root, tricky_tree.path("Bird/a03.png")):
        with pytest.raises(NotADatasetError) as info:
            fastdata.dataset(path)
        assert str(path) in str(info.value)
        with pytest.raises(NotADatasetError):
            fastdata.info(path)
        with pytest.raises(NotADatasetError):
            fastdata.loader(path, num_workers=0)


@pytest.mark.parametrize(("place", "reason"), [
    ("/proc/x.lmdb", "making a folder in /proc fails (No such file or directory)"),
    ("{tmp}/notes.txt/out.lmdb", "{tmp}/notes.txt is a file, not a folder"),
    ("{tmp}/notes.txt/deeper/out.lmdb", "{tmp}/notes.txt is a file, not a folder"),
])
def test_an_output_that_cannot_be_made_is_refused_before_anything_is_written(tricky_tree, tmp_path, place, reason):
    (tmp_path / "notes.txt").write_text("mine")
    out = Path(place.format(tmp=tmp_path))
    with pytest.raises(OutputError) as info:
        fastdata.convert_imagefolder(tricky_tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    assert str(info.value) == f"{out}: cannot be created: {reason.format(tmp=tmp_path)}; choose another OUT"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("inside", ["out.lmdb", "cat/out.lmdb", "."])
def test_an_output_inside_the_source_is_refused_before_anything_is_written(tmp_path, inside):
    src = build_solid_tree(tmp_path / "src", count=4).root
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    out = src / inside
    with pytest.raises(OutputError) as info:
        fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(format="wds", workers=1, progress=False))
    assert str(info.value) == (f"{out}: is inside the source folder {src}; the next conversion of {src} would take "
                               "it in as data: choose an OUT outside the source")
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before


@pytest.mark.parametrize(("option", "value", "message"), [
    ("quality", "90", "quality must be an int, got '90' (str)"),
    ("workers", 2.0, "workers must be an int, got 2.0 (float)"),
    ("seed", True, "seed must be an int, got True (bool)"),
    ("overwrite", 1, "overwrite must be True or False, got 1 (int)"),
    ("shard_size", [1], "shard_size: cannot read [1] (list) as a size: use e.g. 256MB, 64KB, 1GiB or a byte count"),
])
def test_conversion_options_of_the_wrong_type_are_config_errors(tricky_tree, tmp_path, option, value, message):
    with pytest.raises(ConfigError) as info:
        fastdata.convert_imagefolder(
            tricky_tree.root, tmp_path / "o.lmdb", fastdata.ImageFolderOptions(progress=False, **{option: value})
        )
    assert str(info.value) == message
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------- non-UTF-8 file names


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_file_names_that_are_not_utf8_are_kept_exactly(tmp_path, fmt):
    """Class folders and files whose names are not UTF-8 are converted like any other, losslessly: classes, keys
    and `.samples` are torchvision's (undecodable bytes as lone surrogates), LMDB keys and tar member names hold
    the file names' own bytes, the manifest stays valid UTF-8, and verify against the source passes."""
    tree = build_non_utf8_tree(tmp_path / "src")
    out = tmp_path / ("d.lmdb" if fmt == "lmdb" else "shards")
    summary = fastdata.convert_imagefolder(
        tree.root, out, fastdata.ImageFolderOptions(format=fmt, workers=2, progress=False)
    )
    assert (summary.images, summary.rejected) == (len(NON_UTF8_LAYOUT), [])
    classes, _, samples = torchvision_view(tree.root)
    assert classes == ["caf\udce9", "plain"]
    json.loads((out / "manifest.json").read_bytes().decode("utf-8"))  # strict UTF-8, as JSON requires
    ds = fastdata.dataset(out)
    assert ds.classes == classes
    id_of = {relative: sample_id for sample_id, relative in enumerate(tree.images)}
    if fmt == "lmdb":
        assert ds.samples == samples
        assert all(os.path.isfile(os.fsencode(tree.root) + b"/" + os.fsencode(key)) for key, _ in ds.samples)
        assert [sample_id_of(ds[i][0]) for i in range(len(ds))] == [id_of[key] for key, _ in samples]
    else:
        with tarfile.open(out / summary.files[0].name) as tar:
            names = {os.fsencode(m.name) for m in tar.getmembers()}
        assert {folder + b"/" + name for folder, name in NON_UTF8_LAYOUT} <= names
        assert sorted(sample_id_of(image) for image, _ in ds) == list(range(len(NON_UTF8_LAYOUT)))
    loaded = [sample_id_of(image) for images, _ in fastdata.loader(out, batch_size=4, augment="val", image_size=16,
                                                                   num_workers=2) for image in images]
    assert sorted(loaded) == list(range(len(NON_UTF8_LAYOUT)))
    report = fastdata.tools.verify.verify(out, source=tree.root, decode=True)
    assert report.ok, str(report)


# ------------------------------------------------------------------------------------------- rejected files


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_unusable_files_are_rejected_and_the_rest_is_written(bad_tree, tmp_path, fmt):
    out = tmp_path / ("out.lmdb" if fmt == "lmdb" else "out")
    summary = fastdata.convert_imagefolder(
        bad_tree.root, out, fastdata.ImageFolderOptions(format=fmt, workers=2, progress=False)
    )
    rejected = {r["path"]: r["reason"] for r in summary.rejected}
    assert sorted(rejected) == sorted(BAD_FILES)
    assert all(reason.strip() for reason in rejected.values())
    assert "empty" in rejected["more/empty.png"]
    assert "truncated" in rejected["good/truncated.jpg"]
    text = str(summary)
    for path in BAD_FILES:
        assert path in text
    assert "rejected  3 files" in text
    assert summary.images == len(bad_tree.images) == 4
    assert summary.ignored == 1
    manifest = fastdata.info(out)
    assert {r["path"]: r["reason"] for r in manifest.rejected} == rejected
    assert manifest.num_samples == 4
    assert sum(manifest.class_counts) == 4
    ds = fastdata.dataset(out)
    if fmt == "lmdb":
        assert sorted(p for p, _ in ds.samples) == sorted(bad_tree.images)
        for i, (relative, _) in enumerate(ds.samples):
            assert np.array_equal(ds[i][0].numpy(), chw(rgb_of_file(bad_tree.path(relative))))
    else:
        assert len(list(ds)) == 4


@pytest.mark.parametrize("workers", [1, 2])
def test_strict_stops_at_the_first_rejected_file_and_writes_nothing(bad_tree, tmp_path, workers):
    out = tmp_path / "out.lmdb"
    with pytest.raises(RejectedFileError) as info:
        fastdata.convert_imagefolder(
            bad_tree.root, out, fastdata.ImageFolderOptions(strict=True, workers=workers, progress=False)
        )
    message = str(info.value)
    assert any(str(bad_tree.path(p)) in message for p in BAD_FILES), message
    assert not out.exists()
    assert not (tmp_path / "out.lmdb.partial").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


def test_strict_failure_keeps_an_existing_dataset(bad_tree, tmp_path):
    good = build_solid_tree(tmp_path / "good", count=5)
    out = tmp_path / "out.lmdb"
    fastdata.convert_imagefolder(good.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    with pytest.raises(RejectedFileError):
        fastdata.convert_imagefolder(
            bad_tree.root, out, fastdata.ImageFolderOptions(strict=True, overwrite=True, workers=1, progress=False)
        )
    assert len(fastdata.dataset(out)) == 5
    assert not (tmp_path / "out.lmdb.partial").exists()


def test_strict_conversion_of_a_clean_tree_succeeds(tricky_tree, tmp_path):
    summary = fastdata.convert_imagefolder(
        tricky_tree.root, tmp_path / "x.lmdb", fastdata.ImageFolderOptions(strict=True, workers=1, progress=False)
    )
    assert summary.images == len(tricky_tree.images)
    manifest = json.loads((tmp_path / "x.lmdb" / "manifest.json").read_text())
    assert manifest["options"]["strict"] is True


def test_a_class_folder_without_images_is_refused_as_torchvision_refuses_it(tmp_path):
    """A converted dataset (or any folder without images) inside the tree would become an empty class: refused,
    naming the folder, as torchvision's ImageFolder raises for it."""
    from builders.images import build_solid_tree
    from torchvision.datasets import ImageFolder

    from fastdata.errors import SourceError

    tree = build_solid_tree(tmp_path / "src", count=6)
    stray = tree.root / "old.lmdb"
    stray.mkdir()
    (stray / "data.mdb").write_bytes(b"\0" * 64)
    with pytest.raises(FileNotFoundError):
        ImageFolder(str(tree.root))
    with pytest.raises(SourceError, match=r"class folder old\.lmdb holds files but no image file.*not a class"):
        fastdata.convert_imagefolder(
            tree.root, tmp_path / "o.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False)
        )
    (stray / "data.mdb").unlink()  # a folder with nothing in it: an empty class, as allow_empty=True has it
    summary = fastdata.convert_imagefolder(
        tree.root, tmp_path / "o.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False)
    )
    assert summary.empty_classes == ["old.lmdb"] and "classes with no images: old.lmdb" in str(summary)


def test_an_output_beside_a_list_or_inside_its_image_root_is_accepted(tmp_path, capsys):
    """Only a converter that walks its source folder (ImageFolder) refuses an OUT inside it: a file list, pairs and
    the other sources read the files they name, nothing else. The README's `fastdata convert list seg.csv seg.lmdb
    --mask-column mask`, list and OUT in one folder that is also the images' root, converts; so does `convert
    pairs` in the same layout, and a list whose OUT lies inside the folder its images are read from."""
    from builders.runs import cli
    from builders.segmentation import build_segmentation_list

    listed, _ = build_segmentation_list(tmp_path)
    seg_csv = listed.rename(tmp_path / "seg.csv")
    code, _, err = cli(capsys, "convert", "list", seg_csv, tmp_path / "seg.lmdb", "--mask-column", "mask", "-q",
                       "--workers", "1")
    assert code == 0, err
    assert fastdata.info(tmp_path / "seg.lmdb").target_kind == "segmentation"
    code, _, err = cli(capsys, "convert", "list", seg_csv, tmp_path / "img" / "inside.lmdb", "--mask-column",
                       "mask", "-q", "--workers", "1")
    assert code == 0, err
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("path,caption\n" + "".join(f"img/s{i:02d}.png,picture {i}\n" for i in range(3)))
    code, _, err = cli(capsys, "convert", "pairs", pairs, tmp_path / "pairs.lmdb", "-q", "--workers", "1")
    assert code == 0, err
