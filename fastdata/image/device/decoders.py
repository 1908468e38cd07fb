"""The JPEG decoders of the device path, behind one protocol (`BatchDecoder`), and which one a loader gets.

- `NvImageCodecDecoder`: NVIDIA nvImageCodec (pip `nvidia-nvimgcodec-cu13` or `-cu12`, fastdata's `gpu-cu13` /
  `gpu-cu12` extras), the library DALI decodes with: one batched call that returns once the work is queued on the
  stream (the GIL released meanwhile), the GPU's hardware JPEG engines mixed with a hybrid CPU+GPU decoder by a load
  hint, region decoding, images handed to torch through DLPack without a copy (`fastdata.image.device.nvimgcodec`).
- `TorchvisionDecoder`: torchvision's `decode_jpeg` (nvjpeg on CUDA, libjpeg on the CPU: how CI runs this path).
  On CUDA it blocks the host around each call and holds a process-wide lock; used where nvImageCodec is not
  installed, said once with how to install it (which one a loader gets: fastdata.image.device.auto).

A decoder returns, for each payload, a CHW uint8 RGB tensor on its device (queued on the current stream) or None
where it could not decode those bytes; the caller decides what a None means (fastdata.image.device.failures).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch


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

    # Optional, for a decoder that reuses its output buffers (NvImageCodecDecoder): `batch_decoded()` returns a
    # lease on the buffers of the batch decoded since the last call, and `release(lease, guard)` hands them back
    # with an event behind the work that reads them (None: read already); the decoder writes into them again only
    # once that event has completed (fastdata.image.device.stage calls both).


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


def decode_now(decoder: BatchDecoder, payloads: Sequence[np.ndarray],
               regions: Sequence[tuple[int, int, int, int]] | None = None) -> list[torch.Tensor | None]:
    """`decoder.decode` for a caller that is done with the images before its next call on the same stream (a
    probe, a decode-only benchmark): a decoder that reuses its buffers gets them back at once (`batch_decoded` /
    `release`), for its next call to decode into, where they would otherwise pile up until the feeder's next
    batch (and a loop of such calls would hold every image it ever decoded)."""
    images = decoder.decode(payloads, regions)
    batch_decoded = getattr(decoder, "batch_decoded", None)
    if batch_decoded is not None:
        decoder.release(batch_decoded())  # type: ignore[attr-defined]
    return images


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
