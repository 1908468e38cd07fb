"""A source sample's bytes -> a verified image record, in a conversion worker: check the header against the pixel
limit, decode to prove the image is whole (JPEGs at 1/8 scale: the entropy data is still read in full, so
truncation is caught at a fraction of the cost), and re-encode oversized images once (`--max-size`). Every source
kind uses it, whatever its reader (`fastdata.convert.sources`) read the bytes from.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastdata.formats.records import (
    DEFAULT_MAX_PIXELS,
    EXT_OF_FORMAT,
    ImageRecord,
    Label,
    codec_for,
    exception_text,
    pillow_pixels_checked,
)

if TYPE_CHECKING:
    from PIL import Image


@dataclass(frozen=True)
class EncodeOptions:
    """Per-image options of a conversion."""

    max_size: int | None = None  # re-encode images whose longer side exceeds this to JPEG
    quality: int = 90  # of every JPEG a conversion encodes (max_size, non_jpeg="jpeg")
    max_pixels: int = DEFAULT_MAX_PIXELS  # refuse larger images from their header, before any decoding
    jpeg_layout: str = "original"  # "restart": JPEG records rewritten with restart markers (convert.layout)
    non_jpeg: str = "keep"  # "jpeg": images that are not JPEGs stored as JPEGs (`NON_JPEG`)


#: What a conversion does with images that are not JPEGs (PNG, WebP, BMP, TIFF, GIF): "keep" their bytes
#: (lossless), or store them as "jpeg" at the conversion's quality (lossy, as FFCV's write_mode="jpg"): the pixels
#: the loader decodes from them, encoded once, so that decode="device" decodes every image on the GPU and its
#: workers decode none (decoding the sample photos' 3.7% PNGs took about 72% of such a worker's time:
#: benchmarks/device_cpu_side.py).
NON_JPEG = ("keep", "jpeg")


class _Refused(Exception):
    """An image refused on purpose (not a decoding failure)."""


def verify_record(data: bytes, relative_path: str, label: Label, options: EncodeOptions) -> ImageRecord:
    """Verify the bytes of sample `relative_path` (its key); return the record to store. Raises ValueError with the
    reason if they cannot be used: a reason that is the same on every run (it goes into the manifest)."""
    from PIL import Image

    if not data:
        raise ValueError("empty file")
    try:
        with pillow_pixels_checked(), Image.open(io.BytesIO(data)) as im:  # the limit is checked here
            fmt, mode, (width, height) = im.format, im.mode, im.size
            if width * height > options.max_pixels:
                raise _Refused(f"refused: {width}x{height} = {width * height:,} pixels exceeds the limit of "
                               f"{options.max_pixels:,} (--max-pixels); decompression bomb or unusually large image")
            if options.max_size is not None and max(width, height) > options.max_size:
                return _downscaled(im, relative_path, label, options)
            if fmt == "JPEG":  # a colour JPEG decoded to grey: libjpeg still entropy-decodes every component
                # (what proves the stream whole: the same files fail) but skips the chroma's IDCT and the colour
                # conversion, ~6% of the verification's CPU
                im.draft("L" if mode == "RGB" else mode, (max(1, width // 8), max(1, height // 8)))
            im.load()
    except _Refused as exc:
        raise ValueError(str(exc)) from None
    except Image.DecompressionBombError as exc:  # Pillow's own hard limit, checked while opening
        raise ValueError(f"refused: {exception_text(exc)} (--max-pixels cannot go above Pillow's limit)") from None
    except Exception as exc:  # Pillow raises many types for bad data
        raise ValueError(f"not a decodable image ({exception_text(exc)})") from exc
    codec = codec_for(fmt, mode)
    if options.non_jpeg == "jpeg" and fmt != "JPEG":
        return _as_jpeg(data, codec, relative_path, label, options)
    ext = EXT_OF_FORMAT.get(fmt or "", relative_path.rsplit(".", 1)[-1].lower())
    return ImageRecord(relative_path, data, ext, label, width, height, codec)


def _as_jpeg(data: bytes, codec: int, relative_path: str, label: Label, options: EncodeOptions) -> ImageRecord:
    """A verified non-JPEG image stored as a JPEG of the RGB pixels the loader decodes from it (`decode_rgb`, the
    loader's own decode: alpha dropped, 16-bit scaled to 8, the first frame), at `options.quality`."""
    from PIL import Image

    from fastdata.image.decode import decode_rgb

    try:
        pixels = decode_rgb(data, codec, max_pixels=options.max_pixels)
    except ValueError as exc:
        raise ValueError(f"not decodable by the loader ({exc})") from None
    return _jpeg_record(Image.fromarray(pixels), relative_path, label, options.quality)


def _jpeg_record(rgb: Image.Image, relative_path: str, label: Label, quality: int) -> ImageRecord:
    """The RGB PIL image `rgb` encoded once as the JPEG record of sample `relative_path`."""
    out = io.BytesIO()
    rgb.save(out, "JPEG", quality=quality)
    return ImageRecord(relative_path, out.getvalue(), "jpg", label, rgb.width, rgb.height, codec_for("JPEG", "RGB"))


def _downscaled(im: Image.Image, relative_path: str, label: Label, options: EncodeOptions) -> ImageRecord:
    """Re-encode an oversized image to JPEG with its longer side = max_size (FFCV's max_resolution)."""
    from PIL import Image

    width, height = im.size
    assert options.max_size is not None  # called for images larger than it
    scale = options.max_size / max(width, height)
    target = (max(1, round(width * scale)), max(1, round(height * scale)))
    if im.format == "JPEG":
        im.draft("RGB", target)  # DCT-domain downscale first: much less to decode
    rgb = im.convert("RGB").resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
    return _jpeg_record(rgb, relative_path, label, options.quality)
