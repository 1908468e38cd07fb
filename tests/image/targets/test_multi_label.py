"""Multi-label datasets on the read side: every path that hands over labels (worker batches, the device path,
skipped and borrowed samples, DDP ranks, resumed loaders, `fastdata.dataset`) gives multi-hot float32 rows over
the dataset's classes, each matching its own image (the solid samples' ids are in their pixels)."""

from __future__ import annotations

import pytest
import torch
from builders.damaged import corrupt_ids_copy
from builders.images import SOLID_CLASSES, SOLID_COUNT, sample_id_of
from builders.sources import multi_hot, multi_labels
from contracts import check_resumes

import fastdata
from fastdata.image.targets.labels import LabelCodec

SIZE = 16


def make_loader(path, **options):
    settings = dict(batch_size=8, augment="train", image_size=SIZE, num_workers=0, seed=0)
    settings.update(options)
    return fastdata.loader(path, **settings)


def checked_ids(images: torch.Tensor, labels: torch.Tensor) -> list[int]:
    """The sample ids of a batch, after checking that each label row is the multi-hot row of its image's sample."""
    assert labels.dtype == torch.float32 and tuple(labels.shape) == (len(images), len(SOLID_CLASSES))
    ids = [sample_id_of(image.cpu()) for image in images]
    assert labels.cpu().tolist() == [multi_hot(multi_labels(i)) for i in ids]
    return ids


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_batches_carry_multi_hot_labels(multi_label, num_workers):
    loader = make_loader(multi_label, num_workers=num_workers)
    seen = [i for images, labels in loader for i in checked_ids(images, labels)]
    assert sorted(seen) == list(range(SOLID_COUNT))


def test_the_device_path_carries_multi_hot_labels(multi_label):
    loader = make_loader(multi_label, augment="val", device="cpu", decode="device", num_workers=2)
    assert loader.decode == "device"
    seen = [i for images, labels in loader for i in checked_ids(images, labels)]
    assert sorted(seen) == list(range(SOLID_COUNT))


def test_dataset_items_have_multi_hot_labels(multi_label_lmdb, multi_label_wds):
    ds = fastdata.dataset(multi_label_lmdb)
    assert ds.multi_label and ds.classes == list(SOLID_CLASSES)
    for i in range(len(ds)):
        image, label = ds[i]
        assert label.dtype == torch.float32 and label.tolist() == multi_hot(multi_labels(sample_id_of(image)))
    assert ds.targets == [list(multi_labels(sample_id_of(ds[i][0]))) for i in range(len(ds))]
    iterated = [(sample_id_of(image), label.tolist()) for image, label in fastdata.dataset(multi_label_wds)]
    assert sorted(iterated) == [(i, multi_hot(multi_labels(i))) for i in range(SOLID_COUNT)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skipped_and_borrowed_samples_keep_their_labels(multi_label, tmp_path, num_workers):
    options = dict(batch_size=3, shuffle=False, augment="val", num_workers=num_workers)
    clean = [checked_ids(images, labels) for images, labels in make_loader(multi_label, **options)]
    emptied, thinned = set(clean[1]), clean[2][0]  # batch 1 loses every sample, batch 2 one
    path = corrupt_ids_copy(multi_label, tmp_path, emptied | {thinned})
    loader = make_loader(path, on_error="skip", **options)
    with pytest.warns(UserWarning, match="borrowed"):
        got = [checked_ids(images, labels) for images, labels in loader]
    assert len(got) == len(clean)
    assert got[1] == [clean[2][1]] and got[2] == clean[2][1:]  # borrowed from the next batch; one short
    assert len(loader.skipped) == len(emptied) + 1


def test_ranks_split_a_multi_label_epoch(multi_label):
    ranks = [[i for images, labels in make_loader(multi_label, rank=rank, world_size=2, uneven="drop")
              for i in checked_ids(images, labels)] for rank in range(2)]
    assert not set(ranks[0]) & set(ranks[1])
    assert len(ranks[0]) == len(ranks[1]) == SOLID_COUNT // 2


def test_a_multi_label_loader_resumes_exactly(multi_label):
    check_resumes(lambda workers: make_loader(multi_label, num_workers=workers, batch_size=7),
                  lambda batches: [1, batches - 1], workers=2, resume_workers=1)


def test_label_codec_builds_and_checks_labels():
    codec = LabelCodec("multi", 4)
    assert codec.batch([(0, 3), (), (2,)]).tolist() == [[1, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 0]]
    assert tuple(codec.batch([]).shape) == (0, 4)
    assert codec.parse([1, 2]) == (1, 2)
    for bad in ([1, 4], 2, [True], "1"):
        with pytest.raises(ValueError):
            codec.parse(bad)
    single = LabelCodec("single", 4)
    assert single.batch([3, 1]).dtype == torch.int64 and single.one(3) == 3
    with pytest.raises(ValueError):
        single.parse(4)
