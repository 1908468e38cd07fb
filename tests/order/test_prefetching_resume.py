"""A loop that takes its next batch before it checkpoints (nanoGPT's `train.py`, or a prefetcher keeping batches in
flight) checkpoints `loader.state_dict(pending=n)`: resumed from it, it trains on exactly the batches of the
uninterrupted run, for every loader kind, across epoch ends; a plain `state_dict()` there would skip the batches
in hand; more pending batches than the loader yielded is refused."""

from __future__ import annotations

import json

import pytest
from contracts import check_prefetching_resume, clone, prefetching_loop, same

import fastdata
from fastdata.errors import ConfigError

IMAGE = {"image_size": 16, "batch_size": 8, "num_workers": 0, "seed": 3}
TEXT = {"batch_size": 16, "num_workers": 0, "seed": 3}
SEQ = fastdata.TextOptions(seq_len=8)


@pytest.fixture(scope="module")
def makers(solid_lmdb, solid_wds, pets_lmdb, text_mix):
    return {
        "image lmdb": lambda: fastdata.loader(solid_lmdb, **IMAGE),
        "image wds": lambda: fastdata.loader(solid_wds, **IMAGE),
        "text lmdb": lambda: fastdata.loader(text_mix[0], text=SEQ, **TEXT),
        "text wds": lambda: fastdata.loader(text_mix[1], text=SEQ, **TEXT),
        "image mixture": lambda: fastdata.loader([solid_lmdb, pets_lmdb], **IMAGE),
        "text mixture": lambda: fastdata.loader(list(text_mix[:2]), text=SEQ, **TEXT),
        "text best-fit": lambda: fastdata.loader(text_mix[0], text=fastdata.TextOptions(seq_len=8, packing="best-fit",
                                                                                        boundaries=True), **TEXT),
    }


KINDS = ["image lmdb", "image wds", "text lmdb", "text wds", "image mixture", "text mixture", "text best-fit"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ahead", [1, 2])
def test_a_prefetching_loop_resumes_without_losing_a_batch(makers, kind, ahead):
    """Checkpoints every epoch-length steps and every epoch-length - 1 steps land on every place, the ends of
    epochs included (where the batch in hand is the next epoch's first)."""
    per_epoch = len(makers[kind]())
    for every in (per_epoch, per_epoch - 1):
        check_prefetching_resume(makers[kind], 2 * per_epoch + 1, every, ahead)


def test_a_plain_state_there_would_skip_the_batch_in_hand(makers):
    """Why `pending` is needed: state_dict() counts the batch taken but not trained on, so a resume from it
    starts one batch later than the training stood."""
    make = makers["image lmdb"]
    reference, _ = prefetching_loop(make, 5, 5)
    loader = make()
    stream = iter(loader)
    for _ in range(3):  # trained on two, the third in hand
        next(stream)
    plain, pending = json.loads(json.dumps(loader.state_dict())), loader.state_dict(pending=1)
    assert (plain["batches"], pending["batches"]) == (3, 2)
    resumed = make()
    resumed.load_state_dict(plain)
    assert same([clone(next(iter(resumed)))], [reference[3]])  # batch 2 would never be trained on


def test_pending_cannot_exceed_the_batches_yielded(makers):
    loader = makers["text lmdb"]()
    with pytest.raises(ConfigError, match=r"^state_dict\(pending=1\): this loader has yielded 0 batches since it"):
        loader.state_dict(pending=1)
    next(iter(loader))
    assert loader.state_dict(pending=1)["batches"] == 0
    resumed = makers["text lmdb"]()
    resumed.load_state_dict(loader.state_dict())
    with pytest.raises(ConfigError, match="has yielded 0 batches since it was made or restored"):
        resumed.state_dict(pending=1)  # batches of the run before the restore were trained on
    for bad in (-1, 1.5, "1"):
        with pytest.raises(ConfigError, match=r"^pending must be"):
            loader.state_dict(pending=bad)


def test_with_persistent_workers_that_run_ahead_into_the_next_epoch(solid_lmdb):
    """Workers that build the next epoch's first batches ahead (persistent workers roll over) change nothing: the
    batches the loop holds are counted by what the loader yielded, not by what the workers made."""
    def make():
        return fastdata.loader(solid_lmdb, **{**IMAGE, "num_workers": 2, "persistent_workers": True})

    per_epoch = len(make())
    check_prefetching_resume(make, 2 * per_epoch + 1, per_epoch, ahead=1)
