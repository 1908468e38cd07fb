"""Storage formats: the JSON manifest, the LMDB layout (raw bytes, read with `lmdb` directly) and WebDataset
shards (read back with the `webdataset` library itself)."""

from __future__ import annotations

import hashlib
import json
import struct
import tarfile
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
import webdataset
from builders.images import SOLID_COUNT, chw, rgb_of_file, sample_id_of
from PIL import Image
from torchvision.datasets import ImageFolder

import fastdata
from fastdata.errors import ConfigError, CorruptSampleError, NotADatasetError
from fastdata.formats.manifest import (
    FORMAT_VERSION,
    NEWEST_FORMAT_VERSION,
    Manifest,
    content_checksum,
    read_manifest,
)
from fastdata.formats.wds import iter_shard, sanitize_key, split_member_name

MANIFEST_KEYS = {"format_version", "kind", "format", "num_samples", "classes", "class_counts", "files",
                 "options", "rejected"}


def record_digests_root(out: Path) -> str:
    """The root of an LMDB dataset's record digests, computed here from what each record stores."""
    import lmdb

    from fastdata.formats.lmdb import RECORD_DBS, digest_root, index_key, record_digest, release_environments

    release_environments()
    env = lmdb.open(str(out), readonly=True, lock=False, max_dbs=16)
    dbs = {}
    for name in RECORD_DBS:
        try:
            dbs[name] = env.open_db(name.encode(), create=False)
        except lmdb.Error:
            continue
    count = json.loads((out / "manifest.json").read_text())["num_samples"]
    with env.begin() as txn:
        table = b"".join(record_digest([(db, v) for db in RECORD_DBS if db in dbs
                                         and (v := txn.get(index_key(i), db=dbs[db])) is not None])
                         for i in range(count))
    env.close()
    return digest_root(table)


def imagefolder_samples(root: Path) -> list[tuple[str, int]]:
    return [(Path(p).relative_to(root).as_posix(), label) for p, label in ImageFolder(str(root)).samples]


# --------------------------------------------------------------------------------------------------- manifest


@pytest.mark.parametrize("which", ["tricky_lmdb", "tricky_wds"])
def test_manifest_is_plain_json_with_the_documented_fields(request, tricky_tree, which):
    out = request.getfixturevalue(which)
    raw = json.loads((out / "manifest.json").read_text())
    assert set(raw) >= MANIFEST_KEYS
    assert raw["format_version"] == FORMAT_VERSION == 1
    assert raw["kind"] == "image"
    assert raw["format"] == ("lmdb" if which == "tricky_lmdb" else "wds")
    samples = imagefolder_samples(tricky_tree.root)
    assert raw["num_samples"] == len(samples)
    assert raw["classes"] == ["Bird", "cat", "dog.v2"]
    assert raw["class_counts"] == [sum(1 for _, lab in samples if lab == c) for c in range(3)]
    assert raw["rejected"] == []
    assert isinstance(raw["options"], dict) and raw["options"]["format"] == raw["format"]
    assert sum(f["samples"] for f in raw["files"]) == raw["num_samples"]
    for entry in raw["files"]:
        path = out / entry["name"]
        assert path.is_file()
        assert entry["bytes"] == path.stat().st_size
        if which == "tricky_lmdb":  # a digest per record instead of the whole file's (fastdata.formats.lmdb)
            assert entry["sha256"] == "" and raw["record_digests"]["records"] == raw["num_samples"]
            assert raw["record_digests"]["root"] == record_digests_root(out)
        else:
            assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    manifest = fastdata.info(out)
    assert isinstance(manifest, Manifest)
    assert raw.pop("manifest_sha256") == content_checksum(raw)  # the manifest's checksum of its own content
    assert manifest.to_dict() == raw
    assert Manifest.from_dict(raw) == manifest
    assert manifest.class_to_idx == {"Bird": 0, "cat": 1, "dog.v2": 2}


def test_manifest_problems_are_named(tmp_path, tricky_lmdb):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    with pytest.raises(NotADatasetError, match="manifest"):
        read_manifest(broken)
    (broken / "manifest.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(NotADatasetError, match="format"):
        read_manifest(broken)
    newer = json.loads((tricky_lmdb / "manifest.json").read_text())
    newer["format_version"] = NEWEST_FORMAT_VERSION + 1
    (broken / "manifest.json").write_text(json.dumps(newer))
    with pytest.raises(NotADatasetError, match="newer"):
        fastdata.dataset(broken)


# ------------------------------------------------------------------------------------------------------- lmdb


def test_lmdb_directory_holds_only_data_and_manifest(tricky_lmdb):
    assert sorted(p.name for p in tricky_lmdb.iterdir()) == ["data.mdb", "manifest.json"]


def test_lmdb_values_are_raw_bytes(tricky_tree, tricky_lmdb):
    samples = imagefolder_samples(tricky_tree.root)
    env = lmdb.open(str(tricky_lmdb), readonly=True, lock=False, max_dbs=4, subdir=True)
    try:
        images = env.open_db(b"images", create=False)
        keys = env.open_db(b"keys", create=False)
        meta = env.open_db(b"meta", create=False)
        with env.begin() as txn:
            assert txn.stat(images)["entries"] == len(samples)
            for i, (relative, _) in enumerate(samples):
                key = struct.pack(">Q", i)
                assert txn.get(key, db=images) == tricky_tree.path(relative).read_bytes()
                assert txn.get(key, db=keys) == relative.encode("utf-8")
            labels = np.frombuffer(txn.get(b"labels", db=meta), dtype="<i4")
            widths = np.frombuffer(txn.get(b"widths", db=meta), dtype="<i4")
            heights = np.frombuffer(txn.get(b"heights", db=meta), dtype="<i4")
    finally:
        env.close()
    assert labels.tolist() == [label for _, label in samples]
    for i, (relative, _) in enumerate(samples):
        with Image.open(tricky_tree.path(relative)) as im:
            assert (widths[i], heights[i]) == im.size


def test_lmdb_dataset_is_map_style(tricky_tree, tricky_lmdb):
    ds = fastdata.dataset(tricky_lmdb)
    n = len(ds)
    assert n == len(tricky_tree.images)
    last, label = ds[-1]
    assert torch.equal(last, ds[n - 1][0]) and label == ds[n - 1][1]
    assert torch.equal(ds[-n][0], ds[0][0])
    with pytest.raises(IndexError):
        ds[n]
    with pytest.raises(IndexError):
        ds[-n - 1]
    assert ds.classes == ["Bird", "cat", "dog.v2"]
    assert ds.targets == [label for _, label in ds.samples]
    # works as a plain torch dataset
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    assert sum(1 for _ in loader) == n


def test_lmdb_missing_data_file_is_named(tmp_path, tricky_lmdb):
    copy = tmp_path / "copy.lmdb"
    copy.mkdir()
    (copy / "manifest.json").write_bytes((tricky_lmdb / "manifest.json").read_bytes())
    with pytest.raises(NotADatasetError, match=r"data\.mdb"):
        fastdata.dataset(copy)


# -------------------------------------------------------------------------------------------------------- wds


def shard_urls(out: Path) -> list[str]:
    return [str(out / f.name) for f in fastdata.info(out).files]


def test_wds_shard_names_and_count(tricky_wds):
    manifest = fastdata.info(tricky_wds)
    names = [f.name for f in manifest.files]
    assert len(names) >= 3
    assert names == [f"shard-{i:06d}.tar" for i in range(len(names))]
    digests = [name.replace(".tar", ".digests") for name in names]  # each shard's record digests beside it
    assert sorted(p.name for p in tricky_wds.iterdir()) == sorted([*names, *digests, "manifest.json"])
    assert all(f.samples > 0 for f in manifest.files)
    assert manifest.options["shard_size"] == 4000
    assert manifest.options["seed"] == 3


def test_wds_shards_read_by_the_webdataset_library(tricky_tree, tricky_wds):
    expected = dict(imagefolder_samples(tricky_tree.root))
    data = webdataset.WebDataset(shard_urls(tricky_wds), shardshuffle=False, empty_check=False)
    seen = []
    for sample in data:
        key = sample["__key__"]
        members = {k for k in sample if not k.startswith("__")}
        assert "cls" in members and "json" in members, members
        image_exts = members - {"cls", "json"}
        assert len(image_exts) == 1, members
        ext = image_exts.pop()
        assert "." not in key, key
        meta = json.loads(sample["json"])
        path = meta["path"]
        assert int(sample["cls"]) == meta["label"] == expected[path], path
        assert sample[ext] == tricky_tree.path(path).read_bytes(), path
        source_ext = path.rsplit(".", 1)[1].lower()
        assert ext == {"jpg": "jpg", "jpeg": "jpg", "png": "png", "bmp": "bmp"}[source_ext]
        seen.append(path)
    assert sorted(seen) == sorted(expected)  # every sample exactly once
    assert len(seen) == len(set(seen))


def test_wds_per_shard_sample_counts_match_the_manifest(tricky_wds):
    for entry in fastdata.info(tricky_wds).files:
        count = sum(1 for _ in webdataset.WebDataset(str(tricky_wds / entry.name), shardshuffle=False))
        assert count == entry.samples, entry.name


def test_wds_stored_order_is_a_seeded_shuffle(tricky_tree, tricky_wds, tmp_path):
    def stored_paths(out: Path) -> list[str]:
        return [meta["path"] for url in shard_urls(out) for _, _, _, meta in iter_shard(Path(url))]

    reference = stored_paths(tricky_wds)
    imagefolder_order = [p for p, _ in imagefolder_samples(tricky_tree.root)]
    assert sorted(reference) == sorted(imagefolder_order)
    assert reference != imagefolder_order  # classes are spread over the shards

    same = tmp_path / "same"  # same seed (and another worker count): the very same shards
    fastdata.convert_imagefolder(
        tricky_tree.root,
        same,
        fastdata.ImageFolderOptions(format="wds", shard_size="4KB", seed=3, workers=1, progress=False),
    )
    assert stored_paths(same) == reference
    ours, theirs = fastdata.info(tricky_wds).files, fastdata.info(same).files
    assert [(f.name, f.sha256, f.samples) for f in ours] == [(f.name, f.sha256, f.samples) for f in theirs]
    for entry in ours:
        assert (same / entry.name).read_bytes() == (tricky_wds / entry.name).read_bytes()

    other = tmp_path / "other"
    fastdata.convert_imagefolder(
        tricky_tree.root,
        other,
        fastdata.ImageFolderOptions(format="wds", shard_size="4KB", seed=4, workers=1, progress=False),
    )
    other_order = stored_paths(other)
    assert sorted(other_order) == sorted(reference)
    assert other_order != reference


def test_wds_dataset_iterates_every_sample_in_stored_order(tricky_tree, tricky_wds):
    ds = fastdata.dataset(tricky_wds)
    assert len(ds) == len(tricky_tree.images)
    assert ds.classes == ["Bird", "cat", "dog.v2"]
    assert ds.class_to_idx == {"Bird": 0, "cat": 1, "dog.v2": 2}
    stored = [(meta["path"], meta["label"])
              for url in shard_urls(tricky_wds) for _, _, _, meta in iter_shard(Path(url))]
    got = list(ds)
    assert len(got) == len(stored)
    for (image, label), (path, stored_label) in zip(got, stored, strict=True):
        assert isinstance(image, torch.Tensor) and image.dtype == torch.uint8
        assert label == stored_label
        expected = chw(rgb_of_file(tricky_tree.path(path)))
        assert image.shape == expected.shape, path
        tolerance = 0 if path in tricky_tree.exact else 1
        assert np.abs(image.numpy().astype(np.int16) - expected).max() <= tolerance, path
    assert [label for _, label in ds] == [label for _, label in got]  # iterable again


def test_wds_keys_are_unique_and_dot_free():
    assert sanitize_key("cat/v1.2/img.v2.final.PNG") == "cat/v1_2/img_v2_final"
    assert sanitize_key("dog/a.jpg") == "dog/a"
    assert split_member_name("cat/v1_2/img_v2_final.cls") == ("cat/v1_2/img_v2_final", "cls")


def test_wds_twin_stems_get_distinct_keys(tricky_wds):
    keys = []
    for url in shard_urls(tricky_wds):
        with tarfile.open(url) as tar:
            keys += [split_member_name(m.name)[0] for m in tar.getmembers() if m.name.endswith(".json")]
    assert len(keys) == len(set(keys)) == 27
    assert all("." not in k for k in keys)


def test_wds_damaged_shard_is_named(tmp_path, tricky_wds):
    first = fastdata.info(tricky_wds).files[0].name
    damaged = tmp_path / first
    damaged.write_bytes((tricky_wds / first).read_bytes()[:700])
    with pytest.raises(CorruptSampleError) as info:
        list(iter_shard(damaged))
    assert str(damaged) in str(info.value)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_wds_dataset_in_a_plain_dataloader_yields_every_sample_once(solid_wds, num_workers):
    """torch's own DataLoader over fastdata.dataset(WDS): the workers split the stream, none reads it all."""
    ds = fastdata.dataset(solid_wds, "val", image_size=16)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=num_workers)
    ids = [sample_id_of(image) for images, _ in loader for image in images]
    assert sorted(ids) == list(range(SOLID_COUNT)) and len(ds) == SOLID_COUNT


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_wds_dataset_splits_between_ranks_and_workers(solid_wds, uneven):
    per_rank, seen = [], []
    for rank in range(2):
        ds = fastdata.dataset(solid_wds, "val", image_size=16, rank=rank, world_size=2, uneven=uneven)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        ids = [sample_id_of(image) for image, _ in loader]
        assert len(ids) == len(ds)
        per_rank.append(len(ids))
        seen += ids
    assert per_rank[0] == per_rank[1]
    if uneven == "drop":
        assert len(seen) == len(set(seen)) == SOLID_COUNT - 1
    else:
        assert set(seen) == set(range(SOLID_COUNT)) and len(seen) == SOLID_COUNT + 1


def test_rank_arguments_are_refused_for_map_style_datasets(solid_lmdb):
    with pytest.raises(ConfigError, match="DistributedSampler"):
        fastdata.dataset(solid_lmdb, rank=0, world_size=2)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_a_text_writer_without_a_token_dtype_is_refused(tmp_path, fmt):
    from fastdata.formats.registry import WriterOptions, storage

    with pytest.raises(ValueError, match="needs the token dtype"):  # not float64 tokens
        storage("text", fmt).open_writer(tmp_path / "out", WriterOptions())
