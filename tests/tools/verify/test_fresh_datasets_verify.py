"""Every dataset `fastdata convert` can make verifies clean right after conversion, and after a loader has read
it: image LMDB and WebDataset, a file list, an HF dataset, COCO, segmentation label maps, image-text pairs, text
LMDB and WebDataset (the conftest's session conversions, each made with default options)."""

from __future__ import annotations

import shutil

import pytest

import fastdata
from fastdata.tools.verify import verify

KINDS = ["solid_lmdb", "solid_wds", "multi_label_lmdb", "coco_lmdb", "seg_rect_lmdb", "pairs_lmdb", "hf", "text lmdb",
         "text wds"]


@pytest.fixture(scope="module")
def hf_lmdb(solid_tree, tmp_path_factory):
    """A saved Hugging Face dataset (made with `datasets`), converted with default options."""
    pytest.importorskip("datasets")
    from builders.hf import hf_dataset

    root = tmp_path_factory.mktemp("hf_verify")
    hf_dataset(solid_tree).save_to_disk(str(root / "saved"))
    fastdata.convert_hf(root / "saved", root / "hf.lmdb", fastdata.HfOptions(workers=1, progress=False))
    return root / "hf.lmdb"


@pytest.fixture
def dataset(request, tmp_path, text_mix):
    """A copy of the kind's conversion (a loader may leave files beside it: tune results, caches)."""
    kind = request.param
    named = {"text lmdb": text_mix[0], "text wds": text_mix[1]}
    source = named.get(kind) or request.getfixturevalue("hf_lmdb" if kind == "hf" else kind)
    return shutil.copytree(source, tmp_path / source.name)


@pytest.mark.parametrize("dataset", KINDS, indirect=True)
def test_a_fresh_dataset_verifies_before_and_after_a_loader_read_it(dataset):
    report = verify(dataset)
    assert report.ok, report.problems
    manifest = fastdata.info(dataset)
    options = {"text": fastdata.TextOptions(seq_len=8)} if manifest.kind == "text" else {"image_size": 16}
    for _ in fastdata.loader(dataset, batch_size=4, num_workers=2, **options):
        pass
    report = verify(dataset, decode=manifest.kind == "image")
    assert report.ok, report.problems
