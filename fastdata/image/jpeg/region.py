"""Region decoding of JPEGs: decode only the rows and columns a crop covers, at the smallest DCT scale that still
gives the output resolution (libjpeg-turbo's scaling, cropping and row skipping; see csrc/jpeg_region.c).

OpenCV, Pillow and torchvision decode whole images (OpenCV and Pillow can scale by 1/2, 1/4, 1/8 only). The
extension `fastdata.image._jpeg_region` drives libjpeg-turbo directly; it links nothing at build time and loads the
libjpeg-turbo Pillow uses (fastdata.image.jpeg.library says where it is looked for). Before first use a library proves
itself (`self_check`): probe JPEGs in 4:2:0, 4:2:2, 4:4:4 and progressive 4:2:0, decoded at every scale it is used
at (8/8, 4/8, 2/8, 1/8) whole and by regions that need column cropping and row skipping, must equal OpenCV's decode
at that scale, cropped, bit for bit; a library failing any case is not used, and the reason names the case.
`region_decoder()` returns None with the reason in `unavailable_reason()` when the extension is not built or no
library passes; callers then decode whole images with OpenCV and say so once (`warn_fallback`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np

from fastdata.formats.records import DEFAULT_MAX_PIXELS
from fastdata.image.geometry import CropParams, ImageSize, pixel_box, reduce_factor
from fastdata.image.jpeg.extension import extension_built, not_built_message
from fastdata.image.jpeg.library import default_candidates
from fastdata.image.opencv import opencv_decode


@dataclass(frozen=True)
class Region:
    """What to decode for one crop: the scale (scale_num/8) and the box in the scaled image's pixels."""

    scale_num: int
    left: int
    top: int
    width: int
    height: int


def scaled_size(size: int, scale_num: int) -> int:
    """libjpeg's output size of a `size`-pixel dimension at scale scale_num/8 (rounded up)."""
    return -(-size * scale_num // 8)


def plan_region(width: int, height: int, params: CropParams, out_size: ImageSize) -> Region:
    """The part of a `width` x `height` JPEG to decode for the crop `params` (source pixels) that becomes
    `out_size` (a side, or (height, width)): the largest power-of-two DCT scale-down (1/2, 1/4, 1/8:
    libjpeg-turbo's SIMD IDCTs; 3/8, 5/8, ... measured slower than a full-size decode) that leaves the crop at
    least `out_size`, and the whole pixels at that scale that the crop box touches."""
    scale_num = 8 // reduce_factor(params, out_size)
    scaled_w, scaled_h = scaled_size(width, scale_num), scaled_size(height, scale_num)
    factor = scale_num / 8
    x0, y0, x1, y1 = pixel_box(params.left * factor, params.top * factor, params.width * factor,
                               params.height * factor, scaled_w, scaled_h, cover=True)
    return Region(scale_num, x0, y0, x1 - x0, y1 - y0)


def box_in_region(params: CropParams, region: Region) -> tuple[float, float, float, float]:
    """The crop box `params` (source pixels) in the pixels of the decoded `region`: (left, top, width, height)."""
    factor = region.scale_num / 8
    return (params.left * factor - region.left, params.top * factor - region.top,
            params.width * factor, params.height * factor)


class RegionDecoder:
    """A loaded libjpeg-turbo: `decode(data, region, bgr)` -> uint8 (region.height, region.width, 3) array.
    `proof` says what its self-check decoded, and how long that took."""

    def __init__(self, module: Any, api: Any, library: str) -> None:
        self._module = module
        self._api = api  # the library's resolved entry points (a capsule from _jpeg_region.load)
        self.library = library
        self.proof = ""

    def decode(self, data: bytes | memoryview, region: Region, bgr: bool = False, out: np.ndarray | None = None,
               max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
        """Decode `region` of the JPEG `data` (into `out` if given). Raises ValueError on corrupt data, and before
        decoding anything when the JPEG header's own width x height is over `max_pixels`."""
        if out is None:
            out = np.empty((region.height, region.width, 3), np.uint8)
        elif out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be a C-contiguous, writeable uint8 array of shape (H, W, 3)")
        self._module.decode_into(self._api, data, out, region.scale_num, region.left, region.top, bgr, max_pixels)
        return out

    def restart_rewrite(self, data: bytes | memoryview, interval_mcus: int = 1, optimize: bool = True,
                        max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[bytes, np.ndarray]:
        """The JPEG `data` rewritten losslessly with a restart marker every `interval_mcus` MCUs (baseline,
        Huffman tables optimised if `optimize`), and where each restart segment starts then 2 past the start of
        EOI (uint32). Raises NotImplementedError for a JPEG it does not rewrite, ValueError for unreadable bytes
        (fastdata.image.jpeg.restart.rewrite turns both into fastdata errors)."""
        jpeg, offsets = self._module.restart_rewrite(self._api, data, interval_mcus, optimize, max_pixels)
        return jpeg, np.frombuffer(offsets, np.uint32)

    def header(self, data: bytes | memoryview, scale_num: int = 8) -> tuple[int, int, int]:
        """(width, height, components) of the JPEG decoded at scale_num/8."""
        return self._module.header(self._api, data, scale_num)


#: What the self-check decodes: chroma sampling (OpenCV's IMWRITE_JPEG_SAMPLING_FACTOR_*) and progressive, per kind
#: (4:2:0 and progressive exercise libjpeg-turbo's context-row upsampling when skipping rows, the case its own
#: history had bugs in).
PROBE_KINDS = {
    "4:2:0": ("420", False),
    "4:2:2": ("422", False),
    "4:4:4": ("444", False),
    "progressive 4:2:0": ("420", True),
}
PROBE_SCALES = (8, 4, 2, 1)  # the scales plan_region uses


@dataclass(frozen=True)
class Probe:
    """One probe JPEG and OpenCV's decode of it (RGB) at each scale_num of PROBE_SCALES."""

    kind: str
    data: bytes
    expected: dict[int, np.ndarray]


@functools.cache
def probes() -> tuple[Probe, ...]:
    """The self-check's JPEGs: 99 x 75 (no side a multiple of an iMCU), waves of several frequencies and hard
    edges in every block, so that every IDCT, upsampling and edge path leaves its mark on the pixels, yet small
    and smooth enough to entropy-decode quickly (that, not the IDCT, is most of a small decode's time). Encoded
    with OpenCV, which the pipeline imports anyway (Pillow's first save imports all its plugins: about 20 ms)."""
    import cv2

    y, x = np.mgrid[0:75, 0:99]
    waves = [128 + 100 * np.sin(x * 0.3 + y * 0.11), 128 + 100 * np.cos(x * 0.07 - y * 0.4),
             128 + 60 * np.sin((x + y) * 0.9) + 40 * ((x // 9 + y // 7) % 2)]
    image = np.clip(np.stack(waves, axis=2), 0, 255).astype(np.uint8)
    found = []
    for kind, (sampling, progressive) in PROBE_KINDS.items():
        options = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive),
                   cv2.IMWRITE_JPEG_SAMPLING_FACTOR, getattr(cv2, f"IMWRITE_JPEG_SAMPLING_FACTOR_{sampling}")]
        ok, encoded = cv2.imencode(".jpg", image, options)
        if not ok:  # pragma: no cover - OpenCV encodes JPEG wherever it is installed
            raise RuntimeError(f"OpenCV could not encode the {kind} probe JPEG")
        data = encoded.tobytes()
        found.append(Probe(kind, data, {s: opencv_decode(data, 8 // s) for s in PROBE_SCALES}))
    return tuple(found)


def probe_boxes(width: int, height: int, scale_num: int) -> list[tuple[int, int, int, int]]:
    """Boxes (left, top, width, height) of a `width` x `height` image decoded at scale_num/8 whose decode needs both
    column cropping (jpeg_crop_scanline: the box starts right of column 1) and row skipping (jpeg_skip_scanlines:
    it starts below row 0, across whole iMCU rows and then part of one): one in the middle, starting on an iMCU
    column boundary of 2x horizontally subsampled chroma (where the crop would start at the box's own edge, were
    it not for the column of margin the decoder keeps) and ending above the last row, and one from an odd column
    to the bottom-right corner."""
    imcu_width = 2 * scale_num
    left, top = (width - max(1, width // 4)) | 1, height - max(1, height // 4)
    return [(max(imcu_width, width // 3 // imcu_width * imcu_width), height // 3 | 1, max(1, width // 3),
             max(1, height // 3)),
            (left, top, width - left, height - top)]


def self_check(decoder: RegionDecoder) -> tuple[str, int]:
    """Decode every probe at every scale whole and by `probe_boxes`, and compare bit for bit: the whole decode
    with OpenCV's at that scale (the fallback's pixels), each region with the whole decode cropped. Returns
    ("", cases) when all pass, else (the first failing case, cases checked until then)."""
    cases = 0
    for probe in probes():
        for scale_num, expected in probe.expected.items():
            height, width = expected.shape[:2]
            case = f"{probe.kind} JPEG at scale {scale_num}/8"
            try:
                whole = decoder.decode(probe.data, Region(scale_num, 0, 0, width, height))
                cases += 1
                if not np.array_equal(whole, expected):
                    return f"{case}: the whole-image decode differs from OpenCV's", cases
                for left, top, box_w, box_h in probe_boxes(width, height, scale_num):
                    got = decoder.decode(probe.data, Region(scale_num, left, top, box_w, box_h))
                    cases += 1
                    if not np.array_equal(got, whole[top:top + box_h, left:left + box_w]):
                        return (f"{case}: the {box_w}x{box_h} region at ({left}, {top}) differs from the "
                                "whole-image decode cropped", cases)
            except ValueError as exc:
                return f"{case}: {exc}", cases
    return "", cases


def load_region_decoder(libraries: Iterable[str]) -> tuple[RegionDecoder | None, str]:
    """The first of `libraries` (tried in order, no further) that loads and passes `self_check`, or None and why
    each one was refused."""
    try:
        from fastdata.image import _jpeg_region
    except ImportError as exc:  # not there (not built: what to install), or there but not loadable (why)
        if not extension_built():
            return None, not_built_message()
        return None, f"the C extension fastdata.image._jpeg_region does not load ({exc}); reinstall fastdata"
    reasons = []
    probes()  # built once (a few ms), outside the self-check's timing
    for path in libraries:
        try:
            decoder = RegionDecoder(_jpeg_region, _jpeg_region.load(path), path)
        except OSError as exc:
            reasons.append(f"{path}: {exc}")
            continue
        started = perf_counter()
        failure, cases = self_check(decoder)
        if failure:
            reasons.append(f"{path}: failed its self-check: {failure}")
            continue
        decoder.proof = f"{cases} decodes bit-exact in {(perf_counter() - started) * 1e3:.1f} ms"
        return decoder, ""
    if not reasons:
        return None, "no libjpeg-turbo library found (looked at Pillow's and the system's libraries)"
    return None, "no usable libjpeg-turbo: " + "; ".join(reasons)


@functools.cache
def _load(libraries: tuple[str, ...] | None) -> tuple[RegionDecoder | None, str]:
    return load_region_decoder(default_candidates() if libraries is None else libraries)


def region_decoder(libraries: tuple[str, ...] | None = None) -> RegionDecoder | None:
    """The process's region decoder (loaded and checked once), or None if unavailable. `libraries` replaces the
    discovered candidates (fastdata.image.jpeg.library) with these, tried in order."""
    return _load(libraries)[0]


def unavailable_reason(libraries: tuple[str, ...] | None = None) -> str:
    """Why `region_decoder(libraries)` is None ("" when it is available)."""
    return _load(libraries)[1]


#: what `warn_fallback` says (after "fastdata: ")
FALLBACK = "JPEGs are decoded whole with OpenCV, not by crop region"


@functools.cache
def warn_fallback(reason: str) -> None:
    """Say once per process (and reason) that JPEGs are decoded whole with OpenCV because no region decoder is
    available: the same pixels, but every pixel of every image is decoded."""
    warnings.warn(f"fastdata: {FALLBACK} (same pixels, more decoding work per image; `fastdata doctor` checks this): "
                  f"{reason}", RuntimeWarning, stacklevel=4)
