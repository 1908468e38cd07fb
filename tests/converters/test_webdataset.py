"""`fastdata convert webdataset`: shards written by the `webdataset` library (ShardWriter) converted to LMDB and to
new WebDataset shards, checked sample by sample against the shards as webdataset itself reads them (stored bytes,
keys, order, labels, metadata); labels from .cls, .json fields (names, multi-label lists) or none; bad sources refused
in one line with exit code 2 and nothing written; resumable; verified against the source."""

from __future__ import annotations

import gc
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
import torch
from builders.images import SOLID_CLASSES, build_solid_tree, sample_id_of, solid_id_of_path, solid_label
from builders.runs import KILL_WHEN, assert_one_line_error, cli
from builders.sources import multi_hot, multi_labels
from builders.webdataset import WDS_NAMES, wds_key, wds_sample, webdataset_reading, write_wds_shards
from fastdata.converters.webdataset import scan

import fastdata
from fastdata.convert.source_files.tar_samples import TarMemberReader
from fastdata.errors import OutputExistsError
from fastdata.tools.verify import verify

COUNT = 20  # shards of 6: 6, 6, 6, 2
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_solid_tree(tmp_path_factory.mktemp("wds_src") / "src", count=COUNT)


@pytest.fixture(scope="module")
def cls_shards(tree, tmp_path_factory) -> list[Path]:
    """Shards labelled by .cls, with .json metadata and .txt captions."""
    return write_wds_shards(tmp_path_factory.mktemp("cls") / "shards", [wds_sample(tree, r) for r in tree.images])


def shards_of(tree, directory: Path, labels: str | None, **options) -> list[Path]:
    return write_wds_shards(directory, [wds_sample(tree, r, labels, **options) for r in tree.images])


def convert(src, out: Path, **options):
    return fastdata.convert_webdataset(
        src, out, fastdata.WebDatasetOptions(progress=False, **{"workers": 1, **options})
    )


def image_ext(sample: dict) -> str:
    return next(ext for ext in ("jpg", "png") if ext in sample)


def expected_metadata(sample: dict, label_field: str | None = None) -> dict:
    """What the conversion keeps of a webdataset sample as metadata: its .json fields but the label (lists kept as
    lists, as every source keeps them; objects as their JSON text) and its .txt as "caption"."""
    meta = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in json.loads(sample["json"]).items()
            if k != label_field}
    return {**meta, "caption": sample["txt"].decode()}


def lmdb_samples(out: Path) -> list[tuple]:
    """(key, label, stored bytes, metadata) of every sample of an LMDB dataset, in stored order."""
    ds = fastdata.dataset(out, metadata=True)
    return [(ds.reader.key(i), ds.reader.label(i), ds.reader.read(i), ds.metadata(i)) for i in range(len(ds))]


# ------------------------------------------------------------------------------------------- what is converted


def test_lmdb_holds_the_samples_webdataset_reads_in_their_order(cls_shards, tmp_path):
    out = tmp_path / "out.lmdb"
    summary = convert(cls_shards[0].parent, out, workers=2)

    reference = webdataset_reading(cls_shards)
    assert len(reference) == COUNT and len(cls_shards) == 4
    assert lmdb_samples(out) == [(f"{s['__key__']}.{image_ext(s)}", int(s["cls"]), s[image_ext(s)],
                                  expected_metadata(s)) for s in reference]
    manifest = fastdata.info(out)
    assert manifest.classes == ["0", "1", "2"] and manifest.label_kind == "single"
    assert manifest.class_counts == [sum(solid_label(i) == c for i in range(COUNT)) for c in range(3)]
    assert manifest.metadata_fields == ["id", "url", "score", "tags", "nothing", "caption"]
    assert manifest.source["kind"] == "webdataset" and manifest.source["shards"] == 4
    assert summary.images == COUNT and summary.rejected == [] and summary.ignored == 0
    assert verify(out, source=cls_shards[0].parent, decode=True).ok


def test_wds_output_keeps_keys_bytes_and_labels_and_is_hashed(cls_shards, tmp_path):
    out = tmp_path / "out-wds"
    convert(cls_shards[0].parent, out, format="wds", shard_size="8KB", seed=1)

    source = {s["__key__"]: s for s in webdataset_reading(cls_shards)}
    written = webdataset_reading(sorted(out.glob("*.tar")))
    assert sorted(s["__key__"] for s in written) == sorted(source)
    for sample in written:
        original = source[sample["__key__"]]
        ext = image_ext(original)
        assert sample[ext] == original[ext] and sample["cls"] == original["cls"]
        assert json.loads(sample["json"])["metadata"] == expected_metadata(original)
    assert [s["__key__"] for s in written] != list(source)  # spread over the shards by --seed
    manifest = fastdata.info(out)
    assert len(manifest.files) > 1 and all(len(f.sha256) == 64 for f in manifest.files)
    report = verify(out, source=cls_shards[0].parent, decode=True)
    assert report.ok, str(report)


def test_class_names_from_a_json_field_are_sorted(tree, tmp_path, capsys):
    shards = shards_of(tree, tmp_path / "shards", "name", caption=False)
    code, _, err = cli(capsys, "convert", "webdataset", tmp_path / "shards", tmp_path / "out.lmdb",
                       "--label-key", "label", "--workers", "1", "-q")
    assert code == 0, err

    ds = fastdata.dataset(tmp_path / "out.lmdb", metadata=True)
    assert ds.classes == sorted(WDS_NAMES) == ["xerus", "yak", "zebra"]
    reference = webdataset_reading(shards)
    names = [json.loads(s["json"])["label"] for s in reference]
    assert ds.targets == [ds.classes.index(name) for name in names]
    assert [ds.metadata(i) for i in range(len(ds))] == \
        [{k: v for k, v in expected_metadata({**s, "txt": b""}, "label").items() if k != "caption"} for s in reference]
    assert fastdata.info(tmp_path / "out.lmdb").source["labels_from"] == "json"
    assert verify(tmp_path / "out.lmdb", source=tmp_path / "shards").ok


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_json_label_lists_make_a_multi_label_dataset(tree, tmp_path, fmt):
    shards = shards_of(tree, tmp_path / "shards", "multi")
    out = tmp_path / f"out.{fmt}"
    convert(shards[0].parent, out, format=fmt, label_key="label", shard_size="8KB")

    manifest = fastdata.info(out)
    assert manifest.label_kind == "multi" and manifest.classes == sorted(WDS_NAMES)
    ids_of = {solid_id_of_path(r): tuple(sorted(manifest.classes.index(WDS_NAMES[c]) for c in multi_labels(
        solid_id_of_path(r)))) for r in tree.images}
    assert any(len(ids) > 1 for ids in ids_of.values()) and () in ids_of.values()
    if fmt == "lmdb":
        assert [label for _, label, _, _ in lmdb_samples(out)] == \
            [tuple(sorted(manifest.classes.index(n) for n in json.loads(s["json"])["label"]))
             for s in webdataset_reading(shards)]
    loader = fastdata.loader(out, batch_size=4, augment="val", image_size=16, num_workers=2, seed=0)
    seen = []
    for images, labels in loader:
        assert labels.dtype == torch.float32 and labels.shape[1] == 3
        ids = [sample_id_of(image) for image in images]
        assert labels.tolist() == [multi_hot(ids_of[i]) for i in ids]
        seen += ids
    assert sorted(seen) == list(range(COUNT))


def test_json_lists_of_class_ids_and_class_names_in_members(tree, cls_shards, tmp_path):
    samples = [wds_sample(tree, r, None) for r in tree.images]
    for sample in samples:
        sample["json"]["label"] = list(multi_labels(sample["json"]["id"]))
    listing = scan(write_wds_shards(tmp_path / "shards", samples)[0].parent, label_key="label")
    assert listing.label_kind == "multi" and listing.classes == ["0", "1", "2"]
    assert listing.samples == [(f"{s['__key__']}.{image_ext(s)}", multi_labels(s["json"]["id"])) for s in samples]

    by_caption = scan(cls_shards[0].parent, label_key="txt")  # a member of names: the .txt is the label here
    reference = webdataset_reading(cls_shards)
    assert by_caption.classes == sorted(s["txt"].decode() for s in reference)
    assert [by_caption.classes[label] for _, label in by_caption.samples] == [s["txt"].decode() for s in reference]
    assert "caption" not in by_caption.metadata_fields()
    assert len(by_caption.ignored) == COUNT and by_caption.ignored[0].endswith(".cls")  # unused: counted


def test_loader_with_workers_over_a_converted_source(cls_shards, tmp_path):
    out = tmp_path / "out.lmdb"
    convert(cls_shards[0].parent, out)
    loader = fastdata.loader(out, batch_size=6, augment="train", image_size=16, num_workers=2, seed=3)
    pairs = [(sample_id_of(image), int(label)) for images, labels in loader
             for image, label in zip(images, labels, strict=True)]
    assert sorted(pairs) == [(i, solid_label(i)) for i in range(COUNT)]


def test_no_labels_converts_into_one_class(tree, tmp_path, capsys):
    shards_of(tree, tmp_path / "shards", None)
    code, _, err = cli(capsys, "convert", "webdataset", tmp_path / "shards", tmp_path / "out.lmdb", "--workers", "1",
                       "-q")
    assert code == 2
    assert_one_line_error(err, "no sample has a .cls member", "--no-labels")
    assert not (tmp_path / "out.lmdb").exists()

    convert(tmp_path / "shards", tmp_path / "out.lmdb", no_labels=True)
    ds = fastdata.dataset(tmp_path / "out.lmdb")
    assert ds.classes == ["unlabelled"] and ds.targets == [0] * COUNT
    assert fastdata.info(tmp_path / "out.lmdb").source["labels_from"] == "none"
    assert verify(tmp_path / "out.lmdb", source=tmp_path / "shards").ok


def test_num_classes_names_every_class_and_lists_the_empty_ones(cls_shards, tmp_path):
    summary = convert(cls_shards[0].parent, tmp_path / "out.lmdb", num_classes=5)
    manifest = fastdata.info(tmp_path / "out.lmdb")
    assert manifest.classes == ["0", "1", "2", "3", "4"] and manifest.class_counts[3:] == [0, 0]
    assert summary.empty_classes == ["3", "4"] and "classes with no images: 3, 4" in str(summary)


def test_grouping_follows_webdataset(tree, tmp_path):
    """Keys in folders, upper-case extensions, meta members, extra and second-choice members: the samples are the
    ones webdataset reads, the skipped members are counted, and --image-ext picks the image."""
    png, jpg = tree.images[0], tree.images[1]
    shard = tmp_path / "shards" / "one.tar"
    shard.parent.mkdir()
    members = [("__meta__", b"{}"), ("__meta__/info.json", b"{}"), ("train/a.JPG", tree.path(jpg).read_bytes()),
               ("train/a.cls", b"1"), ("train/a.npy", _npy()), ("b.png", tree.path(png).read_bytes()),
               ("b.jpg", tree.path(jpg).read_bytes()), ("b.cls", b"0"), ("README", b"not a sample")]
    _write_tar(shard, members)
    listing = scan(shard, image_ext="png,jpg")
    assert [s["__key__"] for s in webdataset_reading([shard])] == ["train/a", "b"]
    assert listing.samples == [("train/a.JPG", 1), ("b.png", 0)]
    assert sorted(listing.ignored) == ["one.tar!README", "one.tar!__meta__", "one.tar!__meta__/info.json",
                                       "one.tar!b.jpg", "one.tar!train/a.npy"]
    assert scan(shard, image_ext="jpg").samples == [("train/a.JPG", 1), ("b.jpg", 0)]
    summary = convert(shard, tmp_path / "out-wds", format="wds", image_ext="jpg,png")
    assert summary.ignored == 5
    assert sorted(s["__key__"] for s in webdataset_reading(sorted((tmp_path / "out-wds").glob("*.tar")))) == \
        ["b", "train/a"]


def test_brace_patterns_and_single_shards(cls_shards, tmp_path):
    pattern = str(cls_shards[0].parent / "part-{000001..000002}.tar")
    convert(pattern, tmp_path / "two.lmdb")
    reference = webdataset_reading(cls_shards[1:3])
    assert [key for key, *_ in lmdb_samples(tmp_path / "two.lmdb")] == \
        [f"{s['__key__']}.{image_ext(s)}" for s in reference]
    convert(cls_shards[3], tmp_path / "one.lmdb")
    assert len(fastdata.dataset(tmp_path / "one.lmdb")) == 2


def test_undecodable_images_are_rejected_with_their_shard(tree, tmp_path, capsys):
    samples = [wds_sample(tree, r) for r in tree.images]
    broken = samples[8]
    broken[image_ext(broken)] = b"not an image"
    write_wds_shards(tmp_path / "shards", samples)
    member = f"{broken['__key__']}.{image_ext(broken)}"
    summary = convert(tmp_path / "shards", tmp_path / "out.lmdb")
    assert summary.images == COUNT - 1
    assert [(r["shard"], r["path"]) for r in summary.rejected] == [("part-000001.tar", member)]
    assert f"part-000001.tar!{member}: not a decodable image" in str(summary)
    code, _, err = cli(capsys, "convert", "webdataset", tmp_path / "shards", tmp_path / "strict.lmdb", "--strict",
                       "--workers", "1", "-q")
    assert code == 1
    assert_one_line_error(err, f"part-000001.tar!{member}: not a decodable image")


def test_the_reader_reads_by_offset_after_pickling_with_few_open_shards(cls_shards):
    import contextlib
    import pickle

    listing = scan(cls_shards[0].parent)
    keys = [key for key, _ in listing.samples]
    reader = listing.sample_reader
    assert isinstance(reader, TarMemberReader)
    reader.read(keys[0])
    copy = pickle.loads(pickle.dumps(reader))  # how a conversion worker gets it: without the parent's handles
    del listing, reader  # closes the parent's handles, whose numbers the next files opened may take
    gc.collect()
    copy.open_shards = 2
    expected = {f"{s['__key__']}.{image_ext(s)}": s[image_ext(s)] for s in webdataset_reading(cls_shards)}
    with contextlib.ExitStack() as others:
        for _ in range(4):
            others.enter_context(open(__file__, "rb"))
        for key in keys + keys[::-1] + keys[::3]:  # from the parent's first shard on, across the 4, back and forth
            assert copy.read(key) == expected[key]
    assert len(copy._fds) == 2


def test_info_and_verify_from_the_command_line(cls_shards, tmp_path, capsys):
    convert(cls_shards[0].parent, tmp_path / "out.lmdb")
    code, out, _ = cli(capsys, "info", tmp_path / "out.lmdb")
    assert code == 0 and f"source      {cls_shards[0].parent} (webdataset, 0 non-image files ignored)" in out
    code, out, err = cli(capsys, "verify", tmp_path / "out.lmdb", "--source", cls_shards[0].parent)
    assert code == 0, out + err


# ------------------------------------------------------------------------------------------------- bad input


def _write_tar(path: Path, members: list, kind: bytes = tarfile.REGTYPE, mode: str = "w") -> Path:
    """`members` ((name, bytes) or (name, bytes, tar type, link target)) as the tar `path`."""
    with tarfile.open(path, mode) as tar:
        for name, data, *link in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if link:
                info.type, info.linkname, info.size = link[0], link[1], 0
            tar.addfile(info, io.BytesIO(data) if not link else None)
    return path


def _npy() -> bytes:
    import numpy as np

    out = io.BytesIO()
    np.save(out, np.arange(3))
    return out.getvalue()


def _cut(shard: Path, at: int) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[:at])


def _members(shard: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(shard) as tar:
        return tar.getmembers()


def truncated_inside_a_member(tree, src: Path):
    shards = shards_of(tree, src, "cls")
    member = max(_members(shards[1]), key=lambda m: m.size)  # an image
    _cut(shards[1], member.offset_data + member.size // 2)
    return src, ["part-000001.tar: truncated shard", f"member {member.name!r}", "ends at byte"]


def truncated_between_members(tree, src: Path):
    shards = shards_of(tree, src, "cls")
    member = _members(shards[2])[7]
    _cut(shards[2], member.offset_data + -(-member.size // 512) * 512)
    return src, ["part-000002.tar: truncated shard", f"after member {member.name!r}", "end-of-archive marker"]


def damaged_header(tree, src: Path):
    shards = shards_of(tree, src, "cls")
    member = _members(shards[0])[3]
    data = bytearray(shards[0].read_bytes())
    data[member.offset:member.offset + 512] = b"x" * 512
    shards[0].write_bytes(bytes(data))
    return src, ["part-000000.tar: truncated or damaged shard: no valid tar header", f"byte {member.offset:,}"]


def pickle_member(tree, src: Path):
    samples = [wds_sample(tree, r) for r in tree.images]
    samples[13]["pyd"] = {"what": "a pickle"}
    write_wds_shards(src, samples)
    return src, ["part-000002.tar", f"member '{wds_key(13)}.pyd'", "pickle"]


def object_npy_member(tree, src: Path):
    import numpy as np

    out = io.BytesIO()
    np.save(out, np.array([{"a": 1}], dtype=object))
    src.mkdir()
    _write_tar(src / "one.tar", [("x.png", tree.path(tree.images[0]).read_bytes()), ("x.cls", b"0"),
                                 ("x.npy", out.getvalue())])
    return src, ["one.tar", "member 'x.npy'", "object-dtype .npy"]


def symlink_member(tree, src: Path):
    src.mkdir()
    _write_tar(src / "one.tar", [("x.png", tree.path(tree.images[0]).read_bytes()), ("x.cls", b"0"),
                                 ("y.png", b"", tarfile.SYMTYPE, "/etc/passwd")])
    return src, ["one.tar", "member 'y.png'", "symbolic link"]


def unsafe_name(tree, src: Path):
    src.mkdir()
    _write_tar(src / "one.tar", [("../x.png", tree.path(tree.images[0]).read_bytes()), ("../x.cls", b"0")])
    return src, ["one.tar", "member '../x.png'", "unsafe path"]


def pattern_matching_nothing(tree, src: Path):
    return str(src / "nothing-{000..003}.tar"), ["nothing-{000..003}.tar", "matches no files"]


def sample_without_image(tree, src: Path):
    samples = [wds_sample(tree, r) for r in tree.images]
    del samples[7][image_ext(samples[7])]
    write_wds_shards(src, samples)
    return src, ["1 sample(s) have no image member", f"part-000001.tar!{wds_key(7)} (has cls, json, txt)"]


def duplicate_keys(tree, src: Path):
    samples = [wds_sample(tree, r) for r in tree.images]
    samples[15]["__key__"] = samples[2]["__key__"]
    write_wds_shards(src, samples)
    return src, ["1 duplicate sample key(s)", f"{wds_key(2)!r} in part-000000.tar and part-000002.tar"]


def compressed_shards(tree, src: Path):
    import webdataset as wds

    src.mkdir()
    with wds.TarWriter(str(src / "part-000000.tar.gz"), compress=True) as sink:
        sink.write(wds_sample(tree, tree.images[0]))
    return src, ["part-000000.tar.gz: compressed shard", "decompress"]


def gzip_content_named_tar(tree, src: Path):
    import webdataset as wds

    src.mkdir()
    with wds.TarWriter(str(src / "part-000000.tar"), compress=True) as sink:
        sink.write(wds_sample(tree, tree.images[0]))
    return src, ["part-000000.tar: gzip-compressed shard", "decompress"]


def a_missing_label(tree, src: Path):
    samples = [wds_sample(tree, r) for r in tree.images]
    del samples[11]["cls"]
    write_wds_shards(src, samples)
    return src, ["1 sample(s) have no label", f"part-000001.tar!{wds_key(11)}"]


def mixed_label_types(tree, src: Path):
    samples = [wds_sample(tree, r, "name") for r in tree.images]
    json_of = samples[5]["json"]
    json_of["label"] = 2
    write_wds_shards(src, samples)
    return src, ["labels mix class ids and class names", f"part-000000.tar!{wds_key(5)} has 2"]


def unreadable_json(tree, src: Path):
    samples = [wds_sample(tree, r) for r in tree.images]
    samples[4]["json"] = b'{"id": 4,'
    write_wds_shards(src, samples)
    return src, [f"part-000000.tar!{wds_key(4)}: unreadable .json"]


def caption_not_utf8(tree, src: Path):
    samples = [wds_sample(tree, r) for r in tree.images]
    samples[19]["txt"] = "é".encode("latin-1")
    write_wds_shards(src, samples)
    return src, [f"part-000003.tar!{wds_key(19)}: its .txt caption is not UTF-8 text"]


def a_shard_the_pattern_names_is_missing(tree, src: Path):
    shards = shards_of(tree, src, "cls")
    shards[2].unlink()
    return str(src / "part-{000000..000003}.tar"), ["1 of the 4 shards it names do not exist", "part-000002.tar"]


def two_images_of_one_extension(tree, src: Path):
    src.mkdir()
    data = tree.path(tree.images[0]).read_bytes()
    _write_tar(src / "one.tar", [("x.png", data), ("x.PNG", data), ("x.cls", b"0")])
    return src, ["one.tar: sample 'x' has two .png members ('x.png' and 'x.PNG')"]


BAD_SOURCES = [truncated_inside_a_member, truncated_between_members, damaged_header, pickle_member,
               object_npy_member, symlink_member, unsafe_name, pattern_matching_nothing, sample_without_image,
               duplicate_keys, compressed_shards, gzip_content_named_tar, a_missing_label, mixed_label_types,
               unreadable_json, caption_not_utf8, a_shard_the_pattern_names_is_missing, two_images_of_one_extension]


@pytest.mark.parametrize("make", BAD_SOURCES, ids=[f.__name__ for f in BAD_SOURCES])
def test_bad_sources_are_refused_in_one_line_and_nothing_is_written(make, tree, tmp_path, capsys):
    src, needles = make(tree, tmp_path / "src")
    label = ["--label-key", "label"] if make is mixed_label_types else []
    code, _, err = cli(capsys, "convert", "webdataset", src, tmp_path / "out.lmdb", "--workers", "2", "-q", *label)
    assert code == 2
    assert_one_line_error(err, *needles)
    assert not (tmp_path / "out.lmdb").exists() and not (tmp_path / "out.lmdb.partial").exists()


def test_options_that_cannot_work_are_refused(cls_shards, tmp_path, capsys):
    src = cls_shards[0].parent
    for args, needle in ((["--no-labels", "--label-key", "label"], "--no-labels takes neither"),
                         (["--image-ext", "gif"], "--image-ext: gif"),
                         (["--num-classes", "2"], "class id 2 is not below --num-classes 2"),
                         (["--label-key", "jpg"], "--label-key jpg")):
        code, _, err = cli(capsys, "convert", "webdataset", src, tmp_path / "out.lmdb", "-q", *args)
        assert code == 2, args
        assert_one_line_error(err, needle)
    assert not (tmp_path / "out.lmdb").exists()


# --------------------------------------------------------------------------------------------------- resuming

# A conversion of WebDataset shards in a child process that SIGKILLs itself before record `at` is added.
KILLER = KILL_WHEN + textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.formats import lmdb as L, wds as W

    src, out, fmt, at = sys.argv[1:5]
    kill_when(L.LmdbWriter if fmt == "lmdb" else W.WdsWriter, "add", lambda self: self.count == int(at))
    fastdata.convert_webdataset(src, out, fastdata.WebDatasetOptions(format=fmt, shard_size="6KB", workers=1,
                                                                     commit_every=4, progress=False))
""")


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_an_interrupted_conversion_resumes_over_the_same_shards_only(tree, tmp_path, fmt):
    shards = shards_of(tree, tmp_path / "shards", "cls")
    src = tmp_path / "shards"
    reference = tmp_path / f"reference.{fmt}"
    convert(src, reference, format=fmt, shard_size="6KB", commit_every=4)
    out = tmp_path / f"out.{fmt}"
    proc = subprocess.run([sys.executable, "-c", KILLER, str(src), str(out), fmt, "13"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr

    stat = shards[2].stat()
    os.utime(shards[2], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # its bytes may have changed
    with pytest.raises(OutputExistsError, match="source files changed"):
        convert(src, out, format=fmt, shard_size="6KB", commit_every=4)
    os.utime(shards[2], ns=(stat.st_atime_ns, stat.st_mtime_ns))

    summary = convert(src, out, format=fmt, shard_size="6KB", commit_every=4)
    assert summary.resumed_at, "a checkpoint was passed before the kill"
    if fmt == "lmdb":
        assert lmdb_samples(out) == lmdb_samples(reference)
    else:
        assert [(f.name, f.sha256) for f in fastdata.info(out).files] == \
            [(f.name, f.sha256) for f in fastdata.info(reference).files]
    assert fastdata.info(out).class_counts == fastdata.info(reference).class_counts == \
        [sum(solid_label(i) == c for i in range(COUNT)) for c in range(len(SOLID_CLASSES))]
