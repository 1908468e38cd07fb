"""`decode="device"`: JPEGs decoded and cropped on the device, beside the training step.

    workers        read bytes, draw crop box + flip from the seeded RNG, decode only what the GPU cannot take
    decode thread  nvImageCodec's batched decode on a DECODE stream with nothing else queued on it; an event
                   "decoded" per batch; up to 2 decoded batches wait
    resize thread  on a RESIZE stream: a free slot, a wait on "decoded", ONE batched crop-resize-flip-normalise,
                   images AND labels written into the slot, "ready" recorded; the decoder's buffers reused only
                   once "ready" has completed; refused JPEGs decoded on a side pool of CPU threads, never here
    training loop  next() takes a ready slot, its stream waits on "ready": O(1) Python, no host synchronisation

The entry points (imported on first use): `DevicePath` (what an image loader talks to), `DeviceDecodeOptions` (the
user's options), `PassKey`, and for tests and benchmarks `DeviceFeeder`, `DeviceStage`, `SlotRing`.

The room, one job per module:

    path.py        DevicePath: the device path of one loader (the wiring: what the workers ship, stage, slots,
                   feeder, the decoder made after the workers forked, the counters)
    auto.py        every "auto" of the device path (device, placement, progressive files, decoder, backends,
                   preallocation hints, sub-JPEGs) and the probes they are decided by
    options.py     DeviceDecodeOptions, the user's options
    ship.py        worker side: what the device takes, the bytes and crop parameters it gets (sub-JPEGs)
    decoders.py    the BatchDecoder protocol, torchvision's decoder, decode_now
    nvimgcodec.py  NVIDIA nvImageCodec behind the protocol (DALI's options; buffers leased behind events)
    stage.py       one worker batch -> one device batch: decode (decode thread), finish (resize thread), release
    kernels.py     the one batched crop-resize-flip
    failures.py    what is counted, said once, skipped or raised when bytes (or the decoder) fail
    ring.py        SlotRing: preallocated output slots (images and labels) handed over with events
    feeder.py      DeviceFeeder: the decode and resize threads on their two streams (each a
                   fastdata.background.Ahead: order, bound, errors, ending)
    streams.py     streams and events behind one interface (CUDA, the CPU, the tests' emulation); Retired

No CUDA call before the workers fork. A decoder that fails every call is a device error, never a silent CPU path.
docs/gpu.md says what it gives and how to use it; DESIGN.md ("The device path") why it is built so.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastdata.image.device.feeder import DeviceFeeder, PassKey
    from fastdata.image.device.options import DeviceDecodeOptions
    from fastdata.image.device.path import DevicePath
    from fastdata.image.device.ring import SlotRing
    from fastdata.image.device.stage import DeviceStage

#: entry point -> the module that defines it
_ENTRY_POINTS = {
    "DevicePath": "fastdata.image.device.path",
    "DeviceDecodeOptions": "fastdata.image.device.options",
    "PassKey": "fastdata.image.device.feeder",
    "DeviceFeeder": "fastdata.image.device.feeder",
    "DeviceStage": "fastdata.image.device.stage",
    "SlotRing": "fastdata.image.device.ring",
}

__all__ = ["DeviceDecodeOptions", "DeviceFeeder", "DevicePath", "DeviceStage", "PassKey", "SlotRing"]


def __getattr__(name: str) -> Any:
    """Import an entry point the first time it is asked for (PEP 562): importing the package imports nothing."""
    if name == "DeviceDecode":  # the old name of DeviceDecodeOptions
        from fastdata.deprecations import deprecated_alias
        from fastdata.image.device.options import DeviceDecodeOptions

        return deprecated_alias(__name__, name, {name: ("fastdata.options.DeviceDecode", DeviceDecodeOptions)})
    if name not in _ENTRY_POINTS:
        raise AttributeError(f"module 'fastdata.image.device' has no attribute {name!r}")
    return getattr(importlib.import_module(_ENTRY_POINTS[name]), name)
