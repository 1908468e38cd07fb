"""Every "auto" of the device path, decided here and nowhere else, and the probes some are decided by.

- `device_for`: the device of `decode="device"`. Without `device=` it is the GPU ("cuda") where torch sees one;
  on a machine without one the loader refuses in one line (running the GPU path on the CPU would silently change
  the run's nature; `device="cpu"` asks for it explicitly, as CI does). A CUDA device that is not there (no GPU,
  or an index past the last) is refused at construction, naming what is.
- `placement`: `decode="auto"` decodes in the workers unless `fastdata tune --device cuda` measured the device
  path faster (the loader's layer looks that up); what `decode="device"` refuses (detection, segmentation, custom
  transforms, recipes with per-crop operations).
- `ships_progressive`: where progressive JPEGs are decoded: on the device, unless `progressive="workers"` or the
  backends asked for are the hardware engines alone (which refuse them): then the workers keep them.
- `make_decoder`: `DeviceDecodeOptions(decoder="auto")`: nvImageCodec on CUDA when it imports, torchvision's otherwise
  (said once on CUDA); on the CPU torchvision's.
- `device_decoder`: `DeviceDecodeOptions(backends="auto")` for the dataset and the GPU. The GPU's hardware JPEG engines
  take baseline JPEGs only; nvImageCodec's hybrid decoder takes progressive ones too, with its Huffman decoding on
  CPU threads and the rest on the GPU's SMs, beside the training step. Measured on an H200 (benchmarks/README.md,
  "GPU decode", decode only, the same 5,927 sample JPEGs): the engines alone decoded 14,749 img/s (refusing the 19
  progressive files), hardware + hybrid in one decoder 10,198, with 4 CPU threads each. So "auto" gives the engines
  alone where the decoder is sent baseline JPEGs only (`baseline_only`: the conversion recorded no progressive
  JPEG, as after `--jpeg-layout baseline` or `restart`, or `progressive="workers"` keeps them in the workers) and
  the engines decode probe JPEGs on this GPU (`engines_failure`; a GPU without them returns nothing, or the library
  refuses to make such a decoder); otherwise hardware + hybrid. An image the engines still refuse is decoded on the
  CPU beside the feeder (counted in `loader.device_rejected`, said once with how to give it to the hybrid decoder).
- `decoder_hints`: what nvImageCodec preallocates for (the batch size; a typical stored image's size).
- sub-JPEGs (`sub_jpeg_failure`): whether the device's decoder may be given restart-layout sub-JPEGs
  (fastdata.image.device.ship). What the loader relies on is exactly this: in the loader's own batched call on the
  device's decoder, the sub-JPEG of a region decodes, inside that region, to the same pixels as the rewritten whole
  file does on the same decoder. (Not the same pixels as the original file: the rewrite makes progressive files
  baseline, and GPU decoders route baseline and progressive streams to different code with different rounding;
  both are the decoder's own decode of the same image.) It is checked on probe JPEGs of every sampling kind a
  dataset may hold (4:2:0, 4:2:2, 4:4:4, 4:4:0, greyscale, progressive 4:2:0), with regions whose edges fall on,
  beside and inside MCU boundaries; a kind the decoder takes neither whole nor as sub-JPEGs says nothing either way
  (such files go to the CPU whole or cut). The feeder runs it once, on its decode thread, after the workers have
  started; until it passes, the workers ship whole files.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from fastdata.errors import ConfigError, FastdataError
from fastdata.formats.records import CODEC_CV_JPEG
from fastdata.image.decode import decode_rgb
from fastdata.image.device.decoders import BatchDecoder, TorchvisionDecoder, decode_now, nvimgcodec_missing
from fastdata.image.device.nvimgcodec import DecoderHints
from fastdata.image.device.options import AUTO, ENGINES_ALONE, DeviceDecodeOptions
from fastdata.image.device.ship import DECODE_MODES
from fastdata.image.jpeg.region import region_decoder, unavailable_reason
from fastdata.image.jpeg.restart import edge_regions, rewrite, sub_jpeg_for


def device_for(decode: str, device: torch.device | None) -> torch.device | None:
    """The device batches are delivered on (see the module's docstring): `device` as given, checked to exist when
    it is a CUDA device; for `decode="device"` without one, "cuda" where torch sees a GPU, else ConfigError."""
    if device is None and decode == "device":
        if not torch.cuda.is_available():
            raise ConfigError("decode='device' without device=: no CUDA GPU here (torch.cuda.is_available() is "
                              f"False; {_cuda_build()}); pass device='cpu' to run the device path on the CPU "
                              "(as tests do), or decode='worker'")
        return torch.device("cuda")
    if device is not None and device.type == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not available:
            raise ConfigError(f"device={str(device)!r}: no CUDA GPU here (torch.cuda.is_available() is False; "
                              f"{_cuda_build()}); devices available: 'cpu'")
        if device.index is not None and device.index >= available:
            raise ConfigError(f"device={str(device)!r}: this machine has {available} CUDA GPU"
                              f"{'s' * (available != 1)}: {', '.join(f'cuda:{i}' for i in range(available))}")
    return device


def _cuda_build() -> str:
    return f"torch {torch.__version__}, built for CUDA {torch.version.cuda}" if torch.version.cuda else \
        f"torch {torch.__version__} is built without CUDA"


def placement(decode: str, target_kind: str, preset: Any, per_sample: Any = ()) -> str:
    """"worker" or "device" for the loader's `decode` (see the module's docstring); `per_sample`: the recipe's
    operations that run on each crop (RandAugment, RandomErasing, ...), which only the workers run."""
    if decode not in DECODE_MODES:
        raise ConfigError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
    if target_kind in ("detection", "segmentation"):
        if decode == "device":
            raise ConfigError(f"decode='device' supports class labels and image-text pairs; {target_kind} "
                              "datasets decode in the workers (decode='worker' or 'auto')")
        return "worker"
    if decode == "device" and preset is None:
        raise ConfigError("decode='device' needs augment='train' or 'val'; custom transforms run on the CPU "
                          "(decode='worker')")
    if decode == "device" and per_sample:
        raise ConfigError(f"decode='device': {list(per_sample)} run on each crop in the workers (decode='worker'); "
                          "on the device path a recipe takes MixUp / CutMix only")
    return "worker" if decode == "auto" else decode


def ships_progressive(options: DeviceDecodeOptions) -> bool:
    """Whether the workers ship progressive JPEGs to the device (see the module's docstring)."""
    return options.progressive == "device" and options.backends != ENGINES_ALONE


def decoder_hints(batch_size: int, widths: np.ndarray | None = None, heights: np.ndarray | None = None
                  ) -> DecoderHints:
    """What the decoder preallocates for: `batch_size` images of the 95th percentile of the stored sizes (when the
    dataset records them: LMDB)."""
    if widths is None or heights is None or not len(widths):
        return DecoderHints(batch_size)
    return DecoderHints(batch_size, int(np.percentile(widths, 95)), int(np.percentile(heights, 95)))


def baseline_only(options: DeviceDecodeOptions, recorded_kinds: Mapping[str, int] | None) -> bool:
    """Whether the device decoder is sent baseline JPEGs only: progressive ones stay in the workers
    (`progressive="workers"`), or the conversion's count of stored images by GPU kind (the manifest's
    `stats["gpu_kinds"]`; None for an older dataset: not known) has none. The other kinds (PNG, CMYK, ...) are
    always decoded in the workers."""
    if options.progressive == "workers":
        return True
    return recorded_kinds is not None and int(recorded_kinds.get("progressive", 1)) == 0


def device_decoder(device: torch.device, options: DeviceDecodeOptions, baseline_only: bool,
                   make: Callable[..., BatchDecoder] | None = None, hints: DecoderHints | None = None
                   ) -> BatchDecoder:
    """`make(device, options)` with `backends="auto"` resolved (see the module's docstring); a decoder without
    backends (torchvision's) is made as asked. `hints`: what nvImageCodec preallocates for (`make_decoder`)."""
    if make is None:
        make = functools.partial(make_decoder, hints=hints)
    if options.backends != AUTO or not baseline_only:
        return make(device, options)
    try:
        engines = make(device, dataclasses.replace(options, backends=ENGINES_ALONE))
    except Exception as exc:  # the library refused the engines alone here (no JPEG engines on this GPU)
        failure = f"a decoder of the engines alone could not be made: {type(exc).__name__}: {exc}"
    else:
        if getattr(engines, "backends", None) != ENGINES_ALONE:  # not nvImageCodec: backends do not apply
            return engines
        failure = engines_failure(engines)
        if not failure:
            return engines
    _say_engines_failed(str(device), failure)
    return make(device, options)


@functools.cache
def _say_engines_failed(device: str, failure: str) -> None:
    warnings.warn(f"fastdata: decode='device' on {device}: the GPU's JPEG engines alone are not used for this "
                  f"dataset's baseline JPEGs ({failure}); nvImageCodec's hardware + hybrid decoder is "
                  "(DeviceDecodeOptions(backends='auto'); said once)", RuntimeWarning, stacklevel=4)


@functools.cache
def _say_torchvision_once(reason: str) -> None:
    warnings.warn("fastdata: decode='device' decodes with torchvision's decode_jpeg, which blocks the host around "
                  "each batch; NVIDIA nvImageCodec is several times faster on the same GPU: pip install "
                  f"'fastdata[gpu-cu13]' (CUDA 13; 'fastdata[gpu-cu12]' for CUDA 12) ({reason})", RuntimeWarning,
                  stacklevel=3)


def make_decoder(device: torch.device, options: DeviceDecodeOptions, hints: DecoderHints | None = None) -> BatchDecoder:
    """The decoder `options` asks for on `device`. "auto": nvImageCodec on CUDA when it imports, torchvision's
    otherwise (said once on CUDA); on the CPU always torchvision's (nvImageCodec needs an NVIDIA driver even for
    its CPU backend)."""
    if device.type != "cuda":
        if options.decoder == "nvimgcodec":
            raise ConfigError(f"DeviceDecodeOptions(decoder='nvimgcodec') needs a CUDA device, not {device}")
        return TorchvisionDecoder(device)
    if options.decoder == "torchvision":
        return TorchvisionDecoder(device)
    missing = nvimgcodec_missing()
    if not missing:
        from fastdata.image.device.nvimgcodec import NvImageCodecDecoder

        return NvImageCodecDecoder(device, options, hints)
    if options.decoder == "nvimgcodec":
        raise ConfigError(f"DeviceDecodeOptions(decoder='nvimgcodec'): nvImageCodec is not usable here ({missing}); "
                          "pip install 'fastdata[gpu-cu13]' (or gpu-cu12)")
    _say_torchvision_once(missing)
    return TorchvisionDecoder(device)


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
        assert whole is not None  # checked above: the whole probe decoded
        whole = whole.cpu()
        for region, sub, part in zip(regions, subs, parts, strict=True):
            top, left = region.top - sub.top, region.left - sub.left
            assert part is not None  # checked above: every sub-JPEG decoded
            got = part.cpu()[:, top:top + region.height, left:left + region.width]
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
