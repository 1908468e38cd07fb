"""`fastdata.meter`: wrap any iterable a training loop runs over, and learn whether the loop is input-bound.

For each step it times the wait for the next batch (data wait) against the time the loop spent with the batch
(compute); with CUDA in use it also records two CUDA events per step (no blocking sync in the loop) so that
the wait the *GPU* saw is measured, not the host's. A background sampler records CPU, iowait, disk, RSS and
GPU figures (`fastdata.meter.system`); with `fastdata.loader`, the per-stage seconds of its workers say which
stage is the wall. `report()` turns all of it into a verdict with reasons and suggestions; in a torch.distributed
job it compares the ranks and names a straggler (`fastdata.meter.ranks`). `trace=` writes the timeline as a
Perfetto trace (`fastdata.meter.trace`); `on_log=` hands the live figures to a callback (`fastdata.meter.hooks`).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from fastdata.meter import hooks
from fastdata.meter.ranks import compare_ranks, distributed_rank, gather_figures, straggler_advice
from fastdata.meter.report import LoaderFacts, MeterReport, Window, build_report
from fastdata.meter.stages import StageTimes
from fastdata.meter.system import SystemSampler
from fastdata.meter.trace import MAX_EVENTS, Tracer

T = TypeVar("T")


def meter(iterable: Iterable[T], *, sync: bool | None = None, log_every: int | None = None,
          batch_size: int | Callable[[Any], int] | None = None, warmup_steps: int = 1, interval: float = 1.0,
          system: bool = True, log: Callable[[str], None] | None = None,
          on_log: Callable[[dict[str, Any]], None] | None = None, trace: str | Path | None = None,
          trace_max_events: int = MAX_EVENTS, ranks: bool | None = None) -> Meter[T]:
    """Wrap `iterable` so that iterating the result yields its items unchanged while timing every step.

    Args:
        iterable: what the training loop iterates: a `fastdata.loader`, a DataLoader, any iterable.
        sync: time GPU work with CUDA events (None: when CUDA is in use by the first step's end).
        log_every: print a live line (steps/s, samples/s, data wait, CPU, GPU) every N steps through `log`
            (None: no live lines).
        batch_size: samples per item, or a function of the item (default: inferred from the first tensor /
            array / sequence in it).
        warmup_steps: first steps left out of rates and fractions (worker start-up; `first_batch_s` reports it).
        interval: seconds between system samples.
        system: sample CPU, iowait, disk, memory and GPU figures once every `interval` (False: timings only).
        log: where live lines go (default: stderr; with `on_log` and no `log`, no lines are printed).
        on_log: called every `log_every` steps with the live figures as a dict (`step`, `seconds`, `steps_per_s`,
            `samples_per_s`, `data_wait_fraction` since the last call, and the last system sample's
            `cpu_percent`, `iowait_percent`, `gpu_util_percent`, `rss_mb`, ...; unavailable ones left out).
            `fastdata.meter.tensorboard(writer)` and `fastdata.meter.lightning(logger)` make one.
        trace: write the timeline to this JSON file, a Chrome / Perfetto trace (ui.perfetto.dev,
            chrome://tracing): data wait and compute per step, each loader worker's read / decode / augment /
            collate per batch (fastdata loaders), system samples as counters. Rewritten at the end of every pass
            and at `close()`. In a torch.distributed job each rank writes its own (`run.json` -> `run.rank1.json`).
        trace_max_events: events the trace keeps (the first ones; the file says how many were left out).
        ranks: in a torch.distributed job, every rank's data wait is gathered at the end of each whole pass (all
            ranks get there together) and `report()`, on any rank, names the slowest rank. None: when
            torch.distributed is initialised with more than one rank; False: never (`report(ranks=False)` leaves
            the line out of one report).
    """
    return Meter(iterable, sync=sync, log_every=log_every, batch_size=batch_size, warmup_steps=warmup_steps,
                 interval=interval, system=system, log=log, on_log=on_log, trace=trace,
                 trace_max_events=trace_max_events, ranks=ranks)


meter.tensorboard = hooks.tensorboard  # type: ignore[attr-defined]  # fastdata.meter.tensorboard(writer)
meter.lightning = hooks.lightning  # type: ignore[attr-defined]  # fastdata.meter.lightning(logger)


def infer_batch_size(item: Any) -> int | None:
    """Samples in a batch: the first dimension of the first tensor / array found in it (tuples, lists and
    dicts are searched first element first), or None when nothing in it has a shape."""
    for _ in range(8):  # bounded descent into nested containers
        shape = getattr(item, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else None
        if isinstance(item, (tuple, list)):
            if not item:
                return None
            item = item[0]
        elif isinstance(item, Mapping):
            if not item:
                return None
            item = next(iter(item.values()))
        else:
            return None
    return None


class _Counts:
    """Running totals of the hot loop (slots: cheap attribute updates)."""

    __slots__ = ("samples", "samples_known", "steps", "wait")

    def __init__(self) -> None:
        self.steps = 0
        self.samples = 0
        self.samples_known = True
        self.wait = 0.0


class _Timeline:
    """Steps, samples and data wait in fixed-width time bins; when there would be more than `max_bins`, pairs
    merge and the width doubles, so memory stays bounded however long the loop runs."""

    def __init__(self, width: float = 0.1, max_bins: int = 400) -> None:
        self.origin: float | None = None
        self.width = width
        self.max_bins = max_bins
        self.steps: list[int] = []
        self.samples: list[int] = []
        self.wait: list[float] = []
        self.end = 0.0

    def add(self, t0: float, t1: float, samples: int) -> None:
        """One step whose wait ran from t0 to t1 (perf_counter seconds)."""
        if self.origin is None:
            self.origin = t0
        last = self._index(t1)
        first = self._index(t0)
        if first == last:
            self.wait[last] += t1 - t0
        else:  # a wait across bins: give each bin its share
            first = max(first, 0)
            for b in range(first, last + 1):
                lo = max(t0, self.origin + b * self.width)
                hi = min(t1, self.origin + (b + 1) * self.width)
                self.wait[b] += max(0.0, hi - lo)
        self.steps[last] += 1
        self.samples[last] += samples
        self.end = max(self.end, t1)

    def _index(self, t: float) -> int:
        assert self.origin is not None  # set by the first step
        index = int((t - self.origin) / self.width)
        while index >= self.max_bins:
            self._coarsen()
            index = int((t - self.origin) / self.width)
        while len(self.steps) <= index:
            self.steps.append(0)
            self.samples.append(0)
            self.wait.append(0.0)
        return index

    def _coarsen(self) -> None:
        def pairs(values: list) -> list:
            return [sum(values[i:i + 2]) for i in range(0, len(values), 2)]

        self.steps, self.samples, self.wait = pairs(self.steps), pairs(self.samples), pairs(self.wait)
        self.width *= 2

    def as_dict(self, until: float | None = None) -> dict[str, Any]:
        """Per bin: its mid time (s from the first step), samples/s, steps/s and data-wait fraction."""
        out: dict[str, Any] = {"bin_s": self.width, "t": [], "samples_per_s": [], "steps_per_s": [],
                               "data_wait_fraction": []}
        if self.origin is None:
            return out
        end = max(self.end, until or 0.0)
        for b in range(len(self.steps)):
            start = b * self.width
            span = min(self.width, end - self.origin - start) if b == len(self.steps) - 1 else self.width
            if span <= 1e-9:
                continue
            out["t"].append(round(start + span / 2, 4))
            out["samples_per_s"].append(round(self.samples[b] / span, 3))
            out["steps_per_s"].append(round(self.steps[b] / span, 3))
            out["data_wait_fraction"].append(round(min(1.0, self.wait[b] / span), 4))
        return out


class _CudaTimer:
    """GPU-side view of each step, from two CUDA events per step on the current stream: `done` when the loop
    asks for the next batch, `ready` when it has it. The GPU's idle gap between `done` and the next `ready`
    is the wait it saw; events are read when the GPU has passed them (query), never by blocking the loop."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._ready_prev: Any = None
        self._done_prev: Any = None
        self._pending: deque = deque()
        self.wait_s = 0.0
        self.cycle_s = 0.0
        self.steps = 0

    def boundary(self) -> None:
        """The loop finished a step and asks for the next batch."""
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        self._done_prev = event
        while self._pending and self._pending[0][2].query():
            self._resolve(self._pending.popleft())

    def ready(self, counted: bool, first_in_pass: bool) -> None:
        """The next batch arrived; `counted` steps (past warm-up, not the first of a pass) add to the totals."""
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        if counted and not first_in_pass and self._ready_prev is not None and self._done_prev is not None:
            self._pending.append((self._ready_prev, self._done_prev, event))
        self._ready_prev = event

    def flush(self) -> None:
        """Wait for the GPU to pass every recorded event and add them up (report time, not the hot loop)."""
        if self._pending:
            self._pending[-1][2].synchronize()
        while self._pending:
            self._resolve(self._pending.popleft())

    def _resolve(self, events: tuple) -> None:
        ready_prev, done_prev, ready = events
        self.cycle_s += ready_prev.elapsed_time(ready) / 1000.0
        self.wait_s += max(0.0, done_prev.elapsed_time(ready) / 1000.0)
        self.steps += 1


class Meter(Generic[T]):
    """The iterable `fastdata.meter()` returns. Iterate it as you would the wrapped iterable (each pass is
    one pass over it), then call `report()`. Also a context manager that stops the sampler on exit."""

    def __init__(self, iterable: Iterable[T], *, sync: bool | None, log_every: int | None,
                 batch_size: int | Callable[[Any], int] | None, warmup_steps: int, interval: float, system: bool,
                 log: Callable[[str], None] | None, on_log: Callable[[dict[str, Any]], None] | None = None,
                 trace: str | Path | None = None, trace_max_events: int = MAX_EVENTS,
                 ranks: bool | None = None) -> None:
        if not (isinstance(iterable, Iterable)
                or hasattr(iterable, "__getitem__")):  # type: ignore[unreachable]  # old-style sequences too
            raise TypeError(f"fastdata.meter() needs an iterable (a DataLoader, fastdata.loader(...), a list, a "
                            f"generator...), got {type(iterable).__name__} {_short_repr(iterable)}")
        if log_every is not None and log_every < 1:
            raise ValueError(f"log_every must be a positive number of steps, got {log_every}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if batch_size is not None and not callable(batch_size) and int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive int or a function of the batch, got {batch_size!r}")
        if on_log is not None and not callable(on_log):
            raise TypeError(f"on_log must be a function of the figures dict, got {type(on_log).__name__}")
        if trace_max_events < 1:
            raise ValueError(f"trace_max_events must be a positive number of events, got {trace_max_events}")
        self.iterable = iterable
        self.log_every = log_every
        self.warmup_steps = warmup_steps
        self._sync_wanted = sync
        self._sizer: Callable[[Any], int | None] = (
            infer_batch_size if batch_size is None else batch_size if callable(batch_size)
            else (lambda _item, n=int(batch_size): n))  # type: ignore[misc]  # mypy: a lambda with a default
        self._log = log or (None if on_log is not None else _stderr_line)
        self._on_log = on_log
        self._trace_to, self._trace_max = trace, trace_max_events
        self._tracer: Tracer | None = None  # made at the first pass, when the rank is known
        self._ranks_wanted = ranks
        self._ranks_compared: dict[str, Any] | None = None  # gathered at the end of the last whole pass
        self._sampler = SystemSampler(interval=interval) if system else None
        self._facts = LoaderFacts.of(iterable)
        self._counts = _Counts()
        self._timeline = _Timeline()
        self._cuda: _CudaTimer | None = None
        self._sync_decided = False
        self._seconds_done = 0.0  # seconds of finished passes
        self._pass_started: float | None = None
        self._first_batch_s: float | None = None
        self._passes = 0  # passes begun
        self._epoch_starts: list[float] = []  # the first batch's wait of each pass after the first (seconds)
        self._warm: tuple[float, int, int, float] | None = None  # (measured s, steps, samples, wait) at warm-up end
        self._stages_start: StageTimes | None = None
        self._log_mark: tuple[float, int, int, float] | None = None
        if sync and not _cuda_available():
            raise ValueError("sync=True times GPU work with CUDA events, but CUDA is not available here "
                             "(torch.cuda.is_available() is False); use sync=None or False")

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __enter__(self) -> Meter[T]:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the background sampler (a later pass starts it again) and write the trace (with `trace=`)."""
        if self._sampler is not None:
            self._sampler.stop()
        if self._tracer is not None and self._tracer.unwritten:
            self._tracer.write()

    @property
    def trace_path(self) -> Path | None:
        """The trace file this meter writes (this rank's), once the first pass has begun; None without `trace=`."""
        return self._tracer.path if self._tracer is not None else None

    def _start_trace(self) -> Tracer | None:
        """The tracer of this meter, made at the first pass (the rank is known by then), wired to the system
        sampler and, for a fastdata loader, to its workers' batches."""
        if self._trace_to is None:
            return None
        if self._tracer is None:
            rank, world = distributed_rank() or (None, 1)
            self._tracer = Tracer(self._trace_to, rank=rank, world_size=world, max_events=self._trace_max)
            if self._sampler is not None:
                self._sampler.on_sample = self._tracer.sample
        if hasattr(self.iterable, "trace_sink"):
            self.iterable.trace_sink = self._tracer.worker_batch
        return self._tracer

    def __iter__(self) -> Iterator[T]:
        counts, timeline, sizer = self._counts, self._timeline, self._sizer
        perf = time.perf_counter
        log_every, warmup = self.log_every, self.warmup_steps
        first_in_pass = True
        stage_source = getattr(self.iterable, "stage_times", None)
        if self._stages_start is None and isinstance(stage_source, StageTimes):
            self._stages_start = stage_source.copy()
        tracer = self._start_trace()
        if self._sampler is not None:
            self._sampler.start()
        t0 = self._pass_started = perf()
        self._passes += 1
        try:
            iterator = iter(self.iterable)
            while True:
                try:
                    item = next(iterator)
                except StopIteration:
                    counts.wait += perf() - t0
                    if tracer is not None:
                        tracer.end_compute(t0)
                    self._compare_ranks()
                    return
                t1 = perf()
                n = sizer(item)
                if n is None:
                    counts.samples_known = False
                    n = 0
                counts.steps += 1
                counts.samples += n
                counts.wait += t1 - t0
                timeline.add(t0, t1, n)
                if tracer is not None:
                    tracer.step(counts.steps, t0, t1)
                cuda = self._cuda
                if cuda is not None:
                    cuda.ready(counts.steps > warmup, first_in_pass)
                if counts.steps == warmup:
                    self._mark_warm(t1)
                if self._first_batch_s is None:
                    self._first_batch_s = t1 - self._pass_started
                elif first_in_pass:
                    self._epoch_starts.append(t1 - t0)
                if log_every and counts.steps % log_every == 0:
                    self._log_line(t1)
                first_in_pass = False
                yield item
                t0 = perf()
                if cuda is not None:
                    cuda.boundary()
                elif not self._sync_decided:
                    self._decide_sync()
                    if self._cuda is not None:
                        self._cuda.boundary()
                        t0 = perf()
        finally:
            ended = perf()
            self._seconds_done += ended - self._pass_started
            self._pass_started = None
            if self._sampler is not None:
                self._sampler.stop()
            if tracer is not None:
                tracer.end_compute(ended)  # a loop that stopped early: its last step ends here
                if hasattr(self.iterable, "trace_sink"):
                    self.iterable.trace_sink = None
                tracer.write()

    # ---------------------------------------------------------------------------------------------
    def _decide_sync(self) -> None:
        """After the first step: time on the GPU if asked to, or (sync=None) if the step started CUDA."""
        self._sync_decided = True
        want = self._sync_wanted
        if want is False:
            return
        torch = sys.modules.get("torch")
        if want is None and (torch is None or not torch.cuda.is_initialized()):
            return
        if torch is None:
            import torch
        self._cuda = _CudaTimer(torch)

    def _measured_seconds(self, now: float | None = None) -> float:
        seconds = self._seconds_done
        if self._pass_started is not None:
            seconds += (now if now is not None else time.perf_counter()) - self._pass_started
        return seconds

    def _mark_warm(self, now: float) -> None:
        c = self._counts
        self._warm = (self._measured_seconds(now), c.steps, c.samples, c.wait)

    def _log_line(self, now: float) -> None:
        figures = self._figures(now)
        if self._on_log is not None:
            self._on_log(dict(figures))
        if self._log is None:
            return
        parts = [f"step {figures['step']:,}", f"{figures['steps_per_s']:,.1f} steps/s"]
        if "samples_per_s" in figures:
            parts.append(f"{figures['samples_per_s']:,.0f} samples/s")
        parts.append(f"data wait {figures['data_wait_fraction']:.0%}")
        cpu, gpu = figures.get("cpu_percent"), figures.get("gpu_util_percent")
        parts.append("CPU n/a" if cpu is None else f"CPU {cpu:.0f}%")
        parts.append("GPU n/a" if gpu is None else f"GPU {gpu:.0f}%")
        self._log("[fastdata.meter] " + " | ".join(parts))

    def _figures(self, now: float) -> dict[str, Any]:
        """The live figures since the last call: rates and data wait, and the last system sample."""
        c = self._counts
        seconds = self._measured_seconds(now)
        mark = self._log_mark or (0.0, 0, 0, 0.0)
        span = max(1e-9, seconds - mark[0])
        steps, samples, wait = c.steps - mark[1], c.samples - mark[2], c.wait - mark[3]
        self._log_mark = (seconds, c.steps, c.samples, c.wait)
        figures: dict[str, Any] = {"step": c.steps, "seconds": round(seconds, 6), "steps_per_s": steps / span}
        if c.samples_known:
            figures["samples_per_s"] = samples / span
        figures["data_wait_fraction"] = min(1.0, wait / span)
        latest = self._sampler.latest if self._sampler is not None else {}
        figures.update((name, value) for name, value in latest.items() if value is not None)
        return figures

    def report(self, *, ranks: bool | None = None) -> MeterReport:
        """What was measured so far, with a verdict (`input-bound`, `compute-bound`, `cpu-contended` (the data is
        there but other processes took the CPU), `balanced`, or `no steps measured`), the reasons behind it and
        what to try. In a torch.distributed job (unless `ranks`, or the meter's `ranks`, is False) it names the
        slowest rank from every rank's data wait, as gathered at the end of the last whole pass (not a collective:
        call it on any rank)."""
        c = self._counts
        seconds = self._measured_seconds()
        warm = self._warm if (self._warm is not None and c.steps > self.warmup_steps) else None
        base = warm or (0.0, 0, 0, 0.0)
        window = Window(steps=c.steps - base[1], samples=(c.samples - base[2]) if c.samples_known else None,
                        seconds=seconds - base[0], host_wait_s=c.wait - base[3], warmup_steps=base[1])
        if self._cuda is not None:
            self._cuda.flush()
            if self._cuda.steps:
                window.gpu_wait_s, window.gpu_seconds = self._cuda.wait_s, self._cuda.cycle_s
        stages = None
        source = getattr(self.iterable, "stage_times", None)
        if self._stages_start is not None and isinstance(source, StageTimes):
            stages = source.minus(self._stages_start)
        system = self._sampler.summary() if self._sampler is not None else None
        report = build_report(steps=c.steps, samples=c.samples if c.samples_known else None, seconds=seconds,
                              first_batch_s=self._first_batch_s, window=window, system=system, stages=stages,
                              loader=self._facts, cuda=self._cuda is not None,
                              timeline=self._timeline.as_dict(), epoch_starts=self._epoch_starts,
                              total_wait_s=c.wait, warmup_steps=self.warmup_steps)
        if self._tracer is not None:
            report.trace = str(self._tracer.path)
        wanted = self._ranks_wanted if ranks is None else ranks
        if wanted is not False and self._ranks_compared is not None:
            report.ranks = self._ranks_compared
            advice = straggler_advice(report.ranks)
            if advice is not None:
                report.suggestions.insert(0, advice)
        return report

    def _compare_ranks(self) -> None:
        """At the end of a whole pass, in a torch.distributed job: gather every rank's data wait (a collective,
        which every rank reaches together, since every rank's loader yields the same number of batches) for
        `report()`, which then needs no collective and may be called on one rank only. A loop that leaves a pass
        early (break) gathers nothing: its report has no ranks line."""
        distributed = distributed_rank() if self._ranks_wanted is not False else None
        if distributed is None:
            return
        mine = self.report(ranks=False)
        figures = {"data_wait_fraction": mine.data_wait_fraction, "samples_per_s": mine.samples_per_s,
                   "steps": mine.steps}
        self._ranks_compared = compare_ranks(gather_figures(figures), distributed[0])


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
