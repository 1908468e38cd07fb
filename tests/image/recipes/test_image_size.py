"""Progressive resizing: `loader.set_image_size(size)` takes effect at the next epoch that starts from its
beginning, on the worker path (persistent workers that run ahead into the next epoch included) and on the device
path; `state_dict()` carries the sizes, so a run resumed from any checkpoint into a loader built with the original
size yields exactly the uninterrupted run's batches."""

from __future__ import annotations

import json

import pytest
from builders.runs import seeded_loader
from contracts import check_prefetching_resume, clone, same, training_loop

from fastdata.errors import ConfigError, ResumeError
from fastdata.image.recipes.sizes import CAPACITY, ImageSizes
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


@pytest.mark.parametrize("workers", [0, 2])
def test_a_prefetching_loop_resumes_at_the_sizes_of_its_pending_batches(workers, solid_lmdb):
    """nanoGPT's loop holds batches it has not trained on (`state_dict(pending=2)`), which may belong to the epoch
    before the one under way: the state is at that epoch's size, the next one's step kept."""

    def each_pass(loader):  # the schedule's size for the pass about to start
        loader.set_image_size(size_at(min(loader.epoch, len(SCHEDULE) - 1)))

    def make():
        return seeded_loader(solid_lmdb, augment=RRC(16), num_workers=workers)

    check_prefetching_resume(make, steps=26, every=1, ahead=2, each_pass=each_pass)


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


def test_the_schedule_keeps_its_latest_steps_and_refuses_a_damaged_state():
    sizes = ImageSizes((16, 16))
    for epoch in range(1, 40):
        sizes.set(16 + 8 * (epoch % 2), epoch)  # a change every epoch
    assert len(sizes.steps()) == CAPACITY
    assert [sizes.size_for(e)[0] for e in range(30, 40)] == [16 + 8 * (e % 2) for e in range(30, 40)]
    assert not sizes.set(24, 39)  # already so: nothing changes
    restored = ImageSizes((16, 16))
    restored.apply(restored.parse(json.loads(json.dumps(sizes.state()))))
    assert restored.steps() == sizes.steps()
    for damaged in ([[3, 16, 16], [1, 20, 20]], [[0, 0, 16]], "16", [[0, 16]]):
        with pytest.raises(ResumeError, match="image sizes"):
            restored.parse(damaged)
