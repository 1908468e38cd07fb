"""How a device-path batch crosses from a worker to the main process (`EncodedBatch.__reduce__`): the bytes and the
worker's pixels as one shared-memory tensor, everything small by value, and the same batch on the other side."""

from __future__ import annotations

import io
from dataclasses import replace
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import fastdata
from fastdata.image.batch import EncodedBatch
from fastdata.image.device.ship import pack_encoded


class CountingPickler(ForkingPickler):
    """torch's pickler for worker queues, counting the tensors it shares (each one a file-descriptor handshake
    for the main process)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.tensors = 0

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            self.tensors += 1
        return NotImplemented


def shared_tensors(batch: EncodedBatch) -> int:
    pickler = CountingPickler(io.BytesIO())
    pickler.dump(batch)
    return pickler.tensors


def assert_same(received: EncodedBatch, sent: EncodedBatch) -> None:
    for name in ("data", "offsets", "boxes", "flips", "sizes", "labels", "worker_decoded", "pixels"):
        a, b = getattr(received, name), getattr(sent, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert received.keys == sent.keys and received.skipped == sent.skipped and received.metadata == sent.metadata


@pytest.fixture(scope="module")
def packed(photos) -> EncodedBatch:
    ds = fastdata.dataset(photos[0], "train", image_size=32)
    batch = pack_encoded(ds.pipeline, [ds.encoded(i) for i in range(12)], 0)
    assert batch.worker_decoded.any() and (~batch.worker_decoded).any()  # PNGs decoded there, JPEGs shipped
    return batch


def test_a_batch_crosses_as_one_shared_tensor(packed):
    """The worker's bytes and pixels lie in one storage: one tensor to share, where each field was one."""
    assert shared_tensors(packed) == 1
    assert packed.data.untyped_storage().data_ptr() == packed.pixels.untyped_storage().data_ptr()
    apart = replace(packed, pixels=packed.pixels.clone())  # made elsewhere: still correct, two tensors
    assert shared_tensors(apart) == 2


def test_a_batch_in_a_larger_reused_slot_still_crosses_as_one_tensor(packed):
    """A worker's slot keeps the size of the largest batch it held: a smaller batch lies in its first bytes."""
    size = packed.data.numel() + packed.pixels.numel()
    slot = torch.full((size + 1000,), 7, dtype=torch.uint8)
    data, pixels = slot[:packed.data.numel()], slot[packed.data.numel():size].view(packed.pixels.shape)
    data.copy_(packed.data)
    pixels.copy_(packed.pixels)
    batch = replace(packed, data=data, pixels=pixels)
    assert shared_tensors(batch) == 1
    assert_same(ForkingPickler.loads(ForkingPickler.dumps(batch)), packed)


def _send(batch: EncodedBatch, queue: mp.Queue, done: mp.Event) -> None:
    torch.set_num_threads(1)
    queue.put(batch)
    done.wait(120)  # the main process maps the shared memory while this process lives, as a worker does


@pytest.mark.parametrize("kind", ["mixed", "apart", "no pixels", "no bytes"])
def test_a_batch_arrives_whole_from_another_process(packed, kind):
    batch = packed
    if kind == "apart":
        batch = replace(packed, pixels=packed.pixels.clone())
    elif kind == "no pixels":
        rows = (~packed.worker_decoded).numpy()
        batch = pack_encoded_subset(packed, rows)
    elif kind == "no bytes":
        batch = pack_encoded_subset(packed, packed.worker_decoded.numpy())
    context = mp.get_context("fork")
    queue, done = context.Queue(), context.Event()
    process = context.Process(target=_send, args=(batch, queue, done))
    process.start()
    try:
        received = queue.get(timeout=120)
    finally:
        done.set()
        process.join(120)
    assert_same(received, batch)
    received.data[:1] = 0  # writable, as the stage's views expect
    assert received.labels.dtype == torch.int64


def pack_encoded_subset(batch: EncodedBatch, rows: np.ndarray) -> EncodedBatch:
    """The batch's rows `rows` only (all shipped bytes, or all worker pixels), packed as a worker packs them."""
    from fastdata.image.device.ship import encoded_buffer

    index = np.flatnonzero(rows)
    offsets = batch.offsets.numpy()
    data = np.concatenate([batch.data.numpy()[offsets[i]:offsets[i + 1]] for i in index] or [np.zeros(0, np.uint8)])
    lengths = np.diff(offsets)[index]
    new_offsets = np.zeros(len(index) + 1, np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    pixel_rows = np.flatnonzero(batch.worker_decoded.numpy())
    keep_pixels = [n for n, row in enumerate(pixel_rows) if rows[row]]
    shared, pixels, _ = encoded_buffer([data], batch.pixels[keep_pixels])
    return EncodedBatch(shared, torch.from_numpy(new_offsets), batch.boxes[index], batch.flips[index],
                        batch.sizes[index], batch.labels[index], batch.worker_decoded[index], pixels,
                        [batch.keys[i] for i in index])


def test_a_worker_path_batch_shares_its_images_only(photos):
    """The worker path's batch: its images as shared memory (the worker's slot), the labels by value; the same
    labels on the other side."""
    from fastdata.image.batch import Batch

    ds = fastdata.dataset(photos[0], "train", image_size=32)
    decoded = ds.pipeline.batch([ds.encoded(i) for i in range(6)], 0, "raise")
    batch = Batch(decoded.images, decoded.labels)
    assert shared_tensors(batch) == 1
    received = ForkingPickler.loads(ForkingPickler.dumps(batch))
    assert torch.equal(received.labels, batch.labels) and received.labels.dtype == batch.labels.dtype
    assert torch.equal(received.images, batch.images)


class SwitchIntervals(torch.utils.data.Dataset):
    """Reports the GIL switch interval of the process that reads it (a worker's)."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> float:
        import sys

        return sys.getswitchinterval()


@pytest.mark.parametrize("module", ["fastdata.image.loader", "fastdata.text.loader"])
def test_the_loaders_workers_hand_batches_over_quickly(module):
    """fastdata's workers shorten their GIL switch interval (so a handshake with their resource sharer thread does
    not wait 5 ms per GIL hand-off while they work); the main process keeps its own."""
    import importlib
    import sys

    from fastdata.workers import WORKER_SWITCH_INTERVAL

    init = importlib.import_module(module)._worker_init
    mine = sys.getswitchinterval()
    loader = torch.utils.data.DataLoader(SwitchIntervals(), batch_size=None, num_workers=1, worker_init_fn=init)
    assert list(loader) == [WORKER_SWITCH_INTERVAL] * 2
    assert sys.getswitchinterval() == mine != WORKER_SWITCH_INTERVAL


class PackedInAWorker(torch.utils.data.Dataset):
    """Packs a device-path batch where it is read and says whether its storage is shared memory."""

    def __init__(self, path) -> None:
        self.path = path

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> bool:
        ds = fastdata.dataset(self.path, "train", image_size=32)
        batch = pack_encoded(ds.pipeline, [ds.encoded(i) for i in range(6)], 0)
        return batch.data.is_shared() and batch.pixels.is_shared()


def test_a_worker_packs_its_batch_straight_into_shared_memory(photos):
    """In a DataLoader worker the batch is made in shared memory (nothing left to copy when it is handed over);
    in the main process (num_workers=0) it is not."""
    assert not PackedInAWorker(photos[0])[0]
    loader = torch.utils.data.DataLoader(PackedInAWorker(photos[0]), batch_size=None, num_workers=1)
    assert list(loader) == [True]


def test_large_labels_such_as_masks_stay_shared_memory():
    """Masks ([B, H, W]) or multi-hot labels over many classes are no small labels: they cross as shared memory,
    not through the queue's pipe."""
    from fastdata.image.batch import Batch
    from fastdata.image.handover import BY_VALUE_BYTES

    images = torch.zeros((2, 3, 8, 8), dtype=torch.uint8)
    masks = torch.ones((2, 200, 200), dtype=torch.int64)
    assert masks.numel() * 8 > BY_VALUE_BYTES
    assert shared_tensors(Batch(images, masks)) == 2
    received = ForkingPickler.loads(ForkingPickler.dumps(Batch(images, masks)))
    assert torch.equal(received.labels, masks)
    assert shared_tensors(Batch(images, torch.arange(2))) == 1


@pytest.mark.parametrize("masks", [False, True])
def test_detection_targets_cross_by_value_but_their_masks(masks):
    """A detection batch's targets: seven small tensors by value (no handshake each), masks as shared memory;
    the same targets on the other side."""
    from fastdata.image.targets.detection import DetectionBatch

    boxes = torch.rand(5, 4)
    targets = DetectionBatch(boxes, torch.arange(5), torch.zeros(5, dtype=torch.int64), boxes[:, 2] * boxes[:, 3],
                             torch.arange(10, 15), torch.tensor([7, 8]), torch.tensor([2, 3]),
                             torch.ones((5, 200, 200), dtype=torch.uint8) if masks else None)
    assert shared_tensors(targets) == int(masks)
    received = ForkingPickler.loads(ForkingPickler.dumps(targets))
    for name in ("boxes", "labels", "iscrowd", "area", "annotation_ids", "image_ids", "counts", "masks"):
        a, b = getattr(received, name), getattr(targets, name)
        assert (a is None and b is None) or (a.dtype == b.dtype and torch.equal(a, b)), name
