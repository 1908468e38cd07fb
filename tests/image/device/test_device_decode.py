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
from fastdata.image.device.decoders import TorchvisionDecoder
from fastdata.image.device.failures import MAX_CONSECUTIVE_DEVICE_ERRORS
from fastdata.image.device.ship import pack_encoded
from fastdata.image.device.stage import DeviceStage
from fastdata.image.output import IMAGENET_MEAN, IMAGENET_STD
from fastdata.image.pipeline import PipelineConfig


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
        # decode + antialiased batched resize): a mirrored or shifted crop would differ by tens of levels on average
        assert diff.mean() < 2.0
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
    out = batches(photos[0], "device", device="cpu", shuffle=False,
                  output=fastdata.OutputOptions(dtype=dtype, channels_last=True))[0][0]
    assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    expected = (raw.float() / 255 - mean) / std
    assert torch.allclose(out.float(), expected, atol=0.05 if dtype != torch.float32 else 1e-4)


def test_worker_path_with_a_device_normalises_there_too(photos):
    raw = batches(photos[0], "worker", shuffle=False)[0][0]
    out = batches(photos[0], "worker", device="cpu", shuffle=False,
                  output=fastdata.OutputOptions(dtype=torch.float32))[0][0]
    expected = (raw.float() - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255) / (
        torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255)
    assert torch.allclose(out, expected, atol=1e-4)


def test_images_the_device_decoder_cannot_take_are_decoded_in_the_workers(tricky_lmdb):
    """PNG (RGB, L, P, RGBA, LA), BMP and CMYK JPEGs are decoded in the worker processes, pixel for pixel as
    on the worker path, and counted as fallbacks; the main process decodes nothing on the CPU (no device errors)."""
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


def test_progressive_jpegs_go_to_the_workers_when_asked(tricky_lmdb):
    """DeviceDecodeOptions(progressive="workers"): the progressive JPEGs are decoded in the workers, pixel for pixel as
    on the worker path, so that the device decoder gets baseline files only; the rest of the batch is as before."""
    from fastdata.image.jpeg.header import progressive

    ds = fastdata.dataset(tricky_lmdb)
    rows = [i for i in range(len(ds)) if progressive(ds.encoded(i).data)]
    assert rows  # the tricky tree has one
    options = dict(batch_size=len(ds), augment="val", image_size=16, shuffle=False, num_workers=0)
    [(worker, _)] = list(fastdata.loader(tricky_lmdb, **options))
    [(device, _)] = list(fastdata.loader(tricky_lmdb, decode="device", device="cpu", **options))
    routed = fastdata.loader(tricky_lmdb, decode=fastdata.DeviceDecodeOptions(progressive="workers"), device="cpu",
                             **options)
    [(workers, _)] = list(routed)
    routed.close()
    _, others = jpeg_and_other_rows(tricky_lmdb)
    pipeline = fastdata.dataset(tricky_lmdb, "val", image_size=16).pipeline
    pipeline.configure(PipelineConfig(ship_encoded=True, ship_progressive=False))  # as the loader sets it
    packed = pack_encoded(pipeline, [ds.encoded(i) for i in range(len(ds))], 0)
    assert np.flatnonzero(packed.worker_decoded.numpy()).tolist() == sorted([*others, *rows])
    for row in range(len(ds)):
        if row in rows:
            assert torch.equal(workers[row], worker[row]) and not torch.equal(device[row], worker[row]), row
        else:
            assert torch.equal(workers[row], device[row]), row
    with pytest.raises(ConfigError, match=r"progressive=.*must be one of"):
        fastdata.DeviceDecodeOptions(progressive="cpu")


def corrupt_record(path, index: int) -> str:
    env = lmdb.open(str(path), max_dbs=5, map_size=64 << 20)
    images = env.open_db(b"images")
    with env.begin(write=True) as txn:
        txn.put(struct.pack(">Q", index), b"\xff\xd8\xff not a jpeg at all", db=images)
    env.close()
    (path / "lock.mdb").unlink(missing_ok=True)
    return fastdata.dataset(path).reader.key(index)


def test_the_workers_keep_progressive_jpegs_from_a_decoder_of_the_jpeg_engines_alone(tricky_lmdb):
    """DeviceDecodeOptions(backends=("hardware",)): the engines refuse progressive files, so the workers keep them
    (decoded there, as with progressive="workers") rather than ship them to be refused and decoded in the main
    process."""
    from fastdata.image.jpeg.header import progressive

    loader = fastdata.loader(tricky_lmdb, decode=fastdata.DeviceDecodeOptions(backends=("hardware",)), device="cpu",
                             batch_size=9, augment="val", image_size=16, num_workers=0)
    assert fastdata.loader(tricky_lmdb, decode="device", device="cpu").dataset.pipeline.config.ship_progressive is True
    ds = loader.dataset
    samples = [ds.encoded(i) for i in range(len(ds))]
    rows = [i for i, sample in enumerate(samples) if progressive(sample.data)]
    packed = pack_encoded(ds.pipeline, samples, 0)  # as the loader's workers pack them
    assert rows and packed.worker_decoded[rows].all()
    assert sum(len(labels) for _, labels in loader) == len(ds) and loader.device_rejected == 0
    loader.close_feeder()


def test_refused_jpegs_are_decoded_on_the_cpu_pool_never_on_the_resize_thread(photos, monkeypatch):
    """Through the feeder: the bytes the device decoder refuses are decoded on the CPU threads beside it, so the
    resize thread (which feeds the training step) never spends a CPU decode's milliseconds."""
    import threading

    import fastdata.image.device.stage as stage_module

    threads = []
    real = stage_module.decode_rgb

    def decode_rgb(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(stage_module, "decode_rgb", decode_rgb)
    loader = fastdata.loader(photos[0], batch_size=8, image_size=32, num_workers=0, decode="device", device="cpu")
    jpegs, _ = jpeg_and_other_rows(photos[0])
    refused = {loader.dataset.encoded(i).data for i in jpegs[:3]}
    loader._device.stage.decoder = FailingDecoder(rejects=lambda stream: stream in refused)
    with pytest.warns(RuntimeWarning, match="could not decode sample"):
        assert sum(len(labels) for _, labels in loader) == len(loader.dataset)
    loader.close_feeder()
    assert threads and all(name.startswith("fastdata-device-cpu") for name in threads), threads
    assert len(threads) >= loader.device_rejected >= len(refused) and loader.device_errors == 0


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
    with pytest.raises(CorruptSampleError, match="refused"):
        device_stage(size=32, max_pixels=100)(packed)
    made = device_stage(size=32, max_pixels=100, on_error="skip")(packed)
    assert len(made.images) == len(made.labels) == 0 and len(made.skipped) == 3


def test_a_decoded_image_smaller_than_its_stored_size_has_its_crop_scaled_to_it(photos):
    """The stage trusts the decoded pixels over the stored size: where a record says twice the size its JPEG
    decodes to (boxes drawn in that frame), each crop is scaled onto the decoded pixels and the batch is the one
    the true sizes give."""
    from dataclasses import replace

    ds = fastdata.dataset(photos[0], "train", image_size=32)
    true = pack_encoded(ds.pipeline, [ds.encoded(i) for i in jpeg_and_other_rows(photos[0])[0][:4]], 0)
    halved = np.flatnonzero(~true.worker_decoded.numpy())[::2]  # every other JPEG: stored size said twice
    sizes, boxes = true.sizes.clone(), true.boxes.clone()
    sizes[halved] *= 2
    boxes[halved] *= 2  # powers of two: the scaled boxes are exactly the true ones
    claimed = replace(true, sizes=sizes, boxes=boxes)
    expected, got = device_stage()(true), device_stage()(claimed)
    assert len(halved) and torch.equal(got.labels, expected.labels) and torch.equal(got.images, expected.images)
    stage = device_stage(regions=False)  # without a decoder that takes regions the same holds
    assert torch.equal(stage(claimed).images, expected.images)


# ----------------------------------------------------------------------------------------------------
# decoder failures: the stage given a decoder (the BatchDecoder protocol) that fails on purpose


class FailingDecoder(TorchvisionDecoder):
    """torchvision's decoder on the CPU, except that it raises `error` on the calls `fails(streams)` picks, or
    returns None for the streams `rejects(stream)` picks; records the number of streams of every call."""

    def __init__(self, error: Exception | None = None, fails=lambda streams: True, rejects=lambda stream: False):
        super().__init__(torch.device("cpu"))
        self.error, self.fails, self.rejects, self.calls = error, fails, rejects, []

    def decode(self, payloads, regions=None):
        self.calls.append(len(payloads))
        streams = [bytes(p) for p in payloads]
        if self.error is not None and self.fails(streams):
            raise self.error
        decoded = super().decode(payloads, regions)
        return [None if self.rejects(s) else image for s, image in zip(streams, decoded, strict=True)]


@pytest.fixture(scope="module")
def val_photos(photos):
    """The photos with augment "val", their first 8 samples (5 JPEG, 3 PNG) packed as a worker packs them."""
    ds = fastdata.dataset(photos[0], "val", image_size=32)
    return ds, pack_encoded(ds.pipeline, [ds.encoded(i) for i in range(8)], 0)


def device_stage(fail: TorchvisionDecoder | None = None, size: int = 32, **options) -> DeviceStage:
    return DeviceStage("cpu", size, "photos", decoder=fail or TorchvisionDecoder(torch.device("cpu")), **options)


def device_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "decode" in str(w.message) and "photos" in str(w.message)]


def test_bytes_the_device_decoder_rejects_are_decoded_on_the_cpu_and_are_no_device_error(val_photos):
    """A decoder that returns nothing for bytes the CPU decodes: those samples are decoded on the CPU (the same
    crop), counted as rejected and said once; nothing is a device error, so nothing stops the run."""
    _, packed = val_photos
    jpegs = np.flatnonzero(~packed.worker_decoded.numpy()).tolist()
    bad = bytes(packed.data[packed.offsets[jpegs[1]]:packed.offsets[jpegs[1] + 1]].numpy())
    stage = device_stage(FailingDecoder(rejects=lambda stream: stream == bad))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        made = stage(packed)
        for _ in range(MAX_CONSECUTIVE_DEVICE_ERRORS + 1):
            stage(packed)  # the same bytes again: counted, not warned again, never raised
    messages = device_warnings(record)
    assert len(messages) == 1 and packed.keys[jpegs[1]] in messages[0] and "on the CPU" in messages[0]
    assert stage.policy.rejected == MAX_CONSECUTIVE_DEVICE_ERRORS + 2 and stage.policy.errors == 0
    healthy = device_stage()(packed)
    assert made.skipped == [] and torch.equal(made.labels, healthy.labels)
    assert torch.equal(made.images, healthy.images)  # libjpeg both ways, the same batched resize: the same pixels


def test_a_batched_call_that_fails_while_every_sample_decodes_alone_is_one_device_error(val_photos):
    _, packed = val_photos
    fail = FailingDecoder(RuntimeError("nvjpeg status 6"), lambda streams: len(streams) > 1)
    stage = device_stage(fail)
    with pytest.warns(RuntimeWarning, match="failed: the batched call on the 5 JPEGs of a batch raised although "
                                            "each then decoded alone.*one at a time"):
        made = stage(packed)
    assert stage.policy.errors == 1 and fail.calls == [5, 1, 1, 1, 1, 1]
    assert torch.equal(made.images, device_stage()(packed).images)  # all decoded on the device, one at a time


def test_a_failed_call_with_a_stream_no_decoder_takes_is_a_damaged_sample_not_a_device_error(val_photos):
    """The batched call raises because of one stream, which fails alone on the device and on the CPU: that sample
    follows on_error; the others decode; no device error."""
    ds, _ = val_photos
    samples = [ds.encoded(i) for i in range(8)]
    victim = next(s for s in samples if s.codec == 0)
    # a Huffman table with more codes than there are symbols: the frame header and end marker are intact, so the
    # worker ships it to the device; no decoder can decode it
    table = victim.data.index(b"\xff\xc4") + 5
    victim.data = victim.data[:table] + b"\xff" * 16 + victim.data[table + 16:]
    packed = pack_encoded(ds.pipeline, samples, 0)
    assert not packed.worker_decoded[samples.index(victim)]
    with pytest.raises(CorruptSampleError, match=victim.key):
        device_stage()(packed)
    stage = device_stage(on_error="skip")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        made = stage(packed)
    assert [key for key, _ in made.skipped] == [victim.key] and len(made.images) == len(made.labels) == 7
    assert stage.policy.errors == 0 and stage.policy.rejected == 0 and device_warnings(record) == []


def test_a_truncated_jpeg_is_decoded_in_the_worker_and_follows_on_error_there(val_photos):
    """GPU decoders conceal a truncated scan (grey rows) where libjpeg reports it: a file cut short (no end marker
    after its last scan) stays with the worker, whose decode follows on_error as on the worker path."""
    ds, _ = val_photos
    samples = [ds.encoded(i) for i in range(8)]
    victim = next(s for s in samples if s.codec == 0)
    victim.data = victim.data[:victim.data.index(b"\xff\xda") + 200]
    packed = pack_encoded(ds.pipeline, samples, 0, on_error="skip")
    assert [key for key, _ in packed.skipped] == [victim.key] and victim.key not in packed.keys
    with pytest.raises(CorruptSampleError, match=victim.key):
        pack_encoded(ds.pipeline, samples, 0)


def test_device_errors_in_consecutive_batches_raise(val_photos):
    ds, packed = val_photos
    broken = [True]
    fail = FailingDecoder(RuntimeError("CUDA error: an illegal memory access was encountered"),
                          lambda streams: broken[0] and len(streams) > 1)
    stage = device_stage(fail)
    assert stage.policy.max_consecutive_errors == MAX_CONSECUTIVE_DEVICE_ERRORS == 3
    with pytest.warns(RuntimeWarning, match="illegal memory access"):
        stage(packed)
    stage(packed)
    assert stage.policy.errors == 2 and stage.policy.fallbacks == 2 * 3
    broken[0] = False
    stage(packed)  # a batch without errors starts the count again
    broken[0] = True
    stage(packed)
    stage(packed)
    last = pack_encoded(ds.pipeline, [ds.encoded(i) for i in range(8, 16)], 0)
    with pytest.raises(DeviceDecodeError, match="3 batches in a row") as caught:
        stage(last)
    assert last.keys[0] in str(caught.value) and "illegal memory access" in str(caught.value)
    assert "decode='worker'" in str(caught.value)


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("nvjpeg: out of memory")])
def test_out_of_memory_raises_naming_the_batch(val_photos, error):
    _, packed = val_photos
    for on_error in ("raise", "skip"):
        with pytest.raises(DeviceDecodeError, match="ran out of memory") as caught:
            device_stage(FailingDecoder(error), on_error=on_error)(packed)
        assert packed.keys[0] in str(caught.value) and "the 5 JPEGs of a batch" in str(caught.value)
        assert "photos" in str(caught.value) and "batch_size" in str(caught.value)


def test_damaged_jpegs_follow_on_error_through_the_loader_exactly_as_on_the_worker_path(photos, tmp_path):
    """decode="device", device="cpu", on_error="skip" over a dataset with damaged JPEGs (their headers intact)
    skips exactly the samples the worker path skips and never stops with DeviceDecodeError, however many batches
    in a row hold one."""
    import shutil

    path = tmp_path / "damaged.lmdb"
    shutil.copytree(photos[0], path)
    codecs = fastdata.dataset(photos[0]).reader.codecs
    jpegs = np.flatnonzero(codecs == 0).tolist()
    env = lmdb.open(str(path), max_dbs=5, map_size=64 << 20)
    images = env.open_db(b"images")
    with env.begin(write=True) as txn:
        for index in jpegs[::3]:  # a damaged JPEG in (nearly) every batch
            data = txn.get(struct.pack(">Q", index), db=images)
            txn.put(struct.pack(">Q", index), data[:data.index(b"\xff\xda") + 40], db=images)
    env.close()
    (path / "lock.mdb").unlink(missing_ok=True)
    options = dict(batch_size=4, image_size=48, num_workers=0, shuffle=False, on_error="skip")
    worker = fastdata.loader(path, decode="worker", **options)
    device = fastdata.loader(path, decode="device", device="cpu", **options)
    worker_labels = [labels.tolist() for _, labels in worker]
    device_labels = [labels.tolist() for _, labels in device]
    assert device_labels == worker_labels
    assert sorted(k for k, _ in device.skipped) == sorted(k for k, _ in worker.skipped)
    assert len(device.skipped) == len(jpegs[::3])
    assert device.device_errors == 0


def test_device_errors_through_the_loader(photos):
    """The loader counts, warns once and stops with DeviceDecodeError (not a WorkerError) on the third batch."""
    fail = FailingDecoder(RuntimeError("nvjpeg status 5"), lambda streams: len(streams) > 1)
    loader = fastdata.loader(photos[0], batch_size=8, image_size=32, num_workers=2, shuffle=False,
                             decode="device", device="cpu")
    loader._device.stage.decoder = fail  # the feeder makes a decoder only when none is set
    seen = 0
    with pytest.warns(RuntimeWarning, match="nvjpeg status 5"), pytest.raises(DeviceDecodeError, match="in a row"):
        for _, labels in loader:
            seen += len(labels)
    assert seen == 16  # two batches, then the third raised
    assert loader.device_errors == 3


@pytest.mark.parametrize("how", ["raises", "returns nothing"])
def test_a_decoder_that_fails_every_call_is_a_device_error_not_a_silent_cpu_path(val_photos, how):
    """A broken decoder (every call raises, or it decodes nothing of any batch) while the CPU decodes the bytes:
    each batch is a device error, said once, and the third in a row raises DeviceDecodeError; nothing is blamed on
    the bytes (no "rejected" warning). The batches before it are whole (decoded on the CPU)."""
    _, packed = val_photos
    if how == "raises":
        broken = FailingDecoder(RuntimeError("CUDA error: unspecified launch failure"))
    else:
        broken = FailingDecoder(rejects=lambda stream: True)
    stage = device_stage(broken)
    healthy = device_stage()(packed)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(MAX_CONSECUTIVE_DEVICE_ERRORS - 1):
            made = stage(packed)
            assert torch.equal(made.images, healthy.images) and torch.equal(made.labels, healthy.labels)
        with pytest.raises(DeviceDecodeError, match=f"{MAX_CONSECUTIVE_DEVICE_ERRORS} batches in a row"):
            stage(packed)
    messages = device_warnings(record)
    assert len(messages) == 1 and "device errors" in messages[0].lower() and "none of the 5 JPEGs" in messages[0]
    assert stage.policy.errors == MAX_CONSECUTIVE_DEVICE_ERRORS and stage.policy.rejected == 0


def test_a_broken_decoder_stops_the_loader_with_device_decode_error(photos):
    """The same through a loader: a decoder raising on every call stops it at the third batch."""
    loader = fastdata.loader(photos[0], batch_size=8, image_size=32, num_workers=0, shuffle=False,
                             decode="device", device="cpu")
    loader._device.stage.decoder = FailingDecoder(RuntimeError("nvjpeg status 7"))
    seen = 0
    with pytest.warns(RuntimeWarning, match="nvjpeg status 7"), pytest.raises(DeviceDecodeError, match="in a row"):
        for _, labels in loader:
            seen += len(labels)
    assert seen == 16 and loader.device_errors == 3 and loader.device_rejected == 0


def test_device_path_options_are_checked(photos):
    import albumentations as A

    with pytest.raises(ConfigError, match="decode='device' needs"):
        fastdata.loader(photos[0], augment=A.HorizontalFlip(), decode="device", device="cpu")
    with pytest.raises(ConfigError, match="decode must be"):
        fastdata.loader(photos[0], decode="gpu")
    with pytest.raises(ConfigError, match="pass device="):
        fastdata.loader(photos[0], output=fastdata.OutputOptions(channels_last=True))
    assert fastdata.loader(photos[0], device="cpu").decode == "worker"  # "auto" without a measurement: workers


def test_the_device_path_without_a_device_goes_to_the_gpu_or_is_refused_in_one_line(photos, monkeypatch):
    """decode="device" without device=: the GPU where torch sees one; on a machine without one, one ConfigError at
    construction (never the GPU path silently run on the CPU); device="cpu" asks for the CPU explicitly."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"decode='device' without device=: no CUDA GPU here .*device='cpu'") as no:
        fastdata.loader(photos[0], decode="device")
    assert "\n" not in str(no.value)
    assert fastdata.loader(photos[0], decode="device", device="cpu").device == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    loader = fastdata.loader(photos[0], decode="device", num_workers=0)  # made, not iterated: no CUDA call yet
    assert loader.device == torch.device("cuda") and loader.decode == "device"


@pytest.mark.parametrize("decode", ["device", "worker"])
def test_a_cuda_device_that_is_not_there_is_refused_at_construction_naming_what_is(photos, monkeypatch, decode):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match=rf"device='{device}': no CUDA GPU here .*devices available: 'cpu'"):
            fastdata.loader(photos[0], decode=decode, device=device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"device='cuda:2': this machine has 2 CUDA GPUs: cuda:0, cuda:1"):
        fastdata.loader(photos[0], decode=decode, device="cuda:2")


def test_device_path_with_worker_processes(photos):
    loader = fastdata.loader(photos[0], batch_size=8, image_size=32, num_workers=2, decode="device", device="cpu")
    assert sum(len(labels) for _, labels in loader) == 24
    assert sum(len(labels) for _, labels in loader) == 24  # second epoch, persistent workers


