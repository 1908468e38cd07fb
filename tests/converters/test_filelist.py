"""`fastdata convert list`: CSV / TSV / JSON-lines / parquet lists (written by pandas) of tiny images -> LMDB and
WebDataset, checked sample by sample against reading the list and the files directly: order, keys, bytes, pixels,
labels (names, ids, multi-label sets) and metadata; rejections named with their list file and row; every bad list a
one-line error (exit 2) with nothing written; interrupted conversions resumed; the loader over a list dataset."""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from builders.damaged import corrupt_ids_copy
from builders.images import SOLID_CLASSES, build_solid_tree, chw, rgb_of_file, sample_id_of, solid_id_of_path
from builders.lists import list_frame, listed_label, write_list
from builders.pairs import pairs_frame
from builders.runs import KILL_WHEN, assert_one_line_error, cli
from builders.sources import multi_hot, multi_labels, solid_metadata

import fastdata
from fastdata.errors import OutputExistsError, SourceError
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.tools.info import describe

COUNT = 21
SUFFIXES = [".csv", ".tsv", ".jsonl", ".parquet"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_solid_tree(tmp_path_factory.mktemp("list_src") / "data", count=COUNT)


def convert(list_path, out: Path, **options):
    settings = dict(workers=1, progress=False, shard_size="8KB")
    settings.update(options)
    if str(out).endswith(".lmdb"):
        settings.pop("shard_size")
    else:
        settings.setdefault("format", "wds")
    return fastdata.convert_list(list_path, out, fastdata.FileListOptions(**settings))


def stored_samples(out: Path) -> dict[str, tuple]:
    """key -> (stored bytes, label, metadata) of every sample of a conversion."""
    ds = fastdata.dataset(out)
    if fastdata.info(out).format == "lmdb":
        return {ds.reader.key(i): (ds.reader.read(i), ds.reader.label(i), ds.reader.metadata(i) or {})
                for i in range(len(ds))}
    return {s.key: (s.data, s.label, s.metadata or {}) for s in ds.encoded_samples(list(range(len(ds.shards))))}


def expected_label(value, classes: list[str]):
    """A listed label as the dataset stores it: a class id, or the sorted tuple of a set's class ids."""
    if isinstance(value, list):
        return tuple(sorted({classes.index(str(v)) for v in value}))
    return classes.index(str(value))


def check_against_list(out: Path, frame: pd.DataFrame, root: Path) -> None:
    """The conversion holds exactly the list's rows: in LMDB in the list's order, every sample's bytes the file's,
    its label the listed one, its metadata the row's other columns; decoded pixels equal PIL's for lossless
    images."""
    manifest = fastdata.info(out)
    stored = stored_samples(out)
    metadata_columns = [c for c in frame.columns if c not in ("path", "label")]
    assert manifest.metadata_fields == metadata_columns
    assert set(stored) == set(frame["path"]) and manifest.num_samples == len(frame)
    for row in frame.to_dict("records"):
        data, label, metadata = stored[row["path"]]
        assert data == (root / row["path"]).read_bytes()
        assert label == expected_label(row["label"], manifest.classes)
        assert metadata == {c: None if pd.isna(row[c]) else row[c] for c in metadata_columns}  # NaN: missing
    if manifest.format == "lmdb":
        ds = fastdata.dataset(out, metadata=True)
        assert [ds.reader.key(i) for i in range(len(ds))] == list(frame["path"])  # sample i is row i
        for i, row in enumerate(frame.to_dict("records")):
            image, _label, metadata = ds[i]
            assert metadata == solid_metadata(solid_id_of_path(row["path"]))
            if ds.reader.codecs[i] != CODEC_CV_JPEG:  # lossless: the very pixels PIL decodes from the file
                assert np.array_equal(image.numpy(), chw(rgb_of_file(root / row["path"])))


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_each_list_format_converts_sample_by_sample(tree, tmp_path, suffix, fmt):
    frame = list_frame(tree)
    list_path = write_list(frame, tree.root.parent / f"lists-{fmt}" / f"train{suffix}")
    out = tmp_path / ("out.lmdb" if fmt == "lmdb" else "out-wds")
    summary = convert(list_path, out, root=tree.root)
    assert summary.images == COUNT and summary.rejected == []
    manifest = fastdata.info(out)
    assert manifest.classes == sorted(SOLID_CLASSES) and manifest.label_kind == "single"
    assert manifest.source["kind"] == "list" and manifest.source["lists"] == [str(list_path)]
    check_against_list(out, frame, tree.root)


def test_paths_are_relative_to_the_list_folder_by_default(tree, tmp_path):
    frame = list_frame(tree)
    out = tmp_path / "out.lmdb"
    convert(write_list(frame, tree.root / "train.csv"), out)
    check_against_list(out, frame, tree.root)
    assert "images under" in describe(out)


@pytest.mark.parametrize(("suffix", "labels", "fmt"), [
    (".csv", "name-sets", "lmdb"), (".csv", "id-sets", "wds"), (".jsonl", "name-sets", "wds"),
    (".jsonl", "id-sets", "lmdb"), (".parquet", "name-sets", "lmdb"), (".parquet", "id-sets", "wds"),
])
def test_lists_of_labels_make_a_multi_label_dataset(tree, tmp_path, suffix, labels, fmt):
    frame = list_frame(tree, labels=labels)
    out = tmp_path / ("out.lmdb" if fmt == "lmdb" else "out-wds")
    convert(write_list(frame, tmp_path / f"train{suffix}"), out, root=tree.root)
    manifest = fastdata.info(out)
    assert manifest.label_kind == "multi"
    assert manifest.classes == (sorted(SOLID_CLASSES) if labels == "name-sets" else ["0", "1", "2"])
    sets = [tuple(sorted(manifest.classes.index(str(v)) for v in value)) for value in frame["label"]]
    assert manifest.class_counts == [sum(c in s for s in sets) for c in range(3)]
    check_against_list(out, frame, tree.root)
    classes = manifest.classes
    for images, targets in fastdata.loader(out, batch_size=5, image_size=16, num_workers=0):
        for image, target in zip(images, targets, strict=True):
            listed = listed_label(sample_id_of(image), labels)
            assert target.tolist() == multi_hot(expected_label(listed, classes))


def test_integer_labels_are_kept_as_given(tree, tmp_path, capsys):
    frame = list_frame(tree, labels="ids")
    list_path = write_list(frame, tmp_path / "train.parquet")
    summary = convert(list_path, tmp_path / "out.lmdb", root=tree.root, num_classes=5)
    manifest = fastdata.info(tmp_path / "out.lmdb")
    assert manifest.classes == ["0", "1", "2", "3", "4"] and summary.empty_classes == ["3", "4"]
    stored = stored_samples(tmp_path / "out.lmdb")
    assert all(stored[row["path"]][1] == row["label"] for row in frame.to_dict("records"))
    code, _, err = cli(capsys, "convert", "list", list_path, tmp_path / "o2.lmdb", "--root", tree.root,
                       "--num-classes", "2", "-q")
    assert code == 2
    assert_one_line_error(err, f"{list_path} row {list(frame['label']).index(2) + 1}", "label 2", "--num-classes 2")


def test_a_list_of_an_imagefolder_converts_as_the_imagefolder_does(tree, tmp_path):
    from torchvision.datasets import ImageFolder

    folder_view = ImageFolder(str(tree.root))
    frame = pd.DataFrame({"path": [Path(p).relative_to(tree.root).as_posix() for p, _ in folder_view.samples],
                          "label": [folder_view.classes[label] for _, label in folder_view.samples]})
    convert(write_list(frame, tmp_path / "folder.csv"), tmp_path / "list.lmdb", root=tree.root)
    fastdata.convert_imagefolder(
        tree.root, tmp_path / "folder.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False)
    )
    listed, folder = fastdata.dataset(tmp_path / "list.lmdb"), fastdata.dataset(tmp_path / "folder.lmdb")
    assert listed.classes == folder.classes and listed.samples == folder.samples
    assert all(listed.reader.read(i) == folder.reader.read(i) for i in range(len(folder)))


# ------------------------------------------------------------------------------------------- rejected images


def test_missing_and_undecodable_images_are_rejected_with_their_list_row(tmp_path, capsys):
    small = build_solid_tree(tmp_path / "images", count=6)
    (small.root / "alpha/broken.png").write_text("not a PNG\n")
    frame = list_frame(small)
    frame = pd.concat([frame.iloc[:2], pd.DataFrame([{"path": "alpha/missing.png", "label": "beta"}]), frame.iloc[2:],
                       pd.DataFrame([{"path": "alpha/broken.png", "label": "alpha"}])], ignore_index=True)
    list_path = write_list(frame, small.root / "train.csv")
    summary = convert(list_path, tmp_path / "out.lmdb")
    assert summary.rejected == [
        {"path": "alpha/missing.png", "reason": "unreadable (No such file or directory)", "list": str(list_path),
         "row": 3},
        {"path": "alpha/broken.png", "reason": summary.rejected[1]["reason"], "list": str(list_path), "row": 8}]
    assert summary.rejected[1]["reason"].startswith("not a decodable image")
    assert f"{list_path} row 3: alpha/missing.png: unreadable" in str(summary)
    assert fastdata.info(tmp_path / "out.lmdb").rejected == summary.rejected
    assert f"{list_path} row 8: alpha/broken.png" in describe(tmp_path / "out.lmdb")
    assert summary.images == 6 and len(fastdata.dataset(tmp_path / "out.lmdb")) == 6

    code, _, err = cli(capsys, "convert", "list", list_path, tmp_path / "strict.lmdb", "--strict", "-q")
    assert code == 1
    assert_one_line_error(err, f"{list_path} row 3", "missing.png", "--strict: nothing written")
    assert not (tmp_path / "strict.lmdb").exists() and not (tmp_path / "strict.lmdb.partial").exists()


# ------------------------------------------------------------------------------------------- bad lists


def bad_list(tmp_path: Path, case: str) -> tuple[Path, list[str], list[str]]:
    """A list with one problem: (its path, extra CLI arguments, what the one-line error must say)."""
    small = build_solid_tree(tmp_path / "images", count=6)
    frame = list_frame(small)
    if case == "missing column":
        path = write_list(frame.drop(columns=["label"]), small.root / "train.csv")
        return path, [], [f"{path}: no column 'label'", "its columns: path, id, name, score, odd, note",
                          "--label-column"]
    if case == "header only":
        path = write_list(frame.iloc[:0], small.root / "train.csv")
        return path, [], ["the list has no rows"]
    if case == "empty file":
        path = small.root / "train.csv"
        path.write_text("")
        return path, [], [f"{path}: the list is empty"]
    if case == "duplicate":
        frame.loc[4, "path"] = "./" + frame.loc[1, "path"]
        path = write_list(frame, small.root / "train.jsonl")
        return path, [], [f"path '{frame.loc[1, 'path']}' is listed 2 times", f"{path} row 2", f"{path} row 5"]
    if case == "mixed jsonl":
        frame["label"] = frame["label"].astype(object)
        frame.loc[2, "label"] = 1
        path = write_list(frame, small.root / "train.jsonl")
        return path, [], ["column 'label' mixes types", "row 1 holds text ('", "row 3 an integer (1)"]
    if case == "mixed csv":
        frame.loc[3, "label"] = "2"
        path = write_list(frame, small.root / "train.csv")
        return path, [], ["column 'label' mixes label types", f"{path} row 1 holds a class name",
                          f"{path} row 4 an integer class id ('2')"]
    if case == "mixed lists":
        frame["label"] = [["alpha"], "beta", *[["gamma"]] * 4]
        path = write_list(frame, small.root / "train.jsonl")
        return path, [], ["column 'label' mixes types", "row 1 holds a list", "row 2 text ('beta')"]
    if case == "dot-dot":
        frame.loc[2, "path"] = "../elsewhere/x.png"
        path = write_list(frame, small.root / "train.csv")
        return path, [], [f"{path} row 3", "'../elsewhere/x.png' is outside the root", "--allow-outside-root"]
    if case == "absolute":
        frame.loc[0, "path"] = str(tmp_path / "x.png")
        path = write_list(frame, small.root / "train.parquet")
        return path, [], [f"{path} row 1", "is outside the root", "--allow-outside-root"]
    if case == "missing label":
        frame["label"] = frame["label"].astype(object)
        frame.loc[3, "label"] = None
        path = write_list(frame, small.root / "train.parquet")
        return path, [], [f"{path} row 4: no label in column 'label'", "[]"]
    if case == "float label":
        frame["label"] = [0.0, 1.0, 2.5, 0.0, 1.0, 2.0]
        path = write_list(frame, small.root / "train.parquet")
        return path, [], [f"{path} row 1", "holds a number (0.0)"]
    if case == "nested metadata":
        frame["boxes"] = [{"x": 1, "y": 2}] * len(frame)
        path = write_list(frame, small.root / "train.jsonl")
        return path, [], [f"{path} row 1: column 'boxes' holds", "--metadata-columns"]
    if case == "num-classes with names":
        return write_list(frame, small.root / "train.csv"), ["--num-classes", "3"], ["--num-classes applies to "
                                                                                      "integer class ids"]
    if case == "no such list":
        return small.root / "nope.csv", [], ["nope.csv: no such file or folder"]
    if case == "not a list":
        return small.path(small.images[0]), [], ["not a list file"]
    if case == "unknown metadata column":
        return write_list(frame, small.root / "train.csv"), ["--metadata-columns", "id,colour"], [
            "no metadata column 'colour'", "its other columns: id, name"]
    raise AssertionError(case)


BAD_CASES = ["missing column", "header only", "empty file", "duplicate", "mixed jsonl", "mixed csv", "mixed lists",
             "dot-dot", "absolute", "missing label", "float label", "nested metadata", "num-classes with names",
             "no such list", "not a list", "unknown metadata column"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_a_bad_list_is_one_line_naming_the_problem_and_writes_nothing(tmp_path, capsys, case):
    list_path, extra, needles = bad_list(tmp_path, case)
    out = tmp_path / "out.lmdb"
    code, stdout, err = cli(capsys, "convert", "list", list_path, out, "-q", *extra)
    assert code == 2, (stdout, err)
    assert_one_line_error(err, *needles)
    assert not out.exists() and not (tmp_path / "out.lmdb.partial").exists()


def test_nested_metadata_can_be_left_out(tmp_path):
    list_path, _, _ = bad_list(tmp_path, "nested metadata")
    convert(list_path, tmp_path / "out.lmdb", metadata_columns=["id", "name"])
    assert fastdata.info(tmp_path / "out.lmdb").metadata_fields == ["id", "name"]
    convert(list_path, tmp_path / "none.lmdb", metadata_columns=[])
    manifest = fastdata.info(tmp_path / "none.lmdb")
    assert manifest.metadata_fields == [] and manifest.format_version == 1


@pytest.mark.parametrize("command", ["list", "pairs"])
def test_metadata_columns_are_names_separated_by_commas(capsys, tree, tmp_path, command):
    """`--metadata-columns` of both list commands: names separated by commas, blanks dropped; '' keeps none."""
    frame = list_frame(tree) if command == "list" else pairs_frame(tree)
    frame["note"], frame["other"] = "x", 1
    listed = write_list(frame, tmp_path / "src.csv")
    for flag, kept in ((" note , ,other ", ["note", "other"]), ("", [])):
        out = tmp_path / f"kept{len(kept)}.lmdb"
        code, _, err = cli(capsys, "convert", command, listed, out, "--root", tree.root, "--metadata-columns", flag,
                           "-q")
        assert code == 0, err
        assert fastdata.info(out).metadata_fields == kept


def test_metadata_values_become_json_scalars(tree, tmp_path):
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = tree.images[:3]
    when = [datetime.datetime(2024, 5, 17, 8, 30), None, datetime.datetime(1999, 12, 31, 23, 59, 59)]
    table = pa.table({"path": paths, "label": ["alpha", "beta", "alpha"], "score": [0.5, float("nan"), None],
                      "taken": pa.array(when, pa.timestamp("s")), "day": [datetime.date(2024, 1, 2)] * 3})
    pq.write_table(table, tmp_path / "train.parquet")  # pyarrow keeps NaN as a value (pandas would make it null)
    convert(tmp_path / "train.parquet", tmp_path / "out.lmdb", root=tree.root)
    ds = fastdata.dataset(tmp_path / "out.lmdb")
    assert [ds.metadata(i) for i in range(3)] == [
        {"score": 0.5, "taken": "2024-05-17T08:30:00", "day": "2024-01-02"},
        {"score": None, "taken": None, "day": "2024-01-02"},
        {"score": None, "taken": "1999-12-31T23:59:59", "day": "2024-01-02"}]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_paths_outside_the_root_are_converted_only_when_allowed(tree, tmp_path, fmt):
    lists = tmp_path / "lists"  # the default root: every image is outside it
    prefix = os.path.relpath(tree.root, lists) + "/"
    frame = list_frame(tree, prefix=prefix)
    frame.loc[0, "path"] = str(tree.root / frame.loc[0, "path"][len(prefix):])  # absolute, outside it too
    list_path = write_list(frame, lists / "train.csv")
    out = tmp_path / ("out.lmdb" if fmt == "lmdb" else "out-wds")
    with pytest.raises(SourceError, match="outside the root"):
        convert(list_path, out)
    summary = convert(list_path, out, allow_outside_root=True)
    assert summary.rejected == [] and summary.images == COUNT
    stored = stored_samples(out)
    assert set(stored) == {posixpath.normpath(p) for p in frame["path"]}
    assert any(key.startswith("../") for key in stored) and any(key.startswith("/") for key in stored)
    for row in frame.to_dict("records"):
        assert stored[posixpath.normpath(row["path"])][0] == (lists / row["path"]).read_bytes()
    if fmt == "wds":  # every member name is a relative path inside the shard
        for shard in out.glob("*.tar"):
            with tarfile.open(shard) as tar:
                assert all(not m.name.startswith(("/", "..")) for m in tar.getmembers())


def test_absolute_paths_inside_the_root_are_keyed_relative_to_it(tree, tmp_path):
    frame = list_frame(tree)
    frame["path"] = [str(tree.root / p) for p in frame["path"]]
    convert(write_list(frame, tmp_path / "train.jsonl"), tmp_path / "out.lmdb", root=tree.root)
    assert set(stored_samples(tmp_path / "out.lmdb")) == set(tree.images)


def test_a_folder_or_glob_of_lists_is_read_in_sorted_order(tree, tmp_path):
    frame = list_frame(tree)
    folder = tmp_path / "lists"
    write_list(frame.iloc[12:], folder / "b.jsonl")
    write_list(frame.iloc[:12], folder / "a.csv")
    (folder / "notes.txt").write_text("not a list\n")
    summary = convert(folder, tmp_path / "all.lmdb", root=tree.root)
    assert summary.images == COUNT
    ds = fastdata.dataset(tmp_path / "all.lmdb")
    assert [ds.reader.key(i) for i in range(len(ds))] == list(frame["path"])
    assert fastdata.info(tmp_path / "all.lmdb").source["lists"] == [str(folder / "a.csv"), str(folder / "b.jsonl")]
    convert(str(folder / "*.csv"), tmp_path / "csv.lmdb", root=tree.root)
    assert len(fastdata.dataset(tmp_path / "csv.lmdb")) == 12
    frame.loc[13, "path"] = "beta/missing.png"  # row 2 of b.jsonl
    write_list(frame.iloc[12:], folder / "b.jsonl")
    rejected = convert(folder, tmp_path / "again.lmdb", root=tree.root).rejected
    assert [(r["list"], r["row"]) for r in rejected] == [(str(folder / "b.jsonl"), 2)]


# ------------------------------------------------------------------------------------------- resuming

KILLER = KILL_WHEN + textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.formats import lmdb as L, wds as W

    list_path, root, out, fmt, at = sys.argv[1:6]
    kill_when(L.LmdbWriter if fmt == "lmdb" else W.WdsWriter, "add", lambda self: self.count == int(at))
    fastdata.convert_list(list_path, out, fastdata.FileListOptions(
        root=root, format=None if fmt == "lmdb" else "wds", shard_size="8KB", workers=1, commit_every=4,
        progress=False))
""")


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_an_interrupted_list_conversion_resumes_to_the_same_dataset(tree, tmp_path, fmt):
    frame = list_frame(tree, labels="name-sets")
    list_path = write_list(frame, tmp_path / "train.parquet")
    name = "out.lmdb" if fmt == "lmdb" else "out-wds"
    options = dict(root=tree.root, commit_every=4)
    convert(list_path, tmp_path / "reference" / name, **options)
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-c", KILLER, str(list_path), str(tree.root), str(out), fmt, "13"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not out.exists()

    changed = frame.copy()
    changed.loc[0, "score"] = -1.0
    write_list(changed, tmp_path / "changed.parquet")
    shutil.copy(tmp_path / "changed.parquet", list_path)
    with pytest.raises(OutputExistsError, match="source files changed"):
        convert(list_path, out, **options)
    write_list(frame, list_path)
    summary = convert(list_path, out, **options)
    assert summary.resumed_at
    assert stored_samples(out) == stored_samples(tmp_path / "reference" / name)
    reference = fastdata.info(tmp_path / "reference" / name)
    assert fastdata.info(out).class_counts == reference.class_counts
    if fmt == "wds":
        assert [f.sha256 for f in fastdata.info(out).files] == [f.sha256 for f in reference.files]


# ------------------------------------------------------------------------------------------- loading


@pytest.fixture(scope="module")
def list_lmdb(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("list_lmdb") / "list.lmdb"
    convert(write_list(list_frame(tree, labels="name-sets"), out.parent / "train.jsonl"), out, root=tree.root)
    return out


def test_loader_workers_skip_a_corrupt_sample_and_split_ranks(list_lmdb, tmp_path):
    corrupt = corrupt_ids_copy(list_lmdb, tmp_path, {4})
    seen, skipped = [], set()
    for rank in range(2):
        loader = fastdata.loader(corrupt, batch_size=4, image_size=16, num_workers=2, on_error="skip", rank=rank,
                                 world_size=2, seed=3)
        ranks_ids = [sample_id_of(image) for images, labels in loader for image in images]
        for images, labels in loader:  # the next epoch: labels row by row
            for image, row in zip(images, labels, strict=True):
                assert row.tolist() == multi_hot(multi_labels(sample_id_of(image)))
        seen += ranks_ids
        skipped |= {solid_id_of_path(key) for key, _ in loader.skipped}
    assert skipped == {4} and 4 not in seen
    assert set(seen) == set(range(COUNT)) - {4} and len(seen) >= COUNT - 1  # one sample pads the odd count


def test_metadata_of_a_list_dataset(list_lmdb):
    ds = fastdata.dataset(list_lmdb, metadata=True)
    for i in range(len(ds)):
        _image, label, metadata = ds[i]
        sample_id = solid_id_of_path(ds.reader.key(i))
        assert metadata == solid_metadata(sample_id) and label.tolist() == multi_hot(multi_labels(sample_id))
    assert json.loads((list_lmdb / "manifest.json").read_text())["metadata_fields"] == list(solid_metadata(0))


def test_labels_joined_by_a_separator_warn_and_a_json_list_is_multi_label(tmp_path):
    """`a;b` in a CSV cell is one class named "a;b" (a warning says so, naming the row and the list to write);
    `["a", "b"]` is two labels."""
    import warnings

    from tests.builders.images import photo_like, write_image

    src = tmp_path / "src"
    rows = ["path,label"]
    labels = ["a", "b", "a;b", "c", "b;c", "a"]
    for i, label in enumerate(labels):
        write_image(src / f"{i}.jpg", photo_like(i, 32, 24), "jpeg")
        rows.append(f'{i}.jpg,"{label}"')
    (src / "joined.csv").write_text("\n".join(rows) + "\n")
    with pytest.warns(UserWarning, match=r"row 3.*'a;b'.*joined by ';'.*\[\"a\", \"b\"\]"):
        summary = fastdata.convert_list(
            src / "joined.csv", tmp_path / "out" / "joined.lmdb", fastdata.FileListOptions(workers=1, progress=False)
        )
    assert summary.classes == 5  # a, a;b, b, b;c, c
    import csv

    with open(src / "lists.csv", "w", newline="") as handle:  # the csv module quotes the JSON lists
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        writer.writerows([f"{i}.jpg", json.dumps(label.split(";"))] for i, label in enumerate(labels))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        multi = fastdata.convert_list(
            src / "lists.csv", tmp_path / "out" / "lists.lmdb", fastdata.FileListOptions(workers=1, progress=False)
        )
    assert multi.classes == 3 and fastdata.dataset(tmp_path / "out" / "lists.lmdb").multi_label


@pytest.mark.parametrize("decode", ["worker", "device"])
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_batches_carry_keys_and_metadata_when_asked(list_lmdb, decode, workers):
    """`fastdata.loader(..., metadata=True)`: each batch is (images, labels, metadata), one dict per sample in batch
    order with its key and stored metadata, on both decode paths; a skipped sample takes its dict with it."""
    options = dict(batch_size=4, image_size=16, num_workers=workers, seed=3, metadata=True, decode=decode,
                   device="cpu" if decode == "device" else None)
    seen = 0
    for images, labels, metadata in fastdata.loader(list_lmdb, **options):
        assert len(metadata) == len(images) == len(labels)
        for image, entry in zip(images, metadata, strict=True):
            sample_id = solid_id_of_path(entry["key"])
            assert sample_id_of(image) == sample_id and entry == {"key": entry["key"], **solid_metadata(sample_id)}
        seen += len(metadata)
    assert seen == COUNT
    plain = next(iter(fastdata.loader(list_lmdb, batch_size=4, image_size=16, num_workers=0)))
    assert len(plain) == 2  # without metadata=True, batches are (images, labels) as always


def test_loader_metadata_for_detection_and_pairs(coco_lmdb, pairs_lmdb):
    _, targets, metadata = next(iter(fastdata.loader(coco_lmdb, batch_size=2, image_size=64, num_workers=0,
                                                     metadata=True)))
    assert len(metadata) == len(targets) == 2 and all("key" in m for m in metadata)
    batch = next(iter(fastdata.loader(pairs_lmdb, batch_size=2, image_size=32, num_workers=0, metadata=True)))
    assert [m["key"] for m in batch["metadata"]] and len(batch["metadata"]) == len(batch["images"])
