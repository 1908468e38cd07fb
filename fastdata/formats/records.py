"""What every format stores about an image, in one place: the record writers take, the codec that decodes it
(chosen once, at conversion), the image extensions a dataset may hold, the default pixel limit, and the text of a
decoding error as records and reports keep it (the same on every run)."""

from __future__ import annotations

import re
from dataclasses import dataclass

CODEC_CV_JPEG = 0  # JPEG in mode L or RGB: OpenCV, scaled decode allowed
CODEC_CV_OTHER = 1  # 8-bit PNG / BMP in a mode OpenCV converts exactly like Pillow
CODEC_PIL = 2  # anything else: Pillow

#: Default pixel-count limit for decoding (Pillow's own decompression-bomb warning level, ~89.5 megapixels).
DEFAULT_MAX_PIXELS = 89_478_485

#: The image file extensions a source may hold: torchvision.datasets.folder.IMG_EXTENSIONS (the tests check them
#: equal), which are also the image members a WebDataset shard may hold (without the dot).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

#: The stored extension of an image of a given Pillow format.
EXT_OF_FORMAT = {"JPEG": "jpg", "PNG": "png", "PPM": "ppm", "BMP": "bmp", "TIFF": "tiff", "WEBP": "webp"}

_OBJECT_REPR = re.compile(r"\s*<[^<>]*\bat 0x[0-9a-fA-F]+>")  # <_io.BytesIO object at 0x7f3a...>
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{8,}\b")

_CV_JPEG_MODES = frozenset({"L", "RGB"})
_CV_PNG_MODES = frozenset({"L", "RGB", "RGBA", "LA", "P"})


def codec_for(pil_format: str | None, pil_mode: str) -> int:
    """Pick the decoder for an image Pillow identified as (`pil_format`, `pil_mode`)."""
    if pil_format == "JPEG" and pil_mode in _CV_JPEG_MODES:
        return CODEC_CV_JPEG
    if pil_format == "PNG" and pil_mode in _CV_PNG_MODES:
        return CODEC_CV_OTHER
    return CODEC_PIL


@dataclass(frozen=True)
class ImageRecord:
    """One image ready to store. `key` is the source-relative path, `ext` the member extension
    (`jpg`, `png`, ...) that matches the bytes, `codec` the decoder chosen at conversion time."""

    key: str
    data: bytes
    ext: str
    label: int
    width: int
    height: int
    codec: int


def exception_text(exc: BaseException) -> str:
    """What `exc` says, without what changes from run to run: object reprs with their memory address (Pillow's
    "cannot identify image file <_io.BytesIO object at 0x7f...>") are dropped and bare addresses replaced, so that
    a reason recorded in a manifest or a report is the same, byte for byte, every time the same input meets it."""
    text = _ADDRESS.sub("<address>", _OBJECT_REPR.sub("", str(exc))).strip()
    return text or type(exc).__name__
