"""decode: codec choice, pixel equality with PIL's convert("RGB"), DCT-scaled JPEG decode, errors, and the refusal
of images whose own header says more pixels than the limit (image_header)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from builders.images import encode, pattern, with_size
from PIL import Image

from fastdata.formats.records import CODEC_CV_JPEG, CODEC_CV_OTHER, CODEC_PIL, DEFAULT_MAX_PIXELS, codec_for
from fastdata.image.decode import decode_rgb, image_size, jpeg_size, png_size

W, H = 67, 45


@pytest.mark.parametrize(
    ("fmt", "mode", "codec"),
    [
        ("JPEG", "RGB", CODEC_CV_JPEG),
        ("JPEG", "L", CODEC_CV_JPEG),
        ("JPEG", "CMYK", CODEC_PIL),
        ("JPEG", "YCbCr", CODEC_PIL),
        ("PNG", "RGB", CODEC_CV_OTHER),
        ("PNG", "L", CODEC_CV_OTHER),
        ("PNG", "P", CODEC_CV_OTHER),
        ("PNG", "RGBA", CODEC_CV_OTHER),
        ("PNG", "LA", CODEC_CV_OTHER),
        ("PNG", "I;16", CODEC_PIL),
        ("PNG", "I", CODEC_PIL),
        ("PNG", "1", CODEC_PIL),
        ("BMP", "RGB", CODEC_PIL),
        ("TIFF", "RGB", CODEC_PIL),
        ("WEBP", "RGB", CODEC_PIL),
        ("GIF", "P", CODEC_PIL),
        (None, "RGB", CODEC_PIL),
    ],
)
def test_codec_for(fmt, mode, codec):
    assert codec_for(fmt, mode) == codec


def _image_bytes(kind: str) -> bytes:
    array = pattern(7, W, H)
    if kind == "jpeg-rgb":
        return encode(array, "JPEG", quality=90)
    if kind == "jpeg-l":
        return encode(array, "JPEG", "L", quality=90)
    if kind == "jpeg-progressive":
        return encode(array, "JPEG", quality=80, progressive=True)
    if kind == "jpeg-cmyk":
        return encode(array, "JPEG", "CMYK", quality=90)
    if kind == "png-rgb":
        return encode(array, "PNG")
    if kind == "png-l":
        return encode(array, "PNG", "L")
    if kind == "png-p":
        return encode(array, "PNG", "P")
    if kind in ("png-rgba", "png-la"):
        alpha = (np.arange(W * H).reshape(H, W) % 256).astype(np.uint8)
        im = Image.fromarray(np.dstack([array, alpha]), "RGBA")
        if kind == "png-la":
            im = im.convert("LA")
        out = io.BytesIO()
        im.save(out, "PNG")
        return out.getvalue()
    if kind == "png-16":
        out = io.BytesIO()
        Image.fromarray(array[..., 0].astype(np.uint16) * 257).save(out, "PNG")
        return out.getvalue()
    if kind == "bmp":
        return encode(array, "BMP")
    if kind == "tiff":
        return encode(array, "TIFF")
    if kind == "webp":
        return encode(array, "WEBP", lossless=True)
    raise AssertionError(kind)


KINDS = ["jpeg-rgb", "jpeg-l", "jpeg-progressive", "jpeg-cmyk", "png-rgb", "png-l", "png-p", "png-rgba",
         "png-la", "png-16", "bmp", "tiff", "webp"]


def _pil_rgb(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def _codec(data: bytes) -> int:
    with Image.open(io.BytesIO(data)) as im:
        return codec_for(im.format, im.mode)


@pytest.mark.parametrize("kind", KINDS)
def test_decode_rgb_equals_pil_convert_rgb(kind):
    data = _image_bytes(kind)
    codec = _codec(data)
    expected = _pil_rgb(data)
    got = decode_rgb(data, codec)
    assert got.dtype == np.uint8
    assert got.shape == (H, W, 3)
    assert np.array_equal(got, expected), (kind, np.abs(got.astype(int) - expected).max())
    # Pillow is always a valid decoder for anything
    assert np.array_equal(decode_rgb(data, CODEC_PIL), expected)


def test_decode_accepts_memoryview():
    data = _image_bytes("png-rgb")
    assert np.array_equal(decode_rgb(memoryview(data), CODEC_CV_OTHER), _pil_rgb(data))


@pytest.mark.parametrize("kind", ["jpeg-rgb", "jpeg-l", "jpeg-progressive"])
@pytest.mark.parametrize("reduce", [2, 4, 8])
def test_reduced_jpeg_decode_equals_pil_draft(kind, reduce):
    data = _image_bytes(kind)
    with Image.open(io.BytesIO(data)) as im:
        im.draft("RGB", (W // reduce, H // reduce))
        assert im.size == (-(-W // reduce), -(-H // reduce))  # libjpeg scales to ceil(size / reduce)
        expected = np.asarray(im.convert("RGB"))
    got = decode_rgb(data, CODEC_CV_JPEG, reduce)
    assert got.shape == expected.shape == (-(-H // reduce), -(-W // reduce), 3)
    assert np.abs(got.astype(np.int16) - expected).max() <= 1


@pytest.mark.parametrize("kind", ["png-rgb", "jpeg-cmyk", "bmp"])
def test_reduce_is_ignored_for_other_codecs(kind):
    data = _image_bytes(kind)
    assert np.array_equal(decode_rgb(data, _codec(data), reduce=4), _pil_rgb(data))


GARBAGE = [
    b"",
    b"definitely not an image",
    b"\xff\xd8\xff\xe0" + b"\x00" * 40,
    b"\x89PNG\r\n\x1a\n" + b"\x01" * 40,
    encode(pattern(1, 61, 47), "JPEG", quality=95)[:300],
]
GARBAGE_IDS = ["empty", "text", "jpeg-header", "png-header", "truncated-jpeg"]


@pytest.mark.parametrize("codec", [CODEC_CV_JPEG, CODEC_CV_OTHER, CODEC_PIL])
@pytest.mark.parametrize("data", GARBAGE, ids=GARBAGE_IDS)
def test_garbage_bytes_raise_value_error(codec, data):
    with pytest.raises(ValueError):
        decode_rgb(data, codec)


# ---------------------------------------------------------------------------------------------- header sizes


def _with_extras(data: bytes) -> bytes:
    """A JPEG with what real files carry before the frame header: fill bytes, and junk between segments."""
    return data[:2] + b"\xff\xff" + data[2:20] + b"\x00junk" + data[20:]


@pytest.mark.parametrize("kind", KINDS)
def test_header_size_equals_pils_for_every_kind(kind):
    data = _image_bytes(kind)
    with Image.open(io.BytesIO(data)) as im:
        assert image_size(data) == (im.format, im.size) == (im.format, (W, H))
    assert image_size(memoryview(data)) == image_size(data)


def test_jpeg_header_size_through_exif_restart_markers_fill_bytes_and_junk():
    array = pattern(3, W, H)
    exif = Image.Exif()
    exif[0x010E] = "x" * 3000  # ImageDescription: a long APP1 segment before the frame header
    for data in [encode(array, "JPEG", exif=exif.tobytes()), encode(array, "JPEG", restart_marker_rows=1),
                 _with_extras(encode(array, "JPEG", quality=90))]:
        assert jpeg_size(data) == (W, H)
        assert decode_rgb(data, CODEC_CV_JPEG).shape == (H, W, 3)  # libjpeg accepts it too


@pytest.mark.parametrize("data", GARBAGE, ids=GARBAGE_IDS)
def test_header_size_of_garbage_is_none_or_what_the_header_says(data):
    assert png_size(data) is None
    assert jpeg_size(data) in (None, (61, 47))  # the truncated JPEG still has its frame header
    assert image_size(data) in (None, ("JPEG", (61, 47)))


@pytest.mark.parametrize("kind", KINDS)
def test_decode_refuses_an_image_whose_own_header_is_over_the_limit(kind):
    data = _image_bytes(kind)
    codec = _codec(data)
    assert decode_rgb(data, codec, max_pixels=W * H).shape == (H, W, 3)
    with pytest.raises(ValueError, match=rf"^refused: the \w+ header says {W}x{H} pixels, over the limit of 3,014$"):
        decode_rgb(data, codec, max_pixels=W * H - 1)


@pytest.mark.parametrize("kind", ["jpeg-rgb", "jpeg-progressive", "png-rgb"])
@pytest.mark.parametrize("codec", [CODEC_CV_JPEG, CODEC_CV_OTHER, CODEC_PIL])
def test_a_tampered_header_is_refused_before_anything_is_allocated(kind, codec):
    """Whatever codec the dataset stores for it (OpenCV decodes what the bytes are): a header saying 20000 x 20000
    over the default limit is refused from the header; believed, it would cost 1.2 GB before failing."""
    data = with_size(_image_bytes(kind), 20_000, 20_000)
    name = "PNG" if kind.startswith("png") else "JPEG"
    with pytest.raises(ValueError, match=f"^refused: the {name} header says 20000x20000 pixels, over the limit of "
                                         f"{DEFAULT_MAX_PIXELS:,}$"):
        decode_rgb(data, codec, max_pixels=DEFAULT_MAX_PIXELS)


def test_a_pillow_decoding_error_names_no_memory_address():
    """Pillow says "cannot identify image file <_io.BytesIO object at 0x7f...>": the reason a loader records for a
    skipped sample is the same on every run."""
    with pytest.raises(ValueError) as info:
        decode_rgb(b"definitely not an image", CODEC_PIL)
    assert str(info.value) == "Pillow could not decode the image bytes: cannot identify image file"
