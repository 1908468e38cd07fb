"""Per-sample targets beyond a class label, as stored: one binary record per sample, the same bytes in every format
(LMDB's `targets` sub-database, a WebDataset sample's `{key}.det` member). No pickle: fixed little-endian arrays and
ASCII RLE strings at documented offsets, readable with numpy alone.

Detection record (`target_kind: "detection"`), N = the image's annotations, all little-endian:

    offset 0   4 bytes   magic b"FDET"
           4   uint32    layout version (1)
           8   uint32    N
          12   uint32    image width, 16 uint32 image height (the pixels boxes and masks refer to)
          20   uint32    flags: bit 0 = the record holds masks
          24   int64     image id (the source's)
          32   int64[N]  annotation ids
               int64[N]  labels (contiguous class ids, indexing the manifest's classes)
               float32[N, 4] boxes, xyxy in source pixels
               float32[N]    areas (the source's `area`)
               uint32[N + 1] mask offsets into the RLE bytes (all 0 without masks)
               uint8[N]      iscrowd
               bytes         the masks: annotation i's COCO compressed-RLE counts string is
                             rle[offsets[i]:offsets[i + 1]] (ASCII), of an image height x width
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

import numpy as np

from fastdata.errors import CorruptSampleError

DETECTION_MAGIC = b"FDET"
DETECTION_LAYOUT = 1
_HEADER = struct.Struct("<4sIIIIIq")
_HAS_MASKS = 1


@dataclass(frozen=True)
class DetectionRecord:
    """One image's detection target, as stored (see the module docstring)."""

    image_id: int
    width: int
    height: int
    ids: np.ndarray  # int64 [N]
    labels: np.ndarray  # int64 [N]
    boxes: np.ndarray  # float32 [N, 4], xyxy
    areas: np.ndarray  # float32 [N]
    iscrowd: np.ndarray  # uint8 [N]
    rles: list[bytes] | None  # compressed RLE counts per annotation; None: no masks

    def __len__(self) -> int:
        return len(self.ids)


def encode_detection(record: DetectionRecord) -> bytes:
    """The stored bytes of `record`."""
    count = len(record.ids)
    arrays = [np.asarray(record.ids, "<i8"), np.asarray(record.labels, "<i8"),
              np.asarray(record.boxes, "<f4").reshape(count, 4), np.asarray(record.areas, "<f4")]
    if any(len(a) != count for a in arrays[1:]) or len(record.iscrowd) != count or (
            record.rles is not None and len(record.rles) != count):
        raise ValueError(f"image {record.image_id}: target arrays of different lengths")
    offsets = np.zeros(count + 1, "<u4")
    if record.rles is not None:
        np.cumsum([len(r) for r in record.rles], out=offsets[1:])
    header = _HEADER.pack(DETECTION_MAGIC, DETECTION_LAYOUT, count, record.width, record.height,
                          _HAS_MASKS if record.rles is not None else 0, record.image_id)
    return b"".join([header, *(a.tobytes() for a in arrays), offsets.tobytes(),
                     np.asarray(record.iscrowd, "u1").tobytes(), *(record.rles or [])])


def decode_detection(raw: bytes | memoryview, where: str) -> DetectionRecord:
    """A stored detection record back; CorruptSampleError naming `where` when the bytes are not one."""
    raw = bytes(raw)
    if len(raw) < _HEADER.size:
        raise CorruptSampleError(f"{where}: detection target of {len(raw)} bytes is truncated")
    magic, layout, count, width, height, flags, image_id = _HEADER.unpack_from(raw)
    if magic != DETECTION_MAGIC or layout != DETECTION_LAYOUT:
        raise CorruptSampleError(f"{where}: not a detection target record (magic {magic!r}, layout {layout}); "
                                 "the dataset is damaged or newer than this fastdata")
    fixed = _HEADER.size + count * (8 + 8 + 16 + 4 + 1) + 4 * (count + 1)
    if len(raw) < fixed:
        raise CorruptSampleError(f"{where}: detection target of {count} annotations is truncated")
    at = _HEADER.size

    def take(dtype: str, items: int) -> np.ndarray:
        nonlocal at
        values = np.frombuffer(raw, dtype, items, at)
        at += values.nbytes
        return values

    ids, labels = take("<i8", count), take("<i8", count)
    boxes, areas = take("<f4", 4 * count).reshape(count, 4), take("<f4", count)
    offsets, iscrowd = take("<u4", count + 1), take("u1", count)
    rles = None
    if flags & _HAS_MASKS:
        if offsets[0] != 0 or np.any(np.diff(offsets.astype(np.int64)) < 0) or at + int(offsets[-1]) != len(raw):
            raise CorruptSampleError(f"{where}: detection target's mask offsets do not index its RLE bytes")
        rles = [raw[at + a:at + b] for a, b in itertools.pairwise(offsets.tolist())]
    elif at != len(raw):
        raise CorruptSampleError(f"{where}: detection target has {len(raw) - at} bytes past its arrays")
    return DetectionRecord(image_id, width, height, ids, labels, boxes, areas, iscrowd, rles)
