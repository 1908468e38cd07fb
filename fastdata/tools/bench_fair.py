"""Fairness rules shared by `fastdata bench` and every script in benchmarks/, so that a comparison is fair by
construction rather than by care:

- every contender's DataLoader gets the settings fastdata.loader uses (`loader_settings`): workers,
  persistent workers, pinned memory, prefetch factor;
- every contender gets the same warm-up: `WARMUP_PASSES` untimed passes over a freshly built loader (worker
  start-up, JIT compilation and first touches happen there, for all alike);
- every contender's files are read once before any timing (`warm_page_cache`), or evicted before each timed
  run for all (`evict_page_cache`, where the kernel allows);
- contenders run `DEFAULT_REPEATS` times, alternating (`alternate`), and a ratio is the median of the per-run
  ratios (`median_ratio`), never the ratio of two medians: run i of a contender is paired with run i of the
  baseline, which ran next to it under the same machine noise.
"""

from __future__ import annotations

import inspect
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastdata.config import available_cores
from fastdata.errors import ConfigError

DEFAULT_REPEATS = 3
WARMUP_PASSES = 1
PAGE_CACHE = ("warm", "cold")
STEPS = ("none", "to-device")  # what a bench loop does with each batch

T = TypeVar("T")


@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader settings every contender gets: fastdata.loader's own, given to the baselines too."""

    num_workers: int
    persistent_workers: bool
    pin_memory: bool
    prefetch_factor: int

    def dataloader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `torch.utils.data.DataLoader` (persistence and prefetch need workers)."""
        workers = self.num_workers
        return {"num_workers": workers, "persistent_workers": self.persistent_workers and workers > 0,
                "pin_memory": self.pin_memory, "prefetch_factor": self.prefetch_factor if workers else None}

    def loader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `fastdata.loader` (the same values, so that fastdata runs as the baselines do)."""
        return {"num_workers": self.num_workers, "persistent_workers": self.persistent_workers,
                "pin_memory": self.pin_memory, "prefetch_factor": self.prefetch_factor}


def loader_settings(num_workers: int | None = None, augment: Any = "train") -> LoaderSettings:
    """fastdata.loader's defaults, read from its signature: persistent workers as it decides them for `augment`
    (kept for "train", not for "val"), the prefetch factor as declared there, pinned memory when CUDA is
    available, one worker per usable core (at most 16) unless `num_workers` says otherwise."""
    import torch

    from fastdata.loader import default_persistent_workers, loader

    defaults = {name: p.default for name, p in inspect.signature(loader).parameters.items()}
    workers = min(available_cores(), 16) if num_workers is None else num_workers
    if workers < 0:
        raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
    pin = defaults["pin_memory"]
    persistent = defaults["persistent_workers"]
    return LoaderSettings(num_workers=workers,
                          persistent_workers=default_persistent_workers(augment) if persistent is None else
                          bool(persistent),
                          pin_memory=torch.cuda.is_available() if pin is None else bool(pin),
                          prefetch_factor=int(defaults["prefetch_factor"]))


def per_run_ratios(values: Sequence[float], baselines: Sequence[float]) -> list[float]:
    """values[i] / baselines[i]: each run against the baseline run of the same round."""
    if len(values) != len(baselines):
        raise ConfigError(f"per-run ratios need one baseline run per run, got {len(values)} runs and "
                          f"{len(baselines)} baseline runs")
    return [v / b if b > 0 else float("nan") for v, b in zip(values, baselines, strict=True)]


def median_ratio(values: Sequence[float], baselines: Sequence[float]) -> float:
    """The median of the per-run ratios (not the ratio of the medians)."""
    ratios = per_run_ratios(values, baselines)
    return statistics.median(ratios) if ratios else float("nan")


def alternate(contenders: Sequence[T], repeats: int, run: Callable[[T, int], Any]) -> None:
    """Call `run(contender, round)` for every contender, round after round (A B C, A B C, ...), so that a
    drift of the machine hits all of them alike."""
    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    for repeat in range(repeats):
        for contender in contenders:
            run(contender, repeat)


def warm_page_cache(files: Iterable[str | os.PathLike[str]], chunk: int = 1 << 22) -> int:
    """Read every file once (into the page cache, as every contender's are before timing); bytes read."""
    total = 0
    buffer = bytearray(chunk)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    return total


def evict_page_cache(files: Iterable[str | os.PathLike[str]]) -> bool:
    """Ask the kernel to drop the files' cached pages (posix_fadvise DONTNEED: clean pages only, no root
    needed). False where the platform has no posix_fadvise."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def check_page_cache(policy: str) -> str:
    if policy not in PAGE_CACHE:
        raise ConfigError(f"page_cache must be one of {PAGE_CACHE}, got {policy!r}")
    return policy


def dataset_files(path: str | os.PathLike[str]) -> list[Path]:
    """The data files of a converted dataset (LMDB file or shards), as its manifest lists them."""
    from fastdata.formats.manifest import read_manifest

    root = Path(path)
    return [root / entry.name for entry in read_manifest(root).files]


@dataclass(frozen=True)
class BenchConfig:
    """What to measure: timed passes, batch shape, transform preset, workers, repetitions, warm-up and page
    cache policy (the same for every contender)."""

    epochs: int = 2
    batch_size: int = 128
    image_size: int = 224
    augment: str = "train"
    workers: int | None = None
    repeats: int = DEFAULT_REPEATS
    step: str = "none"  # what the loop does with each batch: nothing, or copy to the device + float/255 there
    upper_bound_mb: int = 512  # memory the synthetic upper bound may hold batches in
    warmup_passes: int = WARMUP_PASSES  # untimed passes over each freshly built loader before the timed ones
    page_cache: str = "warm"  # "warm": every contender's files read once before timing; "cold": evicted per run
    metered: bool = True  # time through fastdata.meter (timeline, data wait); False: a bare loop, for loops whose
    # steps take microseconds, where the meter's own ~2 us a step and ~3 ms a pass would show

    def __post_init__(self) -> None:
        if self.step not in STEPS:
            raise ConfigError(f"step must be one of {STEPS}, got {self.step!r}")
        if self.warmup_passes < 0:
            raise ConfigError(f"warmup_passes must be >= 0, got {self.warmup_passes}")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be at least 1, got {self.repeats}")
        check_page_cache(self.page_cache)

    @property
    def settings(self) -> LoaderSettings:
        """The DataLoader settings of every contender: fastdata.loader's for this `augment`, with `workers`
        workers."""
        return loader_settings(self.workers, self.augment)

    @property
    def num_workers(self) -> int:
        return self.settings.num_workers
