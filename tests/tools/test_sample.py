"""sample: the built-in sample generator makes a valid, deterministic ImageFolder tree that converts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from torchvision.datasets import ImageFolder

import fastdata
from fastdata.tools.sample import make_sample_imagefolder, photo_paths


def test_photo_paths_exist():
    colour, gray = photo_paths()
    assert colour and gray  # scikit-image is installed in the test environment
    assert all(p.is_file() for p in colour + gray)


def test_sample_is_a_valid_imagefolder_that_converts(tmp_path):
    root = make_sample_imagefolder(tmp_path / "sample", images=12, classes=3, seed=0, png_fraction=0.3,
                                   workers=1)
    assert root == tmp_path / "sample"
    folder = ImageFolder(str(root))
    assert folder.classes == ["class_000", "class_001", "class_002"]
    assert len(folder) == 12
    assert sorted(folder.targets) == [0] * 4 + [1] * 4 + [2] * 4
    formats = set()
    for path, _ in folder.samples:
        with Image.open(path) as im:
            im.load()
            formats.add(im.format)
            assert 400 <= im.size[0] <= 640 and im.size[1] > 200
    assert "JPEG" in formats

    out = tmp_path / "sample.lmdb"
    summary = fastdata.convert_imagefolder(
        root, out, fastdata.ImageFolderOptions(strict=True, workers=1, progress=False)
    )
    assert summary.images == 12 and summary.rejected == [] and summary.ignored == 0
    ds = fastdata.dataset(out)
    assert ds.samples == [(Path(p).relative_to(root).as_posix(), label) for p, label in folder.samples]
    image, label = ds[5]
    assert image.shape[0] == 3 and label == folder.targets[5]


def test_sample_is_deterministic_for_a_seed(tmp_path):
    a = make_sample_imagefolder(tmp_path / "a", images=6, classes=2, seed=3, workers=1)
    b = make_sample_imagefolder(tmp_path / "b", images=6, classes=2, seed=3, workers=1)
    c = make_sample_imagefolder(tmp_path / "c", images=6, classes=2, seed=4, workers=1)
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files_a)
    first_a = np.asarray(Image.open(a / files_a[0]).convert("RGB"))
    files_c = sorted(p.relative_to(c) for p in c.rglob("*") if p.is_file())
    first_c = np.asarray(Image.open(c / files_c[0]).convert("RGB"))
    assert first_a.shape != first_c.shape or not np.array_equal(first_a, first_c)
