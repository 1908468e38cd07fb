"""`--jpeg-layout restart` (issue 21): each JPEG record is stored rewritten with a restart marker after every MCU
(the same pixels as its source), other images and JPEGs the rewrite refuses keep their bytes and are counted; the
layout, the counts and the size overhead are in the manifest and the summary; "original" changes nothing. The CLI
and WebDataset test covers `baseline` too (its own tests: test_baseline_layout.py)."""

from __future__ import annotations

import json
import signal
import textwrap

import numpy as np
import pytest

import fastdata
import fastdata.tools.info
from fastdata.errors import ConfigError, OutputExistsError
from fastdata.formats.lmdb import LmdbReader
from fastdata.formats.manifest import MANIFEST_NAME, read_manifest
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.jpeg.header import progressive
from fastdata.image.jpeg.restart import build_index, same_pixels
from tests.builders.images import SAMPLING_LAYOUT, build_sampling_tree, damaged_entropy_jpeg, photo_like
from tests.builders.runs import KILL_WHEN, cli, run_python

JPEG_RECORDS = [relative for relative, _, _, how in SAMPLING_LAYOUT if how not in ("png", "cmyk")]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    tree = build_sampling_tree(tmp_path_factory.mktemp("layout") / "src")
    (tree.root / "b" / "cut.jpg").write_bytes(damaged_entropy_jpeg(photo_like(3, 96, 80)))
    return tree


@pytest.fixture(scope="module")
def converted(tree, tmp_path_factory):
    root = tmp_path_factory.mktemp("layout_out")
    summaries = {
        layout: fastdata.convert_imagefolder(
            tree.root,
            root / f"{layout}.lmdb",
            fastdata.ImageFolderOptions(workers=1, progress=False, jpeg_layout=layout),
        )
        for layout in ("original", "restart")
    }
    return root, summaries


def stored(path) -> dict[str, tuple[bytes, int]]:
    manifest = read_manifest(path)
    reader = LmdbReader(path, manifest.num_samples)
    return {reader.key(i): (reader.read(i), int(reader.codecs[i])) for i in range(manifest.num_samples)}


@pytest.mark.region_extension
def test_restart_layout_stores_rewritten_jpegs_with_the_sources_pixels(tree, converted):
    root, _ = converted
    records = stored(root / "restart.lmdb")
    assert set(records) == {*tree.images, "b/cut.jpg"}
    for key in JPEG_RECORDS:
        data, codec = records[key]
        source = (tree.root / key).read_bytes()
        assert codec == CODEC_CV_JPEG and data != source, key
        index = build_index(data, name=key)  # one restart segment per MCU
        assert index.columns * index.rows == len(index.offsets) - 1
        assert same_pixels(source, data), key
    for key in ("b/flat.png", "b/ink.jpg", "b/cut.jpg"):  # not a JPEG record, or refused: the source's bytes
        assert records[key][0] == (tree.root / key).read_bytes(), key


@pytest.mark.region_extension
def test_original_layout_keeps_every_sources_bytes(tree, converted):
    root, summaries = converted
    records = stored(root / "original.lmdb")
    assert all(records[key][0] == (tree.root / key).read_bytes() for key in records)
    manifest = read_manifest(root / "original.lmdb")
    assert manifest.jpeg_layout == "original" and "jpeg_layout" not in manifest.stats
    assert "jpeg_layout" not in json.loads((root / "original.lmdb" / MANIFEST_NAME).read_text())
    assert "  layout " not in str(summaries["original"])


@pytest.mark.region_extension
def test_the_manifest_and_summary_count_what_was_rewritten_and_what_was_kept(tree, converted):
    root, summaries = converted
    manifest = read_manifest(root / "restart.lmdb")
    assert manifest.jpeg_layout == "restart" and manifest.options["jpeg_layout"] == "restart"
    assert manifest.format_version == 1  # any JPEG decoder reads the stored bytes: nothing newer needed
    stats = manifest.stats["jpeg_layout"]
    assert stats["rewritten"] == len(JPEG_RECORDS)
    [(reason, count)] = stats["kept_original"].items()
    assert reason.startswith("unsupported JPEG: damaged entropy data") and count == 1
    records = stored(root / "restart.lmdb")
    before = sum(len((tree.root / key).read_bytes()) for key in [*JPEG_RECORDS, "b/cut.jpg"])
    after = sum(len(records[key][0]) for key in [*JPEG_RECORDS, "b/cut.jpg"])
    assert (stats["jpeg_bytes_before"], stats["jpeg_bytes_after"]) == (before, after)
    assert stats["size_ratio"] == pytest.approx(after / before, abs=1e-5)
    text = str(summaries["restart"])
    assert f"layout    restart: {len(JPEG_RECORDS)} JPEGs rewritten, 1 kept original; JPEG bytes x" \
           f"{after / before:.3f}" in text
    assert "kept original (1): unsupported JPEG: damaged entropy data" in text
    described = fastdata.tools.info.describe(root / "restart.lmdb")
    assert f"layout      restart: {len(JPEG_RECORDS)} JPEGs rewritten with restart markers, 1 kept original, " \
           f"JPEG bytes x{after / before:.3f}" in described
    lines = fastdata.tools.info.describe(root / "original.lmdb").splitlines()
    assert not any(line.strip().startswith("layout ") for line in lines)  # no layout line for "original"


@pytest.mark.region_extension
def test_the_restart_layout_reads_like_the_original_one_without_augmentation(converted):
    root, _ = converted
    original, restart = fastdata.dataset(root / "original.lmdb"), fastdata.dataset(root / "restart.lmdb")
    for index in range(len(original)):
        assert np.array_equal(original[index][0].numpy(), restart[index][0].numpy())


@pytest.mark.region_extension
@pytest.mark.parametrize("layout", ["restart", "baseline"])
def test_wds_and_the_command_line_take_the_layout(tree, tmp_path, capsys, layout):
    """restart: every JPEG record rewritten with restart markers; baseline: the progressive one only."""
    rewritten = JPEG_RECORDS if layout == "restart" else [k for k in JPEG_RECORDS if progressive((tree.root / k)
                                                                                                   .read_bytes())]
    out = tmp_path / "shards"
    code, text, _ = cli(capsys, "convert", "imagefolder", tree.root, out, "--format", "wds", "--jpeg-layout", layout,
                        "--workers", "2", "-q")
    what = "JPEGs rewritten, 1 kept original" if layout == "restart" else "progressive JPEGs rewritten, 0 kept"
    assert code == 0 and f"{len(rewritten)} {what}" in text
    manifest = read_manifest(out)
    assert manifest.jpeg_layout == layout and manifest.stats["jpeg_layout"]["rewritten"] == len(rewritten)
    assert manifest.stats["gpu_kinds"]["progressive"] == 0
    ds = fastdata.dataset(out)
    by_key = {sample.key: sample.data for sample in ds.encoded_samples(list(range(len(manifest.files))))}
    for key in rewritten:
        if layout == "restart":
            build_index(by_key[key], name=key)
        assert not progressive(by_key[key]) and same_pixels((tree.root / key).read_bytes(), by_key[key])
    assert all(by_key[key] == (tree.root / key).read_bytes() for key in by_key if key not in rewritten)


def test_an_unknown_layout_is_refused_before_any_work(tree, tmp_path):
    with pytest.raises(ConfigError, match="--jpeg-layout must be one of original, restart"):
        fastdata.convert_imagefolder(
            tree.root, tmp_path / "x.lmdb", fastdata.ImageFolderOptions(progress=False, jpeg_layout="jpegtran")
        )
    assert not (tmp_path / "x.lmdb").exists()


@pytest.mark.region_extension
def test_max_size_images_are_rewritten_after_their_reencode(tree, tmp_path):
    summary = fastdata.convert_imagefolder(
        tree.root,
        tmp_path / "small.lmdb",
        fastdata.ImageFolderOptions(workers=1, progress=False, max_size=128, jpeg_layout="restart"),
    )
    records = stored(tmp_path / "small.lmdb")
    for key, (data, codec) in records.items():
        if codec == CODEC_CV_JPEG and key != "b/cut.jpg":
            build_index(data, name=key)
    assert summary.layout is not None and summary.layout.rewritten >= len(JPEG_RECORDS)


KILLED_RESTART = KILL_WHEN + textwrap.dedent("""
    import sys
    import fastdata
    from fastdata.formats import lmdb as L

    src, out = sys.argv[1:3]
    kill_when(L.LmdbWriter, "add", lambda self: self.count == 6)  # after the checkpoint of the first 4
    fastdata.convert_imagefolder(src, out, fastdata.ImageFolderOptions(workers=1, commit_every=4, progress=False,
                                                                         jpeg_layout="restart"))
""")


@pytest.mark.region_extension
def test_a_resumed_restart_conversion_counts_what_an_uninterrupted_one_does(tree, converted, tmp_path):
    root, _ = converted
    out = tmp_path / "resumed.lmdb"
    proc = run_python(KILLED_RESTART, tree.root, out)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with pytest.raises(OutputExistsError, match="jpeg_layout restart -> original"):  # not resumed so
        fastdata.convert_imagefolder(
            tree.root, out, fastdata.ImageFolderOptions(workers=1, commit_every=4, progress=False)
        )
    summary = fastdata.convert_imagefolder(
        tree.root, out, fastdata.ImageFolderOptions(workers=1, commit_every=4, progress=False, jpeg_layout="restart")
    )
    assert summary.resumed_at == 4
    reference = read_manifest(root / "restart.lmdb").stats["jpeg_layout"]
    assert read_manifest(out).stats["jpeg_layout"] == reference
    assert read_manifest(out).stats["gpu_kinds"] == read_manifest(root / "restart.lmdb").stats["gpu_kinds"]
    assert stored(out) == stored(root / "restart.lmdb")
