"""Distributed sharding: which part of an epoch's order each rank gets, as pure functions (no IO).

Every rank of a job gets the same number of samples per epoch, so every rank yields the same number of
batches and no DDP collective waits forever. The epoch's order is made a multiple of the world size either
by wrapping (`uneven="pad"`: the first samples of the order are repeated at its end, as DistributedSampler
does) or by dropping its last `n % world_size` samples (`uneven="drop"`).
"""

from __future__ import annotations

import numpy as np

from fastdata.config import check_int
from fastdata.errors import ConfigError

UNEVEN = ("pad", "drop")


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size): the explicit arguments when given, else torch.distributed's when it is initialised,
    else (0, 1) for a single process."""
    if (rank is None) != (world_size is None):
        raise ConfigError(f"give rank and world_size together (got rank={rank}, world_size={world_size}), or "
                          "neither to take them from torch.distributed")
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    rank, world_size = check_int("rank", rank), check_int("world_size", world_size)
    if world_size < 1:
        raise ConfigError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in 0..{world_size - 1} for world_size={world_size}, got {rank}")
    return int(rank), int(world_size)


def check_uneven(uneven: str) -> str:
    if uneven not in UNEVEN:
        raise ConfigError(f"uneven must be one of {UNEVEN}, got {uneven!r}")
    return uneven


def even_length(count: int, world_size: int, uneven: str) -> int:
    """Length of an order of `count` samples once padded or cut to a multiple of `world_size`."""
    if uneven == "drop":
        return count - count % world_size
    return -(-count // world_size) * world_size if count else 0


def rank_count(count: int, world_size: int, uneven: str) -> int:
    """Samples each rank gets out of `count`."""
    return even_length(count, world_size, uneven) // world_size


def make_even(order: np.ndarray, start: int, world_size: int, uneven: str) -> np.ndarray:
    """`order[start:]` padded by wrapping around `order` (from its beginning) or cut to a multiple of the
    world size. Starting later than 0 is how an epoch resumes on another world size."""
    rest = order[start:]
    length = even_length(len(rest), world_size, uneven)
    if length <= len(rest):
        return rest[:length]
    return np.concatenate([rest, np.resize(order, length - len(rest))])


def interleaved_part(order: np.ndarray, rank: int, world_size: int, uneven: str, start: int = 0) -> np.ndarray:
    """Rank `rank`'s samples: every world_size-th of the even order, as DistributedSampler splits. When all
    ranks have taken the same number of samples, together they have taken a prefix of the order, which is what
    lets an epoch resume on another world size."""
    return make_even(order, start, world_size, uneven)[rank::world_size]


def contiguous_part(order: np.ndarray, rank: int, world_size: int, uneven: str) -> np.ndarray:
    """Rank `rank`'s samples: one contiguous slice of the even order (streamed shards: each rank reads about
    1/world_size of the data instead of all of it)."""
    even = make_even(order, 0, world_size, uneven)
    per_rank = len(even) // world_size
    return even[rank * per_rank:(rank + 1) * per_rank]


def check_not_empty(count: int, world_size: int, uneven: str, what: str) -> None:
    """A clear error before training when the split would leave every rank without a sample."""
    if count and rank_count(count, world_size, uneven) == 0:
        raise ConfigError(f"{what}: {count} samples cannot be split over {world_size} ranks with uneven='drop' "
                          "(every rank would get none); use uneven='pad'")
