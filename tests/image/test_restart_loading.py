"""Loading a restart-layout dataset (issue 21): a rewritten JPEG's crop is decoded from the sub-JPEG of the MCUs it
covers, and the batches are bit for bit those of the original-layout dataset of the same source JPEGs (train and
val presets, LMDB and WebDataset, several seeds, several DCT scales); a library that fails the restart self-check
falls back to the whole file's region decode, warned once."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastdata
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image import pipeline as pipeline_module
from fastdata.image.region import region_decoder
from tests.builders import build_sampling_tree, seeded_loader

pytestmark = pytest.mark.skipif(region_decoder() is None, reason="needs the region decoder (C extension)")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("restart_loading")
    tree = build_sampling_tree(root / "src")
    made = {}
    for layout in ("original", "restart"):
        made["lmdb", layout] = root / f"{layout}.lmdb"
        made["wds", layout] = root / f"{layout}-shards"
        fastdata.convert_imagefolder(tree.root, made["lmdb", layout], workers=1, progress=False, jpeg_layout=layout)
        fastdata.convert_imagefolder(tree.root, made["wds", layout], format="wds", shard_size="64KB", seed=2,
                                     workers=1, progress=False, jpeg_layout=layout)
    return made


def batches(path, epochs: int = 2, **options) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every batch of `epochs` passes (each epoch crops anew)."""
    loader = seeded_loader(path, batch_size=4, **options)
    return [(images.numpy().copy(), labels.numpy().copy()) for _ in range(epochs) for images, labels in loader]


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize("augment, image_size", [("train", 48), ("train", 160), ("val", 64)])
def test_restart_layout_batches_equal_the_original_layouts(datasets, fmt, augment, image_size):
    for seed in (0, 1, 5):
        expected = batches(datasets[fmt, "original"], augment=augment, image_size=image_size, seed=seed)
        got = batches(datasets[fmt, "restart"], augment=augment, image_size=image_size, seed=seed)
        assert len(got) == len(expected) == 6
        assert not np.array_equal(got[0][0], got[3][0])  # the second epoch's crops are other ones
        for number, ((images, labels), (want_images, want_labels)) in enumerate(zip(got, expected, strict=True)):
            assert np.array_equal(labels, want_labels)
            assert np.array_equal(images, want_images), (fmt, augment, seed, number)


def test_rewritten_jpegs_are_decoded_from_their_sub_jpegs(datasets):
    ds = fastdata.dataset(datasets["lmdb", "restart"], augment="train", image_size=48)
    decoder = ds.pipeline.region_decoder_for_presets()
    assert ds.pipeline.jpeg_layout == "restart"
    indexed = {}
    for i in range(len(ds)):
        sample = ds.encoded(i)
        indexed[sample.key] = ds.pipeline._restart_index(decoder, sample) is not None
    assert indexed == {key: not key.endswith((".png", "ink.jpg")) for key in indexed}  # CMYK: not a JPEG record
    original = fastdata.dataset(datasets["lmdb", "original"], augment="train", image_size=48)
    assert original.pipeline.jpeg_layout == "original"
    sample = original.encoded(0)
    assert sample.codec == CODEC_CV_JPEG and original.pipeline._restart_index(decoder, sample) is None


def test_a_library_failing_the_restart_self_check_falls_back_with_one_warning(datasets, monkeypatch):
    monkeypatch.setattr(pipeline_module, "restart_failure", lambda decoder: "the 4:2:0 probe differs")
    expected = batches(datasets["lmdb", "original"], augment="train", seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = batches(datasets["lmdb", "restart"], augment="train", seed=3)
    said = [w for w in caught if "restart self-check" in str(w.message)]
    assert len(said) == 1 and "the 4:2:0 probe differs" in str(said[0].message)
    for (images, _), (want, _) in zip(got, expected, strict=True):
        assert np.array_equal(images, want)


@pytest.mark.parametrize("first", ["original", "restart"])
def test_a_mixture_with_a_restart_source_gives_the_original_layouts_batches(datasets, first):
    second = "restart" if first == "original" else "original"
    mixture = [datasets["lmdb", first], datasets["lmdb", second]]
    loader = seeded_loader(mixture, weights=[1, 1], batch_size=4, image_size=48, seed=4)
    assert loader.dataset.pipeline.jpeg_layout == "restart"
    expected = batches([datasets["lmdb", "original"]] * 2, weights=[1, 1], image_size=48, seed=4)
    got = batches(mixture, weights=[1, 1], image_size=48, seed=4)
    assert len(got) == len(expected)
    for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
        assert np.array_equal(labels, want_labels) and np.array_equal(images, want_images)
