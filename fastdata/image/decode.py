"""CPU image decode: bytes -> RGB uint8 HWC arrays, pixel-identical to Pillow's `convert("RGB")`.

The codec of every sample is decided once, at conversion time, from what Pillow saw in the file:
JPEGs and PNGs whose modes OpenCV decodes exactly like Pillow go through OpenCV (`fastdata.image.opencv`: faster,
releases the GIL, and can decode JPEGs at 1/2, 1/4 or 1/8 scale); everything else (CMYK JPEG, 16-bit PNG, TIFF,
WebP, ...) goes through Pillow. Neither path applies EXIF rotation, matching torchvision's ImageFolder loader.

Before a decode, the image's width and height come from its own header bytes (`image_size`): what a decode would
allocate, to check against the pixel limit first (a dataset's stored width/height may lie: tampered, or remote and
untrusted). JPEG and PNG headers are parsed here rather than with Pillow because this runs for every sample OpenCV
decodes: about 3 us for a JPEG, where `PIL.Image.open(...).size` took about 70 us (a tenth of the decode of a
500x375 JPEG) on the development machine. Anything else, which OpenCV would decode too (it sniffs the bytes,
whatever the stored codec says), is left to Pillow's header parsing.
"""

from __future__ import annotations

import contextlib
import io
import struct

import numpy as np

from fastdata.formats.records import CODEC_CV_JPEG, CODEC_CV_OTHER, CODEC_PIL, exception_text, pillow_pixels_checked
from fastdata.image.jpeg.header import read_frame
from fastdata.image.opencv import opencv_decode

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a JPEG's start-of-frame marker, or None where the bytes are not a JPEG or end (or
    start the scan) before a whole one: the decoder then says what is wrong."""
    frame = read_frame(data)
    return None if frame is None else (frame.width, frame.height)


def png_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR chunk, or None where the bytes are not a PNG."""
    if len(data) < 24 or bytes(data[:8]) != _PNG_SIGNATURE or bytes(data[12:16]) != b"IHDR":
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
