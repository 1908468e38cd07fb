"""Workers reuse their shared-memory batch tensors (fastdata.batch_buffers): a batch the user keeps is never
overwritten, whatever the start method, persistence or early exits; one the user lets go is reused."""

from __future__ import annotations

import pytest
import torch
from builders.images import SOLID_COUNT

import fastdata
from fastdata.image.buffers import FREE, LENT, BatchBuffers

SIZE = 16
BATCH = 4  # 12 batches an epoch: more than a worker's slots over a few epochs


def make_loader(path, **kwargs):
    options = dict(batch_size=BATCH, augment="train", image_size=SIZE, num_workers=0, seed=5)
    options.update(kwargs)
    return fastdata.loader(path, **options)


def kept(loader, epochs: int, stop_after: dict[int, int] | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every batch of `epochs` passes, as received (no copy); pass e stops after stop_after[e] batches."""
    stop_after = stop_after or {}
    batches = []
    for epoch in range(epochs):
        for count, batch in enumerate(loader, start=1):
            batches.append(batch)
            if count == stop_after.get(epoch):
                break
    return batches


def assert_same(got, want) -> None:
    assert len(got) == len(want)
    for (images_a, labels_a), (images_b, labels_b) in zip(got, want, strict=True):
        assert torch.equal(labels_a, labels_b)
        assert torch.equal(images_a, images_b)


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh-workers", "persistent"])
def test_kept_batches_are_never_overwritten(solid, persistent):
    reference = kept(make_loader(solid), epochs=4)
    loader = make_loader(solid, num_workers=2, persistent_workers=persistent)
    got = kept(loader, epochs=4)
    assert_same(got, reference)
    if persistent:  # 48 batches held by the test, 6 slots a worker: all but 12 had to be fresh segments
        assert loader._buffers.fresh >= len(got) - 2 * 6
    assert loader._buffers.pooled + loader._buffers.fresh == len(got)


def test_kept_batches_survive_passes_left_early(solid_lmdb):
    """A pass left early drops the batches in flight; with persistent workers their slots are freed for the next
    pass, but never those of batches the user kept."""
    stops = {0: 2, 2: 5}
    reference = kept(make_loader(solid_lmdb), epochs=4, stop_after=stops)
    loader = make_loader(solid_lmdb, num_workers=2, persistent_workers=True)
    assert_same(kept(loader, epochs=4, stop_after=stops), reference)


def test_interleaved_passes_keep_their_batches(solid_lmdb):
    """Two passes at once (zip(loader, loader)), each with its own workers: the first pass's batches, let go,
    never free the slots of the second's, kept."""
    def interleaved(loader):
        return [second for _, second in zip(loader, loader, strict=True)]

    reference = interleaved(make_loader(solid_lmdb))
    assert_same(interleaved(make_loader(solid_lmdb, num_workers=2, persistent_workers=False)), reference)


def test_spawned_workers_reuse_slots_and_keep_kept_batches(solid_lmdb):
    reference = kept(make_loader(solid_lmdb), epochs=2)
    loader = make_loader(solid_lmdb, num_workers=2, persistent_workers=True, multiprocessing_context="spawn")
    got = kept(loader, epochs=2)
    assert_same(got, reference)
    for images, _ in loader:  # let each batch go: the slots come back
        del images
    assert loader._buffers.pooled > 0


def test_batches_let_go_are_reused(solid):
    """A training loop that drops each batch before the next allocates no new shared memory after warm-up."""
    loader = make_loader(solid, num_workers=2)
    for _ in range(3):
        seen = 0
        for images, labels in loader:
            seen += len(labels)
            del images, labels
        assert seen == SOLID_COUNT
    assert loader._buffers.fresh == 0
    assert loader._buffers.pooled == 3 * len(loader)


def test_pinned_batches_are_kept_too(solid_lmdb):
    """pin_memory copies each batch; the copy's lifetime then decides when the slot is free again."""
    reference = kept(make_loader(solid_lmdb), epochs=2)
    loader = make_loader(solid_lmdb, num_workers=2, pin_memory=torch.cuda.is_available())
    assert_same(kept(loader, epochs=2), reference)


def test_slots_are_lent_until_the_main_process_lets_go():
    """The bookkeeping on its own, in one process: a slot is free again only once its storage is gone."""
    buffers = BatchBuffers(workers=1, slots=2)
    images = torch.zeros(4, dtype=torch.uint8)
    buffers.flags[0, 1] = LENT
    buffers.received((0, 0, 1), images)
    assert int(buffers.flags[0, 1]) == LENT
    view = images[:2]
    del images
    buffers.release_expired()
    assert int(buffers.flags[0, 1]) == LENT  # a view still holds the storage
    del view
    buffers.release_expired()
    assert int(buffers.flags[0, 1]) == FREE
    buffers.received(None, torch.zeros(1, dtype=torch.uint8))
    assert (buffers.pooled, buffers.fresh) == (1, 1)
    with pytest.raises(ValueError, match="at least one worker"):
        BatchBuffers(workers=0, slots=2)


def raw_device_batches(loader, epochs: int) -> list:
    """The workers' EncodedBatches of `epochs` passes on the device path, as the main process receives them (held,
    not copied)."""
    from fastdata.image.device.feeder import PassKey

    return [batch for epoch in range(epochs) for batch in loader._open_pass(PassKey(epoch))]


def test_device_path_batches_reuse_slots_and_held_ones_are_never_overwritten(solid_lmdb):
    """The device path's workers pack each batch's bytes and pixels into a reused slot too: batches the main
    process still holds keep their bytes (against the same batches packed without workers), and batches let go
    give their slots back."""
    options = dict(decode="device", device="cpu")
    reference = raw_device_batches(make_loader(solid_lmdb, **options), epochs=3)
    loader = make_loader(solid_lmdb, num_workers=2, persistent_workers=True, **options)
    held = raw_device_batches(loader, epochs=3)
    assert len(held) == len(reference) == 3 * len(loader)
    for got, want in zip(held, reference, strict=True):
        assert got.keys == want.keys and torch.equal(got.data, want.data) and torch.equal(got.pixels, want.pixels)
        assert torch.equal(got.offsets, want.offsets) and torch.equal(got.labels, want.labels)
    assert loader._buffers.pooled + loader._buffers.fresh == len(held)
    del held, got, want
    pooled = loader._buffers.pooled
    from fastdata.image.device.feeder import PassKey

    for batch in loader._open_pass(PassKey(3)):  # let each go: their slots come back (the batches the workers
        del batch  # made while every slot was still held, up to 5 of the 12, came in fresh segments)
    assert loader._buffers.pooled > pooled
    loader.close()
