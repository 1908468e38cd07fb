"""Exact mid-epoch resume: a loader restored from `state_dict()` taken after k batches yields exactly the batches
the uninterrupted run yields after k (pixels, labels, order), then the same next epoch; for LMDB, WebDataset
and text, with 0 or 2 workers, shuffled or not; states are small, JSON, versioned, and refused when they
cannot continue the same order."""

from __future__ import annotations

import json

import pytest
from builders import SOLID_COUNT, corrupt_copy, make_corpus, sample_id_of, seeded_loader, train_bytelevel, write_jsonl
from contracts import check_checkpoint_loop, check_resumes, clone, same
from fastdata.converters.text import convert_text

from fastdata.errors import ResumeError


def image_interrupts(n: int) -> list[int]:
    return [0, 1, n // 2, n - 1, n]  # before the first batch, after the first, middle, before the last, after it


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_image_resume_grid(fmt, workers, shuffle, solid_lmdb, solid_wds):
    path = solid_lmdb if fmt == "lmdb" else solid_wds
    check_resumes(lambda w: seeded_loader(path, num_workers=w, shuffle=shuffle), image_interrupts, workers)


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize(("workers", "resume_workers"), [(0, 2), (2, 1)])
def test_resume_with_another_worker_count(fmt, workers, resume_workers, solid_lmdb, solid_wds):
    path = solid_lmdb if fmt == "lmdb" else solid_wds
    check_resumes(lambda w: seeded_loader(path, num_workers=w), lambda n: [n // 2], workers, resume_workers)


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
    check_resumes(lambda w: seeded_loader(text_data, num_workers=w, batch_size=4, augment=None, **options),
                  lambda n: [0, 1, n // 2, n], workers)


@pytest.mark.filterwarnings("error::UserWarning")  # set_epoch must keep the restored place: no "drops" warning
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_image_checkpoint_loop_sees_exactly_the_uninterrupted_run(fmt, workers, solid_lmdb, solid_wds):
    path = solid_lmdb if fmt == "lmdb" else solid_wds
    check_checkpoint_loop(lambda w: seeded_loader(path, num_workers=w), workers)


@pytest.mark.filterwarnings("error::UserWarning")
@pytest.mark.parametrize("workers", [0, 2])
def test_text_checkpoint_loop_sees_exactly_the_uninterrupted_run(text_data, workers):
    check_checkpoint_loop(lambda w: seeded_loader(text_data, batch_size=4, augment=None, seq_len=16, num_workers=w),
                          workers)


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


def test_a_batch_whose_samples_were_all_skipped_resumes_exactly(solid_lmdb, tmp_path):
    """on_error="skip" with a whole batch undecodable: the batch borrows a sample (fastdata.borrow), and a resume
    before or after it yields exactly the same batches, the borrowed one included."""
    path, _key = corrupt_copy(solid_lmdb, tmp_path, 2, b"not an image")
    options = dict(batch_size=1, shuffle=False, on_error="skip", augment="val")
    loader = seeded_loader(path, **options)
    states, batches = [], []
    with pytest.warns(UserWarning, match="borrowed"):
        for batch in loader:
            batches.append(clone(batch))
            states.append(loader.state_dict())
    assert len(batches) == SOLID_COUNT and [s["batches"] for s in states[1:3]] == [2, 3]
    assert len(loader.borrowed) == 1
    for k in (1, 2):
        resumed = seeded_loader(path, **options)
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
        loader = seeded_loader(text_data, batch_size=4, augment=None, rank=rank, world_size=3, **options)
        batches = [clone(b) for b in loader]
        counts.add((len(batches), len(loader)))
        assert same(batches, [clone(b) for b in seeded_loader(text_data, batch_size=4, augment=None, rank=rank,
                                                               world_size=3, num_workers=2, **options)])
        rows += rows_of(batches)
    assert len(counts) == 1 and len({n for n, _ in counts} | {n for _, n in counts}) == 1
    single = rows_of(seeded_loader(text_data, batch_size=4, augment=None, **options))
    assert set(rows) == set(single) and len(rows) - len(single) < 3
