"""The frame header (SOF segment) of a JPEG stream: coding process, sample precision and the components' sampling
factors, read by walking the marker segments up to it (a few hundred bytes, no decoding). The device path uses it
to tell in the worker which JPEGs nvjpeg takes; Pillow reads the same segment but keeps neither the coding
process nor the sampling factors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

# SOFn markers: 0xC0..0xCF except DHT (C4), JPG (C8) and DAC (CC)
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_NO_LENGTH = frozenset({0x01, 0xD8, *range(0xD0, 0xD8)})  # TEM, SOI, RST0-7: markers without a length field
_SOS, _EOI = 0xDA, 0xD9
BASELINE, PROGRESSIVE = 0xC0, 0xC2
# The chroma subsamplings NVIDIA's JPEG decoders take for a 3-component JPEG: luma (horizontal, vertical) sampling
# factors with both chroma components at (1, 1): 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1, 4:1:0
_GPU_LUMA_SAMPLING = frozenset({(1, 1), (2, 1), (2, 2), (1, 2), (4, 1), (4, 2)})

#: How a stored image meets the GPU's decoders (`gpu_kind`): "baseline" 8-bit Huffman JPEGs, which the hardware
#: JPEG engines decode; "progressive" 8-bit JPEGs, which only the CUDA/hybrid decoders take; "other_jpeg" (CMYK,
#: 12-bit, arithmetic-coded or lossless JPEGs, unusual subsampling, no readable frame header) and "not_jpeg" (PNG,
#: ...), which are decoded on the CPU.
GPU_KINDS = ("baseline", "progressive", "other_jpeg", "not_jpeg")


@dataclass(frozen=True)
class JpegFrame:
    """What the SOF segment says: the marker (0xC0 baseline, 0xC1 extended sequential, 0xC2 progressive, 0xC3
    lossless, 0xC9.. arithmetic coding, ...), the bits per sample, the image's width and height, and each
    component's (horizontal, vertical) sampling factors, luma first."""

    marker: int
    precision: int
    width: int
    height: int
    sampling: tuple[tuple[int, int], ...]


def marker_segments(view: bytes | memoryview) -> Iterator[tuple[int, int, int]]:
    """(marker, start, end) of each marker segment with a length of the JPEG stream `view`, in order, up to and
    including the first SOS: the one marker walk of fastdata (the frame header here, the restart layout's header
    in `fastdata.image.jpeg.restart`). Like libjpeg, stray bytes and fill bytes before a marker are passed over and
    markers without a length (SOI, TEM, RST0-7) are stepped over; the walk stops at EOI or where the bytes end. The
    caller checks the SOI."""
    size = len(view)
    pos = 2
    while pos + 4 <= size:
        marker = view[pos + 1]
        if view[pos] != 0xFF or marker == 0xFF:  # extraneous bytes before a marker (libjpeg skips them), fill bytes
            pos += 1
            continue
        if marker in _NO_LENGTH:
            pos += 2
            continue
        if marker == _EOI:
            return
        end = pos + 2 + ((view[pos + 2] << 8) | view[pos + 3])
        yield marker, pos, end
        if marker == _SOS:
            return
        pos = end


def starts_as_jpeg(view: bytes | memoryview) -> bool:
    """Whether the bytes begin with a JPEG's SOI marker (and hold at least a marker after it)."""
    return len(view) >= 4 and view[0] == 0xFF and view[1] == 0xD8


def read_frame(data: bytes | memoryview) -> JpegFrame | None:
    """The frame header of the JPEG stream `data`, or None when it has none before the scan (not a JPEG, or
    truncated or damaged before its frame header)."""
    view = data if isinstance(data, bytes) else memoryview(data)
    if not starts_as_jpeg(view):
        return None
    for marker, start, end in marker_segments(view):
        if marker == _SOS:
            return None
        if marker in _SOF_MARKERS:
            segment = view[start + 4:end]
            if end - start - 2 < 8 or len(segment) < 6:
                return None
            components = segment[5]
            if len(segment) < 6 + 3 * components:
                return None
            sampling = tuple((segment[6 + 3 * c + 1] >> 4, segment[6 + 3 * c + 1] & 15) for c in range(components))
            height, width = (segment[1] << 8) | segment[2], (segment[3] << 8) | segment[4]
            return JpegFrame(marker, segment[0], width, height, sampling)
    return None


def gpu_kind(frame: JpegFrame | None) -> str:
    """Which of GPU_KINDS a JPEG with frame header `frame` is (None: no readable frame header, "other_jpeg").

    NVIDIA's hardware JPEG engines (A100, H100, H200, ...) take baseline 8-bit Huffman-coded JPEGs only; its
    CUDA and hybrid decoders also take progressive ones. Both need greyscale or a YCbCr subsampling they know."""
    if frame is None or frame.precision != 8 or frame.marker not in (BASELINE, PROGRESSIVE):
        return "other_jpeg"
    sampling = frame.sampling
    if len(sampling) != 1 and not (len(sampling) == 3 and sampling[1] == sampling[2] == (1, 1)
                                   and sampling[0] in _GPU_LUMA_SAMPLING):
        return "other_jpeg"
    return "baseline" if frame.marker == BASELINE else "progressive"


def progressive(data: bytes | memoryview) -> bool:
    """Whether `data` is a progressive JPEG (its frame header says so; a few hundred bytes read)."""
    frame = read_frame(data)
    return frame is not None and frame.marker == PROGRESSIVE


def image_gpu_kind(data: bytes | memoryview) -> str:
    """Which of GPU_KINDS a stored image's bytes are: "not_jpeg" unless they start as a JPEG does, else
    `gpu_kind` of their frame header."""
    if len(data) < 2 or data[0] != 0xFF or data[1] != 0xD8:
        return "not_jpeg"
    return gpu_kind(read_frame(data))
