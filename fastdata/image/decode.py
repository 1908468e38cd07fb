"""CPU image decode: bytes -> RGB uint8 HWC arrays, pixel-identical to Pillow's `convert("RGB")`.

The codec of every sample is decided once, at conversion time, from what Pillow saw in the file:
JPEGs and PNGs whose modes OpenCV decodes exactly like Pillow go through OpenCV (`fastdata.image.opencv`: faster,
releases the GIL, and can decode JPEGs at 1/2, 1/4 or 1/8 scale); everything else (CMYK JPEG, 16-bit PNG, TIFF,
WebP, ...) goes through Pillow. Neither path applies EXIF rotation, matching torchvision's ImageFolder loader.

Those PNGs are decoded by libspng (the `pyspng` package) where their chunks are intact: the same pixels as OpenCV's
libpng and Pillow for every mode they take (the tests hold them equal), in about two thirds of the time on the
development machine. pyspng runs libspng without checking the chunks' CRCs (nor zlib's checksum), so the CRCs are
checked here first (about 0.1 ms for a 400 KB file there); zlib's checksum stays unchecked, which only a file
written with a wrong one (and right CRCs) gets past. A PNG with a damaged chunk, or one libspng refuses, goes to
OpenCV, whose answer (an error for a damaged image chunk, the pixels where only an ancillary chunk is damaged) is
what it always was.

Before a decode, the image's width and height come from its own header bytes (`image_size`): what a decode would
allocate, to check against the pixel limit first (a dataset's stored width/height may lie: tampered, or remote and
untrusted). JPEG and PNG headers are parsed here rather than with Pillow because this runs for every sample OpenCV
decodes: about 3 us for a JPEG, where `PIL.Image.open(...).size` took about 70 us (a tenth of the decode of a
500x375 JPEG) on the development machine. Anything else, which OpenCV would decode too (it sniffs the bytes,
whatever the stored codec says), is left to Pillow's header parsing.
"""

from __future__ import annotations

import contextlib
import functools
import io
import struct
import warnings
import zlib
from collections.abc import Callable

import numpy as np

from fastdata.formats.masks import PNG_SIGNATURE
from fastdata.formats.records import CODEC_CV_JPEG, CODEC_CV_OTHER, CODEC_PIL, exception_text, pillow_pixels_checked
from fastdata.image.jpeg.header import read_frame
from fastdata.image.opencv import opencv_decode


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a JPEG's start-of-frame marker, or None where the bytes are not a JPEG or end (or
    start the scan) before a whole one: the decoder then says what is wrong."""
    frame = read_frame(data)
    return None if frame is None else (frame.width, frame.height)


def png_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk, or None where the bytes are not a PNG."""
    if len(data) < 24 or bytes(data[:8]) != PNG_SIGNATURE or bytes(data[12:16]) != b"IHDR":
        return None
    width, height = struct.unpack_from(">II", data, 16)
    return width, height


def image_size(data: bytes | memoryview, pillow: bool = True) -> tuple[str, tuple[int, int]] | None:
    """(format name, (width, height)) from the image's own header, or None where no header can be read (the
    decoder then says what is wrong). Formats other than JPEG and PNG are asked of Pillow, if `pillow`."""
    for name, parse in (("JPEG", jpeg_size), ("PNG", png_size)):
        size = parse(data)
        if size is not None:
            return name, size
    if not pillow:
        return None
    from PIL import Image

    try:  # a size read for the caller to judge: not Pillow's bomb warning
        with pillow_pixels_checked(), Image.open(io.BytesIO(data)) as im:  # reads the header only
            return im.format or "image", im.size
    except Exception:  # Pillow raises many types for bytes it cannot identify
        return None


def opencv_single_threaded() -> None:
    """Run OpenCV on one thread in this process. The parallelism is the worker processes; and a live OpenCV
    thread pool in a process that later forks workers can deadlock them (seen: a worker stuck in
    cv2.setNumThreads). Called by every DataLoader and conversion worker, and before any crop."""
    import cv2

    if cv2.getNumThreads() != 1:
        cv2.setNumThreads(1)


def check_header_pixels(format_name: str, size: tuple[int, int], max_pixels: int | None) -> None:
    """Raise ValueError if the image's own header `size` (width, height) is over `max_pixels` (None: no limit)."""
    if max_pixels is not None and size[0] * size[1] > max_pixels:
        raise ValueError(f"refused: the {format_name} header says {size[0]}x{size[1]} pixels, over the limit of "
                         f"{max_pixels:,}")


def decode_rgb(data: bytes | memoryview, codec: int = CODEC_PIL, reduce: int = 1, bgr: bool = False,
               max_pixels: int | None = None) -> np.ndarray:
    """Decode image bytes to an RGB uint8 array of shape (H, W, 3) (BGR order if `bgr`: OpenCV's native
    order, about 8% cheaper to decode; channel-agnostic pipelines reorder once, at the end).

    `reduce` (1, 2, 4 or 8) asks for a JPEG decoded at 1/reduce scale (libjpeg's DCT scaling: far less work);
    it is honoured only for CODEC_CV_JPEG and ignored otherwise. With `max_pixels`, an image whose own header
    says more pixels is refused before decoding. Raises ValueError on undecodable or refused bytes.
    """
    if not len(data):
        raise ValueError("empty image record (0 bytes)")
    # the bytes' own size, not the stored one (for Pillow's other formats, _decode_pil checks what it opens)
    header = image_size(data, pillow=codec != CODEC_PIL) if max_pixels is not None else None
    if header is not None:
        check_header_pixels(*header, max_pixels)
    if codec == CODEC_CV_OTHER and bytes(data[:8]) == PNG_SIGNATURE:
        return _decode_png(data, bgr)
    if codec in (CODEC_CV_JPEG, CODEC_CV_OTHER):
        return opencv_decode(data, reduce if codec == CODEC_CV_JPEG else 1, bgr)
    image = _decode_pil(data, max_pixels)
    return np.ascontiguousarray(image[:, :, ::-1]) if bgr else image


def _decode_pil(data: bytes | memoryview, max_pixels: int | None = None) -> np.ndarray:
    from PIL import Image

    try:
        with pillow_pixels_checked() if max_pixels is not None else contextlib.nullcontext():
            im = Image.open(io.BytesIO(data))  # reads the header only; the limit is checked below, in our words
    except Exception as exc:  # Pillow raises many types for bad data
        raise ValueError(f"Pillow could not decode the image bytes: {exception_text(exc)}") from exc
    with im:
        check_header_pixels(im.format or "image", im.size, max_pixels)
        try:
            return np.asarray(im.convert("RGB"))
        except Exception as exc:
            raise ValueError(f"Pillow could not decode the image bytes: {exception_text(exc)}") from exc


def _decode_png(data: bytes | memoryview, bgr: bool) -> np.ndarray:
    """A PNG of OpenCV's codec: libspng's pixels, or OpenCV's where libspng is not used (`spng_decode`)."""
    try:
        image = spng_decode(data)
    except SpngRefused as refused:
        image = opencv_decode(data, 1, bgr)  # raises ValueError where OpenCV refuses it too
        _warn_refused(refused.reason)
        return image
    if image is None:
        return opencv_decode(data, 1, bgr)
    return _rgb_to_bgr(image) if bgr else image


class SpngRefused(Exception):
    """libspng refused a PNG whose chunks are intact (`reason`: its words)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def png_chunks_intact(data: bytes | memoryview) -> bool:
    """Whether every chunk of the PNG `data`, up to and including IEND, is whole and has its CRC: what a decoder
    that checks them (libpng) would find nothing wrong with in the file's structure."""
    view = memoryview(data)
    at, end = len(PNG_SIGNATURE), len(view)
    while at + 12 <= end:
        (length,) = struct.unpack_from(">I", view, at)
        stop = at + 8 + length  # where the chunk's CRC starts
        if stop + 4 > end or zlib.crc32(view[at + 4:stop]) != struct.unpack_from(">I", view, stop)[0]:
            return False
        if bytes(view[at + 4:at + 8]) == b"IEND":
            return True
        at = stop + 4
    return False


def spng_decode(data: bytes | memoryview) -> np.ndarray | None:
    """The PNG `data` decoded by libspng to RGB (H, W, 3) uint8, or None where libspng is not used: pyspng is not
    installed (said once per process), or a chunk is damaged or missing (`png_chunks_intact`). Raises SpngRefused
    where libspng refuses a PNG whose chunks are intact. Either way OpenCV decodes it, to the same pixels."""
    loader = _spng_loader()
    if loader is None or not png_chunks_intact(data):
        return None
    try:
        image = loader(data if isinstance(data, bytes) else bytes(data), "RGB")
    except Exception as exc:  # pyspng raises RuntimeError with libspng's reason
        raise SpngRefused(exception_text(exc)) from exc
    if image.ndim != 3 or image.shape[2] != 3:
        raise SpngRefused(f"an image of shape {image.shape} for RGB output")
    return image


def spng_status() -> tuple[str | None, str]:
    """(pyspng's version, "") where PNGs are decoded by libspng here, else (None, why not), for `fastdata doctor`
    (nothing is said)."""
    try:
        import pyspng
    except ImportError as exc:
        return None, str(exc)
    return str(getattr(pyspng, "__version__", "?")), ""


@functools.cache
def _spng_loader() -> Callable[[bytes, str], np.ndarray] | None:
    """pyspng's `load`, or None (said once per process) where pyspng does not import."""
    try:
        import pyspng
    except ImportError as exc:
        warnings.warn(f"fastdata: PNGs are decoded with OpenCV, not libspng ({exc}; pip install pyspng): the same "
                      "pixels, more decoding time", RuntimeWarning, stacklevel=4)
        return None
    return pyspng.load


@functools.cache
def _warn_refused(reason: str) -> None:
    """Say once per process (and reason) that libspng refused a PNG that OpenCV then decoded."""
    warnings.warn(f"fastdata: libspng refused a PNG ({reason}); OpenCV decodes it, as it decodes every PNG libspng "
                  "does not take (the same pixels where both decode it)", RuntimeWarning, stacklevel=4)


def _rgb_to_bgr(image: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.cvtColor(image, cv2.COLOR_RGB2BGR, dst=image)
