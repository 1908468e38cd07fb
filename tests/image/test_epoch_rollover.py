"""Epochs without a cold start: with persistent workers the worker path's workers go on from one epoch into the
next (the sampler's `rollover`), so the next epoch's first batches are being built while the last ones of this
epoch are used; the batches stay exactly those of each epoch, whatever happens between passes (set_epoch,
load_state_dict, a pass left early, close)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import torch

import fastdata
from fastdata.order.samplers import BucketBatchSampler, EpochBatchSampler

OPTIONS = dict(batch_size=4, image_size=32, seed=7)


def epochs(loader, count: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    return [[(images.clone(), labels.clone()) for images, labels in loader] for _ in range(count)]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1])
                                    for x, y in zip(a, b, strict=True))


def test_a_rolling_sampler_gives_each_epoch_as_a_fresh_one_would():
    rolling = EpochBatchSampler(23, 4, True, 3, False, rank=1, world_size=2)
    rolling.epoch, rolling.start, rolling.skip, rolling.rollover = 5, 6, 1, True
    got = list(itertools.islice(iter(rolling), 2 + 3 + 3))  # epoch 5 from position 6, batch 1 on; then 6 and 7
    expected = []
    for epoch, start, skip in ((5, 6, 1), (6, 0, 0), (7, 0, 0)):
        fresh = EpochBatchSampler(23, 4, True, 3, False, rank=1, world_size=2)
        fresh.epoch, fresh.start, fresh.skip = epoch, start, skip
        expected += list(fresh)
    assert [e for e, _ in got] == [e for e, _ in expected] == [5, 5, 6, 6, 6, 7, 7, 7]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(got, expected, strict=True))
    assert (rolling.epoch, rolling.start, rolling.skip) == (5, 6, 1)  # the pass's, as the loader set them
    assert not BucketBatchSampler.can_roll_over  # orders of their own: never rolled over


def test_the_workers_go_on_into_the_next_epoch_with_the_same_batches(jpeg_photos):
    loader = fastdata.loader(jpeg_photos[0], num_workers=2, **OPTIONS)
    got = []
    iterators = set()
    for _ in range(3):
        got.append([(images.clone(), labels.clone()) for images, labels in loader])
        iterators.add(id(loader._workers.iterator))
        kept = loader._rolled._kept
        assert kept is not None and kept[0].epoch == loader.epoch  # the workers are already on the next epoch
    assert len(iterators) == 1  # one iterator of the workers for all three epochs: never reset
    reference = epochs(fastdata.loader(jpeg_photos[0], num_workers=0, **OPTIONS), 3)
    assert all(same(a, b) for a, b in zip(got, reference, strict=True))
    loader.close()


def test_set_epoch_a_restored_state_and_a_pass_left_early_get_their_own_batches(jpeg_photos):
    loader = fastdata.loader(jpeg_photos[0], num_workers=2, **OPTIONS)
    reference = fastdata.loader(jpeg_photos[0], num_workers=0, **OPTIONS)
    list(loader)  # epoch 0; the workers go on into epoch 1
    loader.set_epoch(4)
    reference.set_epoch(4)
    assert same(epochs(loader, 1)[0], epochs(reference, 1)[0])
    for number, _ in enumerate(loader):  # epoch 5, left after two batches
        if number == 1:
            state = loader.state_dict()
            break
    reference.set_epoch(6)
    assert same(epochs(loader, 1)[0], epochs(reference, 1)[0])  # the next pass: epoch 6, from its start
    restored = fastdata.loader(jpeg_photos[0], num_workers=0, **OPTIONS)
    restored.load_state_dict(state)
    loader.load_state_dict(state)
    assert all(same(a, b) for a, b in zip(epochs(loader, 2), epochs(restored, 2), strict=True))  # 5's rest, 6
    loader.close()
    reference.set_epoch(loader.epoch)
    assert same(epochs(loader, 1)[0], epochs(reference, 1)[0])  # closed: new workers, the right epoch


def test_loaders_that_start_their_workers_each_pass_do_not_roll_over(jpeg_photos):
    val = fastdata.loader(jpeg_photos[0], num_workers=2, augment="val", **OPTIONS)  # persistent_workers=None: off
    list(val)
    assert val._rolled._kept is None and not val._sampler.rollover


def test_the_device_path_rolls_over_too_with_the_same_batches(jpeg_photos):
    """The feeder reads each pass's batches off the workers' rolling iterator and goes on into the next epoch."""
    options = dict(decode="device", device="cpu", **OPTIONS)
    loader = fastdata.loader(jpeg_photos[0], num_workers=2, **options)
    got = epochs(loader, 3)
    assert loader._sampler.rollover
    reference = epochs(fastdata.loader(jpeg_photos[0], num_workers=0, **options), 3)
    assert all(same(a, b) for a, b in zip(got, reference, strict=True))
    loader.set_epoch(9)
    expected = fastdata.loader(jpeg_photos[0], num_workers=0, **options)
    expected.set_epoch(9)
    assert same(epochs(loader, 1)[0], epochs(expected, 1)[0])
    loader.close()


def test_a_borrow_reads_its_own_passes_batches_whatever_pass_the_sampler_is_set_to(jpeg_photos):
    """On the device path the feeder sets the sampler for the next pass while the training thread still delivers
    this one: a batch that borrows (all its samples skipped) takes its candidates from its own pass's batches."""
    from fastdata.image.device.feeder import PassKey
    from fastdata.order.borrow import candidates

    loader = fastdata.loader(jpeg_photos[0], num_workers=0, decode="device", device="cpu", **OPTIONS)
    loader._sampler.epoch, loader._sampler.start = 7, 4  # as if the feeder had opened another pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "every sample of batch 0 of epoch 2 was skipped; ... borrowed"
        loader._borrow(PassKey(2), 0)
    fresh = EpochBatchSampler(len(loader.dataset), OPTIONS["batch_size"], True, OPTIONS["seed"], False)
    fresh.epoch = 2
    first = next(iter(candidates(fresh.epoch_batches(), 0)))
    assert loader.borrowed == [(2, 0, loader.dataset.reader.key(int(first)))]
