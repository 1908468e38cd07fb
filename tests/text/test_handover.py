"""The text loader's hand-over (fastdata.text.handover): workers write each item into a shared-memory slot that the
main process numbered and copies out, so no tensor travels per item; a slot is never written while an item in it may
still be read (kept batches, passes left early, a suspended pass), and an item whose slot is still in use comes in a
fresh segment, counted and said once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from contracts import clone

import fastdata
from fastdata.text.handover import HandOver

OPTIONS = {"plain": {}, "boundaries": {"boundaries": True}, "best-fit": {"packing": "best-fit", "boundaries": True}}


@pytest.fixture
def data(loader_text_lmdb) -> Path:
    return loader_text_lmdb


def epochs(loader, count: int) -> list[dict]:
    return [batch for _ in range(count) for batch in loader]


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k]
                                     for k in x) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", list(OPTIONS))
def test_kept_batches_are_never_overwritten_by_later_items(data, kind):
    """Every batch of three epochs kept (not cloned) while the workers go on writing into the few slots (one
    prefetched item per worker: three slots for many items) equals the same epochs made in this process."""
    options = dict(batch_size=3, seed=2, text=fastdata.TextOptions(seq_len=16, **OPTIONS[kind]))
    expected = [clone(b) for b in epochs(fastdata.loader(data, num_workers=0, **options), 3)]
    loader = fastdata.loader(data, num_workers=2, prefetch_factor=1, persistent_workers=True, **options)
    kept = epochs(loader, 3)
    assert loader.group > 1 and len(kept) > 5 * 3 * loader.group  # items through three slots, each many times
    assert loader._batches.handover.buffers.shape[0] == 3 and loader._batches.handover.fresh == 0
    assert same(kept, expected)
    loader.close()


def test_no_tensor_travels_per_item(data):
    """What a worker hands over for an item is its slot's number and the batches' shapes: no shared-memory tensor
    (each of which would cost a segment and a file-descriptor handshake)."""
    loader = fastdata.loader(data, batch_size=3, seed=2, num_workers=2, text=fastdata.TextOptions(seq_len=16,
                                                                                                  boundaries=True))
    loader._prepare_hand_over()
    handover, items = loader._batches.handover, []
    for handed, layouts in loader._loader:  # the DataLoader's own items, each copied out as the loader does
        items.append((handed, layouts))
        handover.received(handed)
        handover.copied(handed)
    assert len(items) > 3 and all(isinstance(handed, int) for handed, _ in items)
    assert not any(isinstance(x, torch.Tensor) for _, layouts in items for layout in layouts for x in layout)
    loader.close()


@pytest.mark.parametrize("persistent", [True, False])
def test_passes_left_early_leave_the_next_pass_exact(data, persistent):
    """A pass left after two batches (its items in flight dropped, or its workers replaced) and the next pass:
    the batches are those a loader without workers gives."""
    options = dict(batch_size=3, seed=5, text=fastdata.TextOptions(seq_len=16, packing="best-fit"))
    reference = fastdata.loader(data, num_workers=0, **options)
    loader = fastdata.loader(data, num_workers=2, prefetch_factor=1, persistent_workers=persistent, **options)
    for _ in range(3):
        head = [clone(b) for _, b in zip(range(2), loader, strict=False)]
        assert same(head, [clone(b) for _, b in zip(range(2), reference, strict=False)])
    assert same(epochs(loader, 1), [clone(b) for b in epochs(reference, 1)])
    assert loader._batches.handover.fresh == 0
    loader.close()


def test_a_slot_is_written_again_only_once_its_item_is_copied_out():
    handover = HandOver(slots=2, capacity=10)
    assert handover.slot(0, 10) is not None and handover.slot(1, 4) is not None
    assert handover.slot(0, 11) is None  # larger than a slot
    assert handover.slot(None, 4) is None  # an unnumbered item
    assert handover.slot(2, 4) is None  # item 0 is in slot 0 still
    handover.received(0)
    handover.copied(0)
    assert handover.slot(2, 4) is not None and handover.slot(3, 4) is None


def test_an_item_still_being_read_keeps_its_slot_across_a_new_pass():
    """A pass suspended in the middle of an item (its generator kept) and a new pass begun: the item's slot is not
    given to the new pass's items; once the old generator is done with it, it is."""
    handover = HandOver(slots=2, capacity=10)
    handover.received(0)  # a batch of item 0 taken, the rest not yet
    handover.begin(5)  # a new pass: items 5, 6, ... come next
    assert handover.slot(5, 4) is None and handover.slot(6, 4) is None
    handover.copied(0)
    assert handover.slot(5, 4) is not None and handover.slot(6, 4) is not None


def test_an_item_in_a_fresh_segment_is_counted_and_said_once():
    handover = HandOver(slots=2, capacity=10)
    fresh = torch.arange(4, dtype=torch.int32)
    with pytest.warns(RuntimeWarning, match="fresh shared-memory segment"):
        assert handover.received(fresh) is fresh
    handover.received(fresh)  # said once
    assert handover.fresh == 2
