"""`DeviceDecode(decode_ahead=True)`: the feeder decodes batch n+1 on a second thread while it crops and resizes
batch n (fastdata.image.device.feeder), with the same batches as in series, errors in batch order at next(), the
decoder's buffers reused only once the crop that reads them is queued, and no thread left behind. CPU stand-ins."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import fastdata
from fastdata.image.device.decoders import TorchvisionDecoder
from fastdata.image.device.feeder import DeviceFeeder, PassKey, strong
from fastdata.image.device.options import DeviceDecode
from fastdata.image.device.ring import SlotRing
from fastdata.image.device.stage import DeviceStage
from tests.image import nvimgcodec_standin
from tests.image.test_device_feeder import WAIT_S, feeder_threads, packed_batches


class ReleaseWaitsForTheNextDecode(TorchvisionDecoder):
    """Decodes as torchvision does on the CPU, with a lease per batch (the decoder protocol's `batch_decoded` /
    `release`). The release of batch n, which the stage makes inside its crop of batch n, waits until the decode
    of batch n+1 has begun, and that decode waits until the release of batch n has begun: so the two run at the
    same time, and a feeder that decodes and crops in series never gets past batch 0's crop."""

    def __init__(self, batches: int, wait_s: float) -> None:
        super().__init__(torch.device("cpu"))
        self.batches, self.wait_s, self.calls = batches, wait_s, 0
        self.decode_started = [threading.Event() for _ in range(batches)]
        self.release_started = [threading.Event() for _ in range(batches)]
        self.decode_spans: dict[int, tuple[float, float]] = {}
        self.release_spans: dict[int, tuple[float, float]] = {}

    def decode(self, payloads, regions=None):
        i, self.calls = self.calls, self.calls + 1
        started = time.monotonic()
        self.decode_started[i].set()
        if i > 0:
            assert self.release_started[i - 1].wait(self.wait_s), f"batch {i - 1} was never cropped"
        time.sleep(0.02)  # a decoder's call releases the GIL
        decoded = super().decode(payloads, regions)
        self.decode_spans[i] = (started, time.monotonic())
        return decoded

    def batch_decoded(self) -> int:
        return self.calls - 1

    def release(self, lease: int) -> None:
        started = time.monotonic()
        self.release_started[lease].set()
        if lease + 1 < self.batches:
            assert self.decode_started[lease + 1].wait(self.wait_s), f"batch {lease + 1} was not being decoded"
            time.sleep(0.02)
        self.release_spans[lease] = (started, time.monotonic())


def feed(photos, decoder, count: int, decode_ahead: bool) -> list[torch.Tensor]:
    stage = DeviceStage("cpu", 32, "photos", decoder=decoder)
    ring = SlotRing(3, lambda: stage.new_output(4), stage.device)
    batches = packed_batches(photos, count)
    feeder = DeviceFeeder(stage, ring, strong(lambda key: iter(batches)), PassKey(0), follow=lambda key: None,
                          decode_ahead=decode_ahead)
    try:
        return [made.images.clone() for made in feeder.batches(PassKey(0))]
    finally:
        feeder.close()


def test_the_decode_of_the_next_batch_runs_while_this_one_is_cropped(jpeg_photos):
    count = 6
    decoder = ReleaseWaitsForTheNextDecode(count, WAIT_S)
    got = feed(jpeg_photos[0], decoder, count, decode_ahead=True)
    assert len(got) == count and sorted(decoder.release_spans) == list(range(count))
    for n in range(count - 1):
        decode, crop = decoder.decode_spans[n + 1], decoder.release_spans[n]
        assert decode[0] < crop[1] and crop[0] < decode[1], (n, decode, crop)
    expected = feed(jpeg_photos[0], TorchvisionDecoder(torch.device("cpu")), count, decode_ahead=False)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_in_series_the_crop_never_sees_the_next_decode(jpeg_photos):
    """The test above can fail: one thread decodes and crops in turn, so the release of batch 0 waits in vain."""
    with pytest.raises(AssertionError, match="batch 1 was not being decoded"):
        feed(jpeg_photos[0], ReleaseWaitsForTheNextDecode(4, wait_s=1.0), 4, decode_ahead=False)


def test_loaders_give_the_same_batches_over_epochs_and_leave_no_thread(jpeg_photos):
    options = dict(batch_size=4, image_size=32, device="cpu", seed=2)
    ahead = fastdata.loader(jpeg_photos[0], num_workers=2, decode=DeviceDecode(decode_ahead=True), **options)
    series = fastdata.loader(jpeg_photos[0], num_workers=2, decode="device", **options)
    for _ in range(2):  # the second epoch is decoded ahead across the epoch boundary
        got = [(images.clone(), labels.clone()) for images, labels in ahead]
        expected = [(images.clone(), labels.clone()) for images, labels in series]
        assert len(got) == len(expected) == 6
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, expected, strict=True))
    ahead.close_feeder()
    series.close_feeder()
    assert feeder_threads() == []


class ReusingDecoder(nvimgcodec_standin.Decoder):
    """The stand-in library, decoding into the buffers of the Images passed back (`images=`), as nvImageCodec
    does: a batch whose buffers were handed out again too early gets another batch's pixels."""

    def decode(self, srcs, *, images=None, params=None, cuda_stream=0):
        fresh = super().decode(srcs, params=params, cuda_stream=cuda_stream)
        if images is None:
            return fresh
        for old, new in zip(images, fresh, strict=False):
            if new is not None and old.array.size >= new.array.size:
                flat = old.array.reshape(-1)
                flat[:new.array.size] = new.array.reshape(-1)
                new.array = flat[:new.array.size].reshape(new.array.shape)
        return fresh


def test_decoded_buffers_are_reused_only_after_the_crop_that_reads_them(jpeg_photos, monkeypatch):
    """Two batches decoded before the first is cropped (as the decode thread does) keep their own pixels: the
    second decode may not reuse the first's buffers, only those of a batch already cropped."""
    import sys
    import types

    nvidia = sys.modules.get("nvidia") or types.ModuleType("nvidia")
    monkeypatch.setitem(sys.modules, "nvidia", nvidia)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", nvimgcodec_standin)
    monkeypatch.setattr(nvidia, "nvimgcodec", nvimgcodec_standin, raising=False)
    monkeypatch.setattr(nvimgcodec_standin, "Decoder", ReusingDecoder)
    from fastdata.image.device.nvimgcodec import NvImageCodecDecoder

    library = NvImageCodecDecoder(torch.device("cpu"), DeviceDecode())
    stage = DeviceStage("cpu", 32, "photos", decoder=library)
    reference = DeviceStage("cpu", 32, "photos", decoder=NvImageCodecDecoder(torch.device("cpu"), DeviceDecode()))
    batches = packed_batches(jpeg_photos[0], 5)
    expected = [reference(batch).images.clone() for batch in batches]
    got, pending = [], []
    for batch in batches:  # always two decoded ahead of the crop
        pending.append(stage.decode(batch))
        if len(pending) == 2:
            got.append(stage.finish(pending.pop(0)).images.clone())
    got += [stage.finish(one).images.clone() for one in pending]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert library._free  # and buffers were handed back for reuse
    reused = [np.shares_memory(a.array, b.array) for a in library._free[0] for b in library._free[-1]]
    assert len(library._free) >= 2 and not any(reused)


def test_a_dropped_loader_stops_its_feeder_and_decode_threads(jpeg_photos):
    loader = fastdata.loader(jpeg_photos[0], batch_size=4, image_size=32, num_workers=2, device="cpu",
                             decode=DeviceDecode(decode_ahead=True))
    for number, _ in enumerate(loader):
        if number == 2:
            break  # mid-pass, its decode thread ahead of the crop (or already on the next pass)
    del loader
    assert feeder_threads() == []
