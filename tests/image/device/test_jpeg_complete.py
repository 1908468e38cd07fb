"""`complete`: whether a JPEG's last scan is followed by its end marker (the device path sends files cut short to
the workers). Its fast look at the file's tail must give the same answer as the definition, on every cut and
every kind of trailing data."""

from __future__ import annotations

import io

import pytest
from builders.images import encode, photo_like
from PIL import Image

from fastdata.image.device.ship import TAIL_BYTES, complete


def by_definition(data: bytes) -> bool:
    """An EOI after the file's last SOS (and an SOS at all)."""
    return data.rfind(b"\xff\xd9") > data.rfind(b"\xff\xda") >= 0


def with_thumbnail(array) -> bytes:
    """A JPEG whose EXIF carries a JPEG thumbnail (its own SOS and EOI, before the image's)."""
    thumbnail = encode(array[:32, :32], "JPEG")
    exif = Image.Exif()
    exif[0x010F] = "fastdata"
    out = io.BytesIO()
    Image.fromarray(array).save(out, "JPEG", exif=exif.tobytes() + thumbnail)
    return out.getvalue()


@pytest.mark.parametrize("kind", ["baseline", "progressive", "thumbnail"])
def test_the_tail_check_agrees_with_the_definition_on_every_cut_and_trailer(kind):
    array = photo_like(3, 96, 80)
    data = {"baseline": lambda: encode(array, "JPEG", quality=90),
            "progressive": lambda: encode(array, "JPEG", quality=90, progressive=True),
            "thumbnail": lambda: with_thumbnail(array)}[kind]()
    assert complete(data) and by_definition(data)
    variants = [data[:cut] for cut in range(0, len(data), max(1, len(data) // 300))]
    trailers = [b"\x00" * 10, b"\x00" * (TAIL_BYTES + 10), b"\xff\xda" + b"\x00" * 20,
                b"\x00" * (TAIL_BYTES + 5) + b"\xff\xda\x00", b"\xff\xd9" + b"\x00" * (2 * TAIL_BYTES)]
    variants += [data + trailer for trailer in trailers] + [data[:-2] + trailer for trailer in trailers]
    for variant in variants:
        assert complete(variant) == by_definition(variant), (len(variant), len(data))
    assert not complete(data[:-2]) and not complete(b"\xff\xd8\xff\xd9")
