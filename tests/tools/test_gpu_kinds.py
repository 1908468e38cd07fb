"""`fastdata info` says how many stored images the GPU's hardware JPEG engines take (issue 31, item 3): the
conversion counts its stored images as baseline JPEGs, progressive JPEGs and the rest, in its workers, and an older
dataset's images are counted from their headers on request (`--scan-gpu`). The expected counts come from Pillow's
reading of the stored bytes, not from fastdata's header walk."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image

import fastdata
from fastdata.formats.lmdb import LmdbReader
from fastdata.formats.manifest import MANIFEST_NAME, read_manifest
from fastdata.tools.gpu_kinds import scan_gpu_kinds
from tests.builders import build_sampling_tree, cli, webdataset_reading


def pillow_kind(data: bytes) -> str:
    """What Pillow says the bytes are, in GPU_KINDS terms (every JPEG of the sampling tree has a subsampling the
    GPU decoders know, so only the coding process and the colour model decide)."""
    with Image.open(io.BytesIO(data)) as image:
        if image.format != "JPEG":
            return "not_jpeg"
        if image.mode not in ("L", "RGB"):
            return "other_jpeg"
        return "progressive" if image.info.get("progressive") else "baseline"


def counts(kinds: list[str]) -> dict[str, int]:
    return {kind: kinds.count(kind) for kind in ("baseline", "progressive", "other_jpeg", "not_jpeg")}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return build_sampling_tree(tmp_path_factory.mktemp("gpu_kinds") / "src")


@pytest.fixture(scope="module")
def converted(tree, tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_kinds_out")
    fastdata.convert_imagefolder(tree.root, root / "original.lmdb", workers=2, progress=False)
    fastdata.convert_imagefolder(tree.root, root / "restart.tar", format="wds", workers=2, progress=False,
                                 jpeg_layout="restart")
    return root


def stored_lmdb(path) -> list[bytes]:
    manifest = read_manifest(path)
    reader = LmdbReader(path, manifest.num_samples)
    return [reader.read(i) for i in range(manifest.num_samples)]


def stored_shards(path) -> list[bytes]:
    manifest = read_manifest(path)
    samples = webdataset_reading([path / f.name for f in manifest.files])
    return [next(value for name, value in sample.items() if name in ("jpg", "png", "jpeg", "webp", "ppm"))
            for sample in samples]


def test_a_conversion_counts_its_stored_images_by_what_the_gpu_decoders_take(tree, converted):
    original = read_manifest(converted / "original.lmdb").stats["gpu_kinds"]
    expected = counts([pillow_kind(data) for data in stored_lmdb(converted / "original.lmdb")])
    assert original == expected
    assert expected["progressive"] == 1 and expected["other_jpeg"] == 1 and expected["not_jpeg"] == 1
    # the restart layout stores every JPEG it rewrites baseline: the progressive one becomes baseline too
    restart = read_manifest(converted / "restart.tar").stats["gpu_kinds"]
    assert restart == counts([pillow_kind(data) for data in stored_shards(converted / "restart.tar")])
    assert restart["progressive"] == 0 and restart["baseline"] == expected["baseline"] + 1


def test_info_says_how_many_stored_images_the_hardware_engines_take(converted, capsys):
    code, out, _ = cli(capsys, "info", converted / "original.lmdb")
    assert code == 0
    line = next(line for line in out.splitlines() if line.strip().startswith("GPU decode"))
    kinds = read_manifest(converted / "original.lmdb").stats["gpu_kinds"]
    assert f"{kinds['baseline']} of {sum(kinds.values())} stored images are baseline JPEGs" in line
    assert "1 progressive" in line and "--jpeg-layout baseline" in line and "2 decoded on the CPU" in line
    code, out, _ = cli(capsys, "info", converted / "restart.tar")
    line = next(line for line in out.splitlines() if line.strip().startswith("GPU decode"))
    assert "0 progressive" in line and "--jpeg-layout baseline" not in line


@pytest.mark.parametrize("name", ["original.lmdb", "restart.tar"])
def test_an_older_dataset_is_counted_from_its_headers_on_request(converted, tmp_path, capsys, name):
    import shutil

    older = tmp_path / name
    shutil.copytree(converted / name, older)
    manifest = json.loads((older / MANIFEST_NAME).read_text())
    recorded = manifest["stats"].pop("gpu_kinds")
    (older / MANIFEST_NAME).write_text(json.dumps(manifest))
    code, out, _ = cli(capsys, "info", older)
    assert code == 0 and "not recorded at conversion" in out and "--scan-gpu" in out
    assert scan_gpu_kinds(older) == recorded
    code, out, _ = cli(capsys, "info", "--scan-gpu", older)
    assert code == 0 and f"{recorded['baseline']} of {sum(recorded.values())} stored images" in out
