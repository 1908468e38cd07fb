"""Restart-indexed JPEG storage: decode in proportion to the crop (issue 21).

A JPEG's entropy-coded data must be decoded from the start of the scan: every decoder pays for the rows above and
beside a crop. A JPEG rewritten losslessly (DCT coefficients copied, as `jpegtran -restart 1B` does) with a restart
marker after every MCU is instead a set of independently decodable pieces, and the pieces a crop covers behind a
header that says the crop's size form a valid JPEG of the crop, which decodes in time proportional to its area:

- `rewrite` does the rewrite through the libjpeg-turbo the region decoder loaded (csrc/jpeg_restart.c): baseline,
  Huffman tables optimised (smaller than the standard tables most sources use, which pays for most of the markers),
  APPn/COM markers (EXIF, ICC) kept. It refuses, with UnsupportedJpegError, what it does not handle: arithmetic
  coding, 12-bit, lossless, CMYK/YCCK, damaged entropy data (keep the original bytes).
- `RestartIndex` locates the pieces (`to_bytes`: about 1 byte per MCU) so that a loader never scans the file.
- `sub_jpeg_for` (a region planned on the whole image, at its DCT scale) and `crop_jpeg` (a box of pixels) pick
  the MCUs to decode, `assemble` builds their sub-JPEG (in C: the covered pieces of each row are one copy; restart
  markers renumbered, as RST0..7 must cycle; EOI), and `decode_region` decodes the planned region from it. Where
  chroma is subsampled the span gets one more MCU on a side the region comes within EDGE_GUARD pixels of, and at
  least MIN_SPAN pixels: libjpeg's chroma upsampling treats a sub-image's edges as image edges. So the region
  decodes bit for bit as from the whole image, at every DCT scale (tests/image/jpeg/test_restart_jpeg.py sweeps every
  edge position), and `self_check` proves a library on probe JPEGs before use, as the region decoder does.
"""

from __future__ import annotations

import functools
import struct
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.errors import CorruptSampleError, FastdataError, UnsupportedJpegError
from fastdata.formats.records import DEFAULT_MAX_PIXELS
from fastdata.image.jpeg.header import marker_segments, starts_as_jpeg
from fastdata.image.jpeg.region import Region, RegionDecoder, probes, region_decoder, scaled_size, unavailable_reason

INDEX_MAGIC = b"FDRI"
INDEX_VERSION = 1
# magic, version, encoding of the piece lengths, width, height, MCU width, MCU height (pixels), then byte
# positions in the JPEG: its SOF marker, the start and end of the APPn/COM run a sub-JPEG leaves out, the scan data
_INDEX_HEAD = struct.Struct("<4sBBHHBBIIII")
_ESCAPED_BYTES, _ESCAPE = 1, 255  # the lengths' encoding (the only one): bytes, 255 = the next uint32 after them

#: Pixels (at the decode's scale) from a sub-JPEG's edge within which its pixels may differ from the whole image's
#: where chroma is subsampled: twice the one pixel measured (fancy upsampling's one neighbour).
EDGE_GUARD = 2
#: The fewest pixels (at the decode's scale) a sub-JPEG spans in each direction, where the image has them: a
#: 2:1 subsampled component of 2 samples or less is upsampled by replication, not interpolation (jdsample.c).
MIN_SPAN = 5

_SOS, _EOI, _DRI, _COM, _APP0, _APP14 = 0xDA, 0xD9, 0xDD, 0xFE, 0xE0, 0xEE


@dataclass(frozen=True)
class RestartIndex:
    """Where the pieces of a JPEG with a restart marker after every MCU are: MCU `i` (row-major over the
    `columns` x `rows` grid of `mcu_width` x `mcu_height` pixels) is jpeg[offsets[i] : offsets[i + 1] - 2] (each
    piece is followed by its 2-byte RSTn marker, the last by EOI). A sub-JPEG's header is
    jpeg[:keep_until] + jpeg[tables_from:offsets[0]] (the APPn/COM segments between, EXIF and ICC, are not needed
    to decode) with the SOF segment at `sof_offset` patched to the sub-image's size."""

    width: int
    height: int
    mcu_width: int
    mcu_height: int
    sof_offset: int
    keep_until: int
    tables_from: int
    offsets: np.ndarray  # uint32, columns * rows + 1

    @property
    def columns(self) -> int:
        return -(-self.width // self.mcu_width)

    @property
    def rows(self) -> int:
        return -(-self.height // self.mcu_height)

    @property
    def margin_mcus(self) -> int:
        """MCUs of margin a sub-JPEG needs around a box to decode the box's pixels as the whole image does: none
        when the MCU is one 8x8 block (no chroma subsampling: every block decodes on its own), else one."""
        return 0 if (self.mcu_width, self.mcu_height) == (8, 8) else 1

    def to_bytes(self) -> bytes:
        """The stored form: a 28-byte head, each piece's length (its marker included) in one byte, 255 standing
        for "the next of the long lengths", then those (uint32 little-endian, in order). Pieces of 4:2:0 photos
        at quality 75-95 are mostly 20-200 bytes: one byte per MCU, about 2% of the JPEG (`build_index` scans
        a JPEG for them instead in about 20 us)."""
        lengths = np.diff(self.offsets.astype(np.int64))
        head = _INDEX_HEAD.pack(INDEX_MAGIC, INDEX_VERSION, _ESCAPED_BYTES, self.width, self.height,
                                self.mcu_width, self.mcu_height, self.sof_offset, self.keep_until, self.tables_from,
                                int(self.offsets[0]))
        return (head + np.minimum(lengths, _ESCAPE).astype(np.uint8).tobytes()
                + lengths[lengths >= _ESCAPE].astype("<u4").tobytes())

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, name: str = "JPEG") -> RestartIndex:
        """The index `to_bytes` wrote. Raises CorruptSampleError naming `name` when it is not one."""
        if len(data) < _INDEX_HEAD.size:
            raise CorruptSampleError(f"{name}: restart index of {len(data)} bytes is truncated: convert it again")
        magic, version, encoding, width, height, mcu_w, mcu_h, sof, keep, tables, scan = \
            _INDEX_HEAD.unpack_from(data)
        if magic != INDEX_MAGIC or version != INDEX_VERSION or encoding != _ESCAPED_BYTES or mcu_w % 8 or \
                mcu_h % 8 or not (width and height and mcu_w and mcu_h):
            raise CorruptSampleError(f"{name}: not a version-{INDEX_VERSION} restart index (magic {magic!r}, "
                                     f"version {version}): convert it again with this fastdata")
        count = -(-width // mcu_w) * -(-height // mcu_h)
        short = np.frombuffer(data, np.uint8, min(count, max(0, len(data) - _INDEX_HEAD.size)), _INDEX_HEAD.size)
        escaped = np.flatnonzero(short == _ESCAPE)
        expected = _INDEX_HEAD.size + count + 4 * len(escaped)
        if len(short) != count or len(data) != expected:
            raise CorruptSampleError(f"{name}: restart index has {len(data)} bytes, expected {expected} for "
                                     f"{count} MCUs: convert it again")
        offsets = np.empty(count + 1, np.uint32)
        offsets[0] = scan
        if len(escaped):
            lengths = short.astype(np.uint32)
            lengths[escaped] = np.frombuffer(data, "<u4", len(escaped), _INDEX_HEAD.size + count)
            np.cumsum(lengths, out=offsets[1:])
        else:
            np.cumsum(short, out=offsets[1:], dtype=np.uint32)
        offsets[1:] += np.uint32(scan)
        return cls(width, height, mcu_w, mcu_h, sof, keep, tables, offsets)


def segment_offsets(jpeg: bytes | memoryview) -> np.ndarray:
    """Where each restart segment of the JPEG's first scan starts, then 2 past the start of the marker ending the
    scan (uint32): the C extension's scan, or numpy's where it is not built (the same answer: in entropy-coded
    data 0xFF is followed by 0x00, 0xFF or a marker, so FF D0..D7 is always a restart marker). ValueError when
    the bytes have no scan."""
    extension = _extension()
    if extension is None:
        return _segment_offsets_numpy(jpeg)
    return np.frombuffer(extension.restart_scan(jpeg), np.uint32)


def _header_segments(view: bytes | memoryview) -> list[tuple[int, int, int]]:
    """(marker, start, end) of each marker segment up to and including SOS (ValueError where there is none)."""
    if not starts_as_jpeg(view):
        raise ValueError("not a JPEG (no SOI marker)")
    found = list(marker_segments(view))
    if not found or found[-1][0] != _SOS:
        raise ValueError("no scan (SOS marker) in the JPEG header")
    return found


def _segment_offsets_numpy(jpeg: bytes | memoryview) -> np.ndarray:
    start = _header_segments(jpeg)[-1][2]
    data = np.frombuffer(jpeg, np.uint8)[start:]
    markers = np.flatnonzero((data[:-1] == 0xFF) & (data[1:] != 0) & (data[1:] != 0xFF))
    restarts = markers[(data[markers + 1] & 0xF8) == 0xD0]
    end = markers[(data[markers + 1] & 0xF8) != 0xD0]
    last = end[0] + 2 if len(end) else len(data)
    restarts = restarts[restarts < last]
    return np.concatenate([[0], restarts + 2, [last]]).astype(np.uint32) + np.uint32(start)


def _droppable(marker: int, view: bytes | memoryview, start: int) -> bool:
    """APPn and COM segments a decoder does not need: all but a JFIF APP0 and an Adobe APP14 (libjpeg reads the
    colour space from those two)."""
    if marker == _COM or (0xE1 <= marker <= 0xEF and marker != _APP14):
        return True
    return marker == _APP0 and bytes(view[start + 4:start + 9]) != b"JFIF\0"


def build_index(jpeg: bytes | memoryview, offsets: np.ndarray | None = None, name: str = "JPEG") -> RestartIndex:
    """The index of a JPEG with a restart marker after every MCU (what `rewrite` writes), checked: one sequential
    Huffman scan of all components, restart interval 1, one piece per MCU, EOI at the end. `offsets` are the
    JPEG's `segment_offsets` where already known. Raises UnsupportedJpegError otherwise."""
    try:
        segments = _header_segments(jpeg)
    except ValueError as exc:
        raise UnsupportedJpegError(f"{name}: {exc}") from None
    size = len(jpeg)
    sof = [s for s in segments if s[0] in (0xC0, 0xC1)]
    dri = [s for s in segments if s[0] == _DRI and s[2] == s[1] + 6 <= size]
    problem = ""
    if not sof:
        problem = "no baseline or extended sequential Huffman frame"
    elif not dri or struct.unpack_from(">H", jpeg, dri[-1][1] + 4)[0] != 1:
        problem = "no restart marker after every MCU (restart interval 1)"
    if problem:
        raise UnsupportedJpegError(f"{name}: {problem}: rewrite it first (fastdata.image.jpeg.restart.rewrite)")
    sof_at, sof_end = sof[0][1], min(sof[0][2], size)
    components = jpeg[sof_at + 9] if sof_at + 10 <= sof_end else 0
    factors = [jpeg[sof_at + 11 + 3 * c] for c in range(components) if sof_at + 12 + 3 * c <= sof_end]
    scan_at = segments[-1][1]
    if len(factors) != components or not components or not all(f >> 4 in (1, 2, 3, 4) and f & 15 in (1, 2, 3, 4)
                                                               for f in factors):
        raise UnsupportedJpegError(f"{name}: a damaged frame header (SOF segment)")
    if scan_at + 5 > size or jpeg[scan_at + 4] != components:
        raise UnsupportedJpegError(f"{name}: the scan does not hold all {components} components: rewrite it first")
    height, width = struct.unpack_from(">HH", jpeg, sof_at + 5)
    if not (width and height):
        raise UnsupportedJpegError(f"{name}: a frame header of {width}x{height} pixels")
    h_max, v_max = (1, 1) if components == 1 else (max(f >> 4 for f in factors), max(f & 15 for f in factors))
    keep_until = tables_from = sof_at
    for k, (marker, start, _) in enumerate(segments):
        if _droppable(marker, jpeg, start):
            keep_until = start
            tables_from = start
            for marker_after, start_after, end_after in segments[k:]:
                if not _droppable(marker_after, jpeg, start_after):
                    break
                tables_from = end_after
            break
    if offsets is None:
        try:
            offsets = segment_offsets(jpeg)
        except ValueError as exc:
            raise UnsupportedJpegError(f"{name}: {exc}") from None
    index = RestartIndex(width, height, 8 * h_max, 8 * v_max, sof_at, keep_until, tables_from, offsets)
    expected = index.columns * index.rows + 1
    last = jpeg[int(offsets[-1]) - 1] if 0 < int(offsets[-1]) <= size else -1
    if len(offsets) != expected or offsets[0] != segments[-1][2] or last != _EOI:
        raise UnsupportedJpegError(f"{name}: {len(offsets) - 1} restart segments ending in marker 0x{last:02X}, "
                                   f"expected {expected - 1} (one per MCU) and EOI: rewrite it first")
    return index


def rewrite(data: bytes | memoryview, decoder: RegionDecoder | None = None, optimize: bool = True,
            max_pixels: int = DEFAULT_MAX_PIXELS, name: str = "JPEG") -> tuple[bytes, RestartIndex]:
    """The JPEG `data` rewritten losslessly with a restart marker after every MCU, and its index. `decoder` is the
    libjpeg-turbo to use (default: the process's region decoder). Raises UnsupportedJpegError for a JPEG it does
    not rewrite (keep the original), CorruptSampleError for bytes libjpeg cannot read or over `max_pixels`."""
    jpeg, offsets = _transcode(data, decoder, 1, optimize, max_pixels, name)
    return jpeg, build_index(jpeg, offsets, name)


def baseline_rewrite(data: bytes | memoryview, decoder: RegionDecoder | None = None,
                     max_pixels: int = DEFAULT_MAX_PIXELS, name: str = "JPEG") -> bytes:
    """The JPEG `data` rewritten losslessly as one baseline scan (DCT coefficients copied, Huffman tables
    optimised, no restart markers, APPn/COM kept): what `jpegtran -optimize` makes of a progressive file, for the
    GPU's hardware JPEG engines, which take baseline files only. Raises as `rewrite` does."""
    return _transcode(data, decoder, 0, True, max_pixels, name)[0]


def _transcode(data: bytes | memoryview, decoder: RegionDecoder | None, interval_mcus: int, optimize: bool,
               max_pixels: int, name: str) -> tuple[bytes, np.ndarray]:
    """`RegionDecoder.restart_rewrite` with its refusals as fastdata's errors (see `rewrite`)."""
    decoder = decoder or region_decoder()
    if decoder is None:
        raise FastdataError(f"no libjpeg-turbo for the lossless JPEG rewrite: {unavailable_reason()}")
    try:
        return decoder.restart_rewrite(data, interval_mcus, optimize, max_pixels)
    except NotImplementedError as exc:
        raise UnsupportedJpegError(f"{name}: {exc}: keep its original bytes") from None
    except ValueError as exc:
        raise CorruptSampleError(f"{name}: cannot be rewritten: {exc}") from None


def same_pixels(original: bytes | memoryview, rewritten: bytes | memoryview) -> bool:
    """Whether two JPEGs decode (OpenCV, full size, every channel as stored) to exactly the same pixels: the check
    a converter or `verify --decode` makes of a rewrite against its source."""
    import cv2

    def decode(data: bytes | memoryview) -> np.ndarray | None:
        return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)

    before, after = decode(original), decode(rewritten)
    return before is not None and after is not None and before.shape == after.shape and bool((before == after).all())


@dataclass(frozen=True)
class SubJpeg:
    """A JPEG of a rectangle of whole MCUs of a restart-indexed JPEG: `data`, and where its top-left pixel and
    size are in the whole image's pixels (`left` and `top` are multiples of the MCU size, hence of 8)."""

    data: bytes
    left: int
    top: int
    width: int
    height: int

    def region(self, region: Region) -> Region:
        """`region` (at its scale, in the whole image's pixels) in this sub-JPEG's pixels at that scale."""
        scale = region.scale_num
        return Region(scale, region.left - self.left * scale // 8, region.top - self.top * scale // 8,
                      region.width, region.height)


def assemble(jpeg: bytes | memoryview, index: RestartIndex, first_column: int, first_row: int, end_column: int,
             end_row: int) -> SubJpeg:
    """The sub-JPEG of the MCUs in columns [first_column, end_column) and rows [first_row, end_row): the header
    with the sub-image's size, the pieces row by row (each row's pieces are contiguous in the file: one copy),
    restart markers renumbered RST0..7 in turn, EOI. In the C extension (about 5 us) where it is built. Raises
    ValueError for a range outside the grid, or an index that does not match `jpeg`."""
    columns = index.columns
    if not (0 <= first_column < end_column <= columns and 0 <= first_row < end_row <= index.rows):
        raise ValueError(f"MCU columns [{first_column}, {end_column}) x rows [{first_row}, {end_row}) outside the "
                         f"{columns} x {index.rows} grid")
    mcu_w, mcu_h = index.mcu_width, index.mcu_height
    left, top = first_column * mcu_w, first_row * mcu_h
    width, height = min(end_column * mcu_w, index.width) - left, min(end_row * mcu_h, index.height) - top
    keep, tables = index.keep_until, index.tables_from
    sof = index.sof_offset if index.sof_offset < keep else index.sof_offset - (tables - keep)
    extension = _extension()
    if extension is not None:
        data = extension.restart_assemble(jpeg, index.offsets, columns, keep, tables, sof, first_column, first_row,
                                          end_column, end_row, width, height)
    else:
        data = _assemble_numpy(jpeg, index, first_column, first_row, end_column, end_row, sof, width, height)
    return SubJpeg(data, left, top, width, height)


@functools.cache
def _extension() -> Any:
    try:
        from fastdata.image import _jpeg_region
    except ImportError:
        return None
    return _jpeg_region


def _assemble_numpy(jpeg: bytes | memoryview, index: RestartIndex, first_column: int, first_row: int,
                    end_column: int, end_row: int, sof: int, width: int, height: int) -> bytes:
    """`assemble` without the C extension (about 10x slower)."""
    columns, offsets = index.columns, index.offsets
    keep, tables, scan = index.keep_until, index.tables_from, int(offsets[0])
    head_size = keep + scan - tables
    row_first = np.arange(first_row, end_row) * columns + first_column
    starts, ends = offsets[row_first], offsets[row_first + (end_column - first_column)]
    pieces = row_first[:, None] + np.arange(1, end_column - first_column + 1)
    if int(offsets[pieces].max()) > len(jpeg) or (np.diff(offsets[np.concatenate([row_first[:, None], pieces],
                                                                                  1)], axis=1) < 2).any():
        raise ValueError("the restart index does not match the JPEG")
    row_sizes = ends.astype(np.int64) - starts
    out = bytearray(head_size + int(row_sizes.sum()))
    view = memoryview(jpeg)
    out[:keep] = view[:keep]
    out[keep:head_size] = view[tables:scan]
    struct.pack_into(">HH", out, sof + 5, height, width)
    at = head_size
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        out[at:at + end - start] = view[start:end]
        at += end - start
    # the second byte of the marker after each piece: (piece end in the file) - 1, moved to its row's place in out
    shift = head_size + np.concatenate([[0], np.cumsum(row_sizes)[:-1]]) - starts
    marks = (offsets[pieces].astype(np.int64) - 1 + shift[:, None]).ravel()
    patch = np.frombuffer(out, np.uint8)
    if (patch[marks - 1] != 0xFF).any():
        raise ValueError("the restart index does not match the JPEG")
    patch[marks[:-1]] = 0xD0 + (np.arange(len(marks) - 1) & 7)
    patch[marks[-1]] = _EOI
    return bytes(out)


def _span(start: int, end: int, mcu: int, count: int, margin: int | None) -> tuple[int, int]:
    """The MCUs [first, end) covering pixels [start, end) of MCUs `mcu` pixels wide, `count` of them, with `margin`
    MCUs more on each side where there are any; or (margin None) one more on a side only where the pixels come
    within EDGE_GUARD pixels of the span's edge."""
    first, last = start // mcu, -(-end // mcu)
    if margin is None:
        return (first - (first > 0 and start - first * mcu < EDGE_GUARD),
                last + (last < count and last * mcu - end < EDGE_GUARD))
    return max(0, first - margin), min(count, last + margin)


def _widened(first: int, end: int, mcu: int, count: int, size: int, scale_num: int) -> tuple[int, int]:
    """[first, end) with MCUs added (left first) until the span is at least MIN_SPAN pixels at scale_num/8, or the
    whole `size`-pixel dimension: libjpeg upsamples chroma 2:1 by replication instead of interpolation where a
    component is 2 samples wide or less (and so would a sub-JPEG of the last, partial MCU column)."""
    while scaled_size(min(end * mcu, size) - first * mcu, scale_num) < MIN_SPAN and (first > 0 or end < count):
        first, end = (first - 1, end) if first > 0 else (first, end + 1)
    return first, end


def crop_jpeg(jpeg: bytes | memoryview, index: RestartIndex, left: int, top: int, width: int, height: int,
              margin_mcus: int | None = None) -> SubJpeg:
    """The sub-JPEG holding the box (left, top, width, height) of the whole image's pixels: with `margin_mcus`
    MCUs around it where the image has them, or by default what decoding the box's pixels exactly as the whole
    image does at full size needs (`sub_jpeg_for`)."""
    if width < 1 or height < 1 or left < 0 or top < 0 or left + width > index.width or top + height > index.height:
        raise ValueError(f"box {width}x{height} at ({left}, {top}) outside the {index.width}x{index.height} image")
    if margin_mcus is None:
        return sub_jpeg_for(jpeg, index, Region(8, left, top, width, height))
    first_column, end_column = _span(left, left + width, index.mcu_width, index.columns, margin_mcus)
    first_row, end_row = _span(top, top + height, index.mcu_height, index.rows, margin_mcus)
    return assemble(jpeg, index, first_column, first_row, end_column, end_row)


def sub_jpeg_for(jpeg: bytes | memoryview, index: RestartIndex, region: Region) -> SubJpeg:
    """The sub-JPEG that decodes `region` (planned on the whole image, e.g. by region.plan_region) exactly as the
    whole image does: the MCUs it covers at its scale (an MCU is mcu_width * scale_num / 8 pixels wide there),
    and, where chroma is subsampled, one more on a side where the region comes within EDGE_GUARD pixels of their
    edge (libjpeg's chroma upsampling treats a sub-image's edge as the image's, which changes its outermost pixel:
    measured one pixel at every scale and sampling, none where chroma is IDCT-scaled instead), and more while the
    span is under MIN_SPAN pixels."""
    scale = region.scale_num
    if not (region.left >= 0 and region.left + region.width <= scaled_size(index.width, scale)
            and region.top >= 0 and region.top + region.height <= scaled_size(index.height, scale)):
        raise ValueError(f"region {region} outside the {index.width}x{index.height} image at scale {scale}/8")
    if index.margin_mcus == 0:
        first_column, end_column = _span(region.left, region.left + region.width, index.mcu_width * scale // 8,
                                         index.columns, 0)
        first_row, end_row = _span(region.top, region.top + region.height, index.mcu_height * scale // 8,
                                   index.rows, 0)
    else:
        first_column, end_column = _widened(*_span(region.left, region.left + region.width,
                                                   index.mcu_width * scale // 8, index.columns, None),
                                            index.mcu_width, index.columns, index.width, scale)
        first_row, end_row = _widened(*_span(region.top, region.top + region.height, index.mcu_height * scale // 8,
                                             index.rows, None),
                                      index.mcu_height, index.rows, index.height, scale)
    return assemble(jpeg, index, first_column, first_row, end_column, end_row)


def decode_region(decoder: RegionDecoder, jpeg: bytes | memoryview, index: RestartIndex, region: Region,
                  bgr: bool = False, out: np.ndarray | None = None,
                  max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """`decoder.decode(jpeg, region)`'s pixels, decoded from the sub-JPEG of the MCUs the region covers only."""
    sub = sub_jpeg_for(jpeg, index, region)
    return decoder.decode(sub.data, sub.region(region), bgr, out, max_pixels)


def edge_regions(width: int, height: int, mcu_width: int, mcu_height: int) -> list[Region]:
    """Regions (scale 8, to be rescaled by the caller) of a `width` x `height` image whose edges fall where
    `sub_jpeg_for` decides about margins: on, one and two pixels past an MCU boundary, one pixel short of one, and
    the last pixel (in the last, possibly partial MCU)."""
    left, top = 2 * mcu_width, 2 * mcu_height
    found = [Region(8, width - 1, height - 1, 1, 1), Region(8, 0, 0, width, height)]
    for shift in (0, 1, 2):
        found.append(Region(8, min(left + shift, width - 1), min(top + shift, height - 1), 1, 1))
        found.append(Region(8, max(0, left - 1 - shift), max(0, top - 1 - shift),
                            min(mcu_width + 1, width - max(0, left - 1 - shift)),
                            min(mcu_height + 1, height - max(0, top - 1 - shift))))
    return found


def self_check(decoder: RegionDecoder) -> tuple[str, int]:
    """Prove the library `decoder` uses on the region decoder's probe JPEGs (region.probes: 4:2:0, 4:2:2, 4:4:4 and
    progressive 4:2:0, 99 x 75): each rewritten decodes to the original's pixels (OpenCV's) at every probe scale,
    and regions of it whose edges fall on, beside and inside MCU boundaries (`edge_regions`) decode from their
    sub-JPEGs bit for bit as the whole image does. Returns ("", cases) when all pass, else (the first failing
    case, cases checked until then): a library whose upsampling differs from the one measured is not used."""
    cases = 0
    for probe in probes():
        try:
            jpeg, index = rewrite(probe.data, decoder, name=f"the {probe.kind} probe")
        except FastdataError as exc:
            return str(exc), cases
        for scale_num, expected in probe.expected.items():
            height, width = expected.shape[:2]
            case = f"{probe.kind} JPEG at scale {scale_num}/8"
            whole = decoder.decode(jpeg, Region(scale_num, 0, 0, width, height))
            cases += 1
            if not np.array_equal(whole, expected):
                return f"{case}: the rewritten JPEG decodes to other pixels than the original", cases
            mcu_w, mcu_h = index.mcu_width * scale_num // 8, index.mcu_height * scale_num // 8
            for region in edge_regions(width, height, mcu_w, mcu_h):
                region = Region(scale_num, region.left, region.top, region.width, region.height)
                got = decode_region(decoder, jpeg, index, region)
                cases += 1
                if not np.array_equal(got, whole[region.top:region.top + region.height,
                                                  region.left:region.left + region.width]):
                    return f"{case}: the sub-JPEG of {region} decodes to other pixels than the whole image", cases
    return "", cases


@functools.cache
def restart_failure(decoder: RegionDecoder) -> str:
    """Why sub-JPEG decoding cannot be used with `decoder` ("" when it can): its `self_check`, run once per process
    and library (a few ms)."""
    return self_check(decoder)[0]


@functools.cache
def warn_restart_fallback(library: str, reason: str) -> None:
    """Say once per process (and reason) that a restart-layout dataset's JPEGs are decoded by region from the whole
    file, as an original-layout dataset's are: the same pixels, more entropy decoding per image."""
    warnings.warn(f"fastdata: restart-layout JPEGs are decoded by region from the whole file, not from the crop's "
                  f"sub-JPEG (same pixels, more decoding work per image): {library} failed the restart self-check: "
                  f"{reason}", RuntimeWarning, stacklevel=4)
