"""`DeviceDecodeOptions`: how `decode="device"` decodes (the decoder, nvImageCodec's backends and threads, regions, the
output slots, sub-JPEGs), one frozen object a user passes as `fastdata.loader(..., decode=DeviceDecodeOptions(...))`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from fastdata.deprecations import deprecated_alias
from fastdata.errors import ConfigError

#: Decoders `DeviceDecodeOptions(decoder=...)` names.
DECODERS = ("auto", "nvimgcodec", "torchvision")
#: nvImageCodec's JPEG backends by the names `DeviceDecodeOptions(backends=...)` takes.
BACKENDS = ("hardware", "hybrid", "gpu", "cpu")
#: `DeviceDecodeOptions(backends=AUTO)`: chosen per dataset and GPU (fastdata.image.device.auto).
AUTO = "auto"
#: The backends "auto" gives where the decoder may be sent progressive JPEGs, or the engines fail their probe.
MIXED = ("hardware", "hybrid")
#: ... and where it is sent baseline JPEGs only and the engines pass it: the GPU's hardware JPEG engines alone.
ENGINES_ALONE = ("hardware",)
#: Where `DeviceDecodeOptions(progressive=...)` decodes progressive JPEGs.
PROGRESSIVE = ("device", "workers")


@dataclass(frozen=True)
class DeviceDecodeOptions:
    """How `decode="device"` decodes: `decoder` ("auto": nvImageCodec when installed, else torchvision's, said once),
    nvImageCodec's `backends` in order of preference ("hardware": the GPU's JPEG engines, baseline JPEGs only;
    "hybrid": Huffman on CPU threads, the rest on the GPU; "gpu"; "cpu"; "auto": the engines alone where the
    decoder is sent baseline JPEGs only and they decode probes of them, else hardware + hybrid: see
    fastdata.image.device.auto), the share of each batch offered to the hardware engines (`hardware_load`,
    0..1; None: nvImageCodec's own balance), the CPU threads nvImageCodec may use (`cpu_threads`; it would
    otherwise take all cores but one, which the workers need), and `regions`: decode only each crop's covering
    pixels where the decoder can (nvImageCodec; off by default: nvImageCodec 0.9's hardware and hybrid backends
    do not decode these regions, see fastdata.image.device.nvimgcodec). `slots`: the output batches preallocated
    on the device (fastdata.image.device.ring): the one in use, the one before it, and the rest made ahead of
    the training step. `sub_jpegs`: over a restart-layout dataset, ship each crop as its sub-JPEG once the
    decoder has proved it decodes them to the rewritten file's pixels (fastdata.image.device.auto).
    `progressive`: where progressive JPEGs are decoded: "device" (nvImageCodec's hybrid decoder; the hardware
    engines take baseline files only) or "workers" (on the CPU, as the worker path does), so that the device
    decoder gets baseline files only; `--jpeg-layout baseline` at conversion stores them baseline instead.
    `decode_ahead`: deprecated and ignored (the device path always decodes ahead now: a decode thread and a resize
    thread on two streams, docs/gpu.md); passing it warns once.
    """

    decoder: str = "auto"
    backends: str | tuple[str, ...] = AUTO
    hardware_load: float | None = None
    cpu_threads: int = 4
    regions: bool = False
    slots: int = 6
    sub_jpegs: bool = True
    progressive: str = "device"
    decode_ahead: bool | None = None

    def __post_init__(self) -> None:
        if self.decode_ahead is not None:
            _say_decode_ahead_went()
        if self.decoder not in DECODERS:
            raise ConfigError(f"DeviceDecodeOptions(decoder=...) must be one of {DECODERS}, got {self.decoder!r}")
        if self.backends != AUTO:
            backends = (self.backends,) if isinstance(self.backends, str) else tuple(self.backends)
            unknown = [b for b in backends if b not in BACKENDS]
            if not backends or unknown:
                raise ConfigError(f"DeviceDecodeOptions(backends=...) takes {AUTO!r} or one or more of {BACKENDS}, got "
                                  f"{self.backends!r}")
            object.__setattr__(self, "backends", backends)
        if self.hardware_load is not None and not 0 <= self.hardware_load <= 1:
            raise ConfigError(f"DeviceDecodeOptions(hardware_load=...) is a share of each batch, 0..1, got "
                              f"{self.hardware_load!r}")
        if self.progressive not in PROGRESSIVE:
            raise ConfigError(f"DeviceDecodeOptions(progressive=...) must be one of {PROGRESSIVE}, got "
                              f"{self.progressive!r}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 3:
            raise ConfigError(f"DeviceDecodeOptions(slots=...) must be a whole number of at least 3, got "
                              f"{self.slots!r}")
        if isinstance(self.cpu_threads, bool) or not isinstance(self.cpu_threads, int) or self.cpu_threads < 1:
            raise ConfigError(f"DeviceDecodeOptions(cpu_threads=...) must be a positive whole number, got "
                              f"{self.cpu_threads!r}")


def _say_decode_ahead_went() -> None:
    warnings.warn("DeviceDecodeOptions(decode_ahead=...) is deprecated and ignored: the device path always decodes one "
                  "batch ahead now, on a decode thread and stream of its own beside the resize thread (docs/gpu.md); "
                  "remove the argument", FutureWarning, stacklevel=4)


def __getattr__(name: str) -> Any:
    """The old name of `DeviceDecodeOptions`, said deprecated (PEP 562)."""
    return deprecated_alias(__name__, name, {"DeviceDecode": ("fastdata.options.DeviceDecode", DeviceDecodeOptions)})
