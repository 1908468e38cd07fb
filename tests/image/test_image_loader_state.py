"""The image loaders keep the resume contract (contracts.py) over LMDB and WebDataset, with 0 or 2 workers,
shuffled or not, resumed with another worker count, from a training loop's checkpoints, and across a batch whose
samples were all skipped."""

from __future__ import annotations

import pytest
from builders.damaged import corrupt_copy
from builders.images import SOLID_COUNT
from builders.runs import seeded_loader
from contracts import check_checkpoint_loop, check_resumes, clone, same


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


@pytest.mark.filterwarnings("error::UserWarning")  # set_epoch must keep the restored place: no "drops" warning
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
def test_image_checkpoint_loop_sees_exactly_the_uninterrupted_run(fmt, workers, solid_lmdb, solid_wds):
    path = solid_lmdb if fmt == "lmdb" else solid_wds
    check_checkpoint_loop(lambda w: seeded_loader(path, num_workers=w), workers)


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


@pytest.mark.parametrize("workers", [0, 2])
def test_the_device_path_keeps_the_resume_contract(jpeg_photos, workers):
    """decode="device" (device="cpu"): its feeder runs a pass ahead, yet a state taken after k batches resumes
    exactly there, and a checkpointing training loop resumes as if never stopped."""
    def make(w):
        return seeded_loader(jpeg_photos[0], num_workers=w, batch_size=5, decode="device", device="cpu")

    check_resumes(make, image_interrupts, workers)
    if workers:
        check_checkpoint_loop(make, workers)
