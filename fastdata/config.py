"""Option parsing shared by the API and the CLI, and the options every loader takes."""

from __future__ import annotations

import functools
import numbers
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from fastdata.errors import ConfigError, FastdataError, from_worker

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
    return value


def parse_size(text: str | int) -> int:
    """Parse a byte count such as `256MB`, `64KB`, `1.5GiB` or `1000000` (KB/MB/GB are powers of 1000,
    KiB/MiB/GiB powers of 1024)."""
    if isinstance(text, bool) or not isinstance(text, (str, numbers.Real)):
        raise ConfigError(f"cannot read {_given(text)} as a size: use e.g. 256MB, 64KB, 1GiB or a byte count")
    if isinstance(text, numbers.Integral):
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


def stop_workers(dataloader: Any, batches: Any) -> None:
    """End the worker processes behind `batches` (an iterator of `dataloader`, a torch DataLoader) after a pass
    failed, and drop the iterator the DataLoader keeps for persistent workers; the next pass starts new ones.
    Left to the garbage collector instead, the failed iterator may be collected inside the worker processes of a
    loader made later (they inherit it when they fork), where its shutdown prints "Exception ignored in ...
    can only test a child process"."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    if getattr(dataloader, "_iterator", None) is batches:
        dataloader._iterator = None


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back while worker processes start (a loader's first `iter()`, a conversion's pool): a
    Ctrl-C reaches every process of the terminal's group, and one that reached a worker before it entered its loop
    would print the worker's own traceback, or one that broke into the start-up would leave some workers started.
    Two holds, because one alone leaks: the mask, which the workers inherit and clear once they ignore SIGINT
    (`worker_ignores_ctrl_c`); and, in this process, a handler that only notes the signal (any native thread that
    does not block SIGINT, such as torch's or OpenMP's, takes it despite the main thread's mask, and Python runs
    its handler in the main thread all the same). When the block ends, a Ctrl-C that came meanwhile is raised here,
    through the handler that was in place before (and the workers started are then stopped, as after any failed
    start or pass). In a thread other than the main one, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous_handler = signal.getsignal(signal.SIGINT)
    noting = previous_handler is not None  # None: a handler set outside Python, which cannot be put back
    if noting:
        signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if noting:
            signal.signal(signal.SIGINT, previous_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)  # one pending for this thread lands here
        if came:
            signal.raise_signal(signal.SIGINT)


def worker_ignores_ctrl_c() -> None:
    """In a DataLoader worker: leave Ctrl-C to the main process, which stops the workers (a SIGINT held back while
    the worker started is dropped here)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    sys.excepthook = functools.partial(_quiet_hand_over, sys.excepthook)


def _quiet_hand_over(previous: Callable[..., None], kind: type[BaseException], value: BaseException,
                     trace: Any) -> None:
    """A worker's `sys.excepthook`: a batch's shared memory is handed to the main process by multiprocessing's
    resource sharer (a thread of the worker, which reports its errors through this hook); when Ctrl-C stops the
    main process in the middle of taking one, that thread's connection breaks, which is no error of the run (the
    main process says it was interrupted): nothing is printed for it. Anything else goes to the `previous` hook."""
    if issubclass(kind, (EOFError, ConnectionError)) and any(
            frame.filename.endswith("resource_sharer.py") for frame in traceback.extract_tb(trace)):
        return
    previous(kind, value, trace)


def failed_pass(dataloader: Any, batches: Any, exc: BaseException) -> BaseException:
    """After `exc` ended a pass over `batches`: stop the workers (`stop_workers`) and return what to raise, our
    own error as the worker raised it (`fastdata.errors.from_worker`: its one-line message, not torch's wrapper),
    or `exc` itself."""
    stop_workers(dataloader, batches)
    return from_worker(exc) if isinstance(exc, FastdataError) else exc


_LOADER_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "batch_size": lambda name, v: check_int(name, v, minimum=1),
    "shuffle": check_bool,
    "seed": check_int,
    "drop_last": check_bool,
    "num_workers": lambda name, v: check_int(name, v, minimum=0),
    "pin_memory": check_bool,
    "prefetch_factor": lambda name, v: check_int(name, v, minimum=1),
    "persistent_workers": check_bool,
    "timeout": lambda name, v: check_number(name, v, minimum=0),
    "rank": lambda name, v: check_int(name, v, minimum=0),
    "world_size": lambda name, v: check_int(name, v, minimum=1),
}
