"""An emulation of CUDA streams and events for the device path's CPU tests (the interface of
fastdata.image.device.streams), so that the order the feeder asks of the GPU can be checked without one.

Every call that would queue something on a stream adds a node to a graph: a node depends on the node before it on
its stream and on the events it waits for. A node runs once everything it depends on has run and its gate (if a
test gave it one, like `torch.cuda._sleep` holding a stream) is open: `query()` of an event says whether its node
has run. Tests add their own nodes for the kernels that matter (a decoder's engine work, a crop that reads decoded
buffers, a training step) with `op`, and ask `ancestors` which work a node had to wait for.

`one_stream=True` hands out the same stream whenever a new one is asked for: the feeder as it was with one stream
for decode and resize, which the tests show coupled to the training step.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Node:
    number: int
    stream: FakeStream
    label: str
    deps: list[Node]
    gate: threading.Event | None = None
    reads: frozenset[int] = frozenset()  # storages (data pointers) the work reads
    ran: bool = False

    def __repr__(self) -> str:
        return f"<{self.label} #{self.number} on {self.stream.name}>"


@dataclass(eq=False)
class FakeStream:
    name: str
    nodes: list[Node] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<stream {self.name}: {len(self.nodes)} nodes>"

    @property
    def last(self) -> Node | None:
        return self.nodes[-1] if self.nodes else None


class FakeEvent:
    def __init__(self, streams: FakeStreams, node: Node | None) -> None:
        self.streams, self.node = streams, node

    def query(self) -> bool:
        return self.node is None or self.streams.ran(self.node)


class FakeStreams:
    cuda = True  # the feeder takes its device branches (events, hand-overs)

    def __init__(self, one_stream: bool = False) -> None:
        self.one_stream = one_stream
        self.default = FakeStream("default")
        self.nodes: list[Node] = []
        self.handed_over: list[tuple[int, FakeStream]] = []
        self._names = itertools.count(1)
        self._local = threading.local()
        self._lock = threading.RLock()
        self._shared: FakeStream | None = None
        self._pending: list[Node] = []  # nodes not run yet, in the order they were queued

    # the interface of fastdata.image.device.streams
    def new_stream(self) -> FakeStream:
        with self._lock:
            if self.one_stream:
                self._shared = self._shared or FakeStream("feeder")
                return self._shared
            return FakeStream(f"stream-{next(self._names)}")

    @contextlib.contextmanager
    def using(self, stream: FakeStream) -> Iterator[FakeStream]:
        before = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield stream
        finally:
            self._local.stream = before

    def current(self) -> FakeStream:
        return getattr(self._local, "stream", None) or self.default

    def record(self, stream: FakeStream | None = None, timing: bool = False) -> FakeEvent:
        return FakeEvent(self, self.op("event", stream))

    def wait(self, event: Any, stream: FakeStream | None = None) -> None:
        if event is not None and event.node is not None:
            self.op("wait", stream, deps=[event.node])

    @staticmethod
    def done(event: Any) -> bool:
        return event is None or event.query()

    def hand_over(self, tensor: Any, stream: FakeStream | None = None) -> None:
        self.handed_over.append((tensor.untyped_storage().data_ptr(), stream or self.current()))

    @staticmethod
    def elapsed_ms(start: Any, end: Any) -> float:
        return 0.0

    # for the tests
    def op(self, label: str, stream: FakeStream | None = None, deps: list[Node] | tuple[Node, ...] = (),
           gate: threading.Event | None = None, reads: frozenset[int] = frozenset()) -> Node:
        """Queue a node on `stream` (the current one when None) after what is queued there and after `deps`."""
        with self._lock:
            stream = stream or self.current()
            before = [stream.last] if stream.last is not None else []
            node = Node(len(self.nodes), stream, label, before + [d for d in deps if d is not None], gate, reads)
            stream.nodes.append(node)
            self.nodes.append(node)
            self._pending.append(node)
            return node

    def ran(self, node: Node) -> bool:
        """Whether `node` has run: every node it depends on has, and its gate is open (nodes are numbered in the
        order they were queued, which is an order every dependency respects)."""
        with self._lock:
            if node.ran:
                return True
            still = []
            for other in self._pending:
                other.ran = (other.gate is None or other.gate.is_set()) and all(d.ran for d in other.deps)
                if not other.ran:
                    still.append(other)
            self._pending = still
            return node.ran

    @staticmethod
    def ancestors(node: Node) -> set[Node]:
        """Every node `node` waits for, directly or through others."""
        seen: set[Node] = set()
        todo = list(node.deps)
        while todo:
            other = todo.pop()
            if other not in seen:
                seen.add(other)
                todo.extend(other.deps)
        return seen
