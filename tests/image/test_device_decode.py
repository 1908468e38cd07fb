"""decode="device": workers ship bytes + crop parameters, the batch is decoded and augmented on the device.
CI runs the same code path with device="cpu"; the `cuda` tests run wherever a GPU is present."""

from __future__ import annotations

import struct
import warnings

import lmdb
import numpy as np
import pytest
import torch

import fastdata
from fastdata.errors import ConfigError, CorruptSampleError, DeviceDecodeError
from fastdata.image.device import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    MAX_CONSECUTIVE_DEVICE_ERRORS,
    DeviceDecoder,
    decode_jpegs_torchvision,
    pack_encoded,
)
from fastdata.tools.sample import make_sample_imagefolder


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """24 real photo crops (JPEG baseline/progressive/grey, some PNG) converted to LMDB and WebDataset."""
    root = tmp_path_factory.mktemp("photos")
    src = make_sample_imagefolder(root / "src", images=24, classes=3, png_fraction=0.2, workers=1)
    fastdata.convert_imagefolder(src, root / "p.lmdb", workers=1, progress=False)
    fastdata.convert_imagefolder(src, root / "p-wds", format="wds", shard_size="200KB", workers=1, progress=False)
    return root / "p.lmdb", root / "p-wds"


def batches(path, decode, **kwargs):
    options = dict(batch_size=8, image_size=224, num_workers=0, seed=3)
    options.update(kwargs)
    return list(fastdata.loader(path, decode=decode, **options))


@pytest.mark.parametrize("augment", ["train", "val"])
def test_device_path_on_cpu_agrees_with_the_worker_path(photos, augment):
    worker = batches(photos[0], "worker", augment=augment)
    device = batches(photos[0], "device", device="cpu", augment=augment)
    assert len(worker) == len(device) == 3
    for (wi, wl), (di, dl) in zip(worker, device, strict=True):
        assert di.shape == wi.shape == (8, 3, 224, 224) and di.dtype == torch.uint8 and di.device.type == "cpu"
        assert torch.equal(wl, dl)  # same order, same samples
        diff = (wi.int() - di.int()).abs().float()
        # same crop boxes and flips; only resampling differs (DCT-scaled decode + OpenCV resize vs full
        # decode + torch resize): a mirrored or shifted crop would differ by tens of levels on average
        assert diff.mean() < 3.0
        assert diff.flatten().kthvalue(int(diff.numel() * 0.95)).values <= 16


def test_device_path_over_webdataset(photos):
    worker = batches(photos[1], "worker", shuffle=False)
    device = batches(photos[1], "device", device="cpu", shuffle=False)
    assert [b[1].tolist() for b in worker] == [b[1].tolist() for b in device]
    for (wi, _), (di, _) in zip(worker, device, strict=True):
        assert (wi.int() - di.int()).abs().float().mean() < 3.0


def jpeg_and_other_rows(path) -> tuple[list[int], list[int]]:
    codecs = fastdata.dataset(path).reader.codecs
    return np.flatnonzero(codecs == 0).tolist(), np.flatnonzero(codecs != 0).tolist()


def test_workers_ship_jpeg_bytes_and_decode_the_rest(photos):
    """JPEGs: their bytes and crop parameters; PNGs: decoded, cropped and flipped right there, exactly as on
    the worker path, shipped as pixels in batch order."""
    ds = fastdata.dataset(photos[0], "train", image_size=64)
    samples = [ds.encoded(i) for i in range(8)]
    jpegs, others = jpeg_and_other_rows(photos[0])
    assert set(range(8)) & set(others)
    packed = pack_encoded(ds.pipeline, samples, epoch=2)
    assert packed.data.dtype == torch.uint8 and len(packed.data) == sum(len(samples[i].data) for i in jpegs if i < 8)
    assert packed.keys == [s.key for s in samples] and packed.worker_decoded.tolist() == [i in others for i in range(8)]
    for i, sample in enumerate(samples):
        chunk = bytes(packed.data[packed.offsets[i]:packed.offsets[i + 1]].numpy())
        params = ds.pipeline.preset.params(sample.width, sample.height,
                                           fastdata.order.epoch.sample_rng(ds.pipeline.seed, 2, i))
        if i in jpegs:
            assert chunk == sample.data
            assert packed.boxes[i].tolist() == [params.left, params.top, params.width, params.height]
            assert bool(packed.flips[i]) == params.flip
        else:
            assert chunk == b"" and not packed.flips[i]
    worker = ds.pipeline.batch([samples[i] for i in others if i < 8], 2, "raise").images
    assert packed.pixels.shape == (len(worker), 3, 64, 64) and torch.equal(packed.pixels, worker)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_normalised_output_dtypes_and_channels_last(photos, dtype):
    raw = batches(photos[0], "device", device="cpu", shuffle=False)[0][0]
    out = batches(photos[0], "device", device="cpu", shuffle=False, dtype=dtype, channels_last=True)[0][0]
    assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    expected = (raw.float() / 255 - mean) / std
    assert torch.allclose(out.float(), expected, atol=0.05 if dtype != torch.float32 else 1e-4)


def test_worker_path_with_a_device_normalises_there_too(photos):
    raw = batches(photos[0], "worker", shuffle=False)[0][0]
    out = batches(photos[0], "worker", device="cpu", dtype=torch.float32, shuffle=False)[0][0]
    expected = (raw.float() - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255) / (
        torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255)
    assert torch.allclose(out, expected, atol=1e-4)


def test_images_the_device_decoder_cannot_take_are_decoded_in_the_workers(tricky_lmdb):
    """PNG (RGB, L, P, RGBA, LA), BMP and CMYK JPEGs are decoded in the worker processes, pixel for pixel as on
    the worker path, and counted as fallbacks; the main process decodes nothing on the CPU (no device errors)."""
    options = dict(batch_size=9, augment="val", image_size=16, shuffle=False, num_workers=2)
    worker = list(fastdata.loader(tricky_lmdb, **options))
    device = fastdata.loader(tricky_lmdb, decode="device", device="cpu", **options)
    jpegs, others = jpeg_and_other_rows(tricky_lmdb)
    row = 0
    for (wi, wl), (di, dl) in zip(worker, device, strict=True):
        assert torch.equal(wl, dl)
        for w, d in zip(wi, di, strict=True):
            if row in others:
                assert torch.equal(w, d), row
            else:
                assert (w.int() - d.int()).abs().float().mean() < 6.0
            row += 1
    assert row == len(jpegs) + len(others)
    assert device.device_fallbacks == len(others) > 0 and device.device_errors == 0


def corrupt_record(path, index: int) -> str:
    env = lmdb.open(str(path), max_dbs=5, map_size=64 << 20)
    images = env.open_db(b"images")
    with env.begin(write=True) as txn:
        txn.put(struct.pack(">Q", index), b"\xff\xd8\xff not a jpeg at all", db=images)
    env.close()
    (path / "lock.mdb").unlink(missing_ok=True)
    return fastdata.dataset(path).reader.key(index)


def test_corrupt_sample_follows_on_error(photos, tmp_path):
    import shutil

    path = tmp_path / "c.lmdb"
    shutil.copytree(photos[0], path)
    codecs = fastdata.dataset(photos[0]).reader.codecs  # (the copy must not be opened before it is edited)
    index = int(np.flatnonzero(codecs == 0)[0])
    key = corrupt_record(path, index)
    with pytest.raises(CorruptSampleError, match=key):
        batches(path, "device", device="cpu", shuffle=False)
    loader = fastdata.loader(path, batch_size=8, image_size=64, num_workers=0, shuffle=False, decode="device",
                             device="cpu", on_error="skip")
    seen = sum(len(labels) for _, labels in loader)
    assert seen == 23 and [k for k, _ in loader.skipped] == [key]


def test_oversized_images_are_refused_before_decoding(photos):
    ds = fastdata.dataset(photos[0], "train", image_size=32)
    packed = pack_encoded(ds.pipeline, [ds.encoded(i) for i in jpeg_and_other_rows(photos[0])[0][:3]], 0)
    decoder = DeviceDecoder("cpu", 32, "src", max_pixels=100)
    with pytest.raises(CorruptSampleError, match="refused"):
        decoder(packed)
    images, labels, skipped = DeviceDecoder("cpu", 32, "src", max_pixels=100, on_error="skip")(packed)
    assert len(images) == len(labels) == 0 and len(skipped) == 3


# ----------------------------------------------------------------------------------------------------
# device errors: DeviceDecoder's `decode_jpegs` seam given a decoder that fails on purpose


class FailingDecoder:
    """A batched JPEG decoder that raises `error` on the calls `fails(streams)` picks and otherwise decodes as
    the real one does; records the number of streams of every call."""

    def __init__(self, error: Exception, fails=lambda streams: True) -> None:
        self.error, self.fails, self.calls = error, fails, []

    def __call__(self, data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        self.calls.append(len(data))
        if self.fails([bytes(t.numpy()) for t in data]):
            raise self.error
        return decode_jpegs_torchvision(data, device)


@pytest.fixture(scope="module")
def val_photos(photos):
    """The photos with augment "val", their first 8 samples (5 JPEG, 3 PNG) packed as a worker packs them."""
    ds = fastdata.dataset(photos[0], "val", image_size=32)
    return ds, pack_encoded(ds.pipeline, [ds.encoded(i) for i in range(8)], 0)


def device_decoder(fail: FailingDecoder | None = None, **options) -> DeviceDecoder:
    return DeviceDecoder("cpu", 32, "photos", **({"decode_jpegs": fail} if fail else {}), **options)


def device_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "device decoder" in str(w.message)]


def test_a_stream_the_device_fails_on_but_the_cpu_decodes_is_a_device_error(val_photos):
    _, packed = val_photos
    jpegs = np.flatnonzero(~packed.worker_decoded.numpy()).tolist()
    bad = bytes(packed.data[packed.offsets[jpegs[1]]:packed.offsets[jpegs[1] + 1]].numpy())
    fail = FailingDecoder(RuntimeError("nvjpeg status 7: NVJPEG_STATUS_EXECUTION_FAILED"), lambda s: bad in s)
    decoder = device_decoder(fail)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        images, labels, skipped = decoder(packed)
        assert len(device_warnings(record)) == 1
        message = device_warnings(record)[0]
        assert "NVJPEG_STATUS_EXECUTION_FAILED" in message and packed.keys[jpegs[1]] in message
        assert "decoded on the CPU in the main process" in message
        decoder(packed)  # the same failure again: counted, not warned again
        assert len(device_warnings(record)) == 1
    assert decoder.errors == 2 and decoder.fallbacks == 2 * 3 and skipped == []
    assert fail.calls == [5, 1, 1, 1, 1, 1] * 2  # the batched call, then each JPEG alone to find the culprit
    healthy, healthy_labels, _ = device_decoder()(packed)
    assert torch.equal(labels, healthy_labels)
    # every other sample decoded on the device as usual; the culprit on the CPU (libjpeg-turbo both: alike)
    others = [i for i in range(8) if i != jpegs[1]]
    assert torch.equal(images[others], healthy[others])
    assert (images[jpegs[1]].int() - healthy[jpegs[1]].int()).abs().float().mean() < 1.0


def test_a_batched_call_that_fails_while_every_sample_decodes_alone_is_one_device_error(val_photos):
    _, packed = val_photos
    fail = FailingDecoder(RuntimeError("nvjpeg status 6"), lambda streams: len(streams) > 1)
    decoder = device_decoder(fail)
    with pytest.warns(RuntimeWarning, match="failed on the batched call on the 5 JPEGs of a batch .* one at a time"):
        images, _, _ = decoder(packed)
    assert decoder.errors == 1 and fail.calls == [5, 1, 1, 1, 1, 1]
    assert torch.equal(images, device_decoder()(packed)[0])  # all decoded on the device, one at a time


def test_device_errors_in_consecutive_batches_raise(val_photos):
    ds, packed = val_photos
    broken = [True]
    fail = FailingDecoder(RuntimeError("CUDA error: an illegal memory access was encountered"),
                          lambda streams: broken[0])
    decoder = device_decoder(fail)
    assert MAX_CONSECUTIVE_DEVICE_ERRORS == decoder.max_consecutive_errors == 3
    with pytest.warns(RuntimeWarning, match="illegal memory access"):
        decoder(packed)
    decoder(packed)
    assert decoder.errors == 2 * 5 and decoder.fallbacks == 2 * 3
    broken[0] = False
    decoder(packed)  # a batch without errors starts the count again
    broken[0] = True
    decoder(packed)
    decoder(packed)
    last = pack_encoded(ds.pipeline, [ds.encoded(i) for i in range(8, 16)], 0)
    with pytest.raises(DeviceDecodeError, match="3 batches in a row") as caught:
        decoder(last)
    assert last.keys[0] in str(caught.value) and "illegal memory access" in str(caught.value)
    assert "decode='worker'" in str(caught.value)


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("nvjpeg: out of memory")])
def test_out_of_memory_raises_naming_the_batch(val_photos, error):
    _, packed = val_photos
    for on_error in ("raise", "skip"):
        with pytest.raises(DeviceDecodeError, match="ran out of memory") as caught:
            device_decoder(FailingDecoder(error), on_error=on_error)(packed)
        assert packed.keys[0] in str(caught.value) and "the 5 JPEGs of a batch" in str(caught.value)
        assert "photos" in str(caught.value) and "batch_size" in str(caught.value)


def test_a_corrupt_stream_with_an_intact_header_follows_on_error_and_is_no_device_error(val_photos):
    """The worker ships it (its frame header is fine); the device decoder rejects it and so does the CPU:
    corrupt, not a device error."""
    ds, _ = val_photos
    samples = [ds.encoded(i) for i in range(8)]
    victim = next(s for s in samples if s.codec == 0)
    victim.data = victim.data[:victim.data.index(b"\xff\xda") + 20]  # cut inside the scan
    packed = pack_encoded(ds.pipeline, samples, 0)
    assert not packed.worker_decoded[samples.index(victim)]
    with pytest.raises(CorruptSampleError, match=victim.key):
        device_decoder()(packed)
    decoder = device_decoder(on_error="skip")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        images, labels, skipped = decoder(packed)
    assert [key for key, _ in skipped] == [victim.key] and len(images) == len(labels) == 7
    assert decoder.errors == 0 and device_warnings(record) == []


def test_device_errors_through_the_loader(photos):
    """The loader counts, warns once and stops with DeviceDecodeError (not a WorkerError) on the third batch."""
    loader = fastdata.loader(photos[0], batch_size=8, image_size=32, num_workers=2, shuffle=False,
                             decode="device", device="cpu")
    loader._device_decoder.decode_jpegs = FailingDecoder(RuntimeError("nvjpeg status 5"))
    jpegs, others = jpeg_and_other_rows(photos[0])
    seen = 0
    with pytest.warns(RuntimeWarning, match="nvjpeg status 5"), pytest.raises(DeviceDecodeError, match="in a row"):
        for _, labels in loader:
            seen += len(labels)
    assert seen == 16  # two batches, then the third raised (its device errors counted too)
    assert loader.device_errors == len(jpegs) and loader.device_fallbacks == sum(i < 16 for i in others)


def test_device_path_options_are_checked(photos):
    import albumentations as A

    with pytest.raises(ConfigError, match="decode='device' needs"):
        fastdata.loader(photos[0], augment=A.HorizontalFlip(), decode="device", device="cpu")
    with pytest.raises(ConfigError, match="decode must be"):
        fastdata.loader(photos[0], decode="gpu")
    with pytest.raises(ConfigError, match="pass device="):
        fastdata.loader(photos[0], channels_last=True)
    assert fastdata.loader(photos[0], device="cpu").decode == "worker"  # "auto" picks the device path for CUDA


def test_device_path_with_worker_processes(photos):
    loader = fastdata.loader(photos[0], batch_size=8, image_size=32, num_workers=2, decode="device", device="cpu")
    assert sum(len(labels) for _, labels in loader) == 24
    assert sum(len(labels) for _, labels in loader) == 24  # second epoch, persistent workers


@pytest.mark.cuda
def test_cuda_decode_matches_cpu_decode(photos):
    cpu = batches(photos[0], "device", device="cpu", shuffle=False)
    loader = fastdata.loader(photos[0], decode="device", device="cuda", batch_size=8, image_size=224, num_workers=0,
                             seed=3, shuffle=False)
    gpu = list(loader)
    for (ci, cl), (gi, gl) in zip(cpu, gpu, strict=True):
        assert gi.device.type == "cuda" and torch.equal(cl, gl.cpu())
        assert (ci.int() - gi.cpu().int()).abs().float().mean() < 2.0
    _, others = jpeg_and_other_rows(photos[0])
    assert loader.device_fallbacks == len(others) > 0 and loader.device_errors == 0  # nvjpeg took every JPEG


@pytest.mark.cuda
def test_cuda_auto_picks_the_device_path_and_overlaps(photos):
    loader = fastdata.loader(photos[0], batch_size=8, image_size=64, num_workers=2, device="cuda",
                             dtype=torch.bfloat16, channels_last=True)
    assert loader.decode == "device"
    for images, labels in loader:
        assert images.is_cuda and images.dtype == torch.bfloat16 and labels.is_cuda
        assert images.is_contiguous(memory_format=torch.channels_last)
    assert loader.device_fallbacks == len(jpeg_and_other_rows(photos[0])[1]) and loader.device_errors == 0


@pytest.mark.cuda
def test_cuda_out_of_memory_raises_naming_the_batch(val_photos):
    def out_of_memory(data, device):
        torch.empty(1 << 50, dtype=torch.uint8, device=device)  # a real CUDA out-of-memory error
        return decode_jpegs_torchvision(data, device)

    _, packed = val_photos
    with pytest.raises(DeviceDecodeError, match="ran out of memory") as caught:
        DeviceDecoder("cuda", 32, "photos", decode_jpegs=out_of_memory)(packed)
    assert packed.keys[0] in str(caught.value)
