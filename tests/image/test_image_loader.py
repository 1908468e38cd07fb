"""fastdata.loader / fastdata.dataset on the read side: batch shapes, len, exactly-once epochs, seeded order,
epochs, shuffle=False, worker start methods, albumentations and callables, on_error."""

from __future__ import annotations

from collections import Counter

import albumentations as A
import numpy as np
import pytest
import torch
from builders.damaged import corrupt_copy, corrupt_ids_copy
from builders.images import SOLID_COUNT, sample_id_of, solid_id_of_path, solid_label

import fastdata
from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.formats.wds import iter_shard

SIZE = 16
BATCH = 8


def epoch_batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


def ids_of(batches) -> list[int]:
    return [sample_id_of(image) for images, _ in batches for image in images]


def labels_of(batches) -> list[int]:
    return [int(label) for _, labels in batches for label in labels]


def assert_same_batches(a, b) -> None:
    assert len(a) == len(b)
    for (images_a, labels_a), (images_b, labels_b) in zip(a, b, strict=True):
        assert torch.equal(labels_a, labels_b)
        assert torch.equal(images_a, images_b)


def make_loader(path, **kwargs):
    """A loader with this file's settings; image_size=SIZE for the presets (a custom transform sets its own)."""
    options = dict(batch_size=BATCH, augment="train", num_workers=0, seed=0)
    options.update(kwargs)
    if isinstance(options["augment"], str):
        options.setdefault("image_size", SIZE)
    return fastdata.loader(path, **options)


def run(path, epochs: int = 1, first_epoch: int | None = None, **kwargs):
    """The batches of `epochs` consecutive passes of a fresh loader (which is gone when this returns)."""
    loader = make_loader(path, **kwargs)
    if first_epoch is not None:
        loader.set_epoch(first_epoch)
    return [epoch_batches(loader) for _ in range(epochs)]


def items(path, indices, **kwargs):
    """`dataset(path, **kwargs)[i]` for each i, from a dataset that is gone when this returns."""
    ds = fastdata.dataset(path, **kwargs)
    return [ds[i] for i in indices]


def test_batches_look_like_an_imagefolder_dataloader(solid):
    loader = make_loader(solid)
    batches = epoch_batches(loader)
    assert loader.classes == ["alpha", "beta", "gamma"]
    for images, labels in batches:
        assert images.dtype == torch.uint8
        assert labels.dtype == torch.int64
        assert images.shape[1:] == (3, SIZE, SIZE)
        assert labels.shape == (images.shape[0],)
        assert 1 <= len(labels) <= BATCH
    assert sum(len(labels) for _, labels in batches) == SOLID_COUNT


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_len_and_exactly_once_per_epoch(solid, num_workers, drop_last):
    loader = make_loader(solid, num_workers=num_workers, drop_last=drop_last)
    for epoch in range(3):
        expected = len(loader)  # asked before the pass, as tqdm(loader) or a LR schedule would
        batches = epoch_batches(loader)
        assert len(batches) == expected, f"epoch {epoch}: len() said {expected}, got {len(batches)}"
        ids = ids_of(batches)
        assert len(ids) == len(set(ids)), f"epoch {epoch}: a sample came twice"
        assert set(ids) <= set(range(SOLID_COUNT))
        assert labels_of(batches) == [solid_label(i) for i in ids]  # label belongs to its image
        if drop_last:
            assert all(len(labels) == BATCH for _, labels in batches)
        else:
            assert sorted(ids) == list(range(SOLID_COUNT))
            assert Counter(labels_of(batches)) == Counter(solid_label(i) for i in range(SOLID_COUNT))


def test_lmdb_len_values(solid_lmdb):
    assert len(make_loader(solid_lmdb)) == 6
    assert len(make_loader(solid_lmdb, drop_last=True)) == 5


def test_same_seed_same_batches_on_any_worker_count(solid_lmdb):
    multi = run(solid_lmdb, epochs=2, num_workers=2, seed=5)
    single = run(solid_lmdb, epochs=2, num_workers=0, seed=5)
    for epoch in range(2):
        assert_same_batches(single[epoch], multi[epoch])
    assert ids_of(single[0]) != ids_of(single[1])
    other_seed = run(solid_lmdb, seed=6)[0]
    assert ids_of(other_seed) != ids_of(single[0])


def test_augmentation_is_random_but_seeded(solid_lmdb):
    """With the train preset the same sample is cropped differently in different epochs."""
    first, second = run(solid_lmdb, epochs=2, shuffle=False)
    assert ids_of(first) == ids_of(second)
    assert sorted(ids_of(first)) == list(range(SOLID_COUNT))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, second, strict=True))
    # about half of the crops are mirrored: their red gradient falls from left to right
    slopes = [float(img[0, :, -1].float().mean() - img[0, :, 0].float().mean())
              for images, _ in first + second for img in images]
    mirrored = sum(slope < -4 for slope in slopes)
    assert 0.2 * len(slopes) < mirrored < 0.8 * len(slopes)
    assert sum(slope > 4 for slope in slopes) > 0.2 * len(slopes)


def test_batches_are_rgb(solid):
    """Red grows left to right, blue top to bottom, green is the id: channel order and orientation kept."""
    batches = run(solid, augment="val", shuffle=False)[0]
    for images, _ in batches:
        for img in images.float():
            assert img[0, :, -1].mean() > img[0, :, 0].mean() + 40
            assert img[2, -1].mean() > img[2, 0].mean() + 40
            assert float(img[1].max() - img[1].min()) <= 4  # green is flat


def test_next_pass_is_the_next_epoch_and_set_epoch_reproduces(solid):
    loader = make_loader(solid, seed=1)
    assert loader.epoch == 0
    epoch0 = epoch_batches(loader)
    assert loader.epoch == 1
    epoch1 = epoch_batches(loader)
    assert loader.epoch == 2
    assert ids_of(epoch0) != ids_of(epoch1)
    assert sorted(ids_of(epoch0)) == sorted(ids_of(epoch1)) == list(range(SOLID_COUNT))
    loader.set_epoch(1)
    assert_same_batches(epoch_batches(loader), epoch1)
    loader.set_epoch(0)
    assert_same_batches(epoch_batches(loader), epoch0)
    del loader
    assert_same_batches(run(solid, seed=1, first_epoch=1)[0], epoch1)


def test_shuffle_false_gives_dataset_order_lmdb(solid_lmdb):
    first, second = run(solid_lmdb, epochs=2, augment="val", shuffle=False)
    ds = fastdata.dataset(solid_lmdb, augment="val", image_size=SIZE)
    expected_ids = [solid_id_of_path(p) for p, _ in ds.samples]
    assert ids_of(first) == expected_ids
    assert labels_of(first) == ds.targets
    images = torch.cat([b[0] for b in first])
    for i in range(len(ds)):
        assert torch.equal(images[i], ds[i][0])
    assert_same_batches(first, second)  # unshuffled: every epoch alike (val is not random)


def test_shuffle_false_gives_stored_order_wds(solid_wds):
    shards = [solid_wds / f.name for f in fastdata.info(solid_wds).files]
    stored = [meta["path"] for shard in shards for *_, meta in iter_shard(shard)]
    assert ids_of(run(solid_wds, augment="val", shuffle=False)[0]) == [solid_id_of_path(p) for p in stored]


def test_val_preset_is_a_center_crop(solid_lmdb):
    indices = range(0, SOLID_COUNT, 7)
    full = items(solid_lmdb, indices)
    ds = fastdata.dataset(solid_lmdb, augment="val", image_size=SIZE)
    for i, (full_image, full_label) in zip(indices, full, strict=True):
        image, label = ds[i]
        assert image.shape == (3, SIZE, SIZE) and label == full_label
        assert sample_id_of(image) == sample_id_of(full_image)
        assert torch.equal(image, ds[i][0])  # deterministic
        # red grows left to right and blue top to bottom, in the crop as in the source
        red, blue = image[0].float(), image[2].float()
        assert red[:, -1].mean() > red[:, 0].mean() + 40
        assert blue[-1].mean() > blue[0].mean() + 40
        # the central 7/8: the corner pixel is not the source corner
        assert int(image[0, 0, 0]) > 0 and int(image[0, 0, -1]) < 255


def test_spawn_workers(solid_lmdb):
    spawned = run(solid_lmdb, epochs=2, num_workers=1, seed=2, multiprocessing_context="spawn")
    reference = run(solid_lmdb, epochs=2, num_workers=0, seed=2)
    for epoch in range(2):
        assert_same_batches(spawned[epoch], reference[epoch])


def test_fork_workers_follow_epochs(solid_wds):
    loader = make_loader(solid_wds, num_workers=2, seed=3, multiprocessing_context="fork")
    epoch0, epoch1 = epoch_batches(loader), epoch_batches(loader)
    assert sorted(ids_of(epoch0)) == sorted(ids_of(epoch1)) == list(range(SOLID_COUNT))
    assert ids_of(epoch0) != ids_of(epoch1)
    loader.set_epoch(0)
    assert_same_batches(epoch_batches(loader), epoch0)


def crop_flip():
    return A.Compose([A.RandomCrop(SIZE, SIZE), A.HorizontalFlip(p=0.5)])


def test_albumentations_compose_is_deterministic_for_a_seed(solid_lmdb):
    one = run(solid_lmdb, augment=crop_flip(), seed=4)[0]
    two = run(solid_lmdb, augment=crop_flip(), seed=4)[0]
    assert_same_batches(one, two)
    assert all(images.shape[1:] == (3, SIZE, SIZE) for images, _ in one)
    assert sorted(ids_of(one)) == list(range(SOLID_COUNT))
    assert ids_of(run(solid_lmdb, augment=crop_flip(), seed=9)[0]) != ids_of(one)
    # the transform draws are seeded per sample too: same order, different seed -> different crops
    unshuffled = [run(solid_lmdb, augment=crop_flip(), seed=s, shuffle=False)[0] for s in (4, 9)]
    assert ids_of(unshuffled[0]) == ids_of(unshuffled[1])
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(*unshuffled, strict=True))
    # some crops are mirrored: red then falls from left to right
    directions = {bool(img[0, :, -1].float().mean() > img[0, :, 0].float().mean())
                  for images, _ in one for img in images}
    assert directions == {True, False}
    # and a dataset item is reproducible for its epoch: each read is the next epoch, unless one is pinned
    ds = fastdata.dataset(solid_lmdb, augment=crop_flip(), seed=4)
    first, second = ds[3][0], ds[3][0]
    ds.set_epoch(0)
    assert torch.equal(ds[3][0], first) and torch.equal(ds[3][0], first)
    ds.set_epoch(1)
    assert torch.equal(ds[3][0], second) and ds[3][0].shape == (3, SIZE, SIZE)


def test_callable_augment(solid_lmdb):
    (full_image, _), = items(solid_lmdb, [0])
    (image, _), = items(solid_lmdb, [0], augment=lambda image: image[:SIZE, :SIZE])
    assert torch.equal(image, full_image[:, :SIZE, :SIZE])
    batches = run(solid_lmdb, augment=lambda image: np.ascontiguousarray(image[:SIZE, :SIZE][:, ::-1]))[0]
    assert sorted(ids_of(batches)) == list(range(SOLID_COUNT))
    assert all(images.shape[1:] == (3, SIZE, SIZE) for images, _ in batches)


def test_bad_options_are_config_errors(solid_lmdb):
    with pytest.raises(ConfigError):
        make_loader(solid_lmdb, batch_size=0)
    with pytest.raises(ConfigError):
        make_loader(solid_lmdb, num_workers=-1)
    with pytest.raises(ConfigError, match="preset"):
        make_loader(solid_lmdb, augment="bogus")
    with pytest.raises(ConfigError):
        make_loader(solid_lmdb, on_error="ignore")
    with pytest.raises(ConfigError):
        make_loader(solid_lmdb, image_size=0)


# ---------------------------------------------------------------------------------------------- on_error


PAYLOADS = {"garbage": b"this is not an image, it was overwritten" * 3, "empty": b""}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_on_error_skip_drops_and_reports_the_sample(solid_lmdb, tmp_path, payload, num_workers):
    path, key = corrupt_copy(solid_lmdb, tmp_path, 7, PAYLOADS[payload])
    loader = make_loader(path, on_error="skip", num_workers=num_workers)
    batches = epoch_batches(loader)
    ids = ids_of(batches)
    assert sorted(ids) == sorted(set(range(SOLID_COUNT)) - {solid_id_of_path(key)})
    assert [k for k, _ in loader.skipped] == [key]
    assert all(reason for _, reason in loader.skipped)


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_on_error_raise_names_the_sample(solid_lmdb, tmp_path, payload):
    path, key = corrupt_copy(solid_lmdb, tmp_path, 7, PAYLOADS[payload])
    with pytest.raises(CorruptSampleError, match=key):
        run(path, on_error="raise")
    ds = fastdata.dataset(path)
    with pytest.raises(CorruptSampleError, match=key):
        ds[7]
    assert ds[6][0].shape[0] == 3  # the others still read


# ------------------------------------------------------------------------------ one dataset, several readers


def test_two_datasets_on_one_path_in_one_process(solid_lmdb):
    """E.g. a train and an eval view of the same file, or a dataset opened to look at while a loader runs."""
    plain = fastdata.dataset(solid_lmdb)
    val = fastdata.dataset(solid_lmdb, augment="val", image_size=SIZE)
    assert sample_id_of(plain[0][0]) == sample_id_of(val[0][0])
    batches = run(solid_lmdb)[0]
    assert sorted(ids_of(batches)) == list(range(SOLID_COUNT))


def test_worker_processes_after_the_main_process_read_the_dataset(solid_lmdb):
    ds = fastdata.dataset(solid_lmdb)
    first_id = sample_id_of(ds[0][0])
    batches = run(solid_lmdb, num_workers=2, shuffle=False, augment="val", multiprocessing_context="fork")[0]
    assert ids_of(batches)[0] == first_id
    assert sorted(ids_of(batches)) == list(range(SOLID_COUNT))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_every_rank_yields_len_batches_when_skips_empty_a_batch(fmt, num_workers, solid_lmdb, solid_wds, tmp_path):
    """2 ranks, on_error="skip": rank 0's batch 1 loses every sample, its batch 2 loses one. Both ranks still
    yield len(loader) batches; the empty batch borrows one sample (counted, warned once), the other is not
    padded, and `skipped` lists exactly the corrupt samples."""
    source = solid_lmdb if fmt == "lmdb" else solid_wds
    options = dict(batch_size=3, shuffle=True, augment="val", world_size=2, num_workers=num_workers)
    clean = [ids_of(epoch_batches(make_loader(source, rank=rank, **options))) for rank in range(2)]
    rank0 = [clean[0][i:i + 3] for i in range(0, len(clean[0]), 3)]
    emptied, thinned = set(rank0[1]), rank0[2][0]
    path = corrupt_ids_copy(source, tmp_path, emptied | {thinned})
    for rank in range(2):
        loader = make_loader(path, rank=rank, on_error="skip", **options)
        if rank == 0:
            with pytest.warns(UserWarning, match=r"every sample of batch 1 of epoch 0 was skipped"):
                batches = epoch_batches(loader)
        else:
            batches = epoch_batches(loader)
        assert len(batches) == len(loader) == len(rank0)
        got = [ids_of([batch]) for batch in batches]
        if rank == 0:
            lender = rank0[2][1]  # the first decodable sample after the emptied batch
            assert got[1] == [lender] and loader.borrowed == [(0, 1, loader.borrowed[0][2])]
            assert solid_id_of_path(loader.borrowed[0][2]) == lender
            assert got[2] == rank0[2][1:]  # kept one sample short, not padded
            assert sorted(solid_id_of_path(k) for k, _ in loader.skipped) == sorted(emptied | {thinned})
            assert [x for i, ids in enumerate(got) if i != 1 for x in ids] == \
                [x for x in clean[0] if x not in emptied | {thinned}]
        else:
            assert got == [clean[1][i:i + 3] for i in range(0, len(clean[1]), 3)] and not loader.borrowed
        second = epoch_batches(loader)  # the next epoch (reshuffled) meets bad samples again: each listed once
        assert len(second) == len(loader)
        keys = [key for key, _ in loader.skipped]
        assert len(keys) == len(set(keys)) and {solid_id_of_path(k) for k in keys} <= emptied | {thinned}
        if rank == 0:
            assert len(keys) == len(emptied) + 1


def test_a_rank_with_nothing_decodable_raises(solid_lmdb, tmp_path):
    path = corrupt_ids_copy(solid_lmdb, tmp_path, set(range(SOLID_COUNT)))
    with pytest.raises(CorruptSampleError, match="nothing to train on"):
        epoch_batches(make_loader(path, on_error="skip", augment="val"))


def shifted_by_global_rngs(image):
    """A plain callable that draws from all three global RNGs (as torchvision v1 transforms and ad-hoc code do)."""
    import random

    dx = np.random.randint(0, 4) + random.randint(0, 3) + int(torch.randint(0, 4, ()))
    return np.ascontiguousarray(np.roll(image, dx, axis=1)[:SIZE, :SIZE])


def global_rng_states():
    import random

    return random.getstate(), np.random.get_state(), torch.get_rng_state().clone()


def test_plain_callable_gets_the_samples_seed_whatever_the_workers(solid_lmdb):
    import random

    start = global_rng_states()
    run(solid_lmdb, epochs=2, augment=lambda image: np.ascontiguousarray(image[:SIZE, :SIZE]), num_workers=0)
    expected = global_rng_states()  # what the loop itself draws (torch's DataLoader takes a base seed per pass)
    random.setstate(start[0])
    np.random.set_state(start[1])
    torch.set_rng_state(start[2])
    zero = run(solid_lmdb, epochs=2, augment=shifted_by_global_rngs, num_workers=0)
    after = global_rng_states()  # the transform's seeding left the training process's own streams alone
    assert after[0] == expected[0] and torch.equal(after[2], expected[2])
    assert np.array_equal(after[1][1], expected[1][1]) and after[1][2:] == expected[1][2:]
    two = run(solid_lmdb, epochs=2, augment=shifted_by_global_rngs, num_workers=2)
    for a, b in zip(zero, two, strict=True):
        assert_same_batches(a, b)
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(zero[0], zero[1], strict=True))  # epochs differ


def test_callable_with_an_rng_parameter_gets_a_seeded_generator(solid_lmdb):
    seen = []

    def crop(image, rng):
        seen.append(type(rng))
        top = int(rng.integers(0, 3))
        return np.ascontiguousarray(image[top:top + SIZE, :SIZE])

    one, two = run(solid_lmdb, augment=crop)[0], run(solid_lmdb, augment=crop)[0]
    assert_same_batches(one, two)
    assert set(seen) == {np.random.Generator}


def test_a_shape_error_after_a_skip_names_the_right_sample(solid_lmdb, tmp_path):
    path, corrupt_key = corrupt_copy(solid_lmdb, tmp_path, 0, b"not an image")
    ds = fastdata.dataset(solid_lmdb)
    shapes = [tuple(ds[i][0].shape) for i in range(1, 8)]
    odd = next(i for i in range(1, 8) if shapes[i - 1] != shapes[0])  # first sample sized unlike sample 1
    loader = make_loader(path, augment=None, shuffle=False, on_error="skip", batch_size=odd + 1)
    with pytest.raises(ConfigError) as error:
        next(iter(loader))
    assert corrupt_key not in str(error.value) and repr(ds.reader.key(odd)) in str(error.value)


def test_an_emptied_batch_borrows_on_the_device_path_too(solid_lmdb, tmp_path):
    """decode="device" (device="cpu" runs the same code): the emptied batch is found after the device decode
    and still borrows, so the rank yields len(loader) batches."""
    options = dict(batch_size=3, shuffle=False, augment="val", num_workers=2)
    clean = ids_of(epoch_batches(make_loader(solid_lmdb, **options)))
    emptied = set(clean[3:6])
    path = corrupt_ids_copy(solid_lmdb, tmp_path, emptied)
    loader = make_loader(path, on_error="skip", device="cpu", decode="device", **options)
    with pytest.warns(UserWarning, match="borrowed"):
        batches = epoch_batches(loader)
    assert len(batches) == len(loader) and ids_of(batches[1:2]) == [clean[6]]
    assert [solid_id_of_path(key) for _, _, key in loader.borrowed] == [clean[6]]
