"""The resumability contract, one check shared by every stateful piece (image LMDB / WebDataset loaders, text
loaders): a loader restored from `state_dict()` taken after k batches yields exactly the batches the
uninterrupted run yields after k, then the same next epoch; and a training loop that checkpoints (its epoch, the
loader's state) and resumes from any checkpoint sees exactly the uninterrupted run.

A piece is given as `make_loader(num_workers) -> loader` (any object with `__iter__`, `__len__`, `state_dict`,
`load_state_dict` and `set_epoch`); states always pass through JSON, as a checkpoint file would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

MakeLoader = Callable[[int], Any]


def _equal(u, v) -> bool:
    """Tensors, lists (of target dicts: detection) and plain values, compared exactly."""
    if isinstance(u, torch.Tensor):
        return isinstance(v, torch.Tensor) and u.dtype == v.dtype and torch.equal(u, v)
    if isinstance(u, dict):
        return isinstance(v, dict) and u.keys() == v.keys() and all(_equal(u[k], v[k]) for k in u)
    if isinstance(u, list | tuple):
        return isinstance(v, list | tuple) and len(u) == len(v) and all(map(_equal, u, v))
    return u == v


def same(a, b) -> bool:
    """Batches equal exactly: image batches as (images, labels) (detection: (images, list of target dicts)), text
    and image-text pair batches as dicts (pairs: a list of captions beside the tensors)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict) and x.keys() != y.keys():
            return False
        pairs = zip(x.values(), y.values(), strict=True) if isinstance(x, dict) else zip(x, y, strict=True)
        if not all(_equal(u, v) for u, v in pairs):
            return False
    return True


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clone(v) for v in value]
    return value


def clone(batch):
    """A copy of a batch that outlives the loader's reuse of its buffers."""
    if isinstance(batch, dict):  # lists (captions) copied, plain values (a packed batch's max_seqlen) kept
        return {k: v.clone() if isinstance(v, torch.Tensor) else list(v) if isinstance(v, list) else v
                for k, v in batch.items()}
    return tuple(_clone(t) for t in batch)


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


def check_resumes(make_loader: MakeLoader, interrupts: Callable[[int], list[int]], workers: int,
                  resume_workers: int | None = None) -> None:
    """Interrupted after each k in `interrupts(batches per epoch)` and resumed from that state (with
    `resume_workers` workers, by default the same), the run yields exactly the rest of the epoch, then the same
    next epoch as the uninterrupted run."""
    reference = make_loader(workers)
    first, second, states = run_with_states(reference)
    del reference
    assert len(first) == len(states) - 1
    for k in interrupts(len(first)):
        resumed = make_loader(workers if resume_workers is None else resume_workers)
        resumed.load_state_dict(states[k])
        rest = [clone(batch) for batch in resumed]  # the rest of the state's epoch: nothing after its last batch
        assert same(first[:k] + rest, first), f"interrupted after {k} batches: the resumed run differs"
        assert same([clone(batch) for batch in resumed], second), f"after {k}: the next epoch differs"


def training_loop(make_loader: Callable[[], Any], epochs: int, every: int,
                  restore: tuple[int, dict] | None = None, each_epoch: Callable[[Any, int], None] | None = None):
    """A training loop that keeps its own epoch counter, calls `set_epoch(epoch)` (then `each_epoch(loader,
    epoch)` if given: e.g. a size schedule) and checkpoints (its epoch, the loader's state) every `every` steps;
    resumed from `restore`, it starts at the saved epoch. Returns the batches it saw and its checkpoints as (epoch,
    state, batches seen so far)."""
    loader = make_loader()
    start = 0
    if restore is not None:
        start, state = restore
        loader.load_state_dict(state)
    seen, checkpoints = [], []
    for epoch in range(start, epochs):
        loader.set_epoch(epoch)
        if each_epoch is not None:
            each_epoch(loader, epoch)
        for batch in loader:
            seen.append(clone(batch))
            if len(seen) % every == 0:
                checkpoints.append((epoch, json.loads(json.dumps(loader.state_dict())), len(seen)))
    return seen, checkpoints


def check_checkpoint_loop(make_loader: MakeLoader, workers: int) -> None:
    """Checkpoints every epoch-length steps land after the last batch of an epoch, before the iterator is
    exhausted: the resumed loop must see nothing more of that epoch, then the next ones (not an extra epoch).
    Every epoch-length minus one steps covers the other places."""
    def fresh():
        return make_loader(workers)

    per_epoch = len(fresh())
    for every in (per_epoch, per_epoch - 1):
        reference, checkpoints = training_loop(fresh, 3, every)
        assert len(reference) == 3 * per_epoch and checkpoints
        for epoch, state, count in checkpoints:
            resumed, _ = training_loop(fresh, 3, every, restore=(epoch, state))
            assert same(resumed, reference[count:]), \
                f"resumed from the checkpoint after {count} batches (epoch {epoch}): the run differs"


def prefetching_loop(make_loader: Callable[[], Any], steps: int, every: int, ahead: int = 1,
                     restore: dict | None = None, each_pass: Callable[[Any], None] | None = None):
    """nanoGPT's loop: batches are taken `ahead` steps before they are trained on (`X, Y = get_batch()` before
    the step; `ahead` > 1: a prefetcher that keeps more in flight), passes follow one another across epochs
    (`each_pass(loader)` before each, if given: e.g. a size schedule), and every `every` steps it checkpoints
    `state_dict(pending=ahead)`, the batches in hand not trained on yet. Returns the batches it trained on and its
    checkpoints as (state, batches trained so far)."""
    loader = make_loader()
    if restore is not None:
        loader.load_state_dict(restore)

    def passes():
        while True:
            if each_pass is not None:
                each_pass(loader)
            yield from loader  # each pass the next epoch

    stream = passes()
    in_hand = [clone(next(stream)) for _ in range(ahead)]
    trained, checkpoints = [], []
    for step in range(steps):
        trained.append(in_hand.pop(0))
        in_hand.append(clone(next(stream)))  # the next batch, taken before the checkpoint
        if (step + 1) % every == 0:
            checkpoints.append((json.loads(json.dumps(loader.state_dict(pending=ahead))), len(trained)))
    return trained, checkpoints


def check_prefetching_resume(make_loader: Callable[[], Any], steps: int, every: int, ahead: int = 1,
                             each_pass: Callable[[Any], None] | None = None) -> None:
    """A prefetching loop resumed from each of its checkpoints trains on exactly the batches the uninterrupted
    loop trained on after it: none lost, none repeated, across epoch ends too."""
    reference, checkpoints = prefetching_loop(make_loader, steps, every, ahead, each_pass=each_pass)
    assert len(reference) == steps and checkpoints
    for state, count in checkpoints:
        resumed, _ = prefetching_loop(make_loader, steps - count, every, ahead, restore=state, each_pass=each_pass)
        assert same(resumed, reference[count:]), f"resumed from the checkpoint after {count} batches: the run differs"
