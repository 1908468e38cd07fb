"""CPU image decode: bytes -> RGB uint8 HWC arrays, pixel-identical to Pillow's `convert("RGB")`.

The codec of every sample is decided once, at conversion time, from what Pillow saw in the file:
JPEGs and PNGs whose modes OpenCV decodes exactly like Pillow go through OpenCV (faster, releases the GIL,
and can decode JPEGs at 1/2, 1/4 or 1/8 scale); everything else (CMYK JPEG, 16-bit PNG, TIFF, WebP, ...)
goes through Pillow. Neither path applies EXIF rotation, matching torchvision's ImageFolder loader.
"""

from __future__ import annotations

import io

import numpy as np

from fastdata.formats.records import CODEC_CV_JPEG, CODEC_CV_OTHER, CODEC_PIL, exception_text
from fastdata.image.headers import image_size


def _cv2():
    import cv2

    return cv2


def opencv_single_threaded() -> None:
    """Run OpenCV on one thread in this process. The parallelism is the worker processes; and a live OpenCV
    thread pool in a process that later forks workers can deadlock them (seen: a worker stuck in
    cv2.setNumThreads). Called by every DataLoader and conversion worker, and before any crop."""
    cv2 = _cv2()
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
        cv2 = _cv2()
        flags = (cv2.IMREAD_COLOR_BGR if bgr else cv2.IMREAD_COLOR_RGB) | cv2.IMREAD_IGNORE_ORIENTATION
        if codec == CODEC_CV_JPEG and reduce > 1:
            flags |= {2: cv2.IMREAD_REDUCED_GRAYSCALE_2, 4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
                      8: cv2.IMREAD_REDUCED_GRAYSCALE_8}[reduce]
        try:
            image = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
        except cv2.error as exc:
            raise ValueError(f"OpenCV could not decode the image bytes: {exc}") from exc
        if image is None:
            raise ValueError("OpenCV could not decode the image bytes")
        return image
    image = _decode_pil(data, max_pixels)
    return np.ascontiguousarray(image[:, :, ::-1]) if bgr else image


def _decode_pil(data: bytes | memoryview, max_pixels: int | None = None) -> np.ndarray:
    from PIL import Image

    try:
        im = Image.open(io.BytesIO(data))  # reads the header only
    except Exception as exc:  # Pillow raises many types for bad data
        raise ValueError(f"Pillow could not decode the image bytes: {exception_text(exc)}") from exc
    with im:
        check_header_pixels(im.format or "image", im.size, max_pixels)
        try:
            return np.asarray(im.convert("RGB"))
        except Exception as exc:
            raise ValueError(f"Pillow could not decode the image bytes: {exception_text(exc)}") from exc
