"""`fastdata info` says how many stored images the GPU's hardware JPEG engines take (issue 31, item 3): the
conversion counts its stored images as baseline JPEGs, progressive JPEGs and the rest, in its workers, and an older
dataset's images are counted from their headers on request (`--scan-gpu`). The expected counts come from Pillow's
reading of the stored bytes, not from fastdata's header walk."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

import fastdata
from fastdata.formats.lmdb import LmdbReader
from fastdata.formats.manifest import MANIFEST_NAME, read_manifest
from fastdata.tools.gpu_kinds import scan_gpu_kinds
from tests.builders.images import build_sampling_tree
from tests.builders.runs import cli
from tests.builders.webdataset import webdataset_reading


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
    fastdata.convert_imagefolder(
        tree.root, root / "original.lmdb", fastdata.ImageFolderOptions(workers=2, progress=False)
    )
    fastdata.convert_imagefolder(
        tree.root,
        root / "restart.tar",
        fastdata.ImageFolderOptions(format="wds", workers=2, progress=False, jpeg_layout="restart"),
    )
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


@pytest.mark.region_extension
def test_a_conversion_counts_its_stored_images_by_what_the_gpu_decoders_take(tree, converted):
    original = read_manifest(converted / "original.lmdb").stats["gpu_kinds"]
    expected = counts([pillow_kind(data) for data in stored_lmdb(converted / "original.lmdb")])
    assert original == expected
    assert expected["progressive"] == 1 and expected["other_jpeg"] == 1 and expected["not_jpeg"] == 1
    # the restart layout stores every JPEG it rewrites baseline: the progressive one becomes baseline too
    restart = read_manifest(converted / "restart.tar").stats["gpu_kinds"]
    assert restart == counts([pillow_kind(data) for data in stored_shards(converted / "restart.tar")])
    assert restart["progressive"] == 0 and restart["baseline"] == expected["baseline"] + 1


@pytest.mark.region_extension
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


@pytest.mark.region_extension
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


@pytest.fixture(scope="module")
def mixed_tree(tmp_path_factory):
    """One JPEG and the non-JPEG kinds a conversion meets: RGB and RGBA PNGs, a 16-bit grey PNG, a WebP."""
    from tests.builders.images import photo_like

    root = tmp_path_factory.mktemp("non_jpeg") / "src"
    photo = photo_like(7, 120, 90)
    rgba = np.dstack([photo, np.full(photo.shape[:2], 128, np.uint8)])
    deep = photo[:, :, 1].astype(np.uint16) * 257  # 16-bit grey
    files = {"a/photo.jpg": ("JPEG", photo), "a/rgb.png": ("PNG", photo), "b/rgba.png": ("PNG", rgba),
             "b/deep.png": ("PNG", deep), "b/photo.webp": ("WEBP", photo)}
    for relative, (fmt, array) in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(root / relative, fmt, **({"quality": 90} if fmt != "PNG" else {}))
    return root


def whole_images(path) -> list[np.ndarray]:
    data = fastdata.dataset(path)
    return [np.asarray(data[i][0]) for i in range(len(data))]


def test_non_jpeg_jpeg_stores_every_other_image_as_a_jpeg_of_the_pixels_the_loader_decodes(mixed_tree, tmp_path,
                                                                                          capsys):
    kept, as_jpeg = tmp_path / "kept.lmdb", tmp_path / "as_jpeg.lmdb"
    fastdata.convert_imagefolder(mixed_tree, kept, fastdata.ImageFolderOptions(workers=1, progress=False))
    code, out, _ = cli(capsys, "convert", "imagefolder", mixed_tree, as_jpeg, "--non-jpeg", "jpeg", "--quality", "95",
                       "--workers", "1", "--quiet")
    assert code == 0 and "non-JPEG  images that were not JPEGs stored as JPEGs at quality 95" in out
    manifest = read_manifest(as_jpeg)
    assert manifest.options["non_jpeg"] == "jpeg" and manifest.options["quality"] == 95
    stored_kept, stored_jpeg = stored_lmdb(kept), stored_lmdb(as_jpeg)
    assert [pillow_kind(data) for data in stored_jpeg] == ["baseline"] * 5  # every record a JPEG the engines take
    assert manifest.stats["gpu_kinds"] == counts(["baseline"] * 5)
    assert sorted(pillow_kind(data) for data in stored_kept) == ["baseline", "not_jpeg", "not_jpeg", "not_jpeg",
                                                                "not_jpeg"]
    assert set(stored_kept) & set(stored_jpeg) == {(mixed_tree / "a/photo.jpg").read_bytes()}  # JPEGs untouched
    for before, after in zip(whole_images(kept), whole_images(as_jpeg), strict=True):
        assert before.shape == after.shape  # the loader's pixels: alpha dropped, 16 bits scaled to 8, as before
        assert np.abs(before.astype(np.int16) - after.astype(np.int16)).mean() < 4.0  # JPEG at quality 95, 4:2:0
    code, out, _ = cli(capsys, "info", as_jpeg)
    assert "stored as JPEGs (quality 95)" in out and "--non-jpeg jpeg` at conversion" not in out
    code, out, _ = cli(capsys, "info", kept)
    assert "4 not JPEGs: `--non-jpeg jpeg` at conversion stores them as JPEGs" in out


def test_non_jpeg_jpeg_in_webdataset_shards_stores_jpg_members(mixed_tree, tmp_path):
    shards = tmp_path / "shards"
    fastdata.convert_imagefolder(
        mixed_tree, shards, fastdata.ImageFolderOptions(format="wds", workers=1, progress=False, non_jpeg="jpeg")
    )
    manifest = read_manifest(shards)
    samples = webdataset_reading([shards / f.name for f in manifest.files])
    assert [sorted(name for name in sample if name in ("jpg", "png", "webp")) for sample in samples] == [["jpg"]] * 5
    assert [pillow_kind(data) for data in stored_shards(shards)] == ["baseline"] * 5
    assert sum(1 for _ in fastdata.dataset(shards)) == 5  # the loader reads them


@pytest.mark.region_extension
def test_non_jpeg_jpeg_with_the_restart_layout_rewrites_the_new_jpegs_too(mixed_tree, tmp_path):
    """The images stored as JPEGs are JPEG records like the others: the restart layout rewrites them too, so that
    every crop of the dataset can go to the device as a sub-JPEG."""
    out = tmp_path / "restart.lmdb"
    fastdata.convert_imagefolder(
        mixed_tree, out, fastdata.ImageFolderOptions(workers=1, progress=False, jpeg_layout="restart", non_jpeg="jpeg")
    )
    stats = read_manifest(out).stats
    assert stats["jpeg_layout"]["rewritten"] == 5 and stats["gpu_kinds"] == counts(["baseline"] * 5)


def test_non_jpeg_takes_keep_or_jpeg(mixed_tree, tmp_path):
    from fastdata.errors import ConfigError

    with pytest.raises(ConfigError, match="--non-jpeg must be one of keep, jpeg"):
        fastdata.convert_imagefolder(
            mixed_tree, tmp_path / "x.lmdb", fastdata.ImageFolderOptions(non_jpeg="png", progress=False)
        )
