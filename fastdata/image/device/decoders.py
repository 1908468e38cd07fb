"""The JPEG decoders of the device path, behind one protocol (`BatchDecoder`), and which one a loader gets.

- `NvImageCodecDecoder`: NVIDIA nvImageCodec (pip `nvidia-nvimgcodec-cu13` or `-cu12`, fastdata's `gpu-cu13` /
  `gpu-cu12` extras), the library DALI decodes with: one batched call that returns once the work is queued on the
  stream (the GIL released meanwhile), the GPU's hardware JPEG engines mixed with a hybrid CPU+GPU decoder by a load
  hint, region decoding, images handed to torch through DLPack without a copy (`fastdata.image.device.nvimgcodec`).
- `TorchvisionDecoder`: torchvision's `decode_jpeg` (nvjpeg on CUDA, libjpeg on the CPU: how CI runs this path).
  On CUDA it blocks the host around each call and holds a process-wide lock; used where nvImageCodec is not
  installed, said once with how to install it.

A decoder returns, for each payload, a CHW uint8 RGB tensor on its device (queued on the current stream) or None
where it could not decode those bytes; the caller decides what a None means (fastdata.image.device.policy).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from fastdata.errors import ConfigError

#: Decoders `DeviceDecode(decoder=...)` names.
DECODERS = ("auto", "nvimgcodec", "torchvision")
#: nvImageCodec's JPEG backends by the names `DeviceDecode(backends=...)` takes.
BACKENDS = ("hardware", "hybrid", "gpu", "cpu")


@dataclass(frozen=True)
class DeviceDecode:
    """How `decode="device"` decodes: `decoder` ("auto": nvImageCodec when installed, else torchvision's, said
    once), nvImageCodec's `backends` in order of preference ("hardware": the GPU's JPEG engines, baseline JPEGs
    only; "hybrid": Huffman on CPU threads, the rest on the GPU; "gpu"; "cpu"), the share of each batch offered
    to the hardware engines (`hardware_load`, 0..1; None: nvImageCodec's own balance), the CPU threads
    nvImageCodec may use (`cpu_threads`; it would otherwise take all cores but one, which the workers need), and
    `regions`: decode only each crop's covering pixels where the decoder can (nvImageCodec; off by default:
    nvImageCodec 0.9's hardware and hybrid backends do not decode these regions, see
    fastdata.image.device.nvimgcodec). With "hardware" and another backend and no `hardware_load`, baseline JPEGs
    go to the hardware engines and the rest to the other backends (two decoders). `slots`: the output
    batches preallocated on the device (fastdata.image.device.ring): the one in use, the one before it, and the
    rest made ahead of the training step. `sub_jpegs`: over a restart-layout dataset, ship each crop as its
    sub-JPEG once the decoder has proved it decodes them to the rewritten file's pixels (fastdata.image.device.probes).
    """

    decoder: str = "auto"
    backends: tuple[str, ...] = ("hardware", "hybrid")
    hardware_load: float | None = None
    cpu_threads: int = 4
    regions: bool = False
    slots: int = 4
    sub_jpegs: bool = True

    def __post_init__(self) -> None:
        if self.decoder not in DECODERS:
            raise ConfigError(f"DeviceDecode(decoder=...) must be one of {DECODERS}, got {self.decoder!r}")
        backends = (self.backends,) if isinstance(self.backends, str) else tuple(self.backends)
        unknown = [b for b in backends if b not in BACKENDS]
        if not backends or unknown:
            raise ConfigError(f"DeviceDecode(backends=...) takes one or more of {BACKENDS}, got {self.backends!r}")
        object.__setattr__(self, "backends", backends)
        if self.hardware_load is not None and not 0 <= self.hardware_load <= 1:
            raise ConfigError(f"DeviceDecode(hardware_load=...) is a share of each batch, 0..1, got "
                              f"{self.hardware_load!r}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 3:
            raise ConfigError(f"DeviceDecode(slots=...) must be a whole number of at least 3, got {self.slots!r}")
        if isinstance(self.cpu_threads, bool) or not isinstance(self.cpu_threads, int) or self.cpu_threads < 1:
            raise ConfigError(f"DeviceDecode(cpu_threads=...) must be a positive whole number, got "
                              f"{self.cpu_threads!r}")


class BatchDecoder(Protocol):
    """Decodes a batch of JPEGs onto one device."""

    name: str  # what it is, for messages, the meter and `fastdata doctor` ("nvimgcodec 0.9.0 (hardware, hybrid)")
    device: torch.device
    regions: bool  # whether `decode` takes regions

    def decode(self, payloads: Sequence[np.ndarray],
               regions: Sequence[tuple[int, int, int, int]] | None = None) -> list[torch.Tensor | None]:
        """CHW uint8 RGB tensors on `device` (work queued on the current stream), None for the payloads it could
        not decode; `regions` (x0, y0, x1, y1 per payload) when `self.regions`. Raises when the call failed as a
        whole (out of memory, a CUDA error, or a decoder that cannot say which payload it failed on)."""
        ...


class TorchvisionDecoder:
    """torchvision's `decode_jpeg`: one batched call (nvjpeg on CUDA, libjpeg on the CPU). It raises when any JPEG
    of the batch fails; the device stage then decodes each alone to find which."""

    regions = False

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        engine = "nvjpeg" if self.device.type == "cuda" else "libjpeg"
        self.name = f"torchvision {_torchvision_version()} decode_jpeg ({engine})"

    def decode(self, payloads: Sequence[np.ndarray],
               regions: Sequence[tuple[int, int, int, int]] | None = None) -> list[torch.Tensor | None]:
        from torchvision.io import ImageReadMode, decode_jpeg

        tensors = [torch.from_numpy(payload) for payload in payloads]
        return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=self.device)) if tensors else []


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is a device out-of-memory error (torch's, or a decoder library's message)."""
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _torchvision_version() -> str:
    import torchvision

    return torchvision.__version__.split("+")[0]


def nvimgcodec_missing() -> str:
    """Why nvImageCodec cannot be used in this process ("" when it can be imported)."""
    try:
        from nvidia import nvimgcodec  # noqa: F401
    except Exception as exc:  # ImportError, or a library that fails to load
        return f"{type(exc).__name__}: {exc}"
    return ""


@functools.cache
def _say_torchvision_once(reason: str) -> None:
    warnings.warn("fastdata: decode='device' decodes with torchvision's decode_jpeg, which blocks the host around "
                  "each batch; NVIDIA nvImageCodec is several times faster on the same GPU: pip install "
                  f"'fastdata[gpu-cu13]' (CUDA 13; 'fastdata[gpu-cu12]' for CUDA 12) ({reason})", RuntimeWarning,
                  stacklevel=3)


def make_decoder(device: torch.device, options: DeviceDecode) -> BatchDecoder:
    """The decoder `options` asks for on `device`. "auto": nvImageCodec on CUDA when it imports, torchvision's
    otherwise (said once on CUDA); on the CPU always torchvision's (nvImageCodec needs an NVIDIA driver even for
    its CPU backend)."""
    if device.type != "cuda":
        if options.decoder == "nvimgcodec":
            raise ConfigError(f"DeviceDecode(decoder='nvimgcodec') needs a CUDA device, not {device}")
        return TorchvisionDecoder(device)
    if options.decoder == "torchvision":
        return TorchvisionDecoder(device)
    missing = nvimgcodec_missing()
    if not missing:
        from fastdata.image.device.nvimgcodec import NvImageCodecDecoder

        return NvImageCodecDecoder(device, options)
    if options.decoder == "nvimgcodec":
        raise ConfigError(f"DeviceDecode(decoder='nvimgcodec'): nvImageCodec is not usable here ({missing}); "
                          "pip install 'fastdata[gpu-cu13]' (or gpu-cu12)")
    _say_torchvision_once(missing)
    return TorchvisionDecoder(device)
