"""The frame header (SOF segment) of a JPEG stream: coding process, sample precision and the components' sampling
factors, read by walking the marker segments up to it (a few hundred bytes, no decoding). The device path uses it
to tell in the worker which JPEGs nvjpeg takes; Pillow reads the same segment but keeps neither the coding
process nor the sampling factors."""

from __future__ import annotations

from dataclasses import dataclass

# SOFn markers: 0xC0..0xCF except DHT (C4), JPG (C8) and DAC (CC)
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}  # RSTn and TEM carry no length
_SOS, _EOI = 0xDA, 0xD9


@dataclass(frozen=True)
class JpegFrame:
    """What the SOF segment says: the marker (0xC0 baseline, 0xC1 extended sequential, 0xC2 progressive, 0xC3
    lossless, 0xC9.. arithmetic coding, ...), the bits per sample and each component's (horizontal, vertical)
    sampling factors, luma first."""

    marker: int
    precision: int
    sampling: tuple[tuple[int, int], ...]


def read_frame(data: bytes | memoryview) -> JpegFrame | None:
    """The frame header of the JPEG stream `data`, or None when it has none before the scan (not a JPEG, or
    truncated or damaged before its frame header)."""
    view = memoryview(data)
    if len(view) < 4 or view[0] != 0xFF or view[1] != 0xD8:
        return None
    pos = 2
    while pos + 4 <= len(view):
        if view[pos] != 0xFF:
            return None
        marker = view[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in (_SOS, _EOI):
            return None
        length = (view[pos + 2] << 8) | view[pos + 3]
        if marker in _SOF_MARKERS:
            segment = view[pos + 4:pos + 2 + length]
            if length < 8 or len(segment) < 6:
                return None
            components = segment[5]
            if len(segment) < 6 + 3 * components:
                return None
            sampling = tuple((segment[6 + 3 * c + 1] >> 4, segment[6 + 3 * c + 1] & 15) for c in range(components))
            return JpegFrame(marker, segment[0], sampling)
        pos += 2 + length
    return None
