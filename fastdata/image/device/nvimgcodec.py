"""`NvImageCodecDecoder`: NVIDIA nvImageCodec behind the device path's `BatchDecoder` protocol.

A batch is one `nvimgcodec.Decoder.decode` call on the current torch stream: it returns once the work is queued
(the hybrid backend's Huffman decoding runs on its CPU threads inside the call), with the GIL released meanwhile.
One decoder mixes the backends asked for by the library's own balance (or `hardware_load`): measured on an H200
(benchmarks/README.md, "GPU decode"), hardware + hybrid in one decoder decoded the sample photos at 10,198 img/s,
two decoders called in turn (baseline files to the hardware engines, progressive ones to hybrid) at 7,932.
Each decoder keeps a batch or two in flight and has no lock: one feeder thread decodes (`release`, which hands
buffers back, may come from another).

Each image comes back planar RGB (`P_RGB`, the CHW layout the batched crop reads) and crosses into torch through
DLPack (`torch.from_dlpack`, which orders the streams; never `__cuda_array_interface__`, which ignores them). EXIF
orientation is not applied: crop boxes are drawn in the stored frame, as on the CPU path. Region decoding
(`regions`) is offered, but nvImageCodec 0.9's hardware and hybrid backends return nothing for regions of these
files and its CPU backend decodes them slower than whole images (7,041 against 11,272 img/s), so
`DeviceDecodeOptions(regions=False)` is the default.

Options, as DALI's nvImageCodec decoder sets them (dali/operators/imgcodec/image_decoder.h): the hardware decoder
preallocates for the loader's batch (`nvjpeg_hw_decoder:preallocate_batch_size`) and, where the dataset's image
sizes are known, for its typical image (`preallocate_width_hint` / `preallocate_height_hint`); fancy upsampling
off (`:fancy_upsampling=0`, nvImageCodec's own Python default, which passing options replaces).

Buffers (`images=`): the decoded Images of a batch are a lease (`batch_decoded`), every set of them, handed back
with an event behind the crop that reads them (`release(lease, guard)`). A set is decoded into again only once
that event has completed, never merely once the crop is queued: nvJPEG's hardware batched decode has been seen
writing before earlier work on its stream ran (meta-pytorch/torchcodec #1634, pytorch/vision #9606), and the crop
runs on another stream than the decode. Sets beyond the few kept are dropped (their memory freed by the library)
only after their event too. Reusing buffers decoded 10,198 img/s against 9,587 without (H200).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastdata.image.device.options import AUTO, ENGINES_ALONE, MIXED, DeviceDecodeOptions

_BACKEND_KINDS = {"hardware": "HW_GPU_ONLY", "hybrid": "HYBRID_CPU_GPU", "gpu": "GPU_ONLY", "cpu": "CPU_ONLY"}


@dataclass(frozen=True)
class DecoderHints:
    """What the decoder may preallocate for: the loader's batch size and, where known, a typical image's size."""

    batch_size: int = 0
    width: int = 0
    height: int = 0


def library_options(hints: DecoderHints | None) -> str:
    """nvImageCodec's options string for `hints` (see the module's docstring)."""
    options = [":fancy_upsampling=0"]
    if hints is not None and hints.batch_size > 0:
        options.append(f"nvjpeg_hw_decoder:preallocate_batch_size={hints.batch_size}")
    if hints is not None and hints.width > 0 and hints.height > 0:
        options += [f"nvjpeg_hw_decoder:preallocate_width_hint={hints.width}",
                    f"nvjpeg_hw_decoder:preallocate_height_hint={hints.height}"]
    return " ".join(options)


class NvImageCodecDecoder:
    """nvImageCodec's batched (and region) JPEG decoding on a CUDA device."""

    regions = True

    def __init__(self, device: torch.device, options: DeviceDecodeOptions, hints: DecoderHints | None = None) -> None:
        from nvidia import nvimgcodec

        self._codec = nvimgcodec
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        device_id = (self.device.index if self.device.index is not None else torch.cuda.current_device()
                     ) if cuda else -1
        self.backends = MIXED if options.backends == AUTO else options.backends  # "auto" without a choice made
        backends = []
        for name in self.backends:
            kind = getattr(nvimgcodec.BackendKind, _BACKEND_KINDS[name])
            if name == "hardware" and options.hardware_load is not None:
                backends.append(nvimgcodec.Backend(kind, load_hint=options.hardware_load))
            else:
                backends.append(nvimgcodec.Backend(kind))
        self.options = library_options(hints)
        self._decoder = nvimgcodec.Decoder(device_id=device_id, max_num_cpu_threads=options.cpu_threads,
                                           backends=backends, options=self.options)
        self._params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.SRGB,
                                               sample_format=nvimgcodec.SampleFormat.P_RGB,
                                               apply_exif_orientation=False, allow_any_depth=False)
        load = "" if options.hardware_load is None else f", hardware load {options.hardware_load:g}"
        self.name = (f"nvimgcodec {getattr(nvimgcodec, '__version__', '?')} ({', '.join(self.backends)}{load}; "
                     f"{options.cpu_threads} CPU threads)")
        # what the device path's warning about a refused image adds (fastdata.image.device.failures)
        self.refused_hint = ("the GPU's JPEG engines alone decode here; DeviceDecodeOptions(backends=('hardware', "
                             "'hybrid')) gives what they refuse to the hybrid decoder instead"
                             if self.backends == ENGINES_ALONE else "")
        self.reuse = True  # pass a finished batch's Images back for their buffers (`images=`)
        self._decoding: list[list[Any]] = []  # the Images of the batch being decoded (one list per call)
        # released sets and their guards: reusable once the guard is done (`_free`), or to drop then (`_dropping`)
        self._free: collections.deque[tuple[list[Any], Any]] = collections.deque()
        self._dropping: list[tuple[list[Any], Any]] = []
        self._lock = threading.Lock()  # `release` may come from another thread than `decode`

    def decode(self, payloads: Sequence[np.ndarray],
               regions: Sequence[tuple[int, int, int, int]] | None = None) -> list[torch.Tensor | None]:
        if not payloads:
            return []
        codec = self._codec
        streams = [codec.CodeStream(payload) for payload in payloads]
        if regions is not None:
            streams = [s.get_sub_code_stream(region=codec.Region(y0, x0, y1, x1))
                       for s, (x0, y0, x1, y1) in zip(streams, regions, strict=True)]
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        reusable = self._reusable(len(streams))
        if reusable is not None:
            images = self._decoder.decode(streams, images=reusable[:len(streams)], params=self._params,
                                          cuda_stream=stream)
        else:
            images = self._decoder.decode(streams, params=self._params, cuda_stream=stream)
        self._decoding.append(list(images))  # every set is leased, those with a None too
        return [None if image is None else torch.utils.dlpack.from_dlpack(image) for image in images]

    def _reusable(self, count: int) -> list[Any] | None:
        """A released set of at least `count` Images whose guard has completed (None: none; the library then
        allocates)."""
        with self._lock:
            self._dropping = [(images, guard) for images, guard in self._dropping if not _done(guard)]
            for n, (images, guard) in enumerate(self._free):
                if self.reuse and len(images) >= count and _done(guard):
                    del self._free[n]
                    return images
        return None

    def batch_decoded(self) -> list[list[Any]]:
        """The lease on the buffers of the batch decoded since the last call: hand it back with `release` and an
        event behind the work that reads them."""
        lease, self._decoding = self._decoding, []
        return lease

    def release(self, lease: list[list[Any]], guard: Any = None) -> None:
        """The batch of `lease` is read once `guard` (an event with `query()`; None: now) has completed: its
        Images may then be decoded into again, or dropped."""
        with self._lock:
            for images in lease:
                if self.reuse and images and all(image is not None for image in images):
                    self._free.append((images, guard))
                else:
                    self._dropping.append((images, guard))
            while len(self._free) > KEPT_SETS:  # a few sets at most; the others freed once read
                self._dropping.append(self._free.popleft())


#: Released sets of decoded buffers kept for reuse (two decoded batches wait, one is decoded, one cropped)
KEPT_SETS = 4


def _done(guard: Any) -> bool:
    return guard is None or bool(guard.query())
