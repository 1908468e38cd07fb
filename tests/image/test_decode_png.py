"""PNG decoding by libspng (pyspng): the pixels of Pillow's `convert("RGB")` and of OpenCV for every PNG kind the
conversion sends to OpenCV's codec, damaged chunks caught before libspng (which pyspng runs without CRC checks)
sees them, and OpenCV's answer wherever libspng is not used."""

from __future__ import annotations

import io
import struct
import sys
import warnings
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

import fastdata.image.decode as decode
from fastdata.formats.records import CODEC_CV_OTHER, codec_for
from fastdata.image.decode import decode_rgb, png_chunks_intact, spng_decode
from fastdata.image.opencv import opencv_decode

H, W = 37, 53


def _photo() -> np.ndarray:
    """Smooth colour with some noise: a photo-like image, where deflate and the filters have work to do."""
    y, x = np.mgrid[0:H, 0:W]
    noise = np.random.default_rng(3).integers(0, 24, (H, W, 3))
    return np.clip(np.dstack([x * 4, y * 6, (x + y) * 3]) + noise, 0, 255).astype(np.uint8)


def _saved(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG", **options)
    return out.getvalue()


def _png(kind: str) -> bytes:
    """A PNG of `kind`, written by Pillow (or by OpenCV's libpng for 16-bit samples, which Pillow does not write)."""
    photo = _photo()
    rgb = Image.fromarray(photo)
    alpha = (np.arange(H * W).reshape(H, W) % 251).astype(np.uint8)
    if kind == "rgb":
        return _saved(rgb)
    if kind == "rgb-trns":
        return _saved(rgb, transparency=(1, 2, 3))
    if kind == "rgba":
        return _saved(Image.fromarray(np.dstack([photo, alpha]), "RGBA"))
    if kind == "la":
        return _saved(Image.fromarray(np.dstack([photo, alpha]), "RGBA").convert("LA"))
    if kind.startswith("l"):  # l8, l4, l2
        return _saved(rgb.convert("L"), bits=int(kind[1:]))
    if kind.startswith("p"):  # p8, p4, p2, p1, and with a transparent entry
        bits = int(kind[1])
        options = {"transparency": 0} if kind.endswith("trns") else {}
        return _saved(rgb.quantize(1 << bits), bits=bits, **options)
    if kind in ("rgb16", "rgba16"):
        wide = photo.astype(np.uint16) * 257 + np.random.default_rng(1).integers(0, 257, photo.shape).astype(np.uint16)
        if kind == "rgba16":
            wide = np.dstack([wide, alpha.astype(np.uint16) * 257])
        ok, data = cv2.imencode(".png", wide)
        assert ok
        return data.tobytes()
    raise AssertionError(kind)


KINDS = ["rgb", "rgb-trns", "rgba", "la", "l8", "l4", "l2", "p8", "p4", "p2", "p1", "p8-trns", "p2-trns", "rgb16",
         "rgba16"]


def _chunks(data: bytes) -> list[tuple[bytes, int, int]]:
    """(type, offset of the chunk's length field, data length) of each chunk."""
    found, at = [], 8
    while at < len(data):
        (length,) = struct.unpack_from(">I", data, at)
        found.append((data[at + 4:at + 8], at, length))
        at += 12 + length
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_libspng_decodes_every_png_kind_opencv_takes_to_pillows_and_opencvs_pixels(kind):
    data = _png(kind)
    with Image.open(io.BytesIO(data)) as im:
        assert codec_for(im.format, im.mode) == CODEC_CV_OTHER, im.mode  # a kind the loader decodes this way
        expected = np.asarray(im.convert("RGB"))
    assert spng_decode(data) is not None  # libspng took it (not OpenCV)
    for bgr in (False, True):
        got = decode_rgb(data, CODEC_CV_OTHER, bgr=bgr)
        assert got.dtype == np.uint8 and got.shape == (H, W, 3)
        assert np.array_equal(got[:, :, ::-1] if bgr else got, expected), (kind, bgr)
        assert np.array_equal(got, opencv_decode(data, 1, bgr)), (kind, bgr)


def test_a_damaged_image_chunk_libspng_would_decode_is_refused_as_before():
    """pyspng decodes a PNG whose image data has a flipped bit wherever the damage leaves a valid deflate stream:
    the CRC check sends it to OpenCV, which refuses it, as it did before libspng was used."""
    import pyspng

    data = _saved(Image.fromarray(_photo()))
    _, at, length = next(chunk for chunk in _chunks(data) if chunk[0] == b"IDAT")
    for position in range(at + 8 + length // 2, at + 8 + length):
        damaged = bytearray(data)
        damaged[position] ^= 0x04
        try:
            pyspng.load(bytes(damaged))
        except RuntimeError:
            continue
        break
    else:
        pytest.fail("every flipped bit tried was caught by libspng itself: nothing to test")
    damaged_bytes = bytes(damaged)
    assert not png_chunks_intact(damaged_bytes)
    assert spng_decode(damaged_bytes) is None
    with pytest.raises(ValueError, match="OpenCV could not decode"):
        decode_rgb(damaged_bytes, CODEC_CV_OTHER)


def test_a_damaged_ancillary_chunk_leaves_the_pixels_to_opencv():
    data = _saved(Image.fromarray(_photo()))
    _, at, length = _chunks(data)[0]  # IHDR, then a text chunk with a wrong CRC
    text = b"Comment\x00damaged"
    chunk = struct.pack(">I", len(text)) + b"tEXt" + text + struct.pack(">I", zlib.crc32(b"tEXt" + text) ^ 1)
    damaged = data[:at + 12 + length] + chunk + data[at + 12 + length:]
    assert not png_chunks_intact(damaged)
    assert np.array_equal(decode_rgb(damaged, CODEC_CV_OTHER), opencv_decode(damaged, 1, False))


@pytest.mark.parametrize("cut", ["no-iend", "short-chunk", "signature-only"])
def test_a_png_without_all_its_chunks_is_not_intact(cut):
    data = _png("rgb")
    kinds = _chunks(data)
    if cut == "no-iend":
        data = data[:kinds[-1][1]]
    elif cut == "short-chunk":
        data = data[:kinds[1][1] + 20]
    else:
        data = data[:8]
    assert not png_chunks_intact(data)
    assert spng_decode(data) is None
    with pytest.raises(ValueError):
        decode_rgb(data, CODEC_CV_OTHER)


def test_memoryview_bytes_are_decoded_by_libspng():
    data = _png("rgb")
    assert np.array_equal(spng_decode(memoryview(data)), opencv_decode(data, 1, False))


@pytest.fixture
def fresh_decoder_state():
    """The once-per-process loader and warnings of fastdata.image.decode forgotten before and after the test."""
    caches = (decode._spng_loader, decode._warn_refused)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


def test_a_png_libspng_refuses_is_decoded_by_opencv_and_said_once(monkeypatch, fresh_decoder_state):
    import pyspng

    def refuse(data, fmt=None):
        raise RuntimeError("pyspng: could not decode image: a reason")

    monkeypatch.setattr(pyspng, "load", refuse)
    data = _png("rgba")
    with pytest.warns(RuntimeWarning, match="libspng refused a PNG .*a reason.*OpenCV decodes it"):
        first = decode_rgb(data, CODEC_CV_OTHER)
    assert np.array_equal(first, opencv_decode(data, 1, False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(decode_rgb(data, CODEC_CV_OTHER), first)  # said once


def test_without_pyspng_pngs_are_decoded_by_opencv_and_that_is_said(monkeypatch, fresh_decoder_state):
    monkeypatch.setitem(sys.modules, "pyspng", None)  # import pyspng raises ImportError
    data = _png("p4")
    with pytest.warns(RuntimeWarning, match="PNGs are decoded with OpenCV, not libspng.*pip install pyspng"):
        got = decode_rgb(data, CODEC_CV_OTHER)
    assert np.array_equal(got, opencv_decode(data, 1, False))
