"""`NvImageCodecDecoder`: NVIDIA nvImageCodec behind the device path's `BatchDecoder` protocol.

A batch is one `nvimgcodec.Decoder.decode` call on the current torch stream: it returns once the work is queued
(the hybrid backend's Huffman decoding runs on its CPU threads inside the call), with the GIL released meanwhile.
One decoder mixes the backends asked for by the library's own balance (or `hardware_load`): measured on an H200
(benchmarks/README.md, "GPU decode"), hardware + hybrid in one decoder decoded the sample photos at 10,198 img/s,
two decoders called in turn (baseline files to the hardware engines, progressive ones to hybrid) at 7,932.
Each decoder keeps a batch or two in flight and has no lock: one feeder thread decodes (`release`, which hands
buffers back, may come from another).

Each image comes back planar RGB (`P_RGB`, the CHW layout the batched crop reads) and crosses into torch through
DLPack (`torch.from_dlpack`, which orders the streams; never `__cuda_array_interface__`, which ignores them). The
decoded Images of a batch whose crop is queued (`release`) are passed back to a later call (`images=`: their buffers
are resized, not freed and allocated again: 10,198 img/s against 9,587 without), which is safe because that decode
queues on the same stream after the crop that read them. EXIF orientation is not applied: crop boxes are drawn in
the stored frame, as on the CPU path. Region decoding (`regions`) is offered, but nvImageCodec 0.9's hardware and
hybrid backends return nothing for regions of these files and its CPU backend decodes them slower than whole images
(7,041 against 11,272 img/s), so `DeviceDecode(regions=False)` is the default.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack

from fastdata.image.device.options import AUTO, ENGINES_ALONE, MIXED, DeviceDecode

_BACKEND_KINDS = {"hardware": "HW_GPU_ONLY", "hybrid": "HYBRID_CPU_GPU", "gpu": "GPU_ONLY", "cpu": "CPU_ONLY"}


class NvImageCodecDecoder:
    """nvImageCodec's batched (and region) JPEG decoding on a CUDA device."""

    regions = True

    def __init__(self, device: torch.device, options: DeviceDecode) -> None:
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
        self._decoder = nvimgcodec.Decoder(device_id=device_id, max_num_cpu_threads=options.cpu_threads,
                                           backends=backends)
        self._params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.SRGB,
                                               sample_format=nvimgcodec.SampleFormat.P_RGB,
                                               apply_exif_orientation=False, allow_any_depth=False)
        load = "" if options.hardware_load is None else f", hardware load {options.hardware_load:g}"
        self.name = (f"nvimgcodec {getattr(nvimgcodec, '__version__', '?')} ({', '.join(self.backends)}{load}; "
                     f"{options.cpu_threads} CPU threads)")
        # what the device path's warning about a refused image adds (fastdata.image.device.policy)
        self.refused_hint = ("the GPU's JPEG engines alone decode here; DeviceDecode(backends=('hardware', "
                             "'hybrid')) gives what they refuse to the hybrid decoder instead"
                             if self.backends == ENGINES_ALONE else "")
        self.reuse = True  # pass a finished batch's Images back for their buffers (`images=`)
        self._decoding: list[list[Any]] = []  # the Images of the batch being decoded (one list per call)
        self._free: collections.deque[list[Any]] = collections.deque()  # released sets (`release`), reusable
        self._free_lock = threading.Lock()  # `release` may come from another thread than `decode`

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
        if self.reuse and all(image is not None for image in images):
            self._decoding.append(list(images))
        return [None if image is None else from_dlpack(image) for image in images]

    def _reusable(self, count: int) -> list[Any] | None:
        """A released set of at least `count` Images (None: none; a smaller set is dropped, to be freed)."""
        with self._free_lock:
            while self.reuse and self._free:
                images = self._free.popleft()
                if len(images) >= count:
                    return images
        return None

    def batch_decoded(self) -> list[list[Any]]:
        """The lease on the buffers of the batch decoded since the last call: hand it back with `release` once the
        work that reads them is queued (on the same stream: the decode that reuses them is queued after it)."""
        lease, self._decoding = self._decoding, []
        return lease

    def release(self, lease: list[list[Any]]) -> None:
        """The batch of `lease` is read (its crop queued): its Images may be decoded into again."""
        with self._free_lock:
            self._free.extend(lease)
            while len(self._free) > 3:  # a few sets at most (the feeder has at most 2 batches decoded ahead)
                self._free.popleft()
