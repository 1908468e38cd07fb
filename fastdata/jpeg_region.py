"""Region decoding of JPEGs: decode only the rows and columns a crop covers, at the smallest DCT scale that still
gives the output resolution (libjpeg-turbo's scaling, cropping and row skipping; see csrc/jpeg_region.c).

OpenCV, Pillow and torchvision decode whole images (OpenCV and Pillow can scale by 1/2, 1/4, 1/8 only). The
extension `fastdata._jpeg_region` drives libjpeg-turbo directly; it links nothing at build time and loads the
libjpeg-turbo that Pillow's wheel ships (or the system's). Before first use it proves itself: a probe image decoded
through it must equal OpenCV's decode bit for bit, or it is not used. `region_decoder()` returns None with the
reason in `unavailable_reason()` when the extension is not built or no usable library is found; callers then decode
with OpenCV.
"""

from __future__ import annotations

import ctypes.util
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.augment import CropParams, pixel_box, reduce_factor


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


def plan_region(width: int, height: int, params: CropParams, out_size: int) -> Region:
    """The part of a `width` x `height` JPEG to decode for the crop `params` (source pixels) that becomes
    `out_size` x `out_size`: the largest power-of-two DCT scale-down (1/2, 1/4, 1/8: libjpeg-turbo's SIMD IDCTs;
    3/8, 5/8, ... measured slower than a full-size decode) that leaves the crop at least `out_size` on both
    sides, and the whole pixels at that scale that the crop box touches."""
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
    """A loaded libjpeg-turbo: `decode(data, region, bgr)` -> uint8 (region.height, region.width, 3) array."""

    def __init__(self, module: Any, library: str) -> None:
        self._module = module
        self.library = library

    def decode(self, data: bytes | memoryview, region: Region, bgr: bool = False,
               out: np.ndarray | None = None) -> np.ndarray:
        """Decode `region` of the JPEG `data` (into `out` if given). Raises ValueError on corrupt data."""
        if out is None:
            out = np.empty((region.height, region.width, 3), np.uint8)
        elif out.dtype != np.uint8 or not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be a C-contiguous, writeable uint8 array of shape (H, W, 3)")
        self._module.decode_into(data, out, region.scale_num, region.left, region.top, bgr)
        return out

    def header(self, data: bytes | memoryview, scale_num: int = 8) -> tuple[int, int, int]:
        """(width, height, components) of the JPEG decoded at scale_num/8."""
        return self._module.header(data, scale_num)


def _library_candidates() -> list[str]:
    """libjpeg-turbo builds to try, best first: Pillow's bundled copy (SIMD, same on every machine), then the
    system's libjpeg."""
    found: list[str] = []
    try:
        import PIL

        package = Path(PIL.__file__).parent
        found += [str(p) for p in sorted(package.parent.glob("pillow.libs/libjpeg*.so*"))]  # manylinux wheels
        found += [str(p) for p in sorted(package.glob(".dylibs/libjpeg*.dylib"))]  # macOS wheels
    except ImportError:  # pragma: no cover - Pillow is a dependency
        pass
    system = ctypes.util.find_library("jpeg")
    if system:
        found.append(system)
    return found


def _probe_image() -> tuple[bytes, np.ndarray]:
    """A small 4:2:0 JPEG with detail everywhere, and OpenCV's decode of it (BGR)."""
    import cv2

    y, x = np.mgrid[0:61, 0:83]
    image = np.stack([(x * 7 + y * 3) % 256, (x * y) % 256, (x * 13 ^ y * 5) % 256], axis=2).astype(np.uint8)
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    data = encoded.tobytes()
    return data, cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_BGR)


@functools.cache
def _load() -> tuple[RegionDecoder | None, str]:
    try:
        from fastdata import _jpeg_region
    except ImportError as exc:
        return None, f"the C extension fastdata._jpeg_region is not built ({exc}); reinstall with a C compiler"
    candidates = _library_candidates()
    if not candidates:
        return None, "no libjpeg-turbo library found (looked in Pillow's wheel and the system's libraries)"
    reasons = []
    data, expected = _probe_image()
    for path in candidates:
        try:
            _jpeg_region.load(path)
            decoder = RegionDecoder(_jpeg_region, path)
            got = decoder.decode(data, Region(8, 0, 0, expected.shape[1], expected.shape[0]), bgr=True)
        except (OSError, ValueError) as exc:
            reasons.append(f"{path}: {exc}")
            continue
        if not np.array_equal(got, expected):
            reasons.append(f"{path}: decodes differently from OpenCV")
            continue
        return decoder, ""
    return None, "no usable libjpeg-turbo: " + "; ".join(reasons)


def region_decoder() -> RegionDecoder | None:
    """The process's region decoder (loaded and checked once), or None if unavailable."""
    return _load()[0]


def unavailable_reason() -> str:
    """Why `region_decoder()` is None ("" when it is available)."""
    return _load()[1]
