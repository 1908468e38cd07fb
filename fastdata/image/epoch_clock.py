"""`EpochClock`: which epoch a sample of a plain dataset (`fastdata.dataset`, in the user's own DataLoader) is
augmented for, so that every pass draws new crops, as with torchvision, with no call to make: and the same crops
for the same seed, whatever the number of workers, when the user asks for it.

- Without `set_epoch`, the epoch of an LMDB dataset's sample is the number of times the dataset has served it
  before (the n-th read of sample i is augmented for epoch n), and the epoch of a WebDataset dataset's pass is the
  number of passes its worker slot has begun before. The counts live in shared memory, so they are the same in
  the main process and in every worker, persistent or started afresh each epoch.
- `set_epoch(e)` (like DistributedSampler's) pins every sample to epoch e until it is called again: the crops are
  then exactly `(seed, e, sample)`'s, which is what a resumed run needs: call it at the start of each epoch.

Shared memory: 2 bytes per sample (counts wrap at 65,536 passes), a few bytes per worker slot.
"""

from __future__ import annotations

from typing import Any

import torch

MAX_WORKER_SLOTS = 1024  # worker ids a WebDataset pass count is kept for


class EpochClock:
    """Epoch counts in shared memory for a dataset of `samples` samples (see the module's docstring)."""

    def __init__(self, samples: int) -> None:
        self._pinned = torch.full((1,), -1, dtype=torch.int64).share_memory_()
        self._reads = torch.zeros(samples, dtype=torch.int16).share_memory_()
        self._passes = torch.zeros(MAX_WORKER_SLOTS, dtype=torch.int32).share_memory_()
        self._views: dict[str, Any] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_views": None}  # the tensors travel (shared); numpy views are made again

    def _view(self, name: str) -> Any:
        if self._views is None:
            self._views = {key: getattr(self, key).numpy() for key in ("_pinned", "_reads", "_passes")}
        return self._views[name]

    def set_epoch(self, epoch: int) -> None:
        """Pin every sample to `epoch` (seen by every worker, persistent ones included)."""
        self._view("_pinned")[0] = int(epoch)

    @property
    def pinned(self) -> int | None:
        """The epoch `set_epoch` pinned, or None when the counts decide."""
        value = int(self._view("_pinned")[0])
        return value if value >= 0 else None

    def read(self, index: int) -> int:
        """The epoch to augment sample `index` for now, counting this read."""
        pinned = self.pinned
        if pinned is not None:
            return pinned
        reads = self._view("_reads")
        epoch = int(reads[index]) & 0xFFFF  # stored as int16: the count modulo 65,536
        following = (epoch + 1) & 0xFFFF
        reads[index] = following - 0x10000 if following >= 0x8000 else following
        return epoch

    def begin_pass(self, worker: int) -> int:
        """The epoch of a pass worker slot `worker` begins now, counting it."""
        pinned = self.pinned
        if pinned is not None:
            return pinned
        passes = self._view("_passes")
        slot = worker % len(passes)
        epoch = int(passes[slot])
        passes[slot] = epoch + 1
        return epoch
