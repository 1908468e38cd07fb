"""Exact mid-epoch resume: a loader restored from `state_dict()` taken after k batches yields exactly the batches
the uninterrupted run yields after k (pixels, labels, order), then the same next epoch; for LMDB, WebDataset
and text, with 0 or 2 workers, shuffled or not; states are small, JSON, versioned, and refused when they
cannot continue the same order."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SOLID_COUNT, sample_id_of
from fastdata.converters.text import convert_text
from test_text import make_corpus, train_bytelevel, write_jsonl

import fastdata
from fastdata.errors import ResumeError

BATCH = 8  # 45 samples: 6 batches per epoch, the last one short


def make(path, **options):
    settings = dict(batch_size=BATCH, augment="train", image_size=16, num_workers=0, seed=7)
    settings.update(options)
    return fastdata.loader(path, **settings)


def same(a, b) -> bool:
    """Batches equal exactly: image batches as (images, labels), text batches as dicts."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        pairs = zip(x.values(), y.values(), strict=True) if isinstance(x, dict) else zip(x, y, strict=True)
        if not all(torch.equal(u, v) for u, v in pairs):
            return False
    return True


def clone(batch):
    if isinstance(batch, dict):
        return {k: v.clone() for k, v in batch.items()}
    return tuple(t.clone() for t in batch)


def run_with_states(loader) -> tuple[list, list, list[dict]]:
    """Two uninterrupted epochs, and the state (through JSON) before the first batch and after every batch of
    the first epoch."""
    states = [json.loads(json.dumps(loader.state_dict()))]
    first = []
    for batch in loader:
        first.append(clone(batch))
        states.append(json.loads(json.dumps(loader.state_dict())))
    second = [clone(batch) for batch in loader]
    return first, second, states


def check_resumes(path, interrupts, workers, resume_workers=None, **options):
    reference = make(path, num_workers=workers, **options)
    first, second, states = run_with_states(reference)
    del reference
    assert len(first) == len(states) - 1
    for k in interrupts(len(first)):
        resumed = make(path, num_workers=workers if resume_workers is None else resume_workers, **options)
        resumed.load_state_dict(states[k])
        rest = [clone(batch) for batch in resumed]  # the rest of the state's epoch: nothing after its last batch
        assert same(first[:k] + rest, first), f"interrupted after {k} batches: the resumed run differs"
        assert same([clone(batch) for batch in resumed], second), f"after {k}: the next epoch differs"


def image_interrupts(n: int) -> list[int]:
    return [0, 1, n // 2, n - 1, n]  # before the first batch, after the first, middle, before the last, after it


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_image_resume_grid(fmt, workers, shuffle, solid_lmdb, solid_wds):
    check_resumes(solid_lmdb if fmt == "lmdb" else solid_wds, image_interrupts, workers, shuffle=shuffle)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize(("workers", "resume_workers"), [(0, 2), (2, 1)])
def test_resume_with_another_worker_count(fmt, workers, resume_workers, solid_lmdb, solid_wds):
    check_resumes(solid_lmdb if fmt == "lmdb" else solid_wds, lambda n: [n // 2], workers, resume_workers)


@pytest.fixture(scope="module", params=["lmdb", "wds"])
def text_data(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"state_{request.param}")
    corpus = make_corpus(60, seed=5)
    tokenizer = train_bytelevel(root / "bpe.json", corpus)
    out = root / ("d.lmdb" if request.param == "lmdb" else "d")
    convert_text(write_jsonl(root / "c.jsonl", corpus), out, tokenizer=tokenizer, format=request.param,
                 shard_size="2KB", progress=False)
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["packed", "packed-unshuffled", "bucketed"])
def test_text_resume_grid(text_data, mode, workers):
    options = {"seq_len": 16, "shuffle": mode != "packed-unshuffled"} if mode.startswith("packed") else \
        {"packing": False, "max_length": 24, "bucketing": True}
    check_resumes(text_data, lambda n: [0, 1, n // 2, n], workers, batch_size=4, augment=None, **options)


def training_loop(make_loader, epochs: int, every: int, restore: tuple[int, dict] | None = None):
    """A training loop that keeps its own epoch counter, calls `set_epoch(epoch)` and checkpoints (its epoch, the
    loader's state) every `every` steps; resumed from `restore`, it starts at the saved epoch. Returns the batches
    it saw and its checkpoints as (epoch, state, batches seen so far)."""
    loader = make_loader()
    start = 0
    if restore is not None:
        start, state = restore
        loader.load_state_dict(state)
    seen, checkpoints = [], []
    for epoch in range(start, epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            seen.append(clone(batch))
            if len(seen) % every == 0:
                checkpoints.append((epoch, json.loads(json.dumps(loader.state_dict())), len(seen)))
    return seen, checkpoints


def check_checkpoint_loop(make_loader) -> None:
    """Checkpoints every epoch-length steps land after the last batch of an epoch, before the iterator is
    exhausted: the resumed loop must see nothing more of that epoch, then the next ones (not an extra epoch).
    Every epoch-length minus one steps covers the other places."""
    per_epoch = len(make_loader())
    for every in (per_epoch, per_epoch - 1):
        reference, checkpoints = training_loop(make_loader, 3, every)
        assert len(reference) == 3 * per_epoch and checkpoints
        for epoch, state, count in checkpoints:
            resumed, _ = training_loop(make_loader, 3, every, restore=(epoch, state))
            assert same(resumed, reference[count:]), \
                f"resumed from the checkpoint after {count} batches (epoch {epoch}): the run differs"


@pytest.mark.filterwarnings("error::UserWarning")  # set_epoch must keep the restored place: no "drops" warning
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_image_checkpoint_loop_sees_exactly_the_uninterrupted_run(fmt, workers, solid_lmdb, solid_wds):
    check_checkpoint_loop(lambda: make(solid_lmdb if fmt == "lmdb" else solid_wds, num_workers=workers))


@pytest.mark.filterwarnings("error::UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_text_checkpoint_loop_sees_exactly_the_uninterrupted_run(text_data, workers):
    check_checkpoint_loop(lambda: make(text_data, batch_size=4, augment=None, seq_len=16, num_workers=workers))


def test_set_epoch_to_another_epoch_after_restore_warns(solid_lmdb):
    loader = make(solid_lmdb)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    restored = make(solid_lmdb)
    restored.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"set_epoch\(2\) drops the place restored by load_state_dict \(epoch 0, "
                                         r"after 1 batches\)"):
        restored.set_epoch(2)
    assert restored.epoch == 2 and restored.state_dict()["batches"] == 0


def test_state_is_small_versioned_json(solid_wds):
    loader = make(solid_wds)
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
    loader = make(solid_lmdb)
    full = [clone(b) for b in loader]
    loader.set_epoch(0)
    for n, _batch in enumerate(loader):
        if n == 2:
            break
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 3)
    restored = make(solid_lmdb)
    restored.load_state_dict(state)
    restored.set_epoch(0)  # a training loop calls set_epoch(epoch) first: the place in epoch 0 is kept
    assert restored.epoch == 0 and same([clone(b) for b in restored], full[3:])
    restored.load_state_dict(state)
    with pytest.warns(UserWarning, match="drops the place"):
        restored.set_epoch(1)  # another epoch: from its beginning, with a warning that the place was dropped
    assert restored.state_dict()["batches"] == 0 and len([clone(b) for b in restored]) == len(full)


def test_states_that_would_change_the_order_are_refused(solid_lmdb, solid_wds):
    loader = make(solid_lmdb)
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ResumeError, match=r"batch_size=8 in the state, 4 here"):
        make(solid_lmdb, batch_size=4).load_state_dict(state)
    with pytest.raises(ResumeError, match="seed"):
        make(solid_lmdb, seed=8).load_state_dict(state)
    with pytest.raises(ResumeError, match="format"):
        make(solid_wds).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"image_size=16 in the state, 24 here"):
        make(solid_lmdb, image_size=24).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"augment=.*RandomResizedCropFlip.* in the state, .*ResizeCenterCrop"):
        make(solid_lmdb, augment="val").load_state_dict(state)
    with pytest.raises(ResumeError, match=r"augment="):
        make(solid_lmdb, augment=None).load_state_dict(state)
    with pytest.raises(ResumeError, match="version 99"):
        make(solid_lmdb).load_state_dict({**state, "version": 99})
    with pytest.raises(ResumeError, match="not a fastdata loader state"):
        make(solid_lmdb).load_state_dict({"epoch": 3})


def test_states_taken_with_other_transform_parameters_are_refused(solid_lmdb):
    import albumentations as A

    def flips(p):
        return A.Compose([A.HorizontalFlip(p=p), A.Resize(16, 16)])

    loader = make(solid_lmdb, augment=flips(0.5))
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ResumeError, match="augment="):
        make(solid_lmdb, augment=flips(0.3)).load_state_dict(state)
    make(solid_lmdb, augment=flips(0.5)).load_state_dict(state)  # the same pipeline, built again: accepted
    old_state = {**state, "config": {k: v for k, v in state["config"].items() if k != "augment"}}
    make(solid_lmdb, augment=flips(0.3)).load_state_dict(old_state)  # saved before transforms were recorded


def ids(batches) -> list[int]:
    return [sample_id_of(image) for images, _ in batches for image in images]


def test_lmdb_resumes_on_another_world_size(solid_lmdb):
    """Saved by 2 ranks after 2 batches each, resumed by 3: every sample of the epoch exactly once (plus the
    documented padding), and the next epoch is the 3-rank epoch."""
    consumed, state = [], None
    for rank in range(2):
        loader = make(solid_lmdb, batch_size=4, rank=rank, world_size=2, augment="val")
        iterator = iter(loader)
        consumed += ids([next(iterator), next(iterator)])
        state = loader.state_dict()
    rest, counts = [], set()
    for rank in range(3):
        loader = make(solid_lmdb, batch_size=4, rank=rank, world_size=3, augment="val")
        loader.load_state_dict(state)
        batches = [clone(b) for b in loader]
        counts.add(len(batches))
        rest += ids(batches)
        fresh = make(solid_lmdb, batch_size=4, rank=rank, world_size=3, augment="val")
        fresh.set_epoch(1)
        assert same([clone(b) for b in loader], [clone(b) for b in fresh])
    assert len(counts) == 1
    together = consumed + rest
    assert set(together) == set(range(SOLID_COUNT))
    assert len(together) - SOLID_COUNT < 3  # padding of the 29 samples left to a multiple of 3


def test_wds_refuses_another_world_size_mid_epoch_only(solid_wds):
    loader = make(solid_wds, rank=0, world_size=2)
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(ResumeError, match=r"world_size=2.*world_size=3"):
        make(solid_wds, rank=0, world_size=3).load_state_dict(loader.state_dict())
    for _ in iterator:
        pass
    boundary = loader.state_dict()
    other = make(solid_wds, rank=1, world_size=3)
    other.load_state_dict(boundary)
    fresh = make(solid_wds, rank=1, world_size=3)
    fresh.set_epoch(1)
    assert same([clone(b) for b in other], [clone(b) for b in fresh])


def test_a_batch_whose_samples_were_all_skipped_resumes_exactly(solid_lmdb, tmp_path):
    """on_error="skip" with a whole batch undecodable: the batch borrows a sample (fastdata.borrow), and a resume
    before or after it yields exactly the same batches, the borrowed one included."""
    from test_loader import corrupt_copy

    path, _key = corrupt_copy(solid_lmdb, tmp_path, 2, b"not an image")
    options = dict(batch_size=1, shuffle=False, on_error="skip", augment="val")
    loader = make(path, **options)
    states, batches = [], []
    with pytest.warns(UserWarning, match="borrowed"):
        for batch in loader:
            batches.append(clone(batch))
            states.append(loader.state_dict())
    assert len(batches) == SOLID_COUNT and [s["batches"] for s in states[1:3]] == [2, 3]
    assert len(loader.borrowed) == 1
    for k in (1, 2):
        resumed = make(path, **options)
        resumed.load_state_dict(states[k])
        if k == 1:  # the resumed run meets the emptied batch itself
            with pytest.warns(UserWarning, match="borrowed"):
                rest = [clone(b) for b in resumed]
        else:
            rest = [clone(b) for b in resumed]
        assert same(rest, batches[k + 1:])


@pytest.mark.parametrize("bucketing", [False, True])
def test_text_ranks_split_every_epoch_evenly(text_data, bucketing):
    """Text: each of 3 ranks gets its own part of the epoch, the same number of batches, together every block
    (or document) once plus the documented padding; order the same for any number of workers."""
    options = {"packing": False, "max_length": 24, "bucketing": True} if bucketing else {"seq_len": 16}

    def rows_of(batches):  # padded rows trimmed to their real tokens (padding width depends on the batch)
        return [tuple(row[:int(mask.sum())].tolist()) if "attention_mask" in b else tuple(row.tolist())
                for b in batches for row, mask in zip(b["input_ids"], b.get("attention_mask", b["input_ids"]),
                                                      strict=True)]

    rows = []
    counts = set()
    for rank in range(3):
        loader = make(text_data, batch_size=4, augment=None, rank=rank, world_size=3, **options)
        batches = [clone(b) for b in loader]
        counts.add((len(batches), len(loader)))
        assert same(batches, [clone(b) for b in make(text_data, batch_size=4, augment=None, rank=rank,
                                                      world_size=3, num_workers=2, **options)])
        rows += rows_of(batches)
    assert len(counts) == 1 and len({n for n, _ in counts} | {n for _, n in counts}) == 1
    single = rows_of(make(text_data, batch_size=4, augment=None, **options))
    assert set(rows) == set(single) and len(rows) - len(single) < 3
