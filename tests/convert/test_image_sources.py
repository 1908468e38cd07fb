"""The image conversion driver over any source (`fastdata.convert.sources`): samples whose bytes come from a
source's own reader (here the members of a zip archive), multi-label samples and per-sample metadata, stored in
LMDB and WebDataset alike, with the guarantees of an ImageFolder conversion (rejections named, resumable,
fingerprinted)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from builders.images import SOLID_CLASSES, build_solid_tree, solid_id_of_path, solid_label
from builders.runs import KILL_WHEN
from builders.sources import ZipReader, multi_labels, solid_metadata, write_zip, zip_source

import fastdata
from fastdata.convert.images import convert_images
from fastdata.convert.options import ImageConversionOptions
from fastdata.convert.sources import ImageSource
from fastdata.errors import OutputExistsError, RejectedFileError, SourceError
from fastdata.tools.verify import verify

COUNT = 24
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_solid_tree(tmp_path_factory.mktemp("zip_src") / "src", count=COUNT)


def convert(listing: ImageSource, out: Path, fmt: str, **options):
    return convert_images(lambda: listing, out, ImageConversionOptions(format=fmt, shard_size="6KB", progress=False,
                                                                   **{"workers": 1, **options}))


def stored(out: Path) -> list:
    """(key, label, stored bytes) of every sample, in stored order."""
    ds = fastdata.dataset(out)
    if fastdata.info(out).format == "lmdb":
        return [(ds.reader.key(i), ds.reader.label(i), ds.reader.read(i)) for i in range(len(ds))]
    return [(s.key, s.label, s.data) for s in ds.encoded_samples(list(range(len(ds.shards))))]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_samples_are_the_bytes_the_source_reader_reads(tree, tmp_path, fmt):
    missing = tree.images[5]
    archive = write_zip(tree, tmp_path / "images.zip", missing=(missing,))
    summary = convert(zip_source(tree, archive), tmp_path / f"out.{fmt}", fmt, workers=2)

    members = zipfile.ZipFile(archive)
    got = stored(tmp_path / f"out.{fmt}")
    expected = [(key, solid_label(solid_id_of_path(key)), members.read(key)) for key in tree.images if key != missing]
    assert (got if fmt == "lmdb" else sorted(got)) == (expected if fmt == "lmdb" else sorted(expected))
    assert summary.rejected == [{"path": missing, "reason": "unreadable (no such member in the archive)"}]
    manifest = fastdata.info(tmp_path / f"out.{fmt}")
    assert manifest.source["kind"] == "zip" and manifest.source["path"] == str(archive.resolve())
    assert manifest.rejected == summary.rejected
    assert manifest.format_version == 1 and manifest.label_kind == "single" and manifest.metadata_fields == []


def test_strict_names_where_the_reader_failed(tree, tmp_path):
    archive = write_zip(tree, tmp_path / "images.zip", missing=(tree.images[2],))
    with pytest.raises(RejectedFileError, match=rf"images\.zip!{tree.images[2]}: unreadable .*--strict"):
        convert(zip_source(tree, archive), tmp_path / "out.lmdb", "lmdb", strict=True)
    assert not (tmp_path / "out.lmdb").exists() and not (tmp_path / "out.lmdb.partial").exists()


class CountedZipReader(ZipReader):
    """ZipReader counting how often the conversion pickles it (in this process)."""

    pickled = 0

    def __getstate__(self) -> dict:
        CountedZipReader.pickled += 1
        return super().__getstate__()


def test_the_reader_goes_to_each_worker_once_not_with_every_task(tree, tmp_path):
    # a reader may hold a table of where every sample is: sent with each chunk of tasks it would be sent 3 times
    # here (24 samples, chunks of 8), and as often as there are chunks of a million samples
    archive = write_zip(tree, tmp_path / "images.zip")
    listing = zip_source(tree, archive)
    listing.reader = CountedZipReader(archive)
    CountedZipReader.pickled = 0
    convert(listing, tmp_path / "out.lmdb", "lmdb", workers=2)
    assert CountedZipReader.pickled <= 2  # 0 where workers fork, one per worker where they spawn
    assert len(fastdata.dataset(tmp_path / "out.lmdb")) == COUNT


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_multi_label_samples_keep_their_class_sets(tree, tmp_path, fmt):
    archive = write_zip(tree, tmp_path / "images.zip")
    out = tmp_path / f"out.{fmt}"
    convert(zip_source(tree, archive, multi=True), out, fmt)

    manifest = fastdata.info(out)
    assert manifest.label_kind == "multi" and manifest.format_version == 2
    sets = [multi_labels(solid_id_of_path(key)) for key in tree.images]
    assert manifest.num_samples == COUNT
    assert manifest.class_counts == [sum(c in ids for ids in sets) for c in range(len(SOLID_CLASSES))]
    assert sum(manifest.class_counts) != COUNT  # a sample counts once for each of its classes
    assert sorted(stored(out)) == sorted((key, ids, zipfile.ZipFile(archive).read(key))
                                         for key, ids in zip(tree.images, sets, strict=True))
    if fmt == "lmdb":
        ds = fastdata.dataset(out)
        assert ds.samples == [(key, list(ids)) for key, ids in zip(tree.images, sets, strict=True)]
        _image, label = ds[3]
        assert label.dtype == torch.float32
        assert label.tolist() == [1.0 if c in sets[3] else 0.0 for c in range(3)]
    else:  # no .cls (webdataset reads it as one integer); the class ids are the .json's "label"
        for path in sorted(out.glob("*.tar")):
            with tarfile.open(path) as shard:
                members = shard.getmembers()
                assert not [m.name for m in members if m.name.endswith(".cls")]
                for member in (m for m in members if m.name.endswith(".json")):
                    meta = json.loads(shard.extractfile(member).read())
                    assert meta["label"] == list(multi_labels(solid_id_of_path(meta["path"])))
    report = verify(out, decode=True)
    assert report.ok, str(report)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_metadata_is_stored_and_returned_on_request(tree, tmp_path, fmt):
    archive = write_zip(tree, tmp_path / "images.zip")
    out = tmp_path / f"out.{fmt}"
    convert(zip_source(tree, archive, metadata=True), out, fmt)

    manifest = fastdata.info(out)
    assert manifest.metadata_fields == ["id", "name", "score", "odd", "note"] and manifest.format_version == 2
    plain = fastdata.dataset(out)
    with_metadata = fastdata.dataset(out, metadata=True)
    if fmt == "lmdb":
        assert len(plain[0]) == 2  # not loaded unless asked for
        for i in range(len(with_metadata)):
            image, label, metadata = with_metadata[i]
            sample_id = solid_id_of_path(with_metadata.reader.key(i))
            assert metadata == solid_metadata(sample_id) == with_metadata.metadata(i)
            assert label == solid_label(sample_id)
    else:
        from builders.images import sample_id_of

        assert all(len(item) == 2 for item in plain)
        seen = []
        for image, label, metadata in with_metadata:
            sample_id = sample_id_of(image)
            assert metadata == solid_metadata(sample_id) and label == solid_label(sample_id)
            seen.append(sample_id)
        assert sorted(seen) == sorted(solid_id_of_path(key) for key in tree.images)


def test_datasets_without_metadata_give_an_empty_dict(solid_lmdb, solid_wds, tmp_path):
    assert fastdata.dataset(solid_lmdb, metadata=True)[0][2] == {}
    assert next(iter(fastdata.dataset(solid_wds, metadata=True)))[2] == {}


def test_labels_that_do_not_fit_the_listing_are_refused(tree, tmp_path):
    images = tree.images[:2]
    with pytest.raises(SourceError, match="not a tuple of class ids"):
        ImageSource("zip", tmp_path, ["a", "b"], [(images[0], (0,)), (images[1], 1)], label_kind="multi")
    with pytest.raises(SourceError, match=r"not a class id in 0\.\.1"):
        ImageSource("zip", tmp_path, ["a", "b"], [(images[0], 0), (images[1], 2)])
    with pytest.raises(SourceError, match=r"not a tuple of class ids in 0\.\.1"):
        ImageSource("zip", tmp_path, ["a", "b"], [(images[0], (0, 5))], label_kind="multi")


@pytest.mark.parametrize("rows", ["metadata", "captions", "caption_tokens"])
def test_per_sample_rows_that_do_not_match_the_samples_are_refused(tree, tmp_path, rows):
    samples = [(key, 0) for key in tree.images[:3]]
    with pytest.raises(SourceError, match=r"zip source: 2 .*rows for 3 samples"):
        ImageSource("zip", tmp_path, ["a"], samples, **{rows: [{}, {}] if rows == "metadata" else ["x", "y"]})


# --------------------------------------------------------------------------------------------------- resuming

# A zip-source conversion in a child process that SIGKILLs itself before record `at` is added.
KILLER = KILL_WHEN + textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from builders.images import Tree
    from builders.sources import zip_source
    from fastdata.convert.images import convert_images
    from fastdata.convert.options import ImageConversionOptions
    from fastdata.formats import lmdb as L, wds as W

    root, images, archive, out, fmt, at = sys.argv[2:8]
    kill_when(L.LmdbWriter if fmt == "lmdb" else W.WdsWriter, "add", lambda self: self.count == int(at))
    tree = Tree(Path(root), json.loads(images))
    listing = zip_source(tree, Path(archive), multi=True, metadata=True)
    convert_images(lambda: listing, out, ImageConversionOptions(format=fmt, shard_size="6KB", workers=1, commit_every=4,
                                                                progress=False))
""")


def killed(tree, archive: Path, out: Path, fmt: str, at: int) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLER, str(TESTS), str(tree.root), json.dumps(tree.images),
                           str(archive), str(out), fmt, str(at)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_an_interrupted_conversion_resumes_over_the_same_source_only(tree, tmp_path, fmt):
    archive = write_zip(tree, tmp_path / "images.zip")

    def listing(**changes):
        found = zip_source(tree, archive, multi=True, metadata=True)
        for name, value in changes.items():
            setattr(found, name, value)
        return found

    reference = tmp_path / f"reference.{fmt}"
    convert(listing(), reference, fmt, commit_every=4)
    out = tmp_path / f"out.{fmt}"
    killed(tree, archive, out, fmt, at=13)

    changed_label = listing()
    changed_label.samples = [(changed_label.samples[0][0], (2,)), *changed_label.samples[1:]]
    changed_metadata = listing()
    changed_metadata.metadata = [{**changed_metadata.metadata[0], "note": "changed"}, *changed_metadata.metadata[1:]]
    for other in (changed_label, changed_metadata):
        with pytest.raises(OutputExistsError, match="source files changed"):
            convert(other, out, fmt, commit_every=4)
    stat = archive.stat()
    os.utime(archive, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the bytes behind the listing may differ
    with pytest.raises(OutputExistsError, match="source files changed"):
        convert(listing(), out, fmt, commit_every=4)
    os.utime(archive, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    summary = convert(listing(), out, fmt, commit_every=4)
    assert summary.resumed_at, "a checkpoint was passed before the kill"
    assert stored(out) == stored(reference)
    assert fastdata.info(out).class_counts == fastdata.info(reference).class_counts
    with_metadata = fastdata.dataset(out, metadata=True)
    if fmt == "lmdb":
        assert [with_metadata.metadata(i) for i in range(COUNT)] == \
            [solid_metadata(solid_id_of_path(with_metadata.reader.key(i))) for i in range(COUNT)]
    else:
        assert [(f.name, f.sha256) for f in fastdata.info(out).files] == \
            [(f.name, f.sha256) for f in fastdata.info(reference).files]
