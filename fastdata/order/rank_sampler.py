"""`loader.sampler`: this rank's part of every epoch, described as torch's `DistributedSampler` describes its own,
for code written against a DataLoader. PyTorch's ImageNet example, under DDP, checks
`len(val_loader.sampler) * world_size < len(val_loader.dataset)` to evaluate the samples the ranks left out;
training loops call `loader.sampler.set_epoch(epoch)`. A fastdata loader draws its order itself (no sampler to
pass in), so this is a view of that order, made when asked for: it holds the loader, the loader never holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fastdata.order.ranks import rank_count


class RankSampler:
    """This rank's samples of an epoch, as DistributedSampler has them:

    - `len(sampler)` (= `num_samples`): the samples of one epoch on this rank: the epoch's samples (`total`, all
      ranks together) padded or cut to a multiple of the world size (`uneven`), divided by it; the loader's
      `drop_last` then drops a short last batch, as a DataLoader's does after its sampler;
    - `total_size`: `num_samples * num_replicas`; `num_replicas`, `rank`, `shuffle`, `seed`, `epoch`;
      `drop_last`: whether the uneven rest is dropped (`uneven="drop"`), DistributedSampler's meaning;
    - `set_epoch(e)`: the loader's `set_epoch`;
    - iterating it gives this rank's samples of the loader's epoch, in order, as indices into `loader.dataset`
      (a WebDataset dataset's: positions in its stored order, the order `fastdata.dataset` iterates).
    """

    def __init__(self, loader: Any, total: int, shuffle: bool, seed: int, uneven: str,
                 order: Callable[[int], np.ndarray]) -> None:
        self._loader, self._order = loader, order
        self.total, self.shuffle, self.seed, self.uneven = total, shuffle, seed, uneven

    @property
    def num_replicas(self) -> int:
        return int(self._loader.world_size)

    @property
    def rank(self) -> int:
        return int(self._loader.rank)

    @property
    def drop_last(self) -> bool:
        return self.uneven == "drop"

    @property
    def num_samples(self) -> int:
        return rank_count(self.total, self.num_replicas, self.uneven)

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    @property
    def epoch(self) -> int:
        """The epoch the loader's next pass yields."""
        return int(self._loader.epoch)

    def set_epoch(self, epoch: int) -> None:
        """The loader's `set_epoch`."""
        self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        return iter(self._order(self.epoch).tolist())

    def __repr__(self) -> str:
        return (f"RankSampler(rank {self.rank} of {self.num_replicas}: {self.num_samples} of {self.total} samples "
                f"per epoch, uneven={self.uneven!r}, epoch {self.epoch})")
