"""What every format stores about an image, in one place: the record writers take, the codec that decodes it
(chosen once, at conversion), the image extensions a dataset may hold, and the default pixel limit."""

from __future__ import annotations

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



def key_bytes(key: str) -> bytes:
    """A sample key (a source-relative path as Python's os functions give it) as stored: its UTF-8 bytes, and a
    file name's bytes that are not UTF-8 as they were (Python holds them as lone surrogates, PEP 383; torchvision's
    ImageFolder lists such names the same way), so that every key round-trips."""
    return key.encode("utf-8", "surrogateescape")


def key_from_bytes(raw: bytes) -> str:
    """The sample key `key_bytes` stored as `raw`."""
    return raw.decode("utf-8", "surrogateescape")


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
