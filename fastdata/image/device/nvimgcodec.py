"""`NvImageCodecDecoder`: NVIDIA nvImageCodec behind the device path's `BatchDecoder` protocol.

A batch is decoded by one `nvimgcodec.Decoder.decode` call per route, on the current torch stream: each call
returns once the work is queued, with the GIL released meanwhile. Routes: by default (backends "hardware" and
"hybrid", no `hardware_load`) baseline JPEGs go to a decoder of the GPU's hardware JPEG engines and the others
(progressive) to a decoder of the remaining backends, because the hardware engines take baseline files only and
decode them faster than any mix (benchmarks/gpu_check.py: on an H200, hardware alone 14,749 img/s, hardware +
hybrid in one decoder 10,198, hybrid alone 4,200); anything the hardware route returns nothing for goes to the
other route. With `hardware_load` set, or other backends, one decoder mixes the backends by the library's own
balance. Each decoder keeps about one batch in flight and has no lock: the feeder is the only thread that
decodes with them.

Each image comes back planar RGB (`P_RGB`, the CHW layout the batched crop reads) and crosses into torch through
DLPack (`torch.from_dlpack`, which orders the streams; never `__cuda_array_interface__`, which ignores them). A
route's decoded Images are passed back to its next call (`images=`: their buffers are resized, not freed and
allocated again), which is safe because the next decode queues on the same stream as the crop that read them.
EXIF orientation is not applied: crop boxes are drawn in the stored frame, as on the CPU path. Region decoding
(`regions`) is offered, but nvImageCodec 0.9's hardware and hybrid backends return nothing for regions of these
files and its CPU backend decodes them slower than whole images, so `DeviceDecode(regions=False)` is the default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fastdata.image.device.decoders import DeviceDecode
from fastdata.image.jpeg_header import read_frame

_BACKEND_KINDS = {"hardware": "HW_GPU_ONLY", "hybrid": "HYBRID_CPU_GPU", "gpu": "GPU_ONLY", "cpu": "CPU_ONLY"}
_BASELINE = 0xC0


class _Route:
    """One nvimgcodec.Decoder and the Images its last call returned (reused by the next)."""

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder
        self.reusable: list[Any] = []


class NvImageCodecDecoder:
    """nvImageCodec's batched (and region) JPEG decoding on a CUDA device."""

    regions = True

    def __init__(self, device: torch.device, options: DeviceDecode) -> None:
        from nvidia import nvimgcodec

        self._codec = nvimgcodec
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self._device_id = (self.device.index if self.device.index is not None else torch.cuda.current_device()
                           ) if cuda else -1
        self._threads = options.cpu_threads
        backends = list(options.backends)
        routed = "hardware" in backends and len(backends) > 1 and options.hardware_load is None
        if routed:
            rest = [b for b in backends if b != "hardware"]
            self._hardware: _Route | None = _Route(self._decoder(["hardware"], None))
            self._other = _Route(self._decoder(rest, None))
            what = f"baseline: hardware; others: {', '.join(rest)}"
        else:
            self._hardware = None
            self._other = _Route(self._decoder(backends, options.hardware_load))
            load = "" if options.hardware_load is None else f", hardware load {options.hardware_load:g}"
            what = ", ".join(backends) + load
        self._params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.SRGB,
                                               sample_format=nvimgcodec.SampleFormat.P_RGB,
                                               apply_exif_orientation=False, allow_any_depth=False)
        self.name = f"nvimgcodec {getattr(nvimgcodec, '__version__', '?')} ({what}; {options.cpu_threads} CPU threads)"
        self.reuse = True  # pass a route's previous Images back for their buffers (`images=`)

    def _decoder(self, backends: list[str], hardware_load: float | None) -> Any:
        codec = self._codec
        made = []
        for name in backends:
            kind = getattr(codec.BackendKind, _BACKEND_KINDS[name])
            if name == "hardware" and hardware_load is not None:
                made.append(codec.Backend(kind, load_hint=hardware_load))
            else:
                made.append(codec.Backend(kind))
        return codec.Decoder(device_id=self._device_id, max_num_cpu_threads=self._threads, backends=made)

    def decode(self, payloads: Sequence[np.ndarray],
               regions: Sequence[tuple[int, int, int, int]] | None = None) -> list[torch.Tensor | None]:
        if not payloads:
            return []
        codec = self._codec
        streams = [codec.CodeStream(payload) for payload in payloads]
        if regions is not None:
            streams = [s.get_sub_code_stream(region=codec.Region(y0, x0, y1, x1))
                       for s, (x0, y0, x1, y1) in zip(streams, regions, strict=True)]
        out: list[Any] = [None] * len(streams)
        rest = list(range(len(streams)))
        if self._hardware is not None:
            baseline = [i for i in rest if _is_baseline(payloads[i])]
            for i, image in zip(baseline, self._call(self._hardware, [streams[i] for i in baseline]), strict=True):
                out[i] = image
            rest = [i for i in rest if out[i] is None]  # progressive, or what the engines refused
        for i, image in zip(rest, self._call(self._other, [streams[i] for i in rest]), strict=True):
            out[i] = image
        return [None if image is None else torch.from_dlpack(image) for image in out]

    def _call(self, route: _Route, streams: list[Any]) -> list[Any]:
        if not streams:
            return []
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        if self.reuse and len(route.reusable) >= len(streams):
            images = route.decoder.decode(streams, images=route.reusable[:len(streams)], params=self._params,
                                          cuda_stream=stream)
        else:
            images = route.decoder.decode(streams, params=self._params, cuda_stream=stream)
        if all(image is not None for image in images):
            if len(images) >= len(route.reusable):
                route.reusable = list(images)
        else:
            route.reusable = []
        return images


def _is_baseline(payload: np.ndarray) -> bool:
    frame = read_frame(memoryview(payload))
    return frame is not None and frame.marker == _BASELINE
