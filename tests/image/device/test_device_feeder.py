"""decode="device"'s feeder (fastdata.image.device.feeder) and slot ring (fastdata.image.device.ring): the decode
of batch n+1 runs while the training step on batch n runs, a kept batch (or its labels) is never overwritten,
labels live in the slots, errors surface at the training thread's next(), the next epoch is prepared ahead, and
the threads stop cleanly. CPU stand-ins."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from builders.runs import less_the_fallback_note

import fastdata
from fastdata.errors import CorruptSampleError
from fastdata.image.device.decoders import TorchvisionDecoder
from fastdata.image.device.feeder import DeviceFeeder, PassKey, strong
from fastdata.image.device.ring import SlotRing
from fastdata.image.device.ship import pack_encoded
from fastdata.image.device.stage import TIMING_PARTS, DeviceStage

WAIT_S = 120  # only a broken feeder waits this long: the test then fails
FEEDER_THREADS = ("fastdata-device-decode", "fastdata-device-resize")




def packed_batches(path, count: int, size: int = 4):
    ds = fastdata.dataset(path, "train", image_size=32)
    return [pack_encoded(ds.pipeline, [ds.encoded((i * size + j) % len(ds)) for j in range(size)], 0)
            for i in range(count)]


class Timeline:
    def __init__(self, batches: int) -> None:
        self.decode_started = [threading.Event() for _ in range(batches)]
        self.step_started = [threading.Event() for _ in range(batches)]
        self.decode = {}  # batch -> (start, end)
        self.step = {}


class StandInDecoder(TorchvisionDecoder):
    """Decodes as torchvision does on the CPU, but batch i's decode starts only once the step on batch i-1 has
    started, and takes a while (sleeping releases the GIL, as a real decoder's call does)."""

    def __init__(self, timeline: Timeline) -> None:
        super().__init__(torch.device("cpu"))
        self.timeline, self.calls = timeline, 0

    def decode(self, payloads, regions=None):
        i, self.calls = self.calls, self.calls + 1
        started = time.monotonic()
        self.timeline.decode_started[i].set()
        if i > 0:
            assert self.timeline.step_started[i - 1].wait(WAIT_S), f"the step on batch {i - 1} never started"
        time.sleep(0.02)
        decoded = super().decode(payloads, regions)
        self.timeline.decode[i] = (started, time.monotonic())
        return decoded


def test_the_decode_of_the_next_batch_runs_while_the_step_on_this_one_runs(jpeg_photos):
    """For every n, the stand-in decode of batch n+1 and the stand-in step on batch n run at the same time: each
    waits until the other has started, so a loader that decodes batch n+1 before or after the step on batch n
    (not beside it) never gets past the first batch and fails here."""
    count = 6
    timeline = Timeline(count)
    stage = DeviceStage("cpu", 32, "photos", decoder=StandInDecoder(timeline))
    ring = SlotRing(3, lambda: stage.new_output(4), stage.device)
    batches = packed_batches(jpeg_photos[0], count)
    feeder = DeviceFeeder(stage, ring, strong(lambda key: iter(batches)), PassKey(0), follow=lambda key: None)
    try:
        for n, made in enumerate(feeder.batches(PassKey(0))):
            assert made.images.shape == (4, 3, 32, 32)
            started = time.monotonic()
            timeline.step_started[n].set()
            if n + 1 < count:
                assert timeline.decode_started[n + 1].wait(WAIT_S), f"batch {n + 1} was not being decoded"
            time.sleep(0.02)
            timeline.step[n] = (started, time.monotonic())
    finally:
        feeder.close()
    assert sorted(timeline.step) == list(range(count))
    for n in range(count - 1):
        decode, step = timeline.decode[n + 1], timeline.step[n]
        assert decode[0] < step[1] and step[0] < decode[1], (n, decode, step)


def test_the_feeder_times_its_threads_waits(jpeg_photos):
    """timings["workers"]: the decode thread's waits for the workers' next batch (here each takes at least 30 ms);
    "decode_wait": the resize thread's waits for a decoded batch, which with its own work ("resize") covers the
    time the workers took (it cannot end sooner); "starved": the training thread's waits for a finished batch,
    never more than the pass lasted; every part is there."""
    count, delay = 4, 0.03
    stage = DeviceStage("cpu", 32, "photos", decoder=TorchvisionDecoder(torch.device("cpu")))
    ring = SlotRing(3, lambda: stage.new_output(4), stage.device)
    batches = packed_batches(jpeg_photos[0], count)

    def slow_workers(key):
        for batch in batches:
            time.sleep(delay)
            yield batch

    started = time.perf_counter()
    feeder = DeviceFeeder(stage, ring, strong(slow_workers), PassKey(0), follow=lambda key: None)
    try:
        assert len(list(feeder.batches(PassKey(0)))) == count
        lasted = time.perf_counter() - started
    finally:
        feeder.close()
    assert stage.timings["workers"] >= count * delay
    resize_thread = stage.timings["decode_wait"] + stage.timings["resize"] + stage.timings["slot_wait"]
    assert stage.timings["decode_wait"] > 0 and resize_thread >= 0.5 * count * delay
    assert 0 < stage.timings["starved"] <= lasted
    assert set(TIMING_PARTS) <= set(stage.timings) and stage.timings["batches"] == count


def test_slots_keep_their_address_unless_their_batch_is_kept(jpeg_photos):
    """Batches dropped by the loop come back in the same slots (fixed addresses: CUDA-graph friendly); a batch the
    user keeps is never written again: its slot gets a new tensor."""
    stage = DeviceStage("cpu", 32, "photos", decoder=TorchvisionDecoder(torch.device("cpu")))
    ring = SlotRing(3, lambda: stage.new_output(4), stage.device)
    batches = packed_batches(jpeg_photos[0], 9)
    feeder = DeviceFeeder(stage, ring, strong(lambda key: iter(batches)), PassKey(0), follow=lambda key: None)
    addresses, kept, kept_copy = [], None, None
    try:
        for n, made in enumerate(feeder.batches(PassKey(0))):
            addresses.append(made.images.data_ptr())
            if n == 2:
                kept, kept_copy = made.images, made.images.clone()
    finally:
        feeder.close()
    assert len(set(addresses[:3])) == 3 and addresses[3:5] == addresses[:2]  # slots 0 and 1 reused
    assert addresses[5] != addresses[2] and ring.refills >= 1  # slot 2 was kept: a new tensor took its place
    assert torch.equal(kept, kept_copy)  # and the kept batch was never overwritten


def test_labels_live_in_the_slots_and_labels_kept_by_the_user_are_never_overwritten(jpeg_photos):
    """Each batch's labels are a view of its slot's own labels tensor (written on the resize thread, reused at a
    fixed address like the images, never a fresh tensor handed from one stream to another); labels the user keeps
    (appended to a list, as metrics code does) keep their values: their slot gets a new tensor."""
    stage = DeviceStage("cpu", 32, "photos", decoder=TorchvisionDecoder(torch.device("cpu")))
    ring = SlotRing(3, lambda: stage.new_output(4), stage.device)
    batches = packed_batches(jpeg_photos[0], 9)
    feeder = DeviceFeeder(stage, ring, strong(lambda key: iter(batches)), PassKey(0), follow=lambda key: None)
    addresses, kept, kept_copy, values = [], None, None, []
    try:
        for n, made in enumerate(feeder.batches(PassKey(0))):
            addresses.append(made.labels.data_ptr())
            values.append(made.labels.clone())
            if n == 2:
                kept, kept_copy = made.labels, made.labels.clone()
    finally:
        feeder.close()
    slots = {held.tensor.untyped_storage().data_ptr() for slot in ring.slots for held in slot.extra.values()}
    assert len(set(addresses[:3])) == 3 and addresses[3:5] == addresses[:2]  # the slots' labels, reused
    assert set(addresses[:2]) <= slots
    assert addresses[5] != addresses[2] and torch.equal(kept, kept_copy)  # kept: a new tensor took its place
    assert [v.tolist() for v in values] == [b.labels.tolist() for b in batches]


def test_an_error_in_the_feeder_is_raised_at_next_with_its_type(jpeg_photos):
    """... after the batches before it (raised on the resize thread, where the CPU finds the sample damaged), and
    no thread is left."""
    batches = packed_batches(jpeg_photos[0], 4)
    batches[2].data[batches[2].offsets[0] + 200:batches[2].offsets[1]] = 0  # damage the first JPEG's scan
    stage = DeviceStage("cpu", 32, "photos", decoder=TorchvisionDecoder(torch.device("cpu")))
    ring = SlotRing(3, lambda: stage.new_output(4), stage.device)
    feeder = DeviceFeeder(stage, ring, strong(lambda key: iter(batches)), PassKey(0), follow=lambda key: None)
    seen = 0
    with pytest.raises(CorruptSampleError, match=batches[2].keys[0]):
        for _ in feeder.batches(PassKey(0)):
            seen += 1
    feeder.close()
    assert seen == 2
    assert feeder_threads() == []


def feeder_threads() -> list[threading.Thread]:
    """The feeder threads (and their decode threads) still running once every dropped loader was collected (a
    feeder thread that was just starting a pass when its loader was dropped stops on its own a moment later)."""
    import gc

    deadline = time.monotonic() + WAIT_S
    while True:
        gc.collect()
        running = [t for t in threading.enumerate() if t.name in FEEDER_THREADS]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def test_the_next_epoch_is_prepared_while_the_last_batches_are_used_and_close_stops_the_thread(jpeg_photos):
    assert feeder_threads() == []  # loaders other tests dropped have stopped their feeders
    loader = fastdata.loader(jpeg_photos[0], batch_size=4, image_size=32, num_workers=2, decode="device", device="cpu")
    first = [labels.clone() for _, labels in loader]
    assert len(first) == 6
    received = loader.stage_times.batches
    deadline = time.monotonic() + WAIT_S
    while loader.stage_times.batches == received and time.monotonic() < deadline:
        time.sleep(0.01)  # nobody iterates now: only a feeder already on the next epoch receives batches
    assert loader.stage_times.batches > received
    second = [labels.clone() for _, labels in loader]
    assert len(second) == 6 and sorted(torch.cat(first).tolist()) == sorted(torch.cat(second).tolist())
    assert [b.tolist() for b in first] != [b.tolist() for b in second]  # epoch 1's order, not epoch 0's again
    loader.close_feeder()
    assert feeder_threads() == []


def test_a_dropped_loader_stops_its_feeder(jpeg_photos):
    """A loader its user drops while its feeder prepares the next epoch is collected, and its feeder stops."""
    loader = fastdata.loader(jpeg_photos[0], batch_size=4, image_size=32, num_workers=2, decode="device", device="cpu")
    for _ in loader:
        pass
    assert [t for t in threading.enumerate() if t.name in FEEDER_THREADS]
    del loader
    assert feeder_threads() == []


def test_a_script_that_stops_early_exits_cleanly(jpeg_photos, tmp_path):
    """A script that breaks out of a device-path epoch (the feeder mid-pass, workers running) and returns: exit
    code 0 and nothing on stderr."""
    script = tmp_path / "early.py"
    script.write_text(textwrap.dedent(f"""
        import fastdata
        loader = fastdata.loader({str(jpeg_photos[0])!r}, batch_size=4, image_size=32, num_workers=2, decode="device",
                                 device="cpu")
        for number, (images, labels) in enumerate(loader):
            if number == 1:
                break
        print("done")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "done" and less_the_fallback_note(done.stderr) == "", \
        done.stderr


def test_set_epoch_between_passes_gives_that_epochs_batches(jpeg_photos):
    options = dict(batch_size=4, image_size=32, decode="device", device="cpu", seed=1)
    loader = fastdata.loader(jpeg_photos[0], num_workers=2, **options)
    list(loader)  # epoch 0; the feeder then prepares epoch 1
    loader.set_epoch(3)
    got = [images.clone() for images, _ in loader]
    reference = fastdata.loader(jpeg_photos[0], num_workers=0, **options)
    reference.set_epoch(3)
    expected = [images for images, _ in reference]
    assert len(got) == len(expected) == 6
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    loader.close_feeder()
    reference.close_feeder()
