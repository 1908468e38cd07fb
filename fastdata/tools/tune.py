"""`fastdata tune`: find how many workers and how much prefetch (and, with a CUDA device whose nvjpeg works, where
to decode) give a loader its best throughput on this machine, within a time budget, and keep the answer for
`num_workers="auto"` / `prefetch_factor="auto"` (fastdata.loader.tuning).

The search is bounded, not a grid. For each decode placement, worker counts climb a ladder (1, 2, 4, 8, ... up to
`max_workers`, default one more than the cores, since workers waiting on storage leave a core idle) at prefetch 2,
and stop climbing when the loop no longer waits for data (the meter's data wait is under `wait_floor`: the step
is the wall, more workers cannot help) or when throughput falls. The gaps around the best rung are then bisected,
and prefetch 4 and 8 are tried at the best point (unless the loop never waits there). With budget left, the two
best points are measured again, alternating (`confirm` rounds), and a point's figure is the mean of its runs, so
that one lucky window decides less. Each point is one loader
with persistent workers: `warmup` batches untimed (worker start-up, the first round of batches), then a measured
window of `window_s` seconds through the step, timed by `fastdata.meter`. A point starts only when the budget
still holds it (the costliest point so far as the estimate). The choice is the cheapest point (fewest workers,
then least prefetch) within `tolerance` of the best measured one: noise decides nothing, memory is saved.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastdata.config import available_cores, check_int, check_number
from fastdata.errors import ConfigError
from fastdata.loader.tuning import (
    DECODES,
    TUNE_FILE,
    Choice,
    TuneEntry,
    TuneKey,
    dataset_root,
    default_tune_dir,
    loader_key,
    now_utc,
    write_entry,
)
from fastdata.tools.tune_steps import Step, parse_step

PREFETCH = (2, 4, 8)
WAIT_FLOOR = 0.05  # below this data wait, the step is the wall: more workers cannot help
TOLERANCE = 0.03  # points within 3% of the best count as equal; the cheapest of them is chosen
DROP = 0.10  # a rung more than 10% slower than the best so far ends the climb (less would be noise)


@dataclass(frozen=True)
class Point:
    """One setting the search measures."""

    num_workers: int
    prefetch_factor: int = 2
    decode: str = "worker"


@dataclass
class Measured:
    """What one point gave: images/s through the step, the meter's data wait in the window, and the seconds the
    point took in all (loader start to workers gone: what it cost the budget)."""

    point: Point
    images_per_s: float
    data_wait: float | None
    seconds: float
    runs: int = 1

    def as_choice(self) -> Choice:
        p = self.point
        return Choice(p.num_workers, p.prefetch_factor, p.decode, round(self.images_per_s, 1),
                      None if self.data_wait is None else round(self.data_wait, 4))


@dataclass
class Search:
    """The points measured, in order, why the search stopped where it did, and the choice."""

    measured: list[Measured] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tolerance: float = TOLERANCE

    @property
    def seconds(self) -> float:
        return sum(m.seconds for m in self.measured)

    def points(self) -> list[Measured]:
        """One figure per point, in the order first measured: the mean of its runs (seconds: their sum)."""
        runs: dict[Point, list[Measured]] = {}
        for m in self.measured:
            runs.setdefault(m.point, []).append(m)
        out = []
        for point, done in runs.items():
            waits = [m.data_wait for m in done]
            out.append(Measured(point, sum(m.images_per_s for m in done) / len(done),
                                None if None in waits else sum(waits) / len(waits),  # type: ignore[arg-type]
                                sum(m.seconds for m in done), len(done)))
        return out

    def get(self, point: Point) -> Measured | None:
        return next((m for m in self.points() if m.point == point), None)

    def best(self, decode: str | None = None) -> Measured | None:
        """The cheapest point within `tolerance` of the fastest (of one decode placement, or of all)."""
        pool = [m for m in self.points() if decode is None or m.point.decode == decode]
        if not pool:
            return None
        top = max(m.images_per_s for m in pool)
        near = [m for m in pool if m.images_per_s >= top * (1 - self.tolerance)]
        return min(near, key=lambda m: (m.point.num_workers, m.point.prefetch_factor, -m.images_per_s))

    @property
    def choice(self) -> Measured:
        best = self.best()
        if best is None:
            raise ConfigError("the tune search measured no point: raise --budget")
        return best


def ladder(max_workers: int) -> list[int]:
    """1, 2, 4, 8, ... below `max_workers`, then `max_workers` itself."""
    rungs, n = [], 1
    while n < max_workers:
        rungs.append(n)
        n *= 2
    return [*rungs, max_workers]


def search(measure: Callable[[Point], Measured], *, max_workers: int, budget_s: float,
           decodes: Iterable[str] = ("worker",), prefetch: Iterable[int] = PREFETCH, wait_floor: float = WAIT_FLOOR,
           tolerance: float = TOLERANCE, confirm: int = 2, say: Callable[[str], None] | None = None) -> Search:
    """Measure points with `measure` (see the module's docstring) until the search is done or `budget_s`, counted
    as the sum of the points' own seconds, would be exceeded by the next point."""
    check_int("max_workers", max_workers, minimum=1)
    check_number("budget_s", budget_s, minimum=0)
    result = Search(tolerance=tolerance)
    prefetch = list(prefetch)
    say = say or (lambda _line: None)

    def run(point: Point, again: bool = False) -> Measured | None:
        done = result.get(point)
        if done is not None and not again:
            return done
        if result.measured and result.seconds + max(m.seconds for m in result.measured) > budget_s:
            if not any(n.startswith("budget") for n in result.notes):
                result.notes.append(f"budget: {_label(point)} would not fit in the budget of {budget_s:.0f} s "
                                    f"({result.seconds:.1f} s used); --budget gives the search more time")
            return None
        measured = measure(point)
        result.measured.append(measured)
        say(f"tune: {_label(point)}: {measured.images_per_s:,.0f} images/s, data wait "
            f"{_percent(measured.data_wait)} ({measured.seconds:.1f} s)")
        return measured

    decodes = list(decodes)
    if len(decodes) > 1:
        # where to decode is the first question: each placement once at the most workers, then the faster one's
        # worker count is searched first, so that a short budget still measured every placement
        first = {d: run(Point(max_workers, prefetch[0], d)) for d in decodes}
        decodes.sort(key=lambda d: -(m.images_per_s if (m := first[d]) is not None else 0.0))
    for decode in decodes:
        climbed = _climb(run, result, ladder(max_workers), prefetch[0], decode, wait_floor)
        if climbed:
            _bisect(run, result, climbed, prefetch[0], decode)
    best = result.best()
    if best is not None and len(prefetch) > 1:
        if best.data_wait is not None and best.data_wait < wait_floor:
            result.notes.append(f"prefetch: not searched, the loop waits {_percent(best.data_wait)} for data at "
                                f"{_label(best.point)}")
        else:
            for depth in prefetch[1:]:
                if run(Point(best.point.num_workers, depth, best.point.decode)) is None:
                    break
    for _ in range(confirm):
        leaders = sorted(result.points(), key=lambda m: -m.images_per_s)[:2]
        if len(leaders) < 2 or any(run(m.point, again=True) is None for m in leaders):
            break
    return result


def _climb(run: Callable[[Point], Measured | None], result: Search, rungs: list[int], prefetch: int, decode: str,
           wait_floor: float) -> list[int]:
    """Measure the rungs upwards until the step is the wall or throughput falls; the rungs measured."""
    done: list[int] = []
    top, top_workers = 0.0, 0
    for workers in rungs:
        measured = run(Point(workers, prefetch, decode))
        if measured is None:
            break
        done.append(workers)
        if measured.images_per_s < top * (1 - DROP):
            result.notes.append(f"workers ({decode} decode): stopped at {workers}, slower than {top_workers} "
                                f"({measured.images_per_s:,.0f} < {top:,.0f} images/s)")
            break
        if measured.images_per_s > top:
            top, top_workers = measured.images_per_s, workers
        if measured.data_wait is not None and measured.data_wait < wait_floor:
            if workers != rungs[-1]:
                result.notes.append(f"workers ({decode} decode): stopped at {workers}, the loop waits "
                                    f"{_percent(measured.data_wait)} for data: the step is the wall")
            break
    return done


def _bisect(run: Callable[[Point], Measured | None], result: Search, rungs: list[int], prefetch: int,
            decode: str) -> None:
    """Narrow the gaps on either side of the best rung (by halves) while the budget lasts."""
    measured = {w: m for w in rungs if (m := result.get(Point(w, prefetch, decode))) is not None}
    while True:
        best = max(measured, key=lambda w: measured[w].images_per_s)
        lower = max((w for w in measured if w < best), default=None)
        upper = min((w for w in measured if w > best), default=None)
        gaps = [(lo + hi) // 2 for lo, hi in ((lower, best), (best, upper)) if lo is not None and hi is not None
                and hi - lo > 1]
        if not gaps:
            return
        for workers in gaps:
            m = run(Point(workers, prefetch, decode))
            if m is None:
                return
            measured[workers] = m


def _label(point: Point) -> str:
    return f"workers={point.num_workers} prefetch={point.prefetch_factor} decode={point.decode}"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


@dataclass(frozen=True)
class TuneConfig:
    """What the tuned loader is: batch shape, augmentation, output, device; and how long the search may take."""

    batch_size: int = 256
    augment: str = "train"
    image_size: int | None = None
    dtype: Any = None
    device: str | None = None
    step: str = "none"
    budget_s: float = 60.0
    window_s: float = 3.0
    max_workers: int | None = None  # None: one more than the usable cores, at most 16
    prefetch: tuple[int, ...] = PREFETCH

    def workers_cap(self) -> int:
        return self.max_workers if self.max_workers is not None else min(available_cores() + 1, 16)


def measure_point(path: str | os.PathLike[str], point: Point, config: TuneConfig, step: Step,
                  warmup: int | None = None) -> Measured:
    """One point: a loader with persistent workers, `warmup` batches untimed (default: one per worker, plus
    one), then batches through `step` for `config.window_s` seconds (at least two), timed by fastdata.meter;
    the workers are gone when this returns."""
    with warnings.catch_warnings():
        # one worker more than the cores is a point of the search, not a mistake to warn about at every point
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        return _measure_point(path, point, config, step, warmup)


def _measure_point(path: str | os.PathLike[str], point: Point, config: TuneConfig, step: Step,
                   warmup: int | None) -> Measured:
    from fastdata.loader import loader
    from fastdata.loader.options import OutputOptions
    from fastdata.meter.loop import meter

    started = time.perf_counter()
    before = {p.pid for p in multiprocessing.active_children()}
    built = loader(path, batch_size=config.batch_size, augment=config.augment, image_size=config.image_size,
                   num_workers=point.num_workers, prefetch_factor=point.prefetch_factor, persistent_workers=True,
                   device=config.device, decode=point.decode, output=OutputOptions(dtype=config.dtype))
    warm = point.num_workers + 1 if warmup is None else warmup
    timed = meter(built, warmup_steps=warm, system=False)
    steps, window_start, images = 0, 0.0, 0
    try:
        while True:
            before_pass = steps
            for images_, labels in timed:
                now = time.perf_counter()
                steps += 1
                if steps == warm:
                    window_start = now
                elif steps > warm:
                    images += len(images_)
                step(images_, labels)
                if steps > warm + 1 and time.perf_counter() - window_start >= config.window_s:
                    break
            else:
                if steps == before_pass:
                    raise ConfigError(f"{path}: a pass gave no batch (batch_size {config.batch_size} with "
                                      "drop_last?); tune needs a dataset with batches")
                continue
            break
        step.done()
        seconds = time.perf_counter() - window_start
        report = timed.report()
    finally:
        del timed, built
        _wait_for_workers(before)
    return Measured(point, images / seconds if seconds > 0 else 0.0, report.data_wait_fraction,
                    time.perf_counter() - started)


def _wait_for_workers(before: set[int | None], timeout: float = 30.0) -> None:
    """Collect the loader just dropped and wait until its worker processes have exited, so that the next point
    does not share the CPU with them."""
    gc.collect()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in multiprocessing.active_children() if p.pid not in before]
        if not alive:
            return
        alive[0].join(timeout=0.1)


@dataclass
class TuneResult:
    """A finished `fastdata tune`: the search, the entry stored and where."""

    search: Search
    entry: TuneEntry
    stored: Path | None
    notes: list[str] = field(default_factory=list)


def decodes_for(path: str | os.PathLike[str], config: TuneConfig) -> tuple[str, ...]:
    """("worker",), and "device" too where batches go to a CUDA device (presets only): both placements are
    measured, and `decode="auto"` then takes the faster."""
    if config.device is None:
        return ("worker",)
    import torch

    device = torch.device(config.device)
    if device.type == "cuda" and torch.cuda.is_available():
        return DECODES
    return ("worker",)


def tune_key(path: str | os.PathLike[str], config: TuneConfig) -> tuple[TuneKey, Path | None]:
    """The key "auto" will look the result up by (the same function the loader uses), and the dataset's local
    directory (None: remote)."""
    from fastdata.loader import dataset

    if getattr(dataset(path), "pipeline", None) is None:  # opened without image options: any kind opens so
        raise ConfigError(f"{path}: holds text; fastdata tune measures image loaders (their workers decode): give "
                          "a text loader its num_workers and prefetch_factor as numbers")
    data = dataset(path, config.augment, image_size=config.image_size)
    key, why_not = loader_key(data, config.batch_size, config.augment, config.dtype, config.device, 1)
    if key is None:
        raise ConfigError(f"{path}: {why_not}")
    return key, dataset_root(data)


def run_tune(path: str | os.PathLike[str], config: TuneConfig, tune_dir: str | os.PathLike[str] | None = None,
             progress: Callable[[str], None] | None = None,
             measure: Callable[[Point], Measured] | None = None) -> TuneResult:
    """Search (see the module's docstring) and store the result: in `tune_dir` when given, else beside the
    dataset (`tune.json` in its directory), else, when that cannot be written (remote, read-only), in the user
    cache `default_tune_dir()`; the fallback is said in `notes`. `measure` replaces the real measurement (tests)."""
    say = progress or (lambda _line: None)
    started = time.perf_counter()
    key, root = tune_key(path, config)
    step = parse_step(config.step)
    decodes = decodes_for(path, config)
    if measure is None:
        def measure(point: Point) -> Measured:
            return measure_point(path, point, config, step)

    budget = max(0.0, config.budget_s - (time.perf_counter() - started))  # opening the dataset, the step's set-up
    found = search(measure, max_workers=config.workers_cap(), budget_s=budget, decodes=decodes,
                   prefetch=config.prefetch, say=say)
    choice = found.choice
    by_decode = {d: b.as_choice() for d in decodes if (b := found.best(d)) is not None}
    entry = TuneEntry(key=key, choice=choice.as_choice(), by_decode=by_decode,
                      measured=[m.as_choice() for m in found.points()], step=step.name, budget_s=config.budget_s,
                      seconds=round(found.seconds, 2), created=now_utc())
    notes: list[str] = []
    unseen = placement_note(decodes, step.name)
    if unseen is not None:
        notes.append(unseen)
    if config.device is None and _cuda_available():
        notes.append("CUDA is available: for a loader given device='cuda', tune with --device cuda (decoding on the "
                     "GPU is measured too)")
    stored = _store(entry, root, tune_dir, notes)
    return TuneResult(found, entry, stored, notes)


def placement_note(decodes: tuple[str, ...], step: str) -> str | None:
    """What a comparison of decode placements without a model step cannot see (None: nothing): the device path's
    decoding and resizing share the GPU and the training process with the step, where decoding in the workers
    does not (on an H200, tune without a step chose the device path for ResNet-18, and the defaults then fed its
    loop at 3,816 images/s against 4,166 decoding in the workers: benchmarks/README.md, "GPU decode")."""
    if len(decodes) < 2 or not (step == "none" or step == "to-device" or step.endswith("ms")):
        return None
    return ("decode: the placements were measured without a model step; the device path shares the GPU and the "
            "training process with the step, which this does not see: tune again with your model as the step "
            "(e.g. --step resnet50) before trusting decode=\"device\" by a small margin")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _store(entry: TuneEntry, root: Path | None, tune_dir: str | os.PathLike[str] | None, notes: list[str]) -> Path:
    cache = Path(tune_dir) if tune_dir is not None else default_tune_dir()
    if tune_dir is None and root is not None:
        try:
            return write_entry(root / TUNE_FILE, entry)
        except PermissionError as exc:
            notes.append(f"could not write {root / TUNE_FILE} ({exc.strerror}): kept in {cache} instead, where "
                         "\"auto\" looks next")
        except OSError as exc:
            notes.append(f"could not write {root / TUNE_FILE} ({exc.strerror or exc}): kept in {cache} instead, "
                         "where \"auto\" looks next")
    return write_entry(cache / f"{entry.key.dataset}.json", entry)


def format_search(found: Search) -> str:
    """The measured points in order, with images/s, data wait, the share of the best, and the choice marked."""
    choice = found.choice.point
    points = found.points()
    top = max(m.images_per_s for m in points)
    header = (f"  {'workers':>7} {'prefetch':>8} {'decode':>6} {'images/s':>10} {'data wait':>9} {'of best':>8} "
              f"{'runs':>4}")
    lines = [header, "  " + "-" * (len(header) - 2)]
    for m in points:
        p = m.point
        mark = "  <- choice" if p == choice else ""
        lines.append(f"  {p.num_workers:>7} {p.prefetch_factor:>8} {p.decode:>6} {m.images_per_s:>10,.0f} "
                     f"{_percent(m.data_wait):>9} {m.images_per_s / top if top else 0:>8.0%} {m.runs:>4}{mark}")
    return "\n".join(lines)


def format_result(path: str | os.PathLike[str], result: TuneResult, config: TuneConfig) -> str:
    """The table, why the search stopped where it did, the choice, where it is kept and how to use it."""
    found, entry = result.search, result.entry
    c = entry.choice
    lines = [format_search(found), ""]
    lines += [f"  {note}" for note in found.notes + result.notes]
    decode = f", decode={c.decode!r}" if len(entry.by_decode) > 1 else ""
    lines.append(f"choice: num_workers={c.num_workers}, prefetch_factor={c.prefetch_factor}{decode}: "
                 f"{c.images_per_s:,.0f} images/s (step {entry.step}; {len(found.measured)} runs in "
                 f"{found.seconds:.0f} s)")
    lines.append(f"kept in {result.stored}")
    options = [f"batch_size={config.batch_size}"]
    if config.augment != "train":
        options.append(f"augment={config.augment!r}")
    if config.image_size is not None:
        options.append(f"image_size={config.image_size}")
    if config.dtype is not None:
        options.append(f"dtype={config.dtype}")
    if config.device is not None:
        options.append(f"device={config.device!r}")
    if result.stored is not None and result.stored.name != TUNE_FILE and (
            result.stored.parent != default_tune_dir()):
        options.append(f"tune_dir={str(result.stored.parent)!r}")
    lines.append(f"use: fastdata.loader({str(path)!r}, {', '.join(options)}, num_workers=\"auto\", "
                 "prefetch_factor=\"auto\")")
    return "\n".join(lines)
