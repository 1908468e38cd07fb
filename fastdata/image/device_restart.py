"""`decode="device"` over a restart-layout dataset: the workers ship each rewritten JPEG's crop as the sub-JPEG of
the MCUs it covers (fastdata.image.restart) instead of the whole file, so the device decodes (and the bus carries)
about the crop's share of the image. Used only where the device's decoder has proved, on probe JPEGs, that a
sub-JPEG decodes to exactly the whole image's pixels inside it (`sub_jpeg_failure`); otherwise the whole files go,
as for any other layout, with one warning."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch

from fastdata.errors import FastdataError, UnsupportedJpegError
from fastdata.image.augment import CropParams, pixel_box
from fastdata.image.batch import EncodedSample
from fastdata.image.region import Region, probes, region_decoder, unavailable_reason
from fastdata.image.restart import build_index, edge_regions, rewrite, sub_jpeg_for

#: What a sub-JPEG replaces: (bytes, the crop box in its pixels (left, top, width, height), its (width, height)).
Shipped = tuple[bytes, tuple[float, float, float, float], tuple[int, int]]


def sub_jpeg_failure(decode: Callable[[bytes], torch.Tensor]) -> str:
    """Why `decode` (JPEG bytes -> CHW uint8 tensor, e.g. torchvision's decode_jpeg on the device) cannot be given
    sub-JPEGs ("" when it can): for each of the region decoder's probe JPEGs, rewritten with a restart marker
    after every MCU, regions whose edges fall on, beside and inside MCU boundaries must decode from their sub-JPEG
    exactly as the whole rewritten image does there."""
    decoder = region_decoder()
    if decoder is None:
        return f"no libjpeg-turbo to rewrite the probes: {unavailable_reason()}"
    for probe in probes():
        try:
            jpeg, index = rewrite(probe.data, decoder, name=f"the {probe.kind} probe")
            whole = decode(jpeg)
        except (FastdataError, RuntimeError, ValueError) as exc:
            return f"the {probe.kind} probe: {exc}"
        height, width = whole.shape[-2:]
        for region in edge_regions(width, height, index.mcu_width, index.mcu_height):
            sub = sub_jpeg_for(jpeg, index, region)
            try:
                part = decode(sub.data)
            except (RuntimeError, ValueError) as exc:
                return f"the {probe.kind} probe's sub-JPEG of {region}: {exc}"
            top, left = region.top - sub.top, region.left - sub.left
            got = part[:, top:top + region.height, left:left + region.width]
            expected = whole[:, region.top:region.top + region.height, region.left:region.left + region.width]
            if not torch.equal(got.cpu(), expected.cpu()):
                return (f"the {probe.kind} probe's sub-JPEG of {region} decodes to other pixels than the whole "
                        "image")
    return ""


@functools.cache
def warn_whole_files(device: str, reason: str) -> None:
    """Say once per process that a restart-layout dataset's JPEGs go to the device whole."""
    warnings.warn(f"fastdata: decode='device' on {device} gets restart-layout JPEGs whole, not as the crop's "
                  f"sub-JPEG (same pixels, more bytes and decoding per image): {reason}", RuntimeWarning,
                  stacklevel=4)


def ship_sub_jpeg(sample: EncodedSample, params: CropParams) -> Shipped | None:
    """The sub-JPEG of a rewritten JPEG that holds every pixel the device's crop of `params` reads (the box's
    covering pixels, as `device._crop_resize` slices them), the box moved into its pixels, and its size; None for
    a JPEG the conversion kept as it was (no restart marker per MCU), which goes whole."""
    try:
        index = build_index(sample.data, name=sample.key)
    except UnsupportedJpegError:
        return None
    x0, y0, x1, y1 = pixel_box(params.left, params.top, params.width, params.height, sample.width, sample.height,
                               cover=True)
    sub = sub_jpeg_for(sample.data, index, Region(8, x0, y0, x1 - x0, y1 - y0))
    box = (params.left - sub.left, params.top - sub.top, params.width, params.height)
    return sub.data, box, (sub.width, sub.height)

