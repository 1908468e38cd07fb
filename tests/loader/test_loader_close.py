"""`loader.close()` and `with fastdata.loader(...) as loader:`: the persistent worker processes (and the device
path's feeder and decode threads) end then, not when the loader is collected; a closed loader still iterates, with
new workers, from the epoch it had reached."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

import fastdata
from tests.image.device.test_device_feeder import feeder_threads


def workers_now() -> set[int]:
    return {p.pid for p in multiprocessing.active_children()}


@pytest.mark.parametrize("decode", ["worker", "device"])
def test_close_ends_the_workers_and_the_feeder_and_the_loader_goes_on(jpeg_photos, decode):
    before = workers_now()
    options = dict(batch_size=4, image_size=32, num_workers=2, seed=5)
    device = dict(device="cpu", decode="device") if decode == "device" else {}
    loader = fastdata.loader(jpeg_photos[0], **options, **device)
    first = [labels.clone() for _, labels in loader]
    assert workers_now() - before  # persistent workers stay between passes
    loader.close()
    assert workers_now() - before == set()
    assert feeder_threads() == []
    second = [labels.clone() for _, labels in loader]  # epoch 1, with new workers
    reference = fastdata.loader(jpeg_photos[0], **options, **device)
    reference.set_epoch(1)
    expected = [labels.clone() for _, labels in reference]
    assert len(first) == len(second) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(second, expected, strict=True))
    for closing in (loader, reference):
        closing.close()
    assert workers_now() - before == set()


def test_a_with_block_closes_the_loader_even_after_a_break(jpeg_photos):
    before = workers_now()
    with fastdata.loader(jpeg_photos[0], batch_size=4, image_size=32, num_workers=2) as loader:
        for number, _ in enumerate(loader):
            if number == 1:
                break
        assert workers_now() - before
    assert workers_now() - before == set()


def test_text_loaders_close_too(text_mix):
    before = workers_now()
    with fastdata.loader(text_mix[0], batch_size=4, num_workers=2, text=fastdata.TextOptions(seq_len=16)) as loader:
        assert len(list(loader)) == len(loader)
        assert workers_now() - before
    assert workers_now() - before == set()
    assert len(list(loader)) == len(loader)  # closed, it still iterates with new workers
    loader.close()
    assert workers_now() - before == set()
