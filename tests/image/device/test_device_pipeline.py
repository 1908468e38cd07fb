"""The feeder's two threads (fastdata.image.device.feeder): the decode of batch n+1 runs while batch n is cropped,
at most 2 decoded batches wait for the resize thread, the batches are those of a loader without workers, the
decoder's buffers are leased behind events, `decode_ahead` is gone, and no thread is left behind. CPU stand-ins
that wait for each other: nothing depends on the machine's speed."""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import pytest
import torch

import fastdata
from fastdata.image.device.decoders import TorchvisionDecoder
from fastdata.image.device.feeder import DECODED_AHEAD, DeviceFeeder, PassKey, strong
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.device.ring import SlotRing
from fastdata.image.device.stage import DeviceStage
from tests.image.device import nvimgcodec_standin
from tests.image.device.test_device_feeder import WAIT_S, feeder_threads, packed_batches


class ReleaseWaitsForTheNextDecode(TorchvisionDecoder):
    """Decodes as torchvision does on the CPU, with a lease per batch (the decoder protocol's `batch_decoded` /
    `release`). The release of batch n, which comes at the end of batch n's crop, waits until the decode of batch
    n+1 has begun, and that decode waits until the release of batch n has begun: so the two run at the same time,
    and a feeder that decodes and crops in series never gets past batch 0's crop."""

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

    def release(self, lease: int, guard=None) -> None:
        started = time.monotonic()
        self.release_started[lease].set()
        if lease + 1 < self.batches:
            assert self.decode_started[lease + 1].wait(self.wait_s), f"batch {lease + 1} was not being decoded"
            time.sleep(0.02)
        self.release_spans[lease] = (started, time.monotonic())


def feed(photos, decoder, count: int) -> list[torch.Tensor]:
    stage = DeviceStage("cpu", 32, "photos", decoder=decoder)
    ring = SlotRing(3, lambda: stage.new_output(4), stage.device)
    batches = packed_batches(photos, count)
    feeder = DeviceFeeder(stage, ring, strong(lambda key: iter(batches)), PassKey(0), follow=lambda key: None)
    try:
        return [made.images.clone() for made in feeder.batches(PassKey(0))]
    finally:
        feeder.close()


def test_the_decode_of_the_next_batch_runs_while_this_one_is_cropped(jpeg_photos):
    count = 6
    decoder = ReleaseWaitsForTheNextDecode(count, WAIT_S)
    got = feed(jpeg_photos[0], decoder, count)
    assert len(got) == count and sorted(decoder.release_spans) == list(range(count))
    for n in range(count - 1):
        decode, crop = decoder.decode_spans[n + 1], decoder.release_spans[n]
        assert decode[0] < crop[1] and crop[0] < decode[1], (n, decode, crop)
    expected = feed(jpeg_photos[0], TorchvisionDecoder(torch.device("cpu")), count)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_in_series_the_crop_never_sees_the_next_decode(jpeg_photos):
    """The test above can fail: one thread that decodes, crops and releases in turn (the feeder's old default)
    waits in vain in the release of batch 0."""
    decoder = ReleaseWaitsForTheNextDecode(4, wait_s=1.0)
    stage = DeviceStage("cpu", 32, "photos", decoder=decoder)
    with pytest.raises(AssertionError, match="batch 1 was not being decoded"):
        for batch in packed_batches(jpeg_photos[0], 4):
            stage(batch)


class CountingDecoder(TorchvisionDecoder):
    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.calls = 0

    def decode(self, payloads, regions=None):
        self.calls += 1
        return super().decode(payloads, regions)


def test_two_decoded_batches_wait_for_the_resize_thread_and_six_slots_for_the_loop(jpeg_photos):
    """A training loop that takes nothing: the resize thread fills the default 6 slots and waits for a seventh
    with the next decoded batch in hand; 2 decoded batches wait in the queue, and the decode thread holds one more
    it cannot put: 6 + 1 + 2 + 1 decoder calls, and then none (the threads are stuck, not slow)."""
    slots = DeviceDecodeOptions().slots
    assert (slots, DECODED_AHEAD) == (6, 2)
    decoder = CountingDecoder()
    stage = DeviceStage("cpu", 32, "photos", decoder=decoder)
    ring = SlotRing(slots, lambda: stage.new_output(4), stage.device)
    batches = packed_batches(jpeg_photos[0], 20)
    feeder = DeviceFeeder(stage, ring, strong(lambda key: iter(batches)), PassKey(0), follow=lambda key: None)
    try:
        threads = feeder.threads()
        expected = slots + 1 + DECODED_AHEAD + 1
        deadline = time.monotonic() + WAIT_S
        # stuck for good: the resize thread's 6 batches wait for the loop and it holds a seventh (inside the slot
        # wait), 2 decoded batches wait for it, and the decode thread made one more it cannot put
        while not (threads["resize"].waiting == slots and threads["resize"].state == "work"
                   and threads["decode"].waiting == DECODED_AHEAD and decoder.calls >= expected):
            assert time.monotonic() < deadline, f"the feeder stopped at {decoder.calls} decodes"
            time.sleep(0.01)
        assert decoder.calls == expected and len(ring.slots) == slots
    finally:
        feeder.close()
    assert feeder_threads() == []


def test_loaders_give_the_same_batches_over_epochs_and_leave_no_thread(jpeg_photos):
    options = dict(batch_size=4, image_size=32, device="cpu", seed=2, decode="device")
    threaded = fastdata.loader(jpeg_photos[0], num_workers=2, **options)
    reference = fastdata.loader(jpeg_photos[0], num_workers=0, **options)
    for _ in range(2):  # the second epoch is decoded ahead across the epoch boundary
        got = [(images.clone(), labels.clone()) for images, labels in threaded]
        expected = [(images.clone(), labels.clone()) for images, labels in reference]
        assert len(got) == len(expected) == 6
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, expected, strict=True))
    threaded.close_feeder()
    reference.close_feeder()
    assert feeder_threads() == []


def test_decode_ahead_is_deprecated_and_changes_nothing(jpeg_photos):
    with pytest.warns(FutureWarning, match=r"decode_ahead=\.\.\.\) is deprecated and ignored.*remove the argument"):
        options = DeviceDecodeOptions(decode_ahead=False)
    loader = fastdata.loader(jpeg_photos[0], batch_size=4, image_size=32, num_workers=0, device="cpu",
                             decode=options)
    reference = fastdata.loader(jpeg_photos[0], batch_size=4, image_size=32, num_workers=0, device="cpu",
                                decode="device")
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(loader, reference, strict=True))
    loader.close_feeder()
    reference.close_feeder()


# ----------------------------------------------------------------------------------------------------
# the decoder's buffers: a lease, reused only once an event behind its last reader has completed


class Guard:
    """A stand-in event: done when the test says so."""

    def __init__(self, done: bool = False) -> None:
        self.is_done = done

    def query(self) -> bool:
        return self.is_done


@pytest.fixture
def library(monkeypatch):
    nvimgcodec_standin.install(monkeypatch)
    from fastdata.image.device.nvimgcodec import NvImageCodecDecoder

    return NvImageCodecDecoder(torch.device("cpu"), DeviceDecodeOptions())


def payloads_of(batch) -> list[np.ndarray]:
    return [batch.data[batch.offsets[i]:batch.offsets[i + 1]].numpy() for i in range(len(batch))]


def test_buffers_are_decoded_into_again_only_once_their_guard_has_completed(library, jpeg_photos):
    payloads = payloads_of(packed_batches(jpeg_photos[0], 1)[0])
    made = nvimgcodec_standin.Decoder.created[-1]
    library.decode(payloads)
    guard = Guard()
    library.release(library.batch_decoded(), guard)  # its crop is queued, not run
    library.decode(payloads)
    assert made.given == [0, 0]  # not reused: the library allocated
    library.release(library.batch_decoded(), Guard(done=True))
    guard.is_done = True  # the first crop has run
    library.decode(payloads)
    assert made.given == [0, 0, len(payloads)]


def test_sets_beyond_the_kept_few_are_freed_only_after_their_guard(library, jpeg_photos):
    """More sets released than the decoder keeps: those whose reader has not run stay alive (their memory is not
    handed to the library's next allocation), and go once their guard has completed."""
    from fastdata.image.device.nvimgcodec import KEPT_SETS

    payloads = payloads_of(packed_batches(jpeg_photos[0], 1)[0])
    guards, sets = [], []
    for _ in range(KEPT_SETS + 3):
        library.decode(payloads)
        lease = library.batch_decoded()
        sets.append([weakref.ref(image) for images in lease for image in images])
        guards.append(Guard())
        library.release(lease, guards[-1])
    assert all(ref() is not None for refs in sets for ref in refs)
    for guard in guards:
        guard.is_done = True
    library.decode(payloads)  # reuses one set; the surplus ones are dropped now
    alive = sum(all(ref() is not None for ref in refs) for refs in sets)
    assert alive <= KEPT_SETS + 1


def test_a_set_with_an_image_the_library_refused_is_leased_too(library, jpeg_photos):
    """A batch where the library returned None for one image: its other Images are kept until the guard (the
    library's stream-ordered free could otherwise overtake the crop reading them on another stream)."""
    payloads = payloads_of(packed_batches(jpeg_photos[0], 1)[0])
    first = bytes(payloads[0])
    nvimgcodec_standin.Decoder.created[-1].rejects = lambda data: data == first
    images = library.decode(payloads)
    assert images[0] is None
    lease = library.batch_decoded()
    kept = [weakref.ref(image) for image in lease[0] if image is not None]
    guard = Guard()
    library.release(lease, guard)
    del lease, images
    library.decode(payloads)
    assert all(ref() is not None for ref in kept)
    guard.is_done = True
    library.decode(payloads)
    assert all(ref() is None for ref in kept)
