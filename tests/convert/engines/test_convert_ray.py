"""`--engine ray`: a conversion run on a local Ray instance makes the same dataset as the local engine (same
samples, labels, rejected files and manifest counts; byte-identical WebDataset shards), from the API and the
CLI; a conversion interrupted under one engine resumes under the other."""

from __future__ import annotations

import re

import pytest
from builders.coco import COCO_IMAGES, write_coco
from builders.images import BAD_FILES, build_bad_tree, build_solid_tree, build_tricky_tree
from builders.lists import list_frame, write_list
from builders.runs import cli
from builders.segmentation import SEG_COUNT, build_segmentation_list
from builders.webdataset import wds_sample, write_wds_shards

import fastdata
from fastdata.convert.images import ray_chunk
from fastdata.errors import ConfigError


@pytest.fixture(scope="module")
def ray_instance():
    import ray  # from the dev extras (fastdata[ray])

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray_src")
    tricky = build_tricky_tree(root / "src")
    build_bad_tree(root / "src" / "zz_bad")  # unreadable files among the good ones: rejected alike
    return tricky.root


def facts(path):
    """What must be equal between the two engines."""
    info = fastdata.info(path)
    ds = fastdata.dataset(path)
    if info.format == "wds":  # shards: byte-identical
        content = [(f.name, f.sha256, f.samples) for f in info.files]
    else:  # one LMDB file, whose page layout is not deterministic: every record instead
        content = [(key, label, ds.reader.read(i)) for i, (key, label) in enumerate(ds.samples)]
    return (info.num_samples, info.classes, info.class_counts, content, sorted(r["path"] for r in info.rejected))


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_ray_engine_makes_the_same_dataset(fmt, ray_instance, tree, tmp_path):
    name = "out" if fmt == "wds" else "out.lmdb"
    local = fastdata.convert_imagefolder(
        tree,
        tmp_path / "local" / name,
        fastdata.ImageFolderOptions(format=fmt, shard_size="8KB", workers=2, progress=False),
    )
    distributed = fastdata.convert_imagefolder(
        tree,
        tmp_path / "ray" / name,
        fastdata.ImageFolderOptions(format=fmt, shard_size="8KB", workers=2, progress=False, engine="ray"),
    )
    assert distributed.images == local.images and len(distributed.rejected) == len(BAD_FILES)
    assert facts(tmp_path / "ray" / name) == facts(tmp_path / "local" / name)
    # the work went through Ray: each source file was handled inside a Ray actor (pool worker), in Ray tasks of
    # ray_chunk(files, 2) files each, as Ray's runtime context told the workers; the local engine ran none
    files = distributed.images + len(distributed.rejected)
    assert distributed.engine == "ray" and distributed.ray.outside_ray == 0
    assert len(distributed.ray.task_ids) == -(-files // ray_chunk(files, 2)) > 1
    assert 1 <= len(distributed.ray.actor_ids) <= 2
    assert local.engine == "local" and local.ray is None
    if fmt == "wds":
        assert len(local.files) > 2  # several shards, each byte-identical (same sha256 in the manifests)


def test_cli_engine_ray_and_errors(ray_instance, tree, tmp_path, capsys):
    code, out, err = cli(capsys, "convert", "imagefolder", tree, tmp_path / "o", "--format", "wds", "--engine",
                         "ray", "--workers", "2", "-q")
    assert code == 0, err
    assert re.search(r"engine    ray: [1-9]\d* Ray tasks on [12] Ray workers", out), out
    assert fastdata.info(tmp_path / "o").num_samples == fastdata.dataset(tmp_path / "o").manifest.num_samples > 0
    with pytest.raises(ConfigError, match="unknown engine 'spark'"):
        fastdata.convert_imagefolder(
            tree, tmp_path / "x.lmdb", fastdata.ImageFolderOptions(engine="spark", progress=False)
        )
    with pytest.raises(ConfigError, match="--ray-address applies to --engine ray"):
        fastdata.convert_imagefolder(
            tree, tmp_path / "y.lmdb", fastdata.ImageFolderOptions(ray_address="10.0.0.1:6379", progress=False)
        )


def test_a_ray_conversion_interrupted_resumes_locally(ray_instance, tree, tmp_path, monkeypatch):
    """Interrupted (Ctrl-C) after its first shards, the rerun on the local engine finishes the same dataset."""
    from fastdata.formats.wds import WdsWriter

    out = tmp_path / "resumed"
    original_add = WdsWriter.add

    def add_until_interrupted(self, record):
        if self.count == 12:
            raise KeyboardInterrupt
        original_add(self, record)

    with monkeypatch.context() as patch:
        patch.setattr(WdsWriter, "add", add_until_interrupted)
        with pytest.raises(KeyboardInterrupt):
            fastdata.convert_imagefolder(
                tree,
                out,
                fastdata.ImageFolderOptions(format="wds", shard_size="8KB", workers=2, progress=False, engine="ray"),
            )
    resumed = fastdata.convert_imagefolder(
        tree, out, fastdata.ImageFolderOptions(format="wds", shard_size="8KB", workers=2, progress=False)
    )
    assert resumed.resumed_at and resumed.resumed_at > 0
    fastdata.convert_imagefolder(
        tree,
        tmp_path / "reference",
        fastdata.ImageFolderOptions(format="wds", shard_size="8KB", workers=1, progress=False),
    )
    assert facts(out) == facts(tmp_path / "reference")


def test_ray_engine_converts_a_file_list_alike(ray_instance, tmp_path):
    """The source's reader travels to the Ray workers with their initializer: a multi-label list with metadata and a
    missing image gives the dataset the local engine gives (byte-identical shards, the same rejection)."""
    tree = build_solid_tree(tmp_path / "images", count=14)
    frame = list_frame(tree, labels="name-sets")
    frame.loc[3, "path"] = "alpha/missing.png"
    list_path = write_list(frame, tree.root / "train.jsonl")
    options = dict(format="wds", shard_size="8KB", workers=2, progress=False)
    local = fastdata.convert_list(list_path, tmp_path / "local", fastdata.FileListOptions(**options))
    distributed = fastdata.convert_list(list_path, tmp_path / "ray", fastdata.FileListOptions(engine="ray", **options))
    assert distributed.engine == "ray" and distributed.ray.outside_ray == 0 and distributed.ray.actor_ids
    assert distributed.rejected == local.rejected and [r["row"] for r in local.rejected] == [4]
    assert [(f.name, f.sha256) for f in fastdata.info(tmp_path / "ray").files] == \
        [(f.name, f.sha256) for f in fastdata.info(tmp_path / "local").files]


def test_ray_engine_converts_webdataset_shards_alike(ray_instance, tmp_path):
    """The shards' reader (a table of where each member is) goes to the Ray workers and reads there."""
    solid = build_solid_tree(tmp_path / "src", count=12)
    write_wds_shards(tmp_path / "shards", [wds_sample(solid, relative) for relative in solid.images], maxcount=5)
    summaries = {
        engine: fastdata.convert_webdataset(
            tmp_path / "shards",
            tmp_path / engine,
            fastdata.WebDatasetOptions(format="wds", shard_size="8KB", workers=2, progress=False, engine=engine),
        )
        for engine in ("local", "ray")
    }
    assert summaries["ray"].images == 12 and summaries["ray"].ray.outside_ray == 0
    assert len(summaries["ray"].ray.task_ids) == -(-12 // ray_chunk(12, 2)) > 1  # one Ray task per chunk
    assert facts(tmp_path / "ray") == facts(tmp_path / "local")


def test_ray_engine_converts_coco_alike(ray_instance, tmp_path):
    """Detection targets are attached where the records are written: a COCO conversion with a missing image gives
    the local engine's dataset (byte-identical shards, with their .det members; the same rejection)."""
    files = write_coco(tmp_path / "coco")
    (files.images / COCO_IMAGES[1][1]).unlink()
    options = dict(format="wds", shard_size="8KB", workers=2, progress=False)
    local = fastdata.convert_coco(files.annotations, files.images, tmp_path / "local", fastdata.CocoOptions(**options))
    distributed = fastdata.convert_coco(
        files.annotations, files.images, tmp_path / "ray", fastdata.CocoOptions(engine="ray", **options)
    )
    assert distributed.engine == "ray" and distributed.ray.outside_ray == 0
    assert distributed.rejected == local.rejected and [r["image_id"] for r in local.rejected] == [COCO_IMAGES[1][0]]
    assert [(f.name, f.sha256) for f in fastdata.info(tmp_path / "ray").files] == \
        [(f.name, f.sha256) for f in fastdata.info(tmp_path / "local").files]
    assert fastdata.info(tmp_path / "ray").target_kind == "detection"


def test_ray_engine_converts_a_segmentation_list_alike(ray_instance, tmp_path):
    """Label maps are read and stored beside the images the Ray workers verified: the same shards, byte for byte,
    and the same class ids counted."""
    listed, _ = build_segmentation_list(tmp_path / "seg")
    options = dict(format="wds", shard_size="4KB", workers=2, progress=False, mask_column="mask")
    fastdata.convert_list(listed, tmp_path / "local", fastdata.FileListOptions(**options))
    distributed = fastdata.convert_list(listed, tmp_path / "ray", fastdata.FileListOptions(engine="ray", **options))
    assert distributed.engine == "ray" and distributed.images == SEG_COUNT
    local, ray = fastdata.info(tmp_path / "local"), fastdata.info(tmp_path / "ray")
    assert ray.target_kind == "segmentation" and ray.targets == local.targets
    assert [(f.name, f.sha256) for f in ray.files] == [(f.name, f.sha256) for f in local.files]


def test_without_ray_the_engine_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """A missing extra is said before OUT.partial exists, so `fastdata info` has no half-made output to explain."""
    import sys

    from builders.images import build_solid_tree

    from fastdata.errors import ConfigError

    tree = build_solid_tree(tmp_path / "src", count=4)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"--engine ray needs Ray: pip install 'fastdata\[ray\]'"):
        fastdata.convert_imagefolder(
            tree.root, tmp_path / "o.lmdb", fastdata.ImageFolderOptions(engine="ray", workers=1, progress=False)
        )
    assert not (tmp_path / "o.lmdb").exists() and not (tmp_path / "o.lmdb.partial").exists()
