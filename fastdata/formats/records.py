"""What every format stores about an image, in one place: the record writers take, the codec that decodes it
(chosen once, at conversion), the image extensions a dataset may hold, the default pixel limit, the two kinds of
label (one class id, or a set of class ids), and the text of a decoding error as records and reports keep it (the
same on every run)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

CODEC_CV_JPEG = 0  # JPEG in mode L or RGB: OpenCV, scaled decode allowed
CODEC_CV_OTHER = 1  # 8-bit PNG / BMP in a mode OpenCV converts exactly like Pillow
CODEC_PIL = 2  # anything else: Pillow

#: How a dataset stores its JPEG records (the manifest's `jpeg_layout`): "original", the source's bytes; "restart",
#: rewritten losslessly with a restart marker after every MCU (`fastdata.image.jpeg.restart`), which any JPEG
#: decoder reads as it reads the original, and which a loader decodes a crop of in proportion to the crop's area;
#: "baseline", progressive JPEGs rewritten losslessly as baseline ones (the GPU's hardware JPEG engines take
#: baseline files only), every other record stored as the source has it.
JPEG_LAYOUTS = ("original", "restart", "baseline")

#: Default pixel-count limit for decoding (Pillow's own decompression-bomb warning level, ~89.5 megapixels).
DEFAULT_MAX_PIXELS = 89_478_485

#: The image file extensions a source may hold: torchvision.datasets.folder.IMG_EXTENSIONS (the tests check them
#: equal), which are also the image members a WebDataset shard may hold (without the dot).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

#: The stored extension of an image of a given Pillow format.
EXT_OF_FORMAT = {"JPEG": "jpg", "PNG": "png", "PPM": "ppm", "BMP": "bmp", "TIFF": "tiff", "WEBP": "webp"}

_OBJECT_REPR = re.compile(r"\s*<[^<>]*\bat 0x[0-9a-fA-F]+>")  # <_io.BytesIO object at 0x7f3a...>
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{8,}\b")


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


#: A sample's label: one class id ("single"-label datasets), or the sorted class ids it holds, possibly none
#: ("multi"-label datasets). A dataset's manifest says which (`label_kind`).
Label = int | tuple[int, ...]
LABEL_KINDS = ("single", "multi")


def label_from_json(value: Any, kind: str) -> Label:
    """A stored label as JSON holds it (an integer, or a list of integers) -> the Label of a `kind` dataset.
    Raises ValueError saying what is wrong (the caller names the sample)."""
    if kind == "multi":
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(f"a multi-label sample's label must be a list of class ids, got {value!r}")
        return tuple(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"a label must be a class id (an integer), got {value!r}")
    return value


def label_to_json(label: Label) -> int | list[int]:
    return list(label) if isinstance(label, tuple) else label


@dataclass(frozen=True)
class ImageRecord:
    """One image ready to store. `key` is the source-relative path, `ext` the member extension
    (`jpg`, `png`, ...) that matches the bytes, `codec` the decoder chosen at conversion time, `label` one class
    id or (multi-label) a tuple of them, `metadata` the sample's other source columns as JSON scalars (None: the
    source has none). An image-text pair (`target_kind: "pairs"`) also has its `caption` and, when converted with
    a tokenizer, the caption's token ids `tokens` (a uint16 or uint32 numpy array); a detection sample its `target`,
    the stored target record (`fastdata.formats.targets`; None: the dataset has none)."""

    key: str
    data: bytes
    ext: str
    label: Label
    width: int
    height: int
    codec: int
    metadata: dict[str, Any] | None = None
    caption: str | None = None
    tokens: Any = None
    target: bytes | None = None


def exception_text(exc: BaseException) -> str:
    """What `exc` says, without what changes from run to run: object reprs with their memory address (Pillow's
    "cannot identify image file <_io.BytesIO object at 0x7f...>") are dropped and bare addresses replaced, so that
    a reason recorded in a manifest or a report is the same, byte for byte, every time the same input meets it."""
    text = _ADDRESS.sub("<address>", _OBJECT_REPR.sub("", str(exc))).strip()
    return text or type(exc).__name__


@contextmanager
def pillow_pixels_checked() -> Iterator[None]:
    """Around a Pillow open by code that checks the pixel count itself (`max_pixels`) and says so in its own words:
    Pillow's own "could be decompression bomb DOS attack" warning is not printed besides (its hard limit, an error,
    still applies)."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield
