"""Every rank yields `len(loader)` batches, even with `on_error="skip"`: the rule for a batch whose samples were
all skipped.

A batch that keeps at least one sample is yielded as it is (never padded, so `loader.skipped` stays exact). A batch
that would be empty borrows one sample instead: the first sample of this rank's epoch, after that batch (wrapping
round to the epoch's start), that decodes, processed exactly as in its own batch (same crop, from its own seed).
The choice is a pure function of the epoch plan, so a resumed run borrows the same sample. It is counted in
`loader.borrowed` and warned about once per loader. A rank none of whose samples decode raises: there is nothing
to train on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import numpy as np

from fastdata.errors import CorruptSampleError

T = TypeVar("T")


def candidates(batches: Sequence[np.ndarray], empty: int) -> Iterator[int]:
    """The positions a batch `empty` of `batches` may borrow from, in the order they are tried: the samples of
    the following batches, then those of the batches before it."""
    for number in [*range(empty + 1, len(batches)), *range(empty)]:
        yield from (int(p) for p in batches[number])


def borrow(batches: Sequence[np.ndarray], empty: int, make: Callable[[int], T], where: str) -> T:
    """`make(position)` for the first candidate position of batch `empty` that does not raise CorruptSampleError."""
    tried = 0
    for position in candidates(batches, empty):
        tried += 1
        try:
            return make(position)
        except CorruptSampleError:
            continue
    raise CorruptSampleError(f"{where}: every sample of batch {empty} was skipped, and none of the other {tried} "
                             "samples of this rank's epoch decodes either: there is nothing to train on")
