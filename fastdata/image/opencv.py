"""OpenCV's decode of image bytes, the one call every CPU decode that goes through OpenCV makes: pixels as Pillow's
`convert("RGB")` gives them (or BGR, OpenCV's own order), no EXIF rotation (as torchvision's ImageFolder loader),
and for JPEGs libjpeg's DCT scaling (1/2, 1/4, 1/8: far less work).

It sits below both of its users, so that neither imports the other's room: `fastdata.image.decode` (which checks
the header's size first and sends what OpenCV would decode differently to Pillow) and the region decoder's
self-check (`fastdata.image.jpeg.region`), whose reference pixels are the ones a crop gets where the region decoder
is not used."""

from __future__ import annotations

import numpy as np


def opencv_decode(data: bytes | memoryview, reduce: int = 1, bgr: bool = False) -> np.ndarray:
    """Decode image bytes with OpenCV to a uint8 (H, W, 3) array, RGB (BGR if `bgr`); a JPEG at 1/`reduce` scale
    (`reduce`: 1, 2, 4 or 8; pass 1 for anything but a JPEG). Raises ValueError where OpenCV cannot decode them."""
    import cv2

    flags = (cv2.IMREAD_COLOR_BGR if bgr else cv2.IMREAD_COLOR_RGB) | cv2.IMREAD_IGNORE_ORIENTATION
    if reduce > 1:
        flags |= {2: cv2.IMREAD_REDUCED_GRAYSCALE_2, 4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
                  8: cv2.IMREAD_REDUCED_GRAYSCALE_8}[reduce]
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error as exc:
        raise ValueError(f"OpenCV could not decode the image bytes: {exc}") from exc
    if image is None:
        raise ValueError("OpenCV could not decode the image bytes")
    return image
