"""`NvImageCodecDecoder`: NVIDIA nvImageCodec behind the device path's `BatchDecoder` protocol.

One `nvimgcodec.Decoder` per decoder object (it keeps about one batch in flight and has no lock: one per thread;
the feeder is the only thread that decodes). A batch is one `decode` call on the current torch stream: it returns
once the work is queued, with the GIL released meanwhile. Each image comes back planar RGB (`P_RGB`, the CHW layout
the batched crop reads) and crosses into torch through DLPack (`torch.from_dlpack`, which orders the streams; never
`__cuda_array_interface__`, which ignores them). The decoded Images are reused for the next batch (`images=`: their
buffers are resized, not freed and allocated again), which is safe because the next decode queues on the same
stream as the crop that read them. EXIF orientation is not applied: crop boxes are drawn in the stored frame, as
on the CPU path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fastdata.image.device.decoders import DeviceDecode

_BACKEND_KINDS = {"hardware": "HW_GPU_ONLY", "hybrid": "HYBRID_CPU_GPU", "gpu": "GPU_ONLY", "cpu": "CPU_ONLY"}


class NvImageCodecDecoder:
    """nvImageCodec's batched (and region) JPEG decoding on a CUDA device."""

    regions = True

    def __init__(self, device: torch.device, options: DeviceDecode) -> None:
        from nvidia import nvimgcodec

        self._codec = nvimgcodec
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        index = (self.device.index if self.device.index is not None else torch.cuda.current_device()) if cuda else -1
        backends = []
        for name in options.backends:
            kind = getattr(nvimgcodec.BackendKind, _BACKEND_KINDS[name])
            if name == "hardware" and options.hardware_load is not None:
                backends.append(nvimgcodec.Backend(kind, load_hint=options.hardware_load))
            else:
                backends.append(nvimgcodec.Backend(kind))
        self._decoder = nvimgcodec.Decoder(device_id=index, max_num_cpu_threads=options.cpu_threads,
                                           backends=backends)
        self._params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.SRGB,
                                               sample_format=nvimgcodec.SampleFormat.P_RGB,
                                               apply_exif_orientation=False, allow_any_depth=False)
        load = "" if options.hardware_load is None else f", hardware load {options.hardware_load:g}"
        self.name = (f"nvimgcodec {getattr(nvimgcodec, '__version__', '?')} ({', '.join(options.backends)}{load}; "
                     f"{options.cpu_threads} CPU threads)")
        self.reuse = True  # pass the previous batch's Images back for their buffers (`images=`)
        self._reusable: list[Any] = []  # the previous batch's Images

    def decode(self, payloads: Sequence[np.ndarray],
               regions: Sequence[tuple[int, int, int, int]] | None = None) -> list[torch.Tensor | None]:
        codec = self._codec
        if not payloads:
            return []
        streams = [codec.CodeStream(payload) for payload in payloads]
        if regions is not None:
            streams = [s.get_sub_code_stream(region=codec.Region(y0, x0, y1, x1))
                       for s, (x0, y0, x1, y1) in zip(streams, regions, strict=True)]
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        reuse = self._reusable[:len(streams)] if self.reuse and len(self._reusable) >= len(streams) else None
        if reuse is not None:
            images = self._decoder.decode(streams, images=reuse, params=self._params, cuda_stream=stream)
        else:
            images = self._decoder.decode(streams, params=self._params, cuda_stream=stream)
        if all(image is not None for image in images):
            self._reusable = list(images) if len(images) >= len(self._reusable) else self._reusable
        else:
            self._reusable = []
        return [None if image is None else torch.from_dlpack(image) for image in images]
