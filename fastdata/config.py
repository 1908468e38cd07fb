"""Option parsing shared by the API and the CLI, and the options every loader takes."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastdata.errors import ConfigError

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}


def parse_size(text: str | int) -> int:
    """Parse a byte count such as `256MB`, `64KB`, `1.5GiB` or `1000000` (KB/MB/GB are powers of 1000,
    KiB/MiB/GiB powers of 1024)."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        if not match or match.group(2).upper() not in _SIZE_UNITS:
            raise ConfigError(f"cannot read {text!r} as a size: use e.g. 256MB, 64KB, 1GiB or a byte count")
        value = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])
    if value <= 0:
        raise ConfigError(f"a size must be positive, got {text!r}")
    return value


def available_cores() -> int:
    """CPU cores this process may run on (respects affinity masks and container cpusets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1


@dataclass(frozen=True)
class LoaderOptions:
    """What every loader (image or text) takes, validated once by `fastdata.loader`: batch shape, order, the
    DataLoader's workers and hand-over, and this process's rank of the job."""

    batch_size: int = 256
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int = 2
    persistent_workers: bool = True
    multiprocessing_context: Any = None
    timeout: float = 0
    rank: int = 0
    world_size: int = 1
    uneven: str = "pad"

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.prefetch_factor < 1:
            raise ConfigError(f"prefetch_factor must be at least 1, got {self.prefetch_factor}")
        if self.timeout < 0:
            raise ConfigError(f"timeout must be >= 0 seconds, got {self.timeout}")

    def dataloader_kwargs(self, worker_init_fn: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Keyword arguments for the `torch.utils.data.DataLoader` a loader wraps (whole batches come from its
        dataset, so `batch_size=None`); the worker-only settings apply only with workers."""
        workers = self.num_workers
        return {"batch_size": None, "num_workers": workers, "pin_memory": self.pin_memory,
                "worker_init_fn": worker_init_fn if workers else None,
                "persistent_workers": self.persistent_workers and workers > 0,
                "prefetch_factor": self.prefetch_factor if workers else None,
                "multiprocessing_context": self.multiprocessing_context if workers else None,
                "timeout": self.timeout if workers else 0}
