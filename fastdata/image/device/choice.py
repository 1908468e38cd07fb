"""Which decoder the device path's loader makes: `DeviceDecode(backends="auto")` resolved for its dataset and GPU.

The GPU's hardware JPEG engines take baseline JPEGs only; nvImageCodec's hybrid decoder takes progressive ones too,
with its Huffman decoding on CPU threads and the rest on the GPU's SMs, beside the training step. Measured on an
H200 (benchmarks/README.md, "GPU decode", decode only, the same 5,927 sample JPEGs): the engines alone decoded
14,749 img/s (refusing the 19 progressive files), hardware + hybrid in one decoder 10,198, with 4 CPU threads each.
So "auto" gives the engines alone where the decoder is sent baseline JPEGs only (`baseline_only`: the conversion
recorded no progressive JPEG, as after `--jpeg-layout baseline` or `restart`, or `progressive="workers"` keeps them
in the workers) and the engines decode probe JPEGs on this GPU (`engines_failure`; a GPU without them returns
nothing, or the library refuses to make such a decoder); otherwise hardware + hybrid, as before. An image the
engines still refuse is decoded on the CPU in the feeder (counted in `loader.device_rejected`, said once with how to
give it to the hybrid decoder instead).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Mapping

import torch

from fastdata.image.device.decoders import BatchDecoder, make_decoder
from fastdata.image.device.options import AUTO, ENGINES_ALONE, DeviceDecode
from fastdata.image.device.probes import engines_failure


def baseline_only(options: DeviceDecode, recorded_kinds: Mapping[str, int] | None) -> bool:
    """Whether the device decoder is sent baseline JPEGs only: progressive ones stay in the workers
    (`progressive="workers"`), or the conversion's count of stored images by GPU kind (the manifest's
    `stats["gpu_kinds"]`; None for an older dataset: not known) has none. The other kinds (PNG, CMYK, ...) are
    always decoded in the workers."""
    if options.progressive == "workers":
        return True
    return recorded_kinds is not None and int(recorded_kinds.get("progressive", 1)) == 0


def device_decoder(device: torch.device, options: DeviceDecode, baseline_only: bool,
                   make: Callable[[torch.device, DeviceDecode], BatchDecoder] = make_decoder) -> BatchDecoder:
    """`make(device, options)` with `backends="auto"` resolved (see the module's docstring); a decoder without
    backends (torchvision's) is made as asked."""
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
                  "(DeviceDecode(backends='auto'); said once)", RuntimeWarning, stacklevel=4)
