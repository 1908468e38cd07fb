"""The device path's CUDA streams and events behind one small interface (`Streams`), and what keeps memory alive
until the device is done with it (`Retired`).

Every stream and event of the device path is asked of a `Streams`: on CUDA the real ones (`CudaStreams`); on the
CPU none (`HostStreams`: the host's calls run in order, every event is done); in the tests an emulation that checks
the order the feeder asks for (tests/image/device/fake_streams.py). Making a `Streams` touches nothing; its first CUDA
call comes when the feeder's threads first ask for a stream, after the workers have forked.

The rules the device path keeps with it (docs/gpu.md, "Correct by construction"):
- a tensor written on one stream is read on another only after the reader's stream waits for an event recorded
  behind the writes (`record` / `wait`);
- memory read on another stream than the one that allocated it is given back only after an event recorded behind
  those reads has completed (`Retired`), or is recorded as used by the reading stream (`hand_over`,
  `Tensor.record_stream`), or lives in a ring slot that is reused only after such an event (fastdata.image.device.ring);
- a buffer a decoder writes into again is reused only once the event behind its last reader has completed
  (`done`: the decoder's lease, fastdata.image.device.nvimgcodec), never merely once that reader is queued.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch


class CudaStreams:
    """Streams and events of one CUDA device."""

    cuda = True

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)

    def new_stream(self) -> Any:
        """A new stream (default priority, the lowest: the training step's kernels are never put behind it)."""
        return torch.cuda.Stream(self.device)

    def using(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Make `stream` the current stream of this thread inside the block."""
        return torch.cuda.stream(stream)

    def current(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def record(self, stream: Any = None, timing: bool = False) -> Any:
        """A new event recorded on `stream` (the current one when None): done once what is queued there ran."""
        event = torch.cuda.Event(enable_timing=timing)
        event.record(stream if stream is not None else self.current())
        return event

    def wait(self, event: Any, stream: Any = None) -> None:
        """`stream` (the current one when None) runs what is queued on it next only after `event` (None: no wait)."""
        if event is not None:
            (stream if stream is not None else self.current()).wait_event(event)

    @staticmethod
    def done(event: Any) -> bool:
        """Whether `event` has completed (None: nothing to wait for)."""
        return event is None or bool(event.query())

    def hand_over(self, tensor: torch.Tensor, stream: Any = None) -> None:
        """`tensor`'s memory is used by `stream` (the current one when None): the caching allocator reuses it only
        once what that stream queued by the time the tensor is freed has run."""
        tensor.record_stream(stream if stream is not None else self.current())

    @staticmethod
    def elapsed_ms(start: Any, end: Any) -> float:
        """GPU milliseconds between two completed timing events."""
        return float(start.elapsed_time(end))


class HostStreams(CudaStreams):
    """The CPU's: no streams, the work runs as the host calls it, every event is done."""

    cuda = False

    def new_stream(self) -> Any:
        return None

    def using(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def current(self) -> Any:
        return None

    def record(self, stream: Any = None, timing: bool = False) -> Any:
        return None

    def wait(self, event: Any, stream: Any = None) -> None:
        pass

    def hand_over(self, tensor: torch.Tensor, stream: Any = None) -> None:
        pass


Streams = CudaStreams  # the interface: HostStreams and the tests' emulation have the same methods


def streams_for(device: torch.device) -> CudaStreams:
    """The streams of `device` (no CUDA call: the first comes when a stream or an event is asked for)."""
    return CudaStreams(device) if torch.device(device).type == "cuda" else HostStreams(device)


class Retired:
    """Objects kept alive until an event recorded behind their last use on the device has completed: a decoded batch
    (the decoder's images, the pinned bytes it read, CPU-decoded pixels) after the crop that read it, then dropped.
    `collect()` drops those whose event is done, oldest first."""

    def __init__(self, streams: CudaStreams) -> None:
        self.streams = streams
        self._kept: collections.deque[tuple[Any, tuple[Any, ...]]] = collections.deque()
        self._lock = threading.Lock()  # the resize thread adds; a stopped decode thread may too

    def add(self, guard: Any, *objects: Any) -> None:
        """Keep `objects` until `guard` (an event; None: already done) has completed."""
        with self._lock:
            if guard is not None:
                self._kept.append((guard, objects))
            self._collect()

    def collect(self) -> None:
        with self._lock:
            self._collect()

    def _collect(self) -> None:
        while self._kept and self.streams.done(self._kept[0][0]):
            self._kept.popleft()

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[tuple[Any, tuple[Any, ...]]]:
        return iter(list(self._kept))


class GpuTimes:
    """GPU seconds of one thread's work on its stream, from timing events around each batch's work, added to
    `totals[part]` once they have completed (never waiting for them). Nothing on the CPU."""

    def __init__(self, streams: CudaStreams, totals: dict[str, float], part: str) -> None:
        self.streams, self.totals, self.part = streams, totals, part
        self._pending: collections.deque[tuple[Any, Any]] = collections.deque()

    def start(self) -> Any:
        """A timing event on the current stream before the work (None on the CPU)."""
        return self.streams.record(timing=True) if self.streams.cuda else None

    def stop(self, start: Any) -> None:
        """A timing event after the work begun at `start`; adds what has completed so far."""
        if start is None:
            return
        self._pending.append((start, self.streams.record(timing=True)))
        while self._pending and self.streams.done(self._pending[0][1]):
            begun, ended = self._pending.popleft()
            self.totals[self.part] += self.streams.elapsed_ms(begun, ended) / 1000
