"""fastdata.meter's trace files (Chrome / Perfetto Trace Event Format), checked against the format's
schema."""

from __future__ import annotations

import json
from pathlib import Path

# The Trace Event Format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU) as far
# as this trace uses it: complete events (X), counters (C), metadata (M).
_NUMBER = {"type": "number"}
TRACE_SCHEMA = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "traceEvents": {"type": "array", "items": {"$ref": "#/$defs/event"}},
        "otherData": {"type": "object"},
    },
    "additionalProperties": False,  # Perfetto's JSON reader stops at a top-level key it does not know
    "$defs": {
        "event": {
            "type": "object",
            "required": ["name", "ph", "pid"],
            "properties": {"name": {"type": "string"}, "ph": {"enum": ["X", "C", "M"]}, "pid": {"type": "integer"},
                           "tid": {"type": "integer"}, "ts": _NUMBER, "dur": _NUMBER, "args": {"type": "object"}},
            "allOf": [
                {"if": {"properties": {"ph": {"const": "X"}}},
                 "then": {"required": ["ts", "dur", "tid"], "properties": {"dur": {"minimum": 0}}}},
                {"if": {"properties": {"ph": {"const": "C"}}},
                 "then": {"required": ["ts", "args"],
                          "properties": {"args": {"minProperties": 1, "additionalProperties": _NUMBER}}}},
                {"if": {"properties": {"ph": {"const": "M"}}},
                 "then": {"required": ["args"], "properties": {
                     "name": {"enum": ["process_name", "thread_name", "process_sort_index", "thread_sort_index"]}}}},
            ],
        },
    },
}


def check_trace(path: Path) -> dict:
    """Load a trace file and check it as Perfetto and chrome://tracing read it; returns it."""
    import jsonschema  # the dev extra

    text = Path(path).read_text(encoding="utf-8")
    trace = json.loads(text)
    jsonschema.validate(trace, TRACE_SCHEMA)
    # Perfetto's JSON tokenizer: traceEvents first, no \u escapes, no array as an event's own value
    assert text.startswith('{"traceEvents":['), text[:40]
    assert "\\u" not in text
    events = trace["traceEvents"]
    assert not [e for e in events if any(isinstance(v, list) for v in e.values())]
    timed = [e for e in events if e["ph"] != "M"]
    assert timed, "no events"
    assert all(e["ph"] == "M" for e in events[: len(events) - len(timed)]), "metadata events come first"
    assert [e["ts"] for e in timed] == sorted(e["ts"] for e in timed), "events are not in time order"
    meta = [e for e in events if e["ph"] == "M"]
    named_processes = {e["pid"] for e in meta if e["name"] == "process_name"}
    named_threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert all(e.get("tid") != 0 for e in events), "tid 0 is the idle thread's in Perfetto"
    assert {e["pid"] for e in timed} <= named_processes, "a process without a name"
    assert {(e["pid"], e["tid"]) for e in timed if e["ph"] == "X"} <= named_threads, "a track without a name"
    open_slices: dict[tuple[int, int], list[tuple[int, str]]] = {}  # track -> stack of (end ns, name)
    for e in timed:  # slices nest on each track as Perfetto reads them: a slice ends inside the one it starts in
        if e["ph"] != "X":
            continue
        start, end = perfetto_ns(e["ts"]), perfetto_ns(e["ts"]) + perfetto_ns(e["dur"])
        stack = open_slices.setdefault((e["pid"], e["tid"]), [])
        while stack and stack[-1][0] <= start:
            stack.pop()
        assert not stack or end <= stack[-1][0], f"{e} overlaps {stack[-1][1]!r} without nesting in it"
        stack.append((end, e["name"]))
    return trace


def perfetto_ns(us: float) -> int:
    """A trace's microseconds as Perfetto's JSON importer reads them: `int(value * 1000)`, truncated."""
    return int(us * 1000)
