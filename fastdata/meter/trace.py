"""A timeline of a metered loop as a Chrome / Perfetto trace (`fastdata.meter(..., trace="run.json")`).

The file is the Trace Event Format's JSON object (`{"traceEvents": [...]}`), which ui.perfetto.dev and
chrome://tracing open: complete events (`"ph": "X"`, `ts` and `dur` in microseconds) for the loop's "data wait"
and "compute" spans, one track per loader worker with the read / decode / augment / collate spans of each batch it
made, counters (`"ph": "C"`) for the system samples, and metadata events (`"ph": "M"`) naming every process and
track.

One clock for every process: CLOCK_MONOTONIC (`time.monotonic_ns`), which on Linux is system-wide, so the spans a
worker process records line up with the training process's own (the loop times itself with `perf_counter`, mapped
onto the same clock by an offset taken once). Events are kept as integer nanoseconds of that clock and written as
microseconds from the trace's origin (`otherData.origin_monotonic_ns`, the first event's millisecond; the traces
of ranks on one machine align by the difference of their origins), each value a quarter nanosecond above its
nanosecond: Perfetto reads `ts` and `dur` as `int(value * 1000)`, so every span then ends exactly where the next
one starts, and a stage ends inside its batch, instead of overlapping by a nanosecond of rounding (which Perfetto
draws as a wrongly nested slice). The events are kept in memory up to `max_events` (the first ones; what is left
out is counted and said in `otherData`), and the file is rewritten whole, atomically, at the end of each pass and
at close.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from fastdata.meter.stages import StageTimes

MAX_EVENTS = 500_000  # about 60 MB of JSON; a long run keeps its first events and says how many were left out
CLOCK = "CLOCK_MONOTONIC (time.monotonic_ns): system-wide on Linux, so every process's spans share one axis"
WORKER_STAGES = ("read", "decode", "augment", "collate")  # what a worker does, in flow order (transfer: the
# pin-memory thread of the training process)
COUNTERS = {  # sampled figure -> (counter track, unit) (fastdata.meter.system)
    "cpu_percent": ("CPU busy", "%"), "iowait_percent": ("iowait", "%"), "disk_read_mb_s": ("disk reads", "MB/s"),
    "rss_mb": ("RSS", "MB"), "main_cpu_cores": ("training process CPU", "cores"),
    "workers_cpu_cores": ("workers CPU", "cores"), "others_cpu_cores": ("other processes CPU", "cores"),
    "gpu_util_percent": ("GPU busy", "%"), "gpu_memory_used_mb": ("GPU memory", "MB"),
}
LOADER_TID = 1_000_000  # the track of an in-process loader's batches (worker w's is w + 1, the loop's the pid:
# the main thread's id, and never 0, which Perfetto keeps for the idle thread)


def rank_path(path: str | Path, rank: int | None, world_size: int) -> Path:
    """Where rank `rank` writes its trace: `run.json` -> `run.rank1.json` in a job of several ranks."""
    path = Path(path)
    if rank is None or world_size <= 1:
        return path
    suffix = path.suffix or ".json"
    return path.with_name(f"{path.name[: len(path.name) - len(path.suffix)]}.rank{rank}{suffix}")


class Tracer:
    """Collects the spans and samples of one metered loop and writes them as a trace file.

    `step()` is called by the meter's loop (perf_counter seconds), `worker_batch()` by a fastdata loader for every
    batch its workers made (monotonic nanoseconds), `sample()` by the system sampler's thread."""

    def __init__(self, path: str | Path, *, rank: int | None = None, world_size: int = 1,
                 max_events: int = MAX_EVENTS, name: str | None = None) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be a positive number of events, got {max_events}")
        self.path = rank_path(path, rank, world_size)
        self.rank, self.world_size, self.max_events = rank, world_size, max_events
        self.pid = os.getpid()
        self.name = name or "fastdata.meter" + (f" rank {rank}" if rank is not None and world_size > 1 else "")
        self._offset_ns = time.monotonic_ns() - time.perf_counter_ns()  # perf_counter -> CLOCK_MONOTONIC
        self._lock = threading.Lock()  # for the counts the sampler's thread and the loop both change
        # (name, tid or None for a counter, start ns, end ns or None, args): made into JSON events when written,
        # so that the loop's cost per step is one tuple appended
        self._events: list[tuple[str, int | None, int, int | None, dict[str, Any] | None]] = []
        self._workers: set[int] = set()
        self._counters: set[str] = set()
        self._dropped = 0
        self._compute: tuple[int, float] | None = None  # (step, perf_counter start) of the open compute span
        self._received = 0  # loader batches handed to worker_batch (the loop receives them in this order)
        self._written = 0

    # ---------------------------------------------------------------------------------------------
    def step(self, number: int, wait_started: float, wait_ended: float) -> None:
        """Step `number` waited for its batch from `wait_started` to `wait_ended` (perf_counter seconds); the
        previous step's compute ran until `wait_started`."""
        self.end_compute(wait_started)
        self._span("data wait", self.pid, self._ns(wait_started), self._ns(wait_ended), {"step": number})
        self._compute = (number, wait_ended)

    def end_compute(self, ended: float) -> None:
        """Close the open compute span at `ended` (perf_counter seconds): the loop asked for the next batch, or
        the pass ended."""
        if self._compute is not None:
            number, started = self._compute
            self._compute = None
            self._span("compute", self.pid, self._ns(started), self._ns(max(started, ended)), {"step": number})

    def worker_batch(self, span: tuple[int, int, int] | None, times: StageTimes) -> None:
        """One batch a loader worker made: `span` is (worker id, -1 in this process; started and ended,
        monotonic ns), `times` its stage seconds. Drawn as a "batch" span with the stages inside it, laid end to
        end in flow order: read comes first, but decode and augment alternate sample by sample, so their spans
        show each stage's total within the batch, not when each sample's ran. The span's `received` is its
        number in the order the loop receives batches (step `received`, for a loader that yields one per batch)."""
        self._received += 1
        if span is None:
            return
        worker, started_ns, ended_ns = span
        tid = LOADER_TID if worker < 0 else worker + 1
        self._workers.add(worker)
        end = max(started_ns, ended_ns)
        self._span("batch", tid, started_ns, end, {"worker": worker, "received": self._received})
        at = started_ns
        for stage in WORKER_STAGES:
            seconds = getattr(times, stage)
            if seconds <= 0:
                continue
            stop = min(end, at + round(seconds * 1e9))
            self._span(stage, tid, at, stop, None)
            at = stop

    def sample(self, started: float, figures: dict[str, float | None]) -> None:
        """System figures averaged over the interval that began at `started` (time.monotonic seconds), drawn as
        counters from then on."""
        ts = round(started * 1e9)
        for key, (track, unit) in COUNTERS.items():
            value = figures.get(key)
            if value is None:
                continue
            self._counters.add(track)
            self._add(track, None, ts, None, {unit: round(float(value), 3)})

    # ---------------------------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Events left out because the trace held `max_events` already."""
        return self._dropped

    def trace(self) -> dict[str, Any]:
        """The trace as the JSON object the file holds: metadata events first, then every event in time order."""
        with self._lock:
            raw, dropped = list(self._events), self._dropped
        workers, counters = sorted(set(self._workers)), sorted(set(self._counters))
        raw.sort(key=lambda e: (e[2], -(e[3] or e[2])))  # by start, a batch before the stages inside it
        origin = raw[0][2] // 1_000_000 * 1_000_000 if raw else 0
        events = [self._event(origin, *e) for e in raw]
        meta: list[dict[str, Any]] = [self._meta("process_name", None, {"name": f"{self.name} (pid {self.pid})"}),
                                      self._meta("process_sort_index", None, {"sort_index": self.rank or 0}),
                                      self._meta("thread_name", self.pid, {"name": "training loop (data wait / "
                                                                                     "compute)"}),
                                      self._meta("thread_sort_index", self.pid, {"sort_index": -1})]
        for worker in workers:
            tid = LOADER_TID if worker < 0 else worker + 1
            name = "loader (in the training process)" if worker < 0 else f"loader worker {worker}"
            meta += [self._meta("thread_name", tid, {"name": name}), self._meta("thread_sort_index", tid,
                                                                                 {"sort_index": tid})]
        other = {"producer": "fastdata.meter", "clock": CLOCK, "origin_monotonic_ns": origin,
                 "events": len(events), "max_events": self.max_events,
                 "dropped_events": dropped, "counters": counters}
        if self.rank is not None:
            other.update(rank=self.rank, world_size=self.world_size)
        if dropped:
            other["note"] = (f"the trace holds the first {self.max_events:,} events; {dropped:,} later ones were "
                             "left out (a shorter run, or meter(..., trace_max_events=N), shows more)")
        # traceEvents first and otherData, nothing else: Perfetto's JSON reader stops at a top-level key it
        # does not know, and takes displayTimeUnit only at the start of the file (µs is the default anyway)
        return {"traceEvents": meta + events, "otherData": other}

    def write(self) -> Path:
        """Write the trace file whole (a temporary file beside it, then renamed over it)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            # json.dumps: the C encoder (json.dump's is Python); UTF-8 as is, as Perfetto's reader takes no \u escapes
            text = json.dumps(self.trace(), separators=(",", ":"), ensure_ascii=False)
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
        self._written = len(self._events)
        return self.path

    @property
    def unwritten(self) -> bool:
        """Whether events came since the last write."""
        return len(self._events) != self._written

    # ---------------------------------------------------------------------------------------------
    def _ns(self, perf_seconds: float) -> int:
        """perf_counter seconds -> CLOCK_MONOTONIC nanoseconds."""
        return round(perf_seconds * 1e9) + self._offset_ns

    def _span(self, name: str, tid: int, start_ns: int, end_ns: int, args: dict[str, Any] | None) -> None:
        self._add(name, tid, start_ns, end_ns, args)

    def _add(self, name: str, tid: int | None, start_ns: int, end_ns: int | None,
             args: dict[str, Any] | None) -> None:
        if len(self._events) < self.max_events:  # list.append is atomic: no lock on the loop's path
            self._events.append((name, tid, start_ns, end_ns, args))
        else:
            with self._lock:
                self._dropped += 1

    def _event(self, origin: int, name: str, tid: int | None, start_ns: int, end_ns: int | None,
               args: dict[str, Any] | None) -> dict[str, Any]:
        """One stored event as the Trace Event Format's JSON: a complete event (X), or a counter (C)."""
        ts = _us(start_ns - origin)
        if tid is None:
            return {"name": name, "ph": "C", "ts": ts, "pid": self.pid, "args": args}
        assert end_ns is not None  # a complete event has an end
        event: dict[str, Any] = {"name": name, "ph": "X", "ts": ts, "dur": _us(max(0, end_ns - start_ns)),
                                 "pid": self.pid, "tid": tid}
        if args:
            event["args"] = args
        return event

    def _meta(self, name: str, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
        event: dict[str, Any] = {"name": name, "ph": "M", "pid": self.pid, "args": args}
        if tid is not None:
            event["tid"] = tid
        return event


def _us(ns: int) -> float:
    """Integer nanoseconds as the microseconds a trace holds, a quarter nanosecond above: read back by Perfetto as
    `int(us * 1000)` (truncated) or rounded, either gives `ns` exactly."""
    return round((ns + 0.25) / 1000, 5)
