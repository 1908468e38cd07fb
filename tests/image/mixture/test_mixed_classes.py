"""A mixture's label space when its datasets name their classes differently: an ImageFolder conversion (classes
sorted, as torchvision's ImageFolder has them) mixed with a Hugging Face `datasets` conversion whose ClassLabel
holds the same names in another order is one label space, merged by name and said once (not twice as many
classes for the same names); lists that share only some names are refused in one line unless a rule is chosen;
each rule's map is exposed, and every sample's label is its own class's."""

from __future__ import annotations

import warnings

import pytest
from builders.images import (
    SMALL_SOLID_COUNT,
    SOLID_CLASSES,
    build_solid_tree,
    sample_id_of,
    solid_id_of_path,
    solid_label,
)

import fastdata
from fastdata.errors import ConfigError, ResumeError
from fastdata.options import MixOptions

#: the HF dataset's ClassLabel order: the ImageFolder's names, in another order
HF_ORDER = ("gamma", "alpha", "beta")


def _hf_conversion(tree, out, names):
    """The solid `tree` as a `datasets.Dataset` whose ClassLabel has `names` (each sample labelled with its own
    class's name), saved and converted with `fastdata.convert_hf`."""
    from datasets import ClassLabel, Dataset, Features, Image

    rows = sorted(tree.images, key=solid_id_of_path)
    labels = [names.index(SOLID_CLASSES[solid_label(solid_id_of_path(r))]) for r in rows]
    data = Dataset.from_dict({"image": [{"bytes": tree.path(r).read_bytes(), "path": r} for r in rows],
                              "label": labels},
                             features=Features({"image": Image(), "label": ClassLabel(names=list(names))}))
    data.save_to_disk(str(out.parent / f"{out.stem}-saved"))
    fastdata.convert_hf(str(out.parent / f"{out.stem}-saved"), out, fastdata.HfOptions(workers=1, progress=False))
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory, small_solid_tree):
    """folder.lmdb (ImageFolder: alpha, beta, gamma), hf.lmdb (HF ClassLabel: gamma, alpha, beta), partial.lmdb
    (HF ClassLabel: alpha, beta, delta: shares two names)."""
    root = tmp_path_factory.mktemp("mixed_classes")
    folder = root / "folder.lmdb"
    fastdata.convert_imagefolder(small_solid_tree.root, folder, fastdata.ImageFolderOptions(workers=1, progress=False))
    hf = _hf_conversion(small_solid_tree, root / "hf.lmdb", HF_ORDER)
    other = build_solid_tree(root / "other", count=SMALL_SOLID_COUNT, classes=("alpha", "beta", "delta"))
    partial = root / "partial.lmdb"
    fastdata.convert_imagefolder(other.root, partial, fastdata.ImageFolderOptions(workers=1, progress=False))
    return {"folder": folder, "hf": hf, "partial": partial}


def test_the_conversions_keep_their_own_class_orders(sources):
    assert fastdata.dataset(sources["folder"]).classes == list(SOLID_CLASSES)
    assert fastdata.dataset(sources["hf"]).classes == list(HF_ORDER)


def _labels_follow_the_samples(batches, classes):
    seen = 0
    for images, labels in batches:
        for image, label in zip(images, labels.tolist(), strict=True):
            assert classes[label] == SOLID_CLASSES[solid_label(sample_id_of(image))]
            seen += 1
    return seen


def test_the_same_names_in_another_order_are_merged_by_name_and_said_once(sources):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fastdata.loader([sources["folder"], sources["hf"]], batch_size=6, image_size=16, num_workers=0,
                                 augment="val")
    said = [str(w.message) for w in caught if "merged by name" in str(w.message)]
    assert len(said) == 1 and str(sources["hf"]) in said[0] and str(sources["folder"]) in said[0]
    assert "{0: 2, 1: 0, 2: 1}" in said[0] and "3 classes" in said[0]
    assert loader.classes == list(SOLID_CLASSES)  # 3 classes for 3 names, in the first dataset's order
    assert loader.class_maps == {"folder": [0, 1, 2], "hf": [2, 0, 1]}
    for _ in range(2):
        assert _labels_follow_the_samples(loader, loader.classes) == len(loader.dataset)


def test_fastdata_mix_merges_the_same_way(sources):
    with pytest.warns(UserWarning, match="merged by name"):
        mixture = fastdata.mix([sources["hf"], sources["folder"]], batch_size=4, augment="val", image_size=16)
    assert mixture.classes == list(HF_ORDER) and mixture.class_maps == {"hf": [0, 1, 2], "folder": [1, 2, 0]}
    for index in range(len(mixture.dataset)):
        image, label = mixture.dataset[index]
        assert mixture.classes[label] == SOLID_CLASSES[solid_label(sample_id_of(image))]


def test_names_shared_only_in_part_are_refused_in_one_line(sources):
    with pytest.raises(ConfigError) as raised:
        fastdata.loader([sources["folder"], sources["partial"]], image_size=16, num_workers=0)
    message = str(raised.value)
    assert "\n" not in message and str(sources["folder"]) in message and str(sources["partial"]) in message
    assert "share 2 class names ('alpha', 'beta') but not 2 others" in message
    assert "MixOptions(classes='by_name')" in message and "classes='per_dataset'" in message


def test_a_rule_decides_where_names_are_shared_in_part(sources):
    paths = [sources["hf"], sources["partial"]]
    by_name = fastdata.loader(paths, image_size=16, num_workers=0, mixing=MixOptions(classes="by_name"))
    assert by_name.classes == ["gamma", "alpha", "beta", "delta"]
    assert by_name.class_maps == {"hf": [0, 1, 2], "partial": [1, 2, 3]}
    apart = fastdata.loader(paths, image_size=16, num_workers=0, mixing=MixOptions(classes="per_dataset"))
    assert apart.classes == ["hf/gamma", "hf/alpha", "hf/beta", "partial/alpha", "partial/beta", "partial/delta"]
    assert apart.class_maps == {"hf": [0, 1, 2], "partial": [3, 4, 5]}
    for loader in (by_name, apart):
        for images, labels in loader:
            assert images.shape[0] == labels.shape[0] and labels.max() < len(loader.classes)


def test_a_state_of_another_label_space_is_refused(sources):
    paths = [sources["hf"], sources["partial"]]
    by_name = fastdata.loader(paths, image_size=16, num_workers=0, mixing=MixOptions(classes="by_name"))
    apart = fastdata.loader(paths, image_size=16, num_workers=0, mixing=MixOptions(classes="per_dataset"))
    with pytest.raises(ResumeError, match="classes="):
        apart.load_state_dict(by_name.state_dict())


def test_classes_is_for_image_mixtures(solid_lmdb, text_mix):
    with pytest.raises(ConfigError, match="classes: for image datasets only; the mixture holds text"):
        fastdata.loader(list(text_mix[:2]), num_workers=0, mixing=MixOptions(classes="by_name"),
                        text=fastdata.TextOptions(seq_len=8))
    with pytest.raises(ConfigError, match="apply to a mixture"):
        fastdata.loader(solid_lmdb, mixing=MixOptions(classes="by_name"))
    with pytest.raises(ConfigError, match=r"classes must be one of \('auto', 'by_name', 'per_dataset'\)"):
        MixOptions(classes="union")
