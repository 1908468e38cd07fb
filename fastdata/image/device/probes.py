"""Whether the device's decoder may be given restart-layout sub-JPEGs (fastdata.image.device.ship), and whether a
decoder of the GPU's hardware JPEG engines alone decodes baseline JPEGs (`engines_failure`).

What the loader relies on is exactly this: in the loader's own batched call on the device's decoder, the sub-JPEG
of a region decodes, inside that region, to the same pixels as the rewritten whole file does on the same decoder.
(Not the same pixels as the original file: the rewrite makes progressive files baseline, and GPU decoders route
baseline and progressive streams to different code with different rounding; both are the decoder's own decode of
the same image.) `sub_jpeg_failure` checks it on probe JPEGs of every sampling kind a dataset may hold (4:2:0,
4:2:2, 4:4:4, 4:4:0, greyscale, progressive 4:2:0), with regions whose edges fall on, beside and inside MCU
boundaries; a kind the decoder takes neither whole nor as sub-JPEGs says nothing either way (such files go to the
CPU whole or cut). The feeder runs it once, on its own thread, after the workers have started; until it passes,
the workers ship whole files."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch

from fastdata.errors import FastdataError
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.decode import decode_rgb
from fastdata.image.device.decoders import BatchDecoder, decode_now
from fastdata.image.jpeg.region import region_decoder, unavailable_reason
from fastdata.image.jpeg.restart import edge_regions, rewrite, sub_jpeg_for

#: The device probes' kinds: (cv2 sampling factor name, progressive, greyscale).
DEVICE_PROBE_KINDS = {
    "4:2:0": ("420", False, False),
    "4:2:2": ("422", False, False),
    "4:4:4": ("444", False, False),
    "4:4:0": ("440", False, False),
    "grey": ("444", False, True),
    "progressive 4:2:0": ("420", True, False),
}


@functools.cache
def device_probes() -> tuple[tuple[str, bytes], ...]:
    """(kind, JPEG bytes) of 99 x 75 probes, one per DEVICE_PROBE_KINDS entry: waves of several frequencies and hard
    edges, so that every upsampling and edge path leaves its mark."""
    import cv2

    y, x = np.mgrid[0:75, 0:99]
    waves = [128 + 100 * np.sin(x * 0.3 + y * 0.11), 128 + 100 * np.cos(x * 0.07 - y * 0.4),
             128 + 60 * np.sin((x + y) * 0.9) + 40 * ((x // 9 + y // 7) % 2)]
    image = np.clip(np.stack(waves, axis=2), 0, 255).astype(np.uint8)
    found = []
    for kind, (sampling, progressive, grey) in DEVICE_PROBE_KINDS.items():
        options = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive),
                   cv2.IMWRITE_JPEG_SAMPLING_FACTOR, getattr(cv2, f"IMWRITE_JPEG_SAMPLING_FACTOR_{sampling}")]
        ok, encoded = cv2.imencode(".jpg", image[..., 0] if grey else image, options)
        if not ok:  # pragma: no cover - OpenCV encodes JPEG wherever it is installed
            raise RuntimeError(f"OpenCV could not encode the {kind} probe JPEG")
        found.append((kind, encoded.tobytes()))
    return tuple(found)


def sub_jpeg_failure(decoder: BatchDecoder) -> str:
    """Why `decoder` cannot be given sub-JPEGs ("" when it can): see the module's docstring."""
    libjpeg = region_decoder()
    if libjpeg is None:
        return f"no libjpeg-turbo to rewrite the probes: {unavailable_reason()}"
    for kind, data in device_probes():
        try:
            jpeg, index = rewrite(data, libjpeg, name=f"the {kind} probe")
        except FastdataError as exc:
            return f"the {kind} probe: {exc}"
        regions = edge_regions(index.width, index.height, index.mcu_width, index.mcu_height)
        subs = [sub_jpeg_for(jpeg, index, region) for region in regions]
        try:  # the loader's batched call: the whole file and every sub-JPEG together
            decoded = decode_now(decoder, [np.frombuffer(b, np.uint8) for b in [jpeg, *(s.data for s in subs)]])
        except Exception as exc:  # the decoder's own error: it cannot be relied on
            return f"the {kind} probe: {type(exc).__name__}: {exc}"
        whole, parts = decoded[0], decoded[1:]
        if whole is None and all(part is None for part in parts):
            continue  # a kind this decoder takes neither whole nor cut (the engines alone and 4:4:0, say): such
            # files are decoded on the CPU either way (the stage's rule for bytes the device returns nothing for)
        if whole is None or any(part is None for part in parts):
            return f"{decoder.name} could not decode the {kind} probe or one of its sub-JPEGs"
        whole = whole.cpu()
        for region, sub, part in zip(regions, subs, parts, strict=True):
            top, left = region.top - sub.top, region.left - sub.left
            got = part.cpu()[:, top:top + region.height, left:left + region.width]  # type: ignore[union-attr]  # all set
            expected = whole[:, region.top:region.top + region.height, region.left:region.left + region.width]
            if not torch.equal(got, expected):
                return (f"the {kind} probe's sub-JPEG of {region} decodes to other pixels than the whole rewritten "
                        f"file on {decoder.name}")
    return ""


#: The baseline kinds `engines_failure` probes: the subsamplings photos are stored with.
ENGINE_PROBE_KINDS = ("4:2:0", "4:2:2", "4:4:4", "grey")


def engines_failure(decoder: BatchDecoder) -> str:
    """Why `decoder` (nvImageCodec with the hardware backend alone) cannot be the device path's decoder of baseline
    JPEGs ("" when it can): the ENGINE_PROBE_KINDS probes, in one batched call, must each decode to the shape and,
    within 2 grey levels on average, the pixels of the CPU path's decode (`decode_rgb`). A GPU without JPEG engines
    returns nothing."""
    probes = [(kind, data) for kind, data in device_probes() if kind in ENGINE_PROBE_KINDS]
    try:
        decoded = decode_now(decoder, [np.frombuffer(data, np.uint8) for _, data in probes])
    except Exception as exc:  # the library's own error: the engines cannot be relied on
        return f"{decoder.name} failed on the probe JPEGs: {type(exc).__name__}: {exc}"
    for (kind, data), image in zip(probes, decoded, strict=True):
        if image is None:
            return f"{decoder.name} returned nothing for the {kind} probe JPEG"
        expected_chw = torch.from_numpy(decode_rgb(data, CODEC_CV_JPEG).transpose(2, 0, 1).copy())
        got = image.cpu()
        if got.shape != expected_chw.shape:
            return (f"{decoder.name} decoded the {kind} probe JPEG to {tuple(got.shape)}, not "
                    f"{tuple(expected_chw.shape)}")
        difference = (got.float() - expected_chw.float()).abs().mean().item()
        if difference > 2:
            return f"{decoder.name} decoded the {kind} probe JPEG {difference:.1f} grey levels from libjpeg on average"
    return ""


@functools.cache
def warn_whole_files(device: str, reason: str) -> None:
    """Say once per process that a restart-layout dataset's JPEGs go to the device whole."""
    warnings.warn(f"fastdata: decode='device' on {device} gets restart-layout JPEGs whole, not as the crop's "
                  f"sub-JPEG (same pixels, more bytes and decoding per image): {reason}", RuntimeWarning,
                  stacklevel=4)
