"""`fastdata.dataset` in the user's own DataLoader draws new augmentations every epoch without any call, for 0
and N workers, persistent or not, LMDB and WebDataset; `set_epoch` pins an epoch's crops exactly, in every worker
(persistent ones included); the same seed gives the same crops whatever the number of workers."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import fastdata


def epochs(dataset, count: int, pin: bool = False, **loader_options) -> list[list[bytes]]:
    """`count` passes of a DataLoader over `dataset`, unshuffled: each pass's images, as bytes, sorted (several
    workers interleave a WebDataset dataset's batches in another order than one process reads them)."""
    loader = DataLoader(dataset, batch_size=4, shuffle=False, **loader_options)
    passes = []
    for epoch in range(count):
        if pin:
            dataset.set_epoch(epoch)
        passes.append(sorted(image.numpy().tobytes() for images, _ in loader for image in images))
    return passes


CASES = [dict(num_workers=0), dict(num_workers=2), dict(num_workers=2, persistent_workers=True)]


@pytest.mark.parametrize("kind", [0, 1], ids=["lmdb", "wds"])
@pytest.mark.parametrize("options", CASES, ids=["0 workers", "2 workers", "2 persistent workers"])
def test_each_epoch_draws_new_crops_without_any_call(jpeg_photos, kind, options):
    passes = epochs(fastdata.dataset(jpeg_photos[kind], augment="train", image_size=32), 3, **options)
    assert passes[0] != passes[1] and passes[1] != passes[2]
    # and the same seed gives the same crops, whatever the workers: a fresh dataset, in the main process
    assert passes == epochs(fastdata.dataset(jpeg_photos[kind], augment="train", image_size=32), 3)


@pytest.mark.parametrize("kind", [0, 1], ids=["lmdb", "wds"])
@pytest.mark.parametrize("options", CASES, ids=["0 workers", "2 workers", "2 persistent workers"])
def test_set_epoch_pins_each_epochs_crops_in_every_worker(jpeg_photos, kind, options):
    """With set_epoch at each epoch (a resumed run's way), epoch e's crops are exactly (seed, e, i)'s: the same
    as a fresh dataset pinned to e, so a run resumed at epoch 2 gets epoch 2's crops."""
    pinned = epochs(fastdata.dataset(jpeg_photos[kind], augment="train", image_size=32), 3, pin=True, **options)
    resumed = fastdata.dataset(jpeg_photos[kind], augment="train", image_size=32)
    resumed.set_epoch(2)
    assert pinned[2] == sorted(image.numpy().tobytes() for images, _ in DataLoader(resumed, batch_size=4)
                               for image in images)
    assert pinned[1] != pinned[2]
