"""Option parsing shared by the API and the CLI, and the options every loader takes."""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from fastdata.errors import ConfigError

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}


def _given(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def check_int(name: str, value: Any, minimum: int | None = None) -> int:
    """`value` as an int, or ConfigError naming option `name`, what was given and what is expected: a float
    (`32.0`), a string (`"64"`) or a bool is refused, not converted; numpy integers are taken."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an int, got {_given(value)}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value!r}")
    return int(value)


def check_epoch(value: Any) -> int:
    """An epoch given to `set_epoch`: a non-negative int (numpy integers taken), else ConfigError saying so (a
    string, a float or a bool is refused, not converted: `set_epoch(1.5)` must not quietly run epoch 1)."""
    return check_int("epoch", value, minimum=0)


AUTO = "auto"  # num_workers / prefetch_factor: the stored `fastdata tune` result (fastdata.loader.tuning)


def check_int_or_auto(name: str, value: Any, minimum: int | None = None) -> int | str:
    """"auto", or `value` checked by `check_int` (ConfigError naming option `name`, what was given, and that "auto"
    is taken too)."""
    if isinstance(value, str):
        if value != AUTO:
            raise ConfigError(f"{name} must be an int or {AUTO!r}, got {_given(value)}")
        return AUTO
    return check_int(name, value, minimum)


def check_optional_int(name: str, value: Any, minimum: int | None = None) -> int | None:
    """None, or `value` checked by `check_int`."""
    return None if value is None else check_int(name, value, minimum)


def check_bool(name: str, value: Any) -> bool:
    """`value` if it is a bool, else ConfigError naming option `name` and what was given (`1` or `"yes"` is
    refused, not converted)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {_given(value)}")
    return bool(value)


def check_optional_bool(name: str, value: Any) -> bool | None:
    """None, or `value` checked by `check_bool`."""
    return None if value is None else check_bool(name, value)


def check_number(name: str, value: Any, minimum: float | None = None) -> float:
    """`value` as a real number (int or float, not bool or str), or ConfigError naming option `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number, got {_given(value)}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value!r}")
    return value  # type: ignore[return-value]  # a numbers.Real: int, float or a numpy scalar


def parse_size(text: str | int) -> int:
    """Parse a byte count such as `256MB`, `64KB`, `1.5GiB` or `1000000` (KB/MB/GB are powers of 1000,
    KiB/MiB/GiB powers of 1024)."""
    # int named beside the numbers ABCs for mypy, which does not see int registered as one
    if isinstance(text, bool) or not isinstance(text, (str, int, numbers.Real)):
        raise ConfigError(f"cannot read {_given(text)} as a size: use e.g. 256MB, 64KB, 1GiB or a byte count")
    if isinstance(text, (int, numbers.Integral)):
        value = int(text)
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
        """Check every option's type and range (a ConfigError names the option, the value and what it takes)."""
        checked = {name: check(name, getattr(self, name)) for name, check in _LOADER_CHECKS.items()}
        for f in fields(self):
            if f.name in checked:
                object.__setattr__(self, f.name, checked[f.name])

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


_LOADER_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "batch_size": lambda name, v: check_int(name, v, minimum=1),
    "shuffle": check_bool,
    "seed": lambda name, v: check_int(name, v, minimum=0),
    "drop_last": check_bool,
    "num_workers": lambda name, v: check_int(name, v, minimum=0),
    "pin_memory": check_bool,
    "prefetch_factor": lambda name, v: check_int(name, v, minimum=1),
    "persistent_workers": check_bool,
    "timeout": lambda name, v: check_number(name, v, minimum=0),
    "rank": lambda name, v: check_int(name, v, minimum=0),
    "world_size": lambda name, v: check_int(name, v, minimum=1),
}
