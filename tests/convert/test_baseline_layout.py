"""`--jpeg-layout baseline` (issue 31, item 3): every progressive JPEG record is stored rewritten losslessly as a
baseline one (the GPU's hardware JPEG engines take baseline files only), with its source's pixels; every other record
keeps its source's bytes; a progressive JPEG the rewrite refuses keeps its bytes and is counted; the manifest, the
summary, `fastdata info` and `fastdata verify --decode` say what was done."""

from __future__ import annotations

import io
import json
import shutil

import pytest
from PIL import Image

import fastdata
import fastdata.tools.info
from fastdata.formats.lmdb import LmdbReader
from fastdata.formats.manifest import MANIFEST_NAME, read_manifest
from fastdata.image.jpeg.header import progressive
from fastdata.image.jpeg.restart import same_pixels
from fastdata.tools.verify import verify
from tests.builders.images import SAMPLING_LAYOUT, build_sampling_tree, damaged_entropy_jpeg, photo_like, sampling_jpeg
from tests.builders.runs import cli

pytestmark = pytest.mark.region_extension

PROGRESSIVE = [relative for relative, _, _, how in SAMPLING_LAYOUT if how == "progressive"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    tree = build_sampling_tree(tmp_path_factory.mktemp("baseline") / "src")
    (tree.root / "b" / "cut.jpg").write_bytes(damaged_entropy_jpeg(photo_like(3, 96, 80)))
    (tree.root / "a" / "cutprog.jpg").write_bytes(damaged_entropy_jpeg(photo_like(4, 96, 80), progressive=True))
    return tree


@pytest.fixture(scope="module")
def converted(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("baseline_out") / "b.lmdb"
    summary = fastdata.convert_imagefolder(
        tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False, jpeg_layout="baseline")
    )
    return out, summary


def stored(path) -> dict[str, bytes]:
    manifest = read_manifest(path)
    reader = LmdbReader(path, manifest.num_samples)
    return {reader.key(i): reader.read(i) for i in range(manifest.num_samples)}


def test_progressive_jpegs_are_stored_baseline_with_their_sources_pixels_and_the_rest_as_they_were(tree, converted):
    out, _ = converted
    records = stored(out)
    assert set(records) == {*tree.images, "b/cut.jpg", "a/cutprog.jpg"}
    assert PROGRESSIVE and all(progressive((tree.root / key).read_bytes()) for key in PROGRESSIVE)
    for key in PROGRESSIVE:
        data, source = records[key], (tree.root / key).read_bytes()
        assert not progressive(data)
        with Image.open(io.BytesIO(data)) as image:  # Pillow's own reading of the stored file
            assert not image.info.get("progressive") and not image.info.get("progression")
        assert b"\xff\xdd" not in data  # no restart interval: a plain baseline scan
        assert same_pixels(source, data), key
    for key in set(records) - set(PROGRESSIVE):  # baseline (restart markers too), PNG, CMYK, damaged: as stored
        assert records[key] == (tree.root / key).read_bytes(), key


def test_the_manifest_summary_and_info_count_the_rewritten_and_the_refused(tree, converted):
    out, summary = converted
    manifest = read_manifest(out)
    assert manifest.jpeg_layout == "baseline" and manifest.options["jpeg_layout"] == "baseline"
    stats = manifest.stats["jpeg_layout"]
    assert stats["rewritten"] == len(PROGRESSIVE)
    [(reason, count)] = stats["kept_original"].items()
    assert reason.startswith("unsupported JPEG: damaged entropy data") and count == 1
    records = stored(out)
    counted = [*PROGRESSIVE, "a/cutprog.jpg"]  # only progressive JPEGs are the rewrite's business
    before = sum(len((tree.root / key).read_bytes()) for key in counted)
    assert (stats["jpeg_bytes_before"], stats["jpeg_bytes_after"]) == (before, sum(len(records[k]) for k in counted))
    assert f"layout    baseline: {len(PROGRESSIVE)} progressive JPEGs rewritten, 1 kept original" in str(summary)
    described = fastdata.tools.info.describe(out)
    assert f"layout      baseline: {len(PROGRESSIVE)} progressive JPEGs rewritten baseline, 1 kept original" \
        in described
    # the GPU line counts the stored bytes: the refused one is the only progressive JPEG left
    kinds = manifest.stats["gpu_kinds"]
    assert kinds["progressive"] == 1 and "1 progressive" in described
    assert "--jpeg-layout baseline" not in described  # no advice to do what was done


def test_the_original_layouts_info_line_points_at_the_baseline_layout(tree, tmp_path):
    out = tmp_path / "o.lmdb"
    fastdata.convert_imagefolder(tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False))
    assert "`--jpeg-layout baseline` at conversion stores them baseline" in fastdata.tools.info.describe(out)


def test_verify_decode_compares_the_rewritten_jpegs_with_their_sources(tree, converted, tmp_path, capsys):
    out, _ = converted
    report = verify(out, source=tree.root, decode=True)
    assert report.ok, report.problems
    assert (f"baseline layout: 1 progressive JPEGs stored (refused by the rewrite), {len(PROGRESSIVE)} rewritten "
            "ones with the same pixels as their source files") in report.checked
    code, text, _ = cli(capsys, "verify", out, "--decode")
    assert code == 0 and "baseline layout: 1 progressive JPEGs stored" in text
    # a source file changed since: named
    source = tmp_path / "src"
    shutil.copytree(tree.root, source)
    relative = PROGRESSIVE[0]
    width, height = Image.open(tree.root / relative).size
    (source / relative).write_bytes(sampling_jpeg(photo_like(99, width, height), "progressive"))
    report = verify(out, source=source, decode=True)
    assert len(report.problems) == 1
    assert f"sample {relative!r}: the rewritten JPEG decodes to other pixels than the source file" in \
        report.problems[0]


def test_verify_names_a_progressive_jpeg_the_manifest_does_not_account_for(tree, tmp_path):
    out = tmp_path / "b.lmdb"
    fastdata.convert_imagefolder(
        tree.root, out, fastdata.ImageFolderOptions(workers=1, progress=False, jpeg_layout="baseline")
    )
    manifest_path = out / MANIFEST_NAME
    data = json.loads(manifest_path.read_text())
    assert len(data["stats"]["jpeg_layout"]["kept_original"]) == 1
    data["stats"]["jpeg_layout"]["kept_original"] = {}
    manifest_path.write_text(json.dumps(data))
    report = verify(out, decode=True)
    assert any("1 progressive JPEGs stored, the manifest says the rewrite kept 0" in p for p in report.problems)
