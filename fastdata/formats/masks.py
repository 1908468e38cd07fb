"""Semantic segmentation label maps as stored (`target_kind: "segmentation"`): one PNG per sample, single channel,
whose pixel values are the class ids (8-bit, or 16-bit when ids exceed 255), the same bytes in every format (LMDB's
`targets` sub-database, a WebDataset sample's `{key}.seg.png` member, which any PNG decoder reads as the ids).

What a source may give as a label map, checked from its PNG header (`label_map_header`), each refusal a reason:
a greyscale PNG of 8 or 16 bits (stored as it is, byte for byte), or a palette ("P") PNG as VOC ships them, whose
palette indices ARE the class ids (re-encoded as an 8-bit greyscale PNG of those indices, so that no decoder turns
them into colours). Refused: anything not a PNG (a JPEG is lossy: its edges would hold ids no pixel had), colour
(RGB) maps (their colours must be mapped to ids first), maps with an alpha channel, greyscale of fewer than 8 bits.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np

from fastdata.errors import CorruptSampleError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HEADER_BYTES = 33  # signature + the IHDR chunk: all `label_map_header` reads
MASK_EXT = "seg.png"  # the WebDataset member holding a sample's label map
DEFAULT_IGNORE_INDEX = 255
_GREY, _PALETTE = 0, 3
_COLOUR_TYPES = {2: "colour (RGB)", 4: "greyscale with alpha", 6: "colour with alpha (RGBA)"}


@dataclass(frozen=True)
class LabelMapHeader:
    """What a label map's PNG header says: its size, bit depth and whether its values are palette indices."""

    width: int
    height: int
    bit_depth: int
    palette: bool

    @property
    def wide(self) -> bool:
        """Whether its ids may exceed 255 (a 16-bit greyscale map)."""
        return self.bit_depth == 16 and not self.palette


def label_map_header(head: bytes) -> LabelMapHeader:
    """The header of a label map from its first bytes (`HEADER_BYTES` suffice); ValueError saying why the file
    cannot be a lossless single-channel label map."""
    if head[:3] == b"\xff\xd8\xff":
        raise ValueError("is a JPEG: lossy compression would change class ids at every edge; store label maps "
                         "as PNG")
    if head[:8] != PNG_SIGNATURE:
        raise ValueError("is not a PNG (label maps are single-channel PNGs of class ids)")
    if len(head) < HEADER_BYTES or head[12:16] != b"IHDR":
        raise ValueError("is a truncated PNG (no complete IHDR header)")
    width, height, depth, colour = struct.unpack(">IIBB", head[16:26])
    if colour in _COLOUR_TYPES:
        hint = ("convert its colours to class ids first (one channel, pixel value = class id)" if colour in (2, 6)
                else "drop the alpha channel (one channel, pixel value = class id)")
        raise ValueError(f"is a {_COLOUR_TYPES[colour]} PNG; a label map has one channel of class ids: {hint}")
    if colour == _GREY and depth not in (8, 16):
        raise ValueError(f"is a {depth}-bit greyscale PNG; save label maps as 8-bit (or 16-bit) greyscale")
    if colour not in (_GREY, _PALETTE) or width == 0 or height == 0:
        raise ValueError(f"is not a usable PNG (colour type {colour}, {width}x{height})")
    return LabelMapHeader(width, height, depth, colour == _PALETTE)


def label_map_ids(data: bytes, header: LabelMapHeader) -> np.ndarray:
    """The class ids of a label map: uint8 `[H, W]` (palette indices, or 8-bit greyscale values) or uint16
    (16-bit greyscale); ValueError when the PNG does not decode."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            if header.palette:
                if image.mode != "P":
                    raise ValueError(f"decodes as mode {image.mode!r}, not palette indices")
                return np.asarray(image, dtype=np.uint8)
            ids = np.asarray(image)
    except (OSError, SyntaxError) as exc:
        raise ValueError(f"does not decode as a PNG ({exc})") from None
    return ids.astype(np.uint16 if header.wide else np.uint8, copy=False)


def encode_label_map(ids: np.ndarray) -> bytes:
    """A greyscale PNG holding `ids` (uint8 -> 8-bit, uint16 -> 16-bit), losslessly."""
    from PIL import Image

    out = io.BytesIO()
    if ids.dtype == np.uint16:
        image = Image.frombytes("I;16", (ids.shape[1], ids.shape[0]), ids.astype("<u2").tobytes())
    else:
        image = Image.fromarray(ids.astype(np.uint8), mode="L")
    image.save(out, "PNG")
    return out.getvalue()


def decode_label_map(raw: bytes | memoryview, where: str) -> np.ndarray:
    """A stored label map back as its ids, uint8 or uint16 `[H, W]`; CorruptSampleError naming `where`."""
    raw = bytes(raw)
    try:
        header = label_map_header(raw[:HEADER_BYTES])
        if header.palette:
            raise ValueError("is a palette PNG (stored label maps are greyscale)")
        return label_map_ids(raw, header)
    except ValueError as exc:
        raise CorruptSampleError(f"{where}: stored label map {exc}") from None
