"""`fastdata convert hf`: Hugging Face datasets (save_to_disk folders, Parquet / Arrow files, the Hub cache) ->
LMDB / WebDataset, each sample checked against what the `datasets` library itself reads from the source: stored
bytes, pixels, labels, metadata, order; multi-label, rejected rows, bad input, resume, Ray, verify; and the text
converter over a saved text dataset."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from builders.hf import HF_CLASSES, HF_METADATA, HUB_NAME, hf_dataset, hf_row_ids
from builders.images import sample_id_of, solid_label, truncated_jpeg
from builders.runs import KILL_WHEN, assert_one_line_error, cli
from builders.sources import multi_hot, multi_labels
from builders.text import UNICODE, make_corpus, reference_ids, train_bytelevel
from fastdata.converters import hf as hf_converter
from PIL import Image

import fastdata
from fastdata.errors import OutputExistsError, RejectedFileError, SourceError
from fastdata.tools.verify import verify

TESTS = Path(__file__).resolve().parents[1]
COUNT = 24  # rows of the HF sources (conftest's hf_tree)
NOT_KEPT: list[str] = []  # every column is a JSON scalar or a list of them (tags: a list of class ids)


def source_of(sources, kind: str) -> tuple[str, dict]:
    """(SRC, options) of one kind of source; each holds all COUNT rows in its split."""
    return {"saved": (str(sources.saved), {}),
            "dict": (str(sources.saved_dict), {"split": "test"}),
            "parquet": (str(sources.parquet), {}),
            "hub": (HUB_NAME, {"cache_dir": str(sources.cache)})}[kind]


def datasets_view(sources, kind: str, monkeypatch):
    """The split as the `datasets` library reads it (the reference), with its images not decoded."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    src, options = source_of(sources, kind)
    if kind in ("saved", "dict"):
        ds = datasets.load_from_disk(src)
        ds = ds[options["split"]] if "split" in options else ds
    elif kind == "parquet":
        ds = datasets.load_dataset(src, split="train", cache_dir=str(sources.parquet.parent / "reference-cache"))
    else:
        ds = datasets.load_dataset(src, split="train", cache_dir=options["cache_dir"])
    return ds.cast_column("image", datasets.Image(decode=False))


def convert(src, out: Path, fmt: str = "lmdb", **options):
    return fastdata.convert_hf(
        src, out, fastdata.HfOptions(format=fmt, shard_size="6KB", progress=False, **{"workers": 1, **options})
    )


def stored(out: Path) -> list[tuple]:
    """(key, label, stored bytes, metadata) of every sample, in stored order."""
    ds = fastdata.dataset(out)
    if fastdata.info(out).format == "lmdb":
        return [(ds.reader.key(i), ds.reader.label(i), bytes(ds.reader.read(i)), ds.reader.metadata(i))
                for i in range(len(ds))]
    return [(s.key, s.label, bytes(s.data), s.metadata) for s in ds.encoded_samples(list(range(len(ds.shards))))]


def rgb(data: bytes) -> np.ndarray:
    import io

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


# ------------------------------------------------------------------------------------ sample by sample


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize("kind", ["saved", "dict", "parquet", "hub"])
def test_each_row_is_stored_as_datasets_reads_it(hf_sources, kind, fmt, tmp_path, monkeypatch):
    src, options = source_of(hf_sources, kind)
    out = tmp_path / f"out.{fmt}"
    summary = convert(src, out, fmt, **options)
    reference = datasets_view(hf_sources, kind, monkeypatch)
    split = options.get("split", "train")
    assert summary.images == len(reference) == COUNT and summary.rejected == []

    expected = [(f"{split}/{row:05d}", item["label"], item["image"]["bytes"], {n: item[n] for n in HF_METADATA})
                for row, item in enumerate(reference)]
    got = stored(out)
    assert (got if fmt == "lmdb" else sorted(got)) == (expected if fmt == "lmdb" else sorted(expected))
    manifest = fastdata.info(out)
    assert manifest.classes == list(HF_CLASSES)  # the ClassLabel's order, not sorted
    assert manifest.class_counts == [sum(item["label"] == c for item in reference) for c in range(3)]
    assert manifest.label_kind == "single" and manifest.metadata_fields == HF_METADATA
    assert manifest.source["kind"] == "hf" and manifest.source["split"] == split
    assert manifest.source["columns_not_kept"] == NOT_KEPT
    if fmt == "lmdb":  # the pixels the loader decodes are those of the source's image
        ds = fastdata.dataset(out)
        for row, item in enumerate(reference):
            image, label = ds[row]
            source = rgb(item["image"]["bytes"])
            diff = np.abs(image.numpy().transpose(1, 2, 0).astype(int) - source.astype(int)).max()
            assert diff <= (1 if item["image"]["bytes"][:2] == b"\xff\xd8" else 0), row
            assert label == item["label"] and sample_id_of(image) == hf_row_ids(COUNT)[row]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_sequence_of_class_labels_makes_a_multi_label_dataset(hf_sources, fmt, tmp_path, monkeypatch):
    out = tmp_path / f"multi.{fmt}"
    convert(hf_sources.saved, out, fmt, label_column="tags")
    reference = datasets_view(hf_sources, "saved", monkeypatch)

    manifest = fastdata.info(out)
    assert manifest.label_kind == "multi" and manifest.classes == list(HF_CLASSES)
    others = [n for n in HF_METADATA if n != "tags"]
    assert manifest.metadata_fields == ["label", *others]  # the single-label column is now metadata
    sets = [tuple(sorted(set(item["tags"]))) for item in reference]
    assert sets == [multi_labels(i) for i in hf_row_ids(COUNT)] and () in sets
    expected = [(f"train/{row:05d}", ids, item["image"]["bytes"], {"label": item["label"]} | {
        n: item[n] for n in others}) for row, (ids, item) in enumerate(zip(sets, reference, strict=True))]
    got = stored(out)
    assert (got if fmt == "lmdb" else sorted(got)) == (expected if fmt == "lmdb" else sorted(expected))
    if fmt == "lmdb":
        _image, label = fastdata.dataset(out)[5]
        assert label.dtype == torch.float32 and label.tolist() == multi_hot(sets[5])
    assert verify(out, source=hf_sources.saved, decode=True).ok


def test_integer_and_string_label_columns(hf_tree, tmp_path):
    """An integer column keeps its ids (classes "0".."C-1"); a string column's classes are its sorted values."""
    ds = hf_dataset(hf_tree)
    digits = [(i % 3) * 2 for i in range(COUNT)]  # 0, 2, 4: classes 1 and 3 exist, empty
    words = [("pear", "apple", "fig")[i % 3] for i in range(COUNT)]
    ds.remove_columns("label").add_column("digit", digits).add_column("word", words).to_parquet(
        str(tmp_path / "labels.parquet"))

    out = tmp_path / "digits.lmdb"
    summary = convert(tmp_path / "labels.parquet", out, label_column="digit")
    assert fastdata.info(out).classes == ["0", "1", "2", "3", "4"]
    assert summary.empty_classes == ["1", "3"]
    assert [label for _, label, _, _ in stored(out)] == digits
    # the same rows as an Arrow IPC *file* (feather), the other Arrow layout, its Image column now a plain struct
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    feather.write_feather(pq.read_table(tmp_path / "labels.parquet").replace_schema_metadata(None),
                          str(tmp_path / "labels.arrow"))
    for src in (tmp_path / "labels.parquet", tmp_path / "labels.arrow"):
        listing = hf_converter.scan(src, label_column="word")
        assert listing.classes == ["apple", "fig", "pear"]
        assert [listing.classes[label] for _, label in listing.samples] == words
        assert listing.metadata[0] == {"digit": 0, **{n: listing.metadata[0][n] for n in HF_METADATA}}
        assert [listing.sample_reader.read(key) for key, _ in listing.samples] == \
            [data for _, _, data, _ in stored(out)]


def test_images_stored_only_as_paths_are_read_from_their_files(hf_tree, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.chdir(hf_tree.root)  # relative paths are taken from the working directory, as datasets takes them
    hf_dataset(hf_tree, paths=True).to_parquet(str(tmp_path / "paths.parquet"))
    cells = pq.read_table(tmp_path / "paths.parquet").column("image").to_pylist()
    assert all(cell["bytes"] is None and not Path(cell["path"]).is_absolute() for cell in cells)
    convert(tmp_path / "paths.parquet", tmp_path / "out.lmdb")
    monkeypatch.chdir(tmp_path)
    assert [data for _, _, data, _ in stored(tmp_path / "out.lmdb")] == \
        [(hf_tree.root / cell["path"]).read_bytes() for cell in cells]


def test_the_reader_pickles_without_its_open_tables(hf_sources):
    """Pickled once into each conversion worker: it carries where the files are, not their open memory maps or
    cached row groups, and reads the same bytes after the trip."""
    for src in (hf_sources.saved, hf_sources.parquet):
        listing = hf_converter.scan(src)
        reader = listing.sample_reader
        key = listing.samples[-1][0]
        data = reader.read(key)
        assert reader._arrow or reader._groups  # the file it read is open, or its row group cached
        copy = pickle.loads(pickle.dumps(reader))
        assert not copy._arrow and not copy._groups and len(pickle.dumps(reader)) < 4000
        assert copy.read(key) == data


# ------------------------------------------------------------------------------------ rejected rows


def broken_dataset(hf_tree, root: Path) -> Path:
    from builders.images import pattern

    broken = {3: b"not an image at all", 7: truncated_jpeg(pattern(7, 41, 33)), 11: None}
    hf_dataset(hf_tree, broken=broken).save_to_disk(str(root / "broken"), num_shards=2)
    return root / "broken"


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_rows_whose_image_does_not_decode_are_rejected_by_split_and_row(hf_tree, tmp_path, fmt):
    src = broken_dataset(hf_tree, tmp_path)
    summary = convert(src, tmp_path / f"out.{fmt}", fmt, workers=2)
    assert [(r["path"], r["split"], r["row"]) for r in sorted(summary.rejected, key=lambda r: r["row"])] == \
        [("train/00003", "train", 3), ("train/00007", "train", 7), ("train/00011", "train", 11)]
    reasons = {r["row"]: r["reason"] for r in summary.rejected}
    assert reasons[3].startswith("not a decodable image") and reasons[7].startswith("not a decodable image")
    assert reasons[11] == "unreadable (the row's image is null)"
    assert summary.images == COUNT - 3
    assert sorted(key for key, *_ in stored(tmp_path / f"out.{fmt}")) == \
        [f"train/{row:05d}" for row in range(COUNT) if row not in (3, 7, 11)]
    assert fastdata.info(tmp_path / f"out.{fmt}").rejected == summary.rejected
    assert "train/00011: unreadable (the row's image is null)" in str(summary)


def test_strict_names_the_file_and_row_and_writes_nothing(hf_tree, tmp_path, capsys):
    src = broken_dataset(hf_tree, tmp_path)
    with pytest.raises(RejectedFileError, match=r"data-00000-of-00002\.arrow row 3 \(train row 3\): .*--strict"):
        convert(src, tmp_path / "out.lmdb", strict=True)
    code, _, err = cli(capsys, "convert", "hf", src, tmp_path / "out.lmdb", "--strict", "-q", "--workers", "1")
    assert code == 1 and "train row 3" in err
    assert not (tmp_path / "out.lmdb").exists() and not (tmp_path / "out.lmdb.partial").exists()


# ------------------------------------------------------------------------------------ bad input


def no_image_column(hf_tree, root: Path) -> Path:
    from datasets import ClassLabel, Dataset, Features, Value

    features = Features({"text": Value("string"), "label": ClassLabel(names=list(HF_CLASSES))})
    Dataset.from_dict({"text": ["a"] * COUNT, "label": [0] * COUNT}, features=features).save_to_disk(
        str(root / "text"))
    return root / "text"


def unlabelled(hf_tree, root: Path) -> Path:
    from datasets import DatasetDict

    ds = hf_dataset(hf_tree)
    test = ds.map(lambda item, i: {"label": -1 if i % 5 == 0 else item["label"]}, with_indices=True)
    DatasetDict({"train": ds, "test": test}).save_to_disk(str(root / "unlabelled"))
    return root / "unlabelled"


def two_configurations(sources, root: Path) -> Path:
    """A copy of the HF cache whose Hub dataset is there in two configurations."""
    import shutil

    cache = shutil.copytree(sources.cache, root / "cache")
    dataset = cache / HUB_NAME.replace("/", "___")
    shutil.copytree(dataset / "default", dataset / "other")
    info = dataset / "other" / "0.0.0" / "f00d" / "dataset_info.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "config_name": "other"}))
    return cache


BAD_INPUT = {
    "no image column": (lambda tree, sources, root: [no_image_column(tree, root)],
                        ["no image column", "text (Value(string)), label (ClassLabel(3 names))", "--image-column"]),
    "no such split": (lambda tree, sources, root: [sources.saved_dict, "--split", "validation"],
                      ["no split 'validation' (splits: train, test)", "--split"]),
    "no such split in a Dataset": (lambda tree, sources, root: [sources.saved, "--split", "test"],
                                   ["no split 'test' (splits: train)"]),
    "no such label column": (lambda tree, sources, root: [sources.parquet, "--label-column", "class"],
                             ["no label column 'class'", "image (Image), label (ClassLabel(3 names)), tags",
                              "--label-column"]),
    "not a label column": (lambda tree, sources, root: [sources.saved, "--label-column", "score"],
                           ["label column 'score' is Value(float64), not class labels"]),
    "image column that holds no images": (lambda tree, sources, root: [sources.saved, "--image-column", "name"],
                                          ["column 'name' is Value(string), not images"]),
    "unlabelled rows": (lambda tree, sources, root: [unlabelled(tree, root), "--split", "test"],
                        ["label column 'label' has no label in 5 rows (0, 5, 10, 15, 20;", "labelled split"]),
    "not in the cache": (lambda tree, sources, root: ["someone/missing", "--cache-dir", sources.cache],
                         ["someone/missing: no such file or folder, and not in the Hugging Face datasets cache",
                          "datasets.load_dataset('someone/missing')"]),
    "several configurations": (lambda tree, sources, root: [HUB_NAME, "--cache-dir", two_configurations(sources, root)],
                               ["multiple 'fastdata-tests/solid' configurations in the cache: ", "other",
                                "choose one with --config"]),
    "no tables in a folder": (lambda tree, sources, root: [tree.root],
                              ["holds no Parquet or Arrow files"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, hf_tree, hf_sources, tmp_path, capsys):
    make_args, needles = BAD_INPUT[case]
    args = make_args(hf_tree, hf_sources, tmp_path)
    capsys.readouterr()  # datasets' progress bars while the source was written
    out = tmp_path / "out.lmdb"
    code, _, err = cli(capsys, "convert", "hf", args[0], out, *args[1:], "-q")
    assert code == 2, err
    assert_one_line_error(err, *needles)
    assert not out.exists() and not out.with_name("out.lmdb.partial").exists()


# ------------------------------------------------------------------------------------ resume, loader, Ray, tools

# A conversion of an HF source in a child process that SIGKILLs itself before record `at` is added.
KILLER = KILL_WHEN + textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.formats import lmdb as L, wds as W

    src, out, fmt, at = sys.argv[1:5]
    kill_when(L.LmdbWriter if fmt == "lmdb" else W.WdsWriter, "add", lambda self: self.count == int(at))
    fastdata.convert_hf(src, out, fastdata.HfOptions(format=fmt, shard_size="6KB", workers=1, commit_every=4,
                                                     progress=False))
""")


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_an_interrupted_conversion_resumes_over_the_same_source_only(hf_sources, tmp_path, fmt):
    import shutil

    src = tmp_path / "parquet"
    shutil.copytree(hf_sources.parquet, src)
    reference = tmp_path / f"reference.{fmt}"
    convert(src, reference, fmt, commit_every=4)
    out = tmp_path / f"out.{fmt}"
    proc = subprocess.run([sys.executable, "-c", KILLER, str(src), str(out), fmt, "13"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr

    part = src / "data" / "train-00001-of-00002.parquet"
    stat = part.stat()
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the bytes behind the rows may differ
    with pytest.raises(OutputExistsError, match="source files changed"):
        convert(src, out, fmt, commit_every=4)
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    summary = convert(src, out, fmt, commit_every=4)
    assert summary.resumed_at, "a checkpoint was passed before the kill"
    assert stored(out) == stored(reference)
    if fmt == "wds":
        assert [(f.name, f.sha256) for f in fastdata.info(out).files] == \
            [(f.name, f.sha256) for f in fastdata.info(reference).files]


def test_loader_with_workers_over_a_conversion(hf_sources, tmp_path):
    out = tmp_path / "out.lmdb"
    convert(hf_sources.parquet, out)
    loader = fastdata.loader(out, batch_size=5, augment="val", image_size=16, num_workers=2, seed=3)
    ids, labels = [], []
    for images, batch_labels in loader:
        ids += [sample_id_of(image) for image in images]
        labels += batch_labels.tolist()
    assert sorted(ids) == list(range(COUNT))
    assert labels == [solid_label(i) for i in ids]


def test_ray_engine_makes_the_same_dataset(hf_sources, tmp_path):
    import ray  # from the dev extras (fastdata[ray])

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        summary = convert(hf_sources.parquet, tmp_path / "ray", "wds", workers=2, engine="ray")
    finally:
        ray.shutdown()
    convert(hf_sources.parquet, tmp_path / "local", "wds", workers=2)
    assert summary.engine == "ray" and summary.ray.outside_ray == 0 and len(summary.ray.actor_ids) >= 1
    assert [(f.name, f.sha256) for f in fastdata.info(tmp_path / "ray").files] == \
        [(f.name, f.sha256) for f in fastdata.info(tmp_path / "local").files]


def test_cli_convert_info_and_verify_against_the_source(hf_sources, hf_tree, tmp_path, capsys):
    out = tmp_path / "out.lmdb"
    code, stdout, err = cli(capsys, "convert", "hf", HUB_NAME, out, "--cache-dir", hf_sources.cache, "-q",
                            "--workers", "2")
    assert code == 0, err
    assert f"images    {COUNT} in 3 classes" in stdout
    assert "columns not kept" not in stdout  # the list column (tags) is kept as lists
    code, stdout, _ = cli(capsys, "info", out)
    assert code == 0 and "metadata    tags, id, name, score, odd, note" in stdout
    code, stdout, _ = cli(capsys, "verify", out, "--source", HUB_NAME, "--decode")
    assert code == 0 and f"against the source {HUB_NAME}" in stdout, stdout

    other = tmp_path / "other"  # the same images, other labels: verify --source names the difference
    hf_dataset(hf_tree).map(lambda item: {"label": (item["label"] + 1) % 3}).save_to_disk(str(other))
    manifest = fastdata.info(out)
    report = verify(out, source=other)
    assert not report.ok and any("labelled differently" in p for p in report.problems), report
    assert manifest.source["hf"]["cache_dir"] == str(hf_sources.cache)


def test_the_hub_cache_is_found_where_datasets_looks_for_it(hf_sources, tmp_path):
    """No --cache-dir: the cache `datasets` itself uses (HF_DATASETS_CACHE here), read without the network."""
    env = {**os.environ, "HF_DATASETS_CACHE": str(hf_sources.cache), "HF_HUB_OFFLINE": "0"}
    proc = subprocess.run([sys.executable, "-m", "fastdata", "convert", "hf", HUB_NAME, str(tmp_path / "o.lmdb"),
                           "-q", "--workers", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert fastdata.info(tmp_path / "o.lmdb").num_samples == COUNT


# ------------------------------------------------------------------------------------ text


def test_a_saved_text_dataset_is_a_text_source(tmp_path, capsys):
    import pyarrow as pa
    from datasets import Dataset, DatasetDict

    corpus = make_corpus(40)
    tokenizer = train_bytelevel(tmp_path / "bpe.json", corpus + UNICODE)
    ds = Dataset.from_dict({"text": corpus, "n": list(range(40))})
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    # what datasets leaves beside a loaded dataset's files after a .map(): not part of the saved dataset
    with pa.OSFile(str(tmp_path / "saved" / "cache-0123abcd.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as writer:
        writer.write_table(pa.table({"text": ["not a document of the dataset"]}))

    code, _, err = cli(capsys, "convert", "text", tmp_path / "saved", tmp_path / "out.lmdb", "--tokenizer",
                       tokenizer, "--field", "text", "-q")
    assert code == 0, err
    out = fastdata.dataset(tmp_path / "out.lmdb")
    assert [out[i]["input_ids"].tolist() for i in range(len(out))] == [reference_ids(tokenizer, t) for t in corpus]

    DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dict"))
    capsys.readouterr()
    code, _, err = cli(capsys, "convert", "text", tmp_path / "dict", tmp_path / "d.lmdb", "--tokenizer", tokenizer,
                       "-q")
    assert code == 2
    assert_one_line_error(err, "a saved DatasetDict (splits: train, test)", str(tmp_path / "dict" / "train"))

    Dataset.from_dict({"text": ["first", None, "third"]}).save_to_disk(str(tmp_path / "nulls"))
    summary = fastdata.convert_text(
        tmp_path / "nulls" / "data-00000-of-00001.arrow",
        tmp_path / "n.lmdb",
        tokenizer=tokenizer,
        options=fastdata.TextConversionOptions(progress=False),
    )
    assert summary.documents == 2
    assert [str(r) for r in summary.rejected] == [
        f"{tmp_path / 'nulls' / 'data-00000-of-00001.arrow'}:2: row 2: column 'text' is null"]


def test_the_hf_source_options_are_recorded_for_verify(hf_sources, tmp_path):
    convert(hf_sources.saved_dict, tmp_path / "out.lmdb", split="test", metadata=False)
    manifest = fastdata.info(tmp_path / "out.lmdb")
    assert manifest.source["hf"] == {"split": "test", "image_column": None, "label_column": "label",
                                     "config": None, "cache_dir": None, "metadata": False}
    assert manifest.metadata_fields == [] and manifest.format_version == 1
    assert json.loads(json.dumps(manifest.source)) == manifest.source
    with pytest.raises(SourceError, match="no split 'validation'"):
        hf_converter.scan(hf_sources.saved_dict, split="validation")
