"""The JPEG frame header reader, and what it tells the device path (`device_takes`) about each stream."""

from __future__ import annotations

import pytest
from builders.images import encode, pattern

from fastdata.formats.records import CODEC_CV_JPEG, CODEC_PIL
from fastdata.image.batch import EncodedSample
from fastdata.image.device.ship import device_takes
from fastdata.image.jpeg.header import read_frame

PICTURE = pattern(3, 37, 29)


def jpeg_sample(data: bytes, codec: int = CODEC_CV_JPEG) -> EncodedSample:
    return EncodedSample("k.jpg", data, 0, 37, 29, codec, (0,))


@pytest.mark.parametrize(("save", "marker", "sampling"), [
    (dict(subsampling=0), 0xC0, ((1, 1), (1, 1), (1, 1))),
    (dict(subsampling=1), 0xC0, ((2, 1), (1, 1), (1, 1))),
    (dict(subsampling=2), 0xC0, ((2, 2), (1, 1), (1, 1))),
    (dict(subsampling=2, progressive=True), 0xC2, ((2, 2), (1, 1), (1, 1))),
])
def test_frame_of_colour_jpegs(save, marker, sampling):
    data = encode(PICTURE, "JPEG", quality=90, **save)
    frame = read_frame(data)
    assert frame.marker == marker and frame.precision == 8 and frame.sampling == sampling
    assert device_takes(jpeg_sample(data))


def test_frame_behind_large_app_segments_and_fill_bytes():
    data = encode(PICTURE, "JPEG", quality=90, exif=b"Exif\x00\x00" + bytes(60_000), icc_profile=bytes(5_000))
    padded = data[:2] + b"\xff" + data[2:]  # a fill byte before the first marker is allowed
    assert read_frame(padded) == read_frame(data) is not None
    assert read_frame(data).sampling[0] == (2, 2)


def test_streams_the_device_does_not_take():
    grey = encode(PICTURE, "JPEG", "L", quality=90)
    assert read_frame(grey).sampling == ((1, 1),) and device_takes(jpeg_sample(grey))
    cmyk = encode(PICTURE, "JPEG", "CMYK", quality=90)
    assert len(read_frame(cmyk).sampling) == 4
    assert not device_takes(jpeg_sample(cmyk)) and not device_takes(jpeg_sample(cmyk, CODEC_PIL))
    baseline = encode(PICTURE, "JPEG", quality=90)
    sof = baseline.index(b"\xff\xc0")
    arithmetic = baseline[:sof + 1] + b"\xc9" + baseline[sof + 2:]  # the same frame, flagged arithmetic-coded
    assert read_frame(arithmetic).marker == 0xC9 and not device_takes(jpeg_sample(arithmetic))
    odd = bytearray(baseline)
    odd[sof + 2 + 2 + 6 + 3 + 1] = 0x21  # second component sampled 2x1: no nvjpeg chroma subsampling
    assert read_frame(bytes(odd)).sampling[1] == (2, 1) and not device_takes(jpeg_sample(bytes(odd)))
    png = encode(PICTURE, "PNG")
    assert read_frame(png) is None and not device_takes(jpeg_sample(png, 1))


@pytest.mark.parametrize("cut", [0, 3, 20, "before-frame"])
def test_damaged_or_truncated_headers_give_none(cut):
    data = encode(PICTURE, "JPEG", quality=90)
    sof = data.index(b"\xff\xc0")
    damaged = data[:sof] if cut == "before-frame" else data[:cut]
    assert read_frame(damaged) is None
    assert not device_takes(jpeg_sample(damaged))  # decoded (or found corrupt) in the worker
    assert read_frame(data[:sof + 9]) is None  # frame segment cut short
