"""jpeg_region: the region decoder equals a whole decode cropped, bit for bit, at every scale it uses; it refuses bad
input with ValueError, and a JPEG whose own header says more pixels than the limit before decoding; the pipeline's
output is the same with and without it; and its pixels match a full-size decode + crop + antialiased resize within
interpolation tolerance. Both decode paths refuse a dataset whose stored sizes lie."""

from __future__ import annotations

import io
import shutil
import struct
import threading
from pathlib import Path

import lmdb
import numpy as np
import pytest
from builders.images import SOLID_COUNT, with_size
from PIL import Image

import fastdata
from fastdata.errors import CorruptSampleError
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.augment import RandomResizedCropFlip, ResizeCenterCrop, apply_crop, crop_resize_flip
from fastdata.image.batch import EncodedSample
from fastdata.image.decode import decode_rgb
from fastdata.image.geometry import CropParams, reduce_factor
from fastdata.image.jpeg.region import (
    Region,
    box_in_region,
    plan_region,
    scaled_size,
)
from fastdata.image.pipeline import SamplePipeline


def photo_like(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Smooth shading plus texture at several frequencies and a few hard edges: what photos have."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for c in range(3):
        fx, fy = rng.uniform(0.01, 0.2, 2)
        value = 128 + 60 * np.sin(x * fx + c) * np.cos(y * fy) + 40 * np.sin((x + 2 * y) * 0.03 * (c + 1))
        value += (x > width * rng.uniform(0.2, 0.8)) * 30 - (y > height * rng.uniform(0.2, 0.8)) * 30
        channels.append(value + rng.normal(0, 2, value.shape))
    return np.clip(np.stack(channels, 2), 0, 255).astype(np.uint8)


def jpeg(array: np.ndarray, **options) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, "JPEG", **options)
    return out.getvalue()


KINDS = {
    "420": dict(quality=90),
    "444": dict(quality=90, subsampling=0),
    "422": dict(quality=85, subsampling=1),
    "progressive": dict(quality=90, progressive=True),
    "restart-markers": dict(quality=90, restart_marker_rows=1),
}


def image_bytes(kind: str, width: int = 233, height: int = 171) -> bytes:
    array = photo_like(width, height, seed=len(kind))
    if kind == "gray":
        return jpeg(array[:, :, 1], quality=90)
    return jpeg(array, **KINDS[kind])


@pytest.mark.parametrize("kind", [*KINDS, "gray"])
@pytest.mark.parametrize("scale_num", [8, 4, 2, 1])
def test_region_equals_whole_decode_cropped(decoder, kind, scale_num):
    data = image_bytes(kind)
    whole = decode_rgb(data, CODEC_CV_JPEG, reduce=8 // scale_num)  # OpenCV, pinned to Pillow by test_decode
    width, height = scaled_size(233, scale_num), scaled_size(171, scale_num)
    assert whole.shape == (height, width, 3)
    assert decoder.header(data, scale_num)[:2] == (width, height)
    rng = np.random.default_rng(scale_num)
    boxes = [(0, 0, width, height), (0, 0, 1, 1), (width - 1, height - 1, width, height)]
    boxes += [(16 * (width // 32), 8, width, height - 3)]  # left edge on an iMCU boundary
    for _ in range(25):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        boxes.append((x0, y0, int(rng.integers(x0 + 1, width + 1)), int(rng.integers(y0 + 1, height + 1))))
    for x0, y0, x1, y1 in boxes:
        got = decoder.decode(data, Region(scale_num, x0, y0, x1 - x0, y1 - y0))
        assert np.array_equal(got, whole[y0:y1, x0:x1]), (kind, scale_num, (x0, y0, x1, y1))
        bgr = decoder.decode(data, Region(scale_num, x0, y0, x1 - x0, y1 - y0), bgr=True)
        assert np.array_equal(bgr, got[:, :, ::-1])


def test_decode_into_a_given_buffer_and_from_memoryview(decoder):
    data = image_bytes("420")
    out = np.zeros((40, 50, 3), np.uint8)
    got = decoder.decode(memoryview(data), Region(8, 10, 20, 50, 40), out=out)
    assert got is out
    assert np.array_equal(out, decode_rgb(data, CODEC_CV_JPEG)[20:60, 10:60])


@pytest.mark.parametrize(("data", "message"), [
    (b"", "Empty input"),
    (b"not a jpeg at all", "Not a JPEG"),
    (b"\xff\xd8\xff\xe0" + b"\x00" * 40, "JPEG"),
])
def test_garbage_raises_value_error(decoder, data, message):
    with pytest.raises(ValueError, match=message):
        decoder.decode(data, Region(8, 0, 0, 1, 1))


def test_truncated_jpeg_is_an_error_not_grey_pixels(decoder):
    data = image_bytes("420")
    with pytest.raises(ValueError, match="Premature end"):
        decoder.decode(data[: len(data) // 2], Region(8, 0, 0, 233, 171))


def test_region_outside_the_image_or_bad_buffer_is_refused(decoder):
    data = image_bytes("420")
    with pytest.raises(ValueError, match="outside"):
        decoder.decode(data, Region(8, 200, 0, 40, 10))
    with pytest.raises(ValueError, match="outside"):
        decoder.decode(data, Region(4, 0, 0, 118, 10))  # 233 at 1/2 is 117 wide
    with pytest.raises(ValueError, match="C-contiguous"):
        decoder.decode(data, Region(8, 0, 0, 10, 10), out=np.zeros((10, 10, 4), np.uint8))
    with pytest.raises(ValueError, match="C-contiguous"):
        decoder.decode(data, Region(8, 0, 0, 10, 10), out=np.zeros((10, 20, 3), np.uint8)[:, ::2])
    with pytest.raises(ValueError, match="scale_num"):
        decoder.decode(data, Region(9, 0, 0, 10, 10))


def test_threads_decode_concurrently_with_identical_results(decoder):
    datas = [image_bytes(kind) for kind in KINDS]
    expected = [decoder.decode(d, Region(8, 5, 7, 200, 150)) for d in datas]
    failures: list[str] = []

    def work() -> None:
        for _ in range(20):
            for data, want in zip(datas, expected, strict=True):
                if not np.array_equal(decoder.decode(data, Region(8, 5, 7, 200, 150)), want):
                    failures.append("mismatch")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


@pytest.mark.parametrize(("width", "height"), [(233, 171), (640, 480), (1000, 300), (97, 401), (3000, 2000)])
@pytest.mark.parametrize("preset", [RandomResizedCropFlip(64), ResizeCenterCrop(64)], ids=["train", "val"])
def test_plan_region_covers_the_crop_at_the_chosen_scale(width, height, preset):
    rng = np.random.default_rng(width)
    for _ in range(300):
        params = preset.params(width, height, rng)
        region = plan_region(width, height, params, 64)
        assert region.scale_num == 8 // reduce_factor(params, 64)
        scaled_w, scaled_h = scaled_size(width, region.scale_num), scaled_size(height, region.scale_num)
        assert 0 <= region.left < region.left + region.width <= scaled_w
        assert 0 <= region.top < region.top + region.height <= scaled_h
        left, top, box_w, box_h = box_in_region(params, region)
        # the region holds the whole crop box, and at most one partial pixel more on each side
        assert -1e-9 <= left < 1 and -1e-9 <= top < 1
        assert left + box_w <= region.width + 1e-9 and region.width - (left + box_w) < 1
        assert top + box_h <= region.height + 1e-9 and region.height - (top + box_h) < 1
        if region.scale_num < 8:  # never decoded smaller than the output
            assert min(box_w, box_h) >= 64


def _sample(data: bytes, width: int, height: int, index: int) -> EncodedSample:
    return EncodedSample(key=f"img{index}", data=data, label=index % 3, width=width, height=height,
                         codec=CODEC_CV_JPEG, position=(index,))


@pytest.mark.parametrize("augment", ["train", "val"])
def test_pipeline_output_is_the_same_with_and_without_region_decoding(decoder, augment):
    """Region decoding changes only which pixels are decoded, not the result: the same crops as a whole-image
    decode at the same DCT scale, up to the warp's fixed-point rounding (the box sits at another integer offset)."""
    samples = [_sample(image_bytes(kind, 233 + 40 * i, 171 + 17 * i), 233 + 40 * i, 171 + 17 * i, i)
               for i, kind in enumerate([*KINDS, "gray"])]
    region = SamplePipeline(augment, 64, seed=3, source="test")
    whole = SamplePipeline(augment, 64, seed=3, source="test")
    whole.region_decode = False
    assert region.bgr is False and whole.bgr is True
    for epoch in range(4):
        got = region.batch(samples, epoch, "raise")
        want = whole.batch(samples, epoch, "raise")
        assert got.images.shape == want.images.shape == (len(samples), 3, 64, 64)
        diff = (got.images.int() - want.images.int()).abs()
        assert diff.max() <= 2 and diff.float().mean() < 0.1, (epoch, diff.max(), diff.float().mean())
        assert got.labels.tolist() == want.labels.tolist()


@pytest.mark.parametrize("preset", [RandomResizedCropFlip(224), ResizeCenterCrop(224)], ids=["train", "val"])
def test_pixels_match_full_decode_crop_and_antialiased_resize(decoder, preset):
    """The reduced-scale region decode + bilinear resize against the reference: the full-size decode, the exact
    (fractional) crop box, and an antialiased resize (torchvision's resized_crop on the full-size image)."""
    import torch
    from torchvision.transforms.v2 import functional as F

    width, height = 700, 530
    data = jpeg(photo_like(width, height, seed=7), quality=92)
    full = torch.from_numpy(decode_rgb(data, CODEC_CV_JPEG).copy()).permute(2, 0, 1)
    rng = np.random.default_rng(11)
    scales_seen = set()
    for _ in range(40):
        params = preset.params(width, height, rng)
        region = plan_region(width, height, params, 224)
        scales_seen.add(region.scale_num)
        out = np.empty((224, 224, 3), np.uint8)
        crop_resize_flip(decoder.decode(data, region), box_in_region(params, region), out, params.flip)
        reference = F.resized_crop(full, round(params.top), round(params.left), round(params.height),
                                   round(params.width), [224, 224], antialias=True)
        if params.flip:
            reference = reference.flip(-1)
        diff = np.abs(out.astype(np.int16) - reference.permute(1, 2, 0).numpy().astype(np.int16))
        assert diff.mean() < 1.5, (params, region, diff.mean())  # a crop off by 2 source pixels: ~12
        assert np.percentile(diff, 99) <= 6, (params, region, np.percentile(diff, 99))
    if isinstance(preset, RandomResizedCropFlip):
        assert {8, 4} <= scales_seen  # both full-scale and reduced-scale regions were checked


def test_apply_crop_and_region_agree_on_a_fractional_box(decoder):
    data = image_bytes("444", 640, 480)
    params = CropParams(100.5, 50.25, 300.0, 280.0, flip=True)
    region = plan_region(640, 480, params, 64)
    assert region.scale_num == 2  # 1/4 scale: 75 x 70 pixels left for a 64 x 64 output
    via_region = np.empty((64, 64, 3), np.uint8)
    crop_resize_flip(decoder.decode(data, region), box_in_region(params, region), via_region, True)
    via_whole = np.empty((64, 64, 3), np.uint8)
    apply_crop(decode_rgb(data, CODEC_CV_JPEG, 4), params, via_whole, scale=4)
    diff = np.abs(via_region.astype(int) - via_whole)
    assert diff.max() <= 2 and diff.mean() < 0.1


def test_workers_fork_cleanly_after_decoding_in_the_main_process(tmp_path):
    """Decoding in the main process (num_workers=0, or dataset[i]) must not leave OpenCV's thread pool in a
    state that deadlocks forked workers (it did: workers hung in cv2.setNumThreads, every time, here)."""
    import subprocess
    import sys
    import textwrap

    import fastdata
    from fastdata.tools.sample import make_sample_imagefolder

    src = make_sample_imagefolder(tmp_path / "src", images=24, classes=3, workers=1)
    fastdata.convert_imagefolder(src, tmp_path / "p.lmdb", fastdata.ImageFolderOptions(workers=1, progress=False))
    script = textwrap.dedent(f"""
        import fastdata
        path = {str(tmp_path / "p.lmdb")!r}
        for _ in fastdata.loader(path, batch_size=8, num_workers=0, image_size=224):
            pass
        for _ in range(2):
            batches = list(fastdata.loader(path, batch_size=8, num_workers=2, image_size=32,
                                           multiprocessing_context="fork"))
            assert sum(len(labels) for _, labels in batches) == 24
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- pixel limit


def test_the_region_decoder_refuses_a_header_over_the_pixel_limit_before_decoding(decoder):
    data = image_bytes("420")
    assert decoder.decode(data, Region(8, 0, 0, 10, 10), max_pixels=233 * 171).shape == (10, 10, 3)
    with pytest.raises(ValueError, match=r"^refused: the JPEG header says 233x171 pixels, over the limit of 39,842$"):
        decoder.decode(data, Region(8, 0, 0, 10, 10), max_pixels=233 * 171 - 1)
    tampered = with_size(data, 20_000, 20_000)  # believed, 1.2 GB of pixels; the stored size says 233 x 171
    with pytest.raises(ValueError, match=r"^refused: the JPEG header says 20000x20000 pixels, over the limit of "
                                         r"89,478,485$"):
        decoder.decode(tampered, Region(8, 0, 0, 233, 171))


def tampered_copy(solid_lmdb, tmp_path, payload_for) -> tuple[Path, str, tuple[int, int]]:
    """A copy of the solid LMDB dataset whose first JPEG record holds `payload_for(its bytes)`, its stored
    metadata (width, height, codec) unchanged; returns (path, the record's key, its stored width and height)."""
    copy = tmp_path / "tampered.lmdb"
    shutil.copytree(solid_lmdb, copy)
    env = lmdb.open(str(copy), max_dbs=5, subdir=True, map_size=1 << 26)
    try:
        images, keys, meta = (env.open_db(name, create=False) for name in (b"images", b"keys", b"meta"))
        with env.begin(write=True) as txn:
            widths = np.frombuffer(txn.get(b"widths", db=meta), "<i4")
            heights = np.frombuffer(txn.get(b"heights", db=meta), "<i4")
            index = next(i for i in range(len(widths))
                         if bytes(txn.get(struct.pack(">Q", i), db=keys)).endswith(b".jpg"))
            key = bytes(txn.get(struct.pack(">Q", index), db=keys)).decode()
            original = bytes(txn.get(struct.pack(">Q", index), db=images))
            txn.put(struct.pack(">Q", index), payload_for(original), db=images)
            stored = int(widths[index]), int(heights[index])
    finally:
        env.close()
    (copy / "lock.mdb").unlink(missing_ok=True)
    return copy, key, stored


def _loader(path, on_error, region, max_pixels=None):
    device = dict(device="cpu", decode="device") if region == "device" else {}
    loader = fastdata.loader(path, batch_size=8, image_size=16, num_workers=0, on_error=on_error, **device)
    loader.dataset.pipeline.region_decode = region is True
    if max_pixels is not None:
        loader.dataset.pipeline.max_pixels = max_pixels
    return loader


@pytest.mark.parametrize("region", [True, False, "device"], ids=["region", "opencv", "device"])
def test_a_dataset_whose_stored_size_lies_is_refused_from_the_jpeg_header(decoder, solid_lmdb, tmp_path, region):
    """Stored metadata says the record's own small size; its bytes say 20000 x 20000 (default limit)."""
    path, key, _ = tampered_copy(solid_lmdb, tmp_path, lambda data: with_size(data, 20_000, 20_000))
    with pytest.raises(CorruptSampleError, match=rf"sample {key!r}: refused: the JPEG header says 20000x20000"):
        list(_loader(path, "raise", region))
    loader = _loader(path, "skip", region)
    assert sum(len(labels) for _, labels in loader) == SOLID_COUNT - 1
    assert [k for k, _ in loader.skipped] == [key]
    assert "header says 20000x20000 pixels" in loader.skipped[0][1]


@pytest.mark.parametrize("region", [True, False, "device"], ids=["region", "opencv", "device"])
def test_a_real_jpeg_larger_than_its_stored_size_is_refused_over_the_limit(decoder, solid_lmdb, tmp_path, region):
    """A real, decodable JPEG of 150 x 150 where the stored size says the original's (at most 69 x 69): with the
    limit between the two, only the header can tell (unchecked, the region decoder decodes it without a word)."""
    path, key, stored = tampered_copy(solid_lmdb, tmp_path, lambda _: jpeg(photo_like(150, 150), quality=90))
    assert stored[0] * stored[1] <= 69 * 69 < 150 * 150
    with pytest.raises(CorruptSampleError, match=rf"sample {key!r}: refused: the JPEG header says 150x150 pixels, "
                                                 r"over the limit of 4,761"):
        list(_loader(path, "raise", region, max_pixels=69 * 69))
    loader = _loader(path, "skip", region, max_pixels=69 * 69)
    assert sum(len(labels) for _, labels in loader) == SOLID_COUNT - 1
    assert [k for k, _ in loader.skipped] == [key]
    assert len(list(_loader(path, "raise", region))) == -(-SOLID_COUNT // 8)  # under the default limit: decoded
