"""Memory a user can predict: an evaluation loader (augment="val") holds no worker processes between its passes
unless asked to, a training loader keeps its workers for the next epoch, and a WebDataset image dataset says at
once that it is iterable-only when indexed."""

from __future__ import annotations

import psutil
import pytest

import fastdata
from fastdata.loader import default_persistent_workers


def workers_left_after_a_pass(loader) -> tuple[int, int]:
    """(worker processes seen during one pass, those still alive once it has ended)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    seen: set[int] = set()
    for _ in loader:
        seen |= {p.pid for p in me.children(recursive=True)} - before
    alive = set()
    for pid in seen:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return len(seen), len(alive)


def test_a_val_loader_lets_its_workers_go_after_each_pass(solid_lmdb):
    loader = fastdata.loader(solid_lmdb, batch_size=8, augment="val", image_size=16, num_workers=2, shuffle=False)
    assert loader._loader.persistent_workers is False
    for _ in range(2):  # every pass starts its workers and ends them
        seen, alive = workers_left_after_a_pass(loader)
        assert seen == 2 and alive == 0


def test_a_train_loader_keeps_its_workers_for_the_next_epoch(solid_lmdb):
    loader = fastdata.loader(solid_lmdb, batch_size=8, augment="train", image_size=16, num_workers=2)
    seen, alive = workers_left_after_a_pass(loader)
    assert seen == 2 and alive == 2
    assert workers_left_after_a_pass(loader) == (0, 0)  # the next epoch starts none: the same two serve it
    del loader


def test_persistence_is_the_users_to_choose(solid_lmdb):
    kept = fastdata.loader(solid_lmdb, batch_size=8, augment="val", image_size=16, num_workers=2,
                           persistent_workers=True)
    assert kept._loader.persistent_workers is True
    fresh = fastdata.loader(solid_lmdb, batch_size=8, augment="train", image_size=16, num_workers=2,
                            persistent_workers=False)
    assert fresh._loader.persistent_workers is False
    assert default_persistent_workers("train") and default_persistent_workers(lambda image, seed: image)
    assert not default_persistent_workers("val") and not default_persistent_workers(None)


@pytest.mark.parametrize("open_it", [fastdata.dataset, lambda path: fastdata.dataset(path, "val")])
def test_indexing_a_webdataset_dataset_says_it_is_iterable_only(solid_wds, open_it):
    ds = open_it(solid_wds)
    with pytest.raises(TypeError) as info:
        ds[3]
    message = str(info.value)
    assert "\n" not in message and str(solid_wds) in message and "iterable-only" in message
    assert "fastdata.loader" in message and "LMDB" in message
    image, label = next(iter(ds))  # iterating it works
    assert image.ndim == 3 and isinstance(label, int)
