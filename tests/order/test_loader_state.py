"""Loader state: states are small, JSON, versioned; refused (every difference named) when they cannot continue
the same order; kept or dropped (with a warning) by set_epoch; and carried to another world size where the order
allows it. The resume contract itself is checked per loader (tests/image, tests/text: contracts.py)."""

from __future__ import annotations

import json

import pytest
from builders.images import SOLID_COUNT, sample_id_of
from builders.runs import seeded_loader
from contracts import clone, same

from fastdata.errors import ResumeError


def test_set_epoch_to_another_epoch_after_restore_warns(solid_lmdb):
    loader = seeded_loader(solid_lmdb)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    restored = seeded_loader(solid_lmdb)
    restored.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(2\) drops the place restored by load_state_dict \(epoch 0, "
                                         r"after 1 batches\)"):
        restored.set_epoch(2)
    assert restored.epoch == 2 and restored.state_dict()["batches"] == 0


def test_state_is_small_versioned_json(solid_wds):
    loader = seeded_loader(solid_wds)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert len(json.dumps(state)) < 600
    assert state["version"] == 1 and state["epoch"] == 0 and state["batches"] == 1
    for _ in iterator:
        pass
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batches"] == 0


def test_break_then_state_then_set_epoch(solid_lmdb):
    loader = seeded_loader(solid_lmdb)
    full = [clone(b) for b in loader]
    loader.set_epoch(0)
    for n, _batch in enumerate(loader):
        if n == 2:
            break
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 3)
    restored = seeded_loader(solid_lmdb)
    restored.load_state_dict(state)
    restored.set_epoch(0)  # a training loop calls set_epoch(epoch) first: the place in epoch 0 is kept
    assert restored.epoch == 0 and same([clone(b) for b in restored], full[3:])
    restored.load_state_dict(state)
    with pytest.warns(UserWarning, match="drops the place"):
        restored.set_epoch(1)  # another epoch: from its beginning, with a warning that the place was dropped
    assert restored.state_dict()["batches"] == 0 and len([clone(b) for b in restored]) == len(full)


def test_states_that_would_change_the_order_are_refused(solid_lmdb, solid_wds):
    loader = seeded_loader(solid_lmdb)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ResumeError, match=r"batch_size=8 in the state, 4 here"):
        seeded_loader(solid_lmdb, batch_size=4).load_state_dict(state)
    with pytest.raises(ResumeError, match="seed"):
        seeded_loader(solid_lmdb, seed=8).load_state_dict(state)
    with pytest.raises(ResumeError, match="format"):
        seeded_loader(solid_wds).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"image_size=16 in the state, 24 here"):
        seeded_loader(solid_lmdb, image_size=24).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"augment=.*RandomResizedCropFlip.* in the state, .*ResizeCenterCrop"):
        seeded_loader(solid_lmdb, augment="val").load_state_dict(state)
    with pytest.raises(ResumeError, match=r"augment="):
        seeded_loader(solid_lmdb, augment=None).load_state_dict(state)
    with pytest.raises(ResumeError, match="version 99"):
        seeded_loader(solid_lmdb).load_state_dict({**state, "version": 99})
    with pytest.raises(ResumeError, match="not a fastdata loader state"):
        seeded_loader(solid_lmdb).load_state_dict({"epoch": 3})


def test_states_taken_with_other_transform_parameters_are_refused(solid_lmdb):
    import albumentations as A

    def flips(p):
        return A.Compose([A.HorizontalFlip(p=p), A.Resize(16, 16)])

    loader = seeded_loader(solid_lmdb, augment=flips(0.5))
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ResumeError, match="augment="):
        seeded_loader(solid_lmdb, augment=flips(0.3)).load_state_dict(state)
    seeded_loader(solid_lmdb, augment=flips(0.5)).load_state_dict(state)  # the same pipeline, built again: accepted
    old_state = {**state, "config": {k: v for k, v in state["config"].items() if k != "augment"}}
    seeded_loader(solid_lmdb, augment=flips(0.3)).load_state_dict(old_state)  # saved before transforms were recorded


def ids(batches) -> list[int]:
    return [sample_id_of(image) for images, _ in batches for image in images]


def test_lmdb_resumes_on_another_world_size(solid_lmdb):
    """Saved by 2 ranks after 2 batches each, resumed by 3: every sample of the epoch exactly once (plus the
    documented padding), and the next epoch is the 3-rank epoch."""
    consumed, state = [], None
    for rank in range(2):
        loader = seeded_loader(solid_lmdb, batch_size=4, rank=rank, world_size=2, augment="val")
        iterator = iter(loader)
        consumed += ids([next(iterator), next(iterator)])
        state = loader.state_dict()
    rest, counts = [], set()
    for rank in range(3):
        loader = seeded_loader(solid_lmdb, batch_size=4, rank=rank, world_size=3, augment="val")
        loader.load_state_dict(state)
        batches = [clone(b) for b in loader]
        counts.add(len(batches))
        rest += ids(batches)
        fresh = seeded_loader(solid_lmdb, batch_size=4, rank=rank, world_size=3, augment="val")
        fresh.set_epoch(1)
        assert same([clone(b) for b in loader], [clone(b) for b in fresh])
    assert len(counts) == 1
    together = consumed + rest
    assert set(together) == set(range(SOLID_COUNT))
    assert len(together) - SOLID_COUNT < 3  # padding of the 29 samples left to a multiple of 3


def test_wds_refuses_another_world_size_mid_epoch_only(solid_wds):
    loader = seeded_loader(solid_wds, rank=0, world_size=2)
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(ResumeError, match=r"world_size=2.*world_size=3"):
        seeded_loader(solid_wds, rank=0, world_size=3).load_state_dict(loader.state_dict())
    for _ in iterator:
        pass
    boundary = loader.state_dict()
    other = seeded_loader(solid_wds, rank=1, world_size=3)
    other.load_state_dict(boundary)
    fresh = seeded_loader(solid_wds, rank=1, world_size=3)
    fresh.set_epoch(1)
    assert same([clone(b) for b in other], [clone(b) for b in fresh])
