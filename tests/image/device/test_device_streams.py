"""The order the device path asks of the GPU, checked on the CPU with emulated streams
(tests/image/device/fake_streams.py): the decoder never waits for the training step (two streams; the one-stream
feeder did), every crop waits for its decode and every training step for its crop, a slot is rewritten only after
the step that read it, decoded buffers are decoded into again only after the crop that read them has run (the
training stream held back, as `torch.cuda._sleep` would), a replacement feeder writes no slot before the old one's
last write, and nothing touches the device before the workers have forked. Nothing here depends on the machine's
speed: the checks are on the order of the work, not on its time."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import fastdata
import fastdata.image.device.stage as stage_module
from fastdata.image.device.decoders import TorchvisionDecoder
from fastdata.image.device.feeder import DeviceFeeder, PassKey, strong
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.device.ring import SlotRing
from fastdata.image.device.stage import DeviceStage
from tests.image.device import nvimgcodec_standin
from tests.image.device.fake_streams import FakeStream, FakeStreams, Node
from tests.image.device.test_device_feeder import WAIT_S, feeder_threads, packed_batches

BATCHES = 16


class EngineDecoder(TorchvisionDecoder):
    """torchvision's CPU decode, queued as nvImageCodec queues its work: the engines' task for a call starts after
    everything already queued on the caller's stream (its "preSync"), and the caller's stream waits for that task
    (its "postSync"); the host returns once it is queued."""

    def __init__(self, streams: FakeStreams) -> None:
        super().__init__(torch.device("cpu"))
        self.streams = streams
        self.engine_stream = FakeStream("engines")
        self.engines: list[Node] = []

    def decode(self, payloads, regions=None):
        caller = self.streams.current()
        engine = self.streams.op("engine", self.engine_stream, deps=[caller.last])
        self.streams.op("after-engine", caller, deps=[engine])
        self.engines.append(engine)
        return super().decode(payloads, regions)


@pytest.fixture
def crops(monkeypatch):
    """Each batched crop-resize-flip also queued as a node on the current (emulated) stream that reads the decoded
    images' memory; the real crop runs as well."""
    found: list[Node] = []
    real = stage_module.crop_resize_flip

    def crop_resize_flip(images, crops_, size, dtype=None):
        streams = _STREAMS[0]
        found.append(streams.op("crop", reads=frozenset(image.untyped_storage().data_ptr() for image in images)))
        return real(images, crops_, size, dtype)

    monkeypatch.setattr(stage_module, "crop_resize_flip", crop_resize_flip)
    return found


_STREAMS: list[FakeStreams] = []


def run(photos, streams: FakeStreams, decoder, slots: int = 6, gates: list[threading.Event] | None = None,
        on_step=None) -> list[Node]:
    """A training loop over a feeder on `streams`: one "step" node on the training (default) stream per batch,
    held by `gates[n]` when given; `on_step(n)` after each. Returns the step nodes."""
    _STREAMS[:] = [streams]
    stage = DeviceStage("cpu", 32, "photos", decoder=decoder, streams=streams)
    ring = SlotRing(slots, lambda: stage.new_output(4), stage.device, streams)
    batches = packed_batches(photos, BATCHES)
    feeder = DeviceFeeder(stage, ring, strong(lambda key: iter(batches)), PassKey(0), follow=lambda key: None)
    steps = []
    try:
        for n, made in enumerate(feeder.batches(PassKey(0))):
            steps.append(streams.op("step", gate=gates[n] if gates else None,
                                    reads=frozenset([made.images.untyped_storage().data_ptr()])))
            if on_step is not None:
                on_step(n)
    finally:
        feeder.close()
    assert len(steps) == BATCHES
    return steps


def labelled(nodes, label: str) -> list[Node]:
    return [node for node in nodes if node.label == label]


def test_on_two_streams_the_decoder_never_waits_for_the_training_step(jpeg_photos, crops):
    streams = FakeStreams()
    decoder = EngineDecoder(streams)
    steps = run(jpeg_photos[0], streams, decoder)
    assert len(decoder.engines) == len(crops) == BATCHES
    for n, engine in enumerate(decoder.engines):
        assert not labelled(FakeStreams.ancestors(engine), "step"), f"the decode of batch {n} waits for a step"
    for n in range(BATCHES):
        assert decoder.engines[n] in FakeStreams.ancestors(crops[n]), f"the crop of batch {n} skips its decode"
        assert crops[n] in FakeStreams.ancestors(steps[n]), f"step {n} does not wait for its batch's writes"
        if n >= 6:  # its slot held batch n - 6: rewritten only after the step that read it
            assert steps[n - 6] in FakeStreams.ancestors(crops[n]), f"batch {n} overwrites a slot in use"


def test_on_one_stream_the_decoder_waits_for_the_training_step(jpeg_photos, crops):
    """The check above can fail: the same feeder on one stream for decode and resize (as it was) queues the slot's
    wait for the training step where the decoder's next call waits for everything queued before it."""
    streams = FakeStreams(one_stream=True)
    decoder = EngineDecoder(streams)
    run(jpeg_photos[0], streams, decoder)
    coupled = [n for n, engine in enumerate(decoder.engines) if labelled(FakeStreams.ancestors(engine), "step")]
    assert coupled and max(coupled) == BATCHES - 1


class Overwrite(BaseException):
    """A decode into buffers a queued crop has not read yet (a BaseException: no decoder failure policy takes it)."""


class ReusingLibrary(nvimgcodec_standin.Decoder):
    """The stand-in library, decoding into the buffers of the Images passed back (`images=`), as nvImageCodec does,
    and checking, as nvJPEG's hardware decoder would need, that every crop that read those buffers has run."""

    reuses = 0

    def decode(self, srcs, *, images=None, params=None, cuda_stream=0):
        fresh = super().decode(srcs, params=params, cuda_stream=cuda_stream)
        if not images:
            return fresh
        written = {image.array.__array_interface__["data"][0] for image in images}
        streams = _STREAMS[0]
        for node in list(streams.nodes):
            if node.label == "crop" and node.reads & written and not streams.ran(node):
                raise Overwrite("a decode writes into buffers a queued crop has not read yet")
        ReusingLibrary.reuses += 1
        for old, new in zip(images, fresh, strict=False):
            if new is not None and old.array.size >= new.array.size:
                flat = old.array.reshape(-1)
                flat[:new.array.size] = new.array.reshape(-1)
                new.array = flat[:new.array.size].reshape(new.array.shape)
        return fresh


def test_with_the_training_stream_held_back_no_decode_overwrites_a_buffer_before_its_crop_ran(jpeg_photos, crops,
                                                                                          monkeypatch):
    """The training stream held back for the whole pass (its steps wait, as behind a long `torch.cuda._sleep`):
    the slots' reuse waits for it, so every crop after the sixth is still queued, and the decoder (nvImageCodec
    behind the stand-in library) gets buffers back only once the crop that read them has run: it reuses those of
    the first six batches, and no other."""
    nvimgcodec_standin.install(monkeypatch)
    monkeypatch.setattr(nvimgcodec_standin, "Decoder", ReusingLibrary)
    ReusingLibrary.reuses = 0
    from fastdata.image.device.nvimgcodec import NvImageCodecDecoder

    streams = FakeStreams()
    gates = [threading.Event() for _ in range(BATCHES)]

    steps = run(jpeg_photos[0], streams, NvImageCodecDecoder(torch.device("cpu"), DeviceDecodeOptions()), gates=gates)
    assert not streams.ran(steps[0]) and not streams.ran(crops[6])  # held back to the end
    assert ReusingLibrary.reuses > 0
    for gate in gates:
        gate.set()
    assert all(streams.ran(node) for node in streams.nodes)


def test_a_replacement_feeder_writes_no_slot_before_the_old_ones_last_write(jpeg_photos, crops):
    """A pass left after 3 batches and another started (set_epoch, say): the new feeder's stream waits for the old
    stream's last write before its first, so the two never write one slot at once."""
    from fastdata.image.device.path import DevicePath

    streams = FakeStreams()
    _STREAMS[:] = [streams]
    ds = fastdata.dataset(jpeg_photos[0], "train", image_size=32)
    path = DevicePath(torch.device("cpu"), ds.pipeline, "photos", 4, output=ds.pipeline.output,
                      channels_last=False, on_error="raise", options=DeviceDecodeOptions(slots=3), streams=streams)
    path.stage.decoder = EngineDecoder(streams)
    batches = packed_batches(jpeg_photos[0], 6)

    class Owner:
        pass

    owner = Owner()
    first = path.batches(PassKey(0), strong(lambda key: iter(batches)), owner)
    for n, _ in enumerate(first):
        if n == 2:
            break
    resize = path._feeder.threads()["resize"]
    deadline = time.monotonic() + WAIT_S
    while not resize.waiting:  # a batch written into a slot the loop never took: batch 3, in slot 0
        assert time.monotonic() < deadline, "the feeder never made a fourth batch"
        time.sleep(0.01)
    first.close()
    old = len(crops)
    old_stream = crops[0].stream
    second = path.batches(PassKey(5), strong(lambda key: iter(batches)), owner)
    assert len(list(second)) == len(batches)
    path.close()
    new = crops[old:]
    assert new and all(node.stream is not old_stream for node in new)
    old_writes = [node for node in old_stream.nodes if node.label == "crop"]
    for node in new:
        assert old_writes[-1] in FakeStreams.ancestors(node)
    assert feeder_threads() == []


def test_nothing_touches_the_device_before_the_workers_fork(jpeg_photos, monkeypatch):
    """Through a loader with worker processes: every stream or event the device path asks for, and the decoder
    (whose creation is a CUDA call on a GPU), come after the workers started; so do torch.cuda's own entry points,
    watched too."""
    import fastdata.image.device.auto as auto
    import fastdata.image.device.path as path_module
    from fastdata.workers import WorkerPass

    calls: list[tuple[str, bool]] = []
    started = threading.Event()

    class Recording(FakeStreams):
        def __getattribute__(self, name):
            if name in ("new_stream", "using", "current", "record", "wait", "done", "hand_over"):
                calls.append((name, started.is_set()))
            return super().__getattribute__(name)

    real_start, real_make = WorkerPass.start, auto.make_decoder

    def start(self):
        batches = real_start(self)
        started.set()
        return batches

    def make_decoder(*args, **kwargs):
        calls.append(("make_decoder", started.is_set()))
        return real_make(*args, **kwargs)

    monkeypatch.setattr(WorkerPass, "start", start)
    monkeypatch.setattr(auto, "make_decoder", make_decoder)
    monkeypatch.setattr(path_module, "streams_for", lambda device: Recording())
    for name in ("Stream", "Event", "current_stream", "synchronize", "set_device", "init", "_lazy_init"):
        real = getattr(torch.cuda, name)
        monkeypatch.setattr(torch.cuda, name, lambda *a, _name=name, _real=real, **k: (
            calls.append((f"torch.cuda.{_name}", started.is_set())), _real(*a, **k))[1])
    loader = fastdata.loader(jpeg_photos[0], batch_size=4, image_size=32, num_workers=2, decode="device",
                             device="cpu")
    assert sum(1 for _ in loader) == 6
    loader.close()
    assert ("make_decoder", True) in calls and ("new_stream", True) in calls
    early = [name for name, after in calls if not after]
    assert early == [], f"asked of the device before the workers forked: {early}"


def test_fake_streams_run_nodes_in_order_and_hold_gated_ones():
    """The emulation itself: a node runs after what precedes it on its stream and what it waits for."""
    streams = FakeStreams()
    a, b = streams.new_stream(), streams.new_stream()
    gate = threading.Event()
    first = streams.op("first", a, gate=gate)
    event = streams.record(a)
    streams.wait(event, b)
    later = streams.op("later", b)
    assert not streams.ran(later) and not event.query()
    gate.set()
    assert streams.ran(later) and event.query() and first in FakeStreams.ancestors(later)
    assert np.all([streams.ran(node) for node in streams.nodes])
