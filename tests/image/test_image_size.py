"""Progressive resizing: `loader.set_image_size(size)` takes effect at the next epoch that starts from its
beginning, on the worker path (persistent workers that run ahead into the next epoch included) and on the device
path; `state_dict()` carries the sizes, so a run resumed from any checkpoint into a loader built with the original
size yields exactly the uninterrupted run's batches."""

from __future__ import annotations

import pytest
from builders import seeded_loader
from contracts import clone, same, training_loop

from fastdata.errors import ConfigError
from fastdata.presets import RandomResizedCrop, TrivialAugmentWide

RRC = RandomResizedCrop

#: FFCV-like: low resolution first, rising, one change in the middle of an epoch's run of equal sizes
SCHEDULE = [16, 16, 20, 24, 24]


def size_at(epoch: int) -> int:
    return SCHEDULE[epoch]


def scheduled(loader, epoch: int) -> None:
    """Each epoch's size set before its pass, as FFCV's recipes do."""
    loader.set_image_size(size_at(epoch))


@pytest.mark.parametrize(("fmt", "workers"), [("lmdb", 0), ("lmdb", 2), ("wds", 0), ("wds", 2)])
def test_a_resumed_schedule_sees_exactly_the_uninterrupted_run(fmt, workers, solid_lmdb, solid_wds):
    path = solid_lmdb if fmt == "lmdb" else solid_wds

    def make():
        return seeded_loader(path, augment=[RRC(16), TrivialAugmentWide()], num_workers=workers)

    reference, checkpoints = training_loop(make, len(SCHEDULE), 4, each_epoch=scheduled)
    assert [batch[0].shape[-1] for batch in reference[::6]] == SCHEDULE  # 6 batches an epoch
    for epoch, state, count in checkpoints:
        resumed, _ = training_loop(make, len(SCHEDULE), 4, restore=(epoch, state), each_epoch=scheduled)
        assert same(resumed, reference[count:]), f"resumed after {count} batches (epoch {epoch})"


def test_the_size_applies_from_the_next_epoch_that_starts(solid_lmdb):
    loader = seeded_loader(solid_lmdb, augment=RandomResizedCrop(16), num_workers=2)
    assert loader.image_size == 16
    loader.set_image_size(20)  # before the pass: this epoch
    assert loader.image_size == 20
    batches = iter(loader)
    assert next(batches)[0].shape[-1] == 20
    loader.set_image_size((12, 18))  # during the pass: the next epoch
    assert [b[0].shape[-2:] for b in batches] == [(20, 20)] * 5
    assert loader.image_size == (12, 18)
    assert {b[0].shape[-2:] for b in loader} == {(12, 18)}
    loader.set_image_size(12)
    assert {b[0].shape[-2:] for b in loader} == {(12, 12)}


def test_a_change_made_while_the_workers_run_ahead_is_kept(solid_lmdb):
    """Persistent workers go on into the next epoch before its pass (rollover): a size set during the pass drops
    what they made ahead, so the next epoch is exactly a fresh loader's at that size."""
    loader = seeded_loader(solid_lmdb, augment=RandomResizedCrop(16), num_workers=2, prefetch_factor=4)
    for count, _ in enumerate(loader, start=1):
        if count == 5:  # by now the workers have made epoch 1's first batches, at 16 px
            loader.set_image_size(20)
    second = [clone(b) for b in loader]
    fresh = seeded_loader(solid_lmdb, augment=RandomResizedCrop(20), num_workers=0)
    fresh.set_epoch(1)
    assert same(second, [clone(b) for b in fresh])


def test_a_state_without_sizes_is_the_built_size(solid_lmdb):
    """A state saved before loaders carried sizes (or by an older fastdata) restores at the size the loader was
    built with, whatever was set on it before."""
    state = seeded_loader(solid_lmdb, augment=RandomResizedCrop(16)).state_dict()
    del state["image_sizes"]
    loader = seeded_loader(solid_lmdb, augment=RandomResizedCrop(16))
    loader.set_image_size(24)
    loader.load_state_dict(state)
    assert {b[0].shape[-1] for b in loader} == {16}


def test_the_device_path_follows_the_size(photos):
    """decode="device" (here on the CPU): the output slots are remade at each new size, and the feeder does not
    run ahead into an epoch of another size (whose PNGs, decoded in the workers, come at the new size)."""
    loader = seeded_loader(photos[0], augment=RandomResizedCrop(16), num_workers=1, decode="device", device="cpu")
    reference = seeded_loader(photos[0], augment=RandomResizedCrop(16), num_workers=0, decode="device",
                              device="cpu")
    sizes = [16, 24, 24, 12, 12]
    for epoch, size in enumerate(sizes):
        got = []
        for batch in loader:
            got.append(clone(batch))
            if len(got) == 1 and epoch + 1 < len(sizes):
                loader.set_image_size(sizes[epoch + 1])  # during the pass: for the next epoch
        assert {b[0].shape[-1] for b in got} == {size}
        reference.set_epoch(epoch)
        reference.set_image_size(size)
        assert same(got, [clone(b) for b in reference])
    loader.close()


def test_set_image_size_is_refused_where_the_size_is_not_the_loaders(solid_lmdb):
    loader = seeded_loader(solid_lmdb, augment=lambda image: image[:8, :8])
    assert loader.image_size is None
    with pytest.raises(ConfigError, match="custom transform"):
        loader.set_image_size(16)
    with pytest.raises(ConfigError, match="image_size"):
        seeded_loader(solid_lmdb, augment=RandomResizedCrop(16)).set_image_size(0)
