"""A stand-in for `nvidia.nvimgcodec` (0.9's Python API, as documented and as fastdata calls it) that decodes on
the CPU with Pillow, so that fastdata's nvImageCodec integration runs in CI, where the real library cannot (it
needs an NVIDIA driver even for its CPU backend). It honours what fastdata relies on: `Decoder(device_id,
max_num_cpu_threads, backends)` (the hardware backend alone decodes baseline JPEGs only, and nothing on a GPU
without JPEG engines: `Decoder.engines = False`), a batched `decode(srcs, images=, params=, cuda_stream=)` that
returns None (no exception) for an image it cannot decode,
`CodeStream(array).get_sub_code_stream(region=Region(y0, x0, y1, x1))`, `DecodeParams(sample_format=P_RGB)`
giving planar RGB, and Images exported through DLPack."""

from __future__ import annotations

import enum
import io
from typing import ClassVar

import numpy as np
from PIL import Image as PILImage

__version__ = "0.9.0-standin"


class BackendKind(enum.Enum):
    CPU_ONLY = 1
    GPU_ONLY = 2
    HYBRID_CPU_GPU = 3
    HW_GPU_ONLY = 4


class ColorSpec(enum.Enum):
    SRGB = 1
    GRAY = 2


class SampleFormat(enum.Enum):
    I_RGB = 1
    P_RGB = 2


class Backend:
    def __init__(self, backend_kind: BackendKind = BackendKind.GPU_ONLY, load_hint: float = 1.0,
                 load_hint_policy: object = None) -> None:
        self.backend_kind, self.load_hint = backend_kind, load_hint


class Region:
    def __init__(self, start_y: int, start_x: int, end_y: int, end_x: int) -> None:
        self.start_y, self.start_x, self.end_y, self.end_x = start_y, start_x, end_y, end_x


class CodeStream:
    def __init__(self, data: object) -> None:
        self.data = bytes(np.asarray(data, dtype=np.uint8))
        self.region: Region | None = None

    def get_sub_code_stream(self, image_idx: int = 0, region: Region | None = None) -> CodeStream:
        sub = CodeStream(np.frombuffer(self.data, np.uint8))
        sub.region = region
        return sub


class DecodeParams:
    def __init__(self, apply_exif_orientation: bool = True, color_spec: ColorSpec = ColorSpec.SRGB,
                 allow_any_depth: bool = False, sample_format: SampleFormat = SampleFormat.I_RGB) -> None:
        self.sample_format = sample_format


class Image:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.shape = array.shape

    def __dlpack__(self, stream: object = None, **kwargs: object) -> object:
        return self.array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.array.__dlpack_device__()


class Decoder:
    """Decodes with Pillow; `rejects(data)` (set by a test) makes it return None for chosen bytes."""

    created: ClassVar[list[Decoder]] = []
    engines: ClassVar[bool] = True  # the GPU has hardware JPEG engines (HW_GPU_ONLY decodes baseline JPEGs)
    refuse_engines_alone: ClassVar[bool] = False  # without them, the library may refuse such a decoder instead

    def __init__(self, device_id: int = -1, max_num_cpu_threads: int = 0, backends: list[Backend] | None = None,
                 options: str = "") -> None:
        self.device_id, self.max_num_cpu_threads, self.backends = device_id, max_num_cpu_threads, backends
        self.options = options
        self.calls: list[int] = []
        self.given: list[int] = []  # per call, how many Images were passed back to decode into (`images=`)
        self.rejects = lambda data: False
        kinds = {backend.backend_kind for backend in backends or [Backend()]}
        self.engines_alone = kinds == {BackendKind.HW_GPU_ONLY}
        if self.engines_alone and Decoder.refuse_engines_alone:
            raise RuntimeError("nvImageCodec: no backend available for the requested backend kinds")
        Decoder.created.append(self)

    def decode(self, srcs: list[CodeStream], *, images: list[Image] | None = None,
               params: DecodeParams | None = None, cuda_stream: int = 0) -> list[Image | None]:
        self.calls.append(len(srcs))
        self.given.append(len(images or []))
        return [self._one(src, params) for src in srcs]

    def _one(self, src: CodeStream, params: DecodeParams | None) -> Image | None:
        if self.rejects(src.data):
            return None
        try:
            with PILImage.open(io.BytesIO(src.data)) as opened:
                if self.engines_alone and (not Decoder.engines or opened.format != "JPEG"
                                           or opened.info.get("progressive") or opened.info.get("progression")):
                    return None  # the hardware engines: baseline JPEGs only, and only where the GPU has them
                array = np.asarray(opened.convert("RGB"))
        except Exception:  # nvImageCodec gives None for an image it cannot decode, never an exception
            return None
        if src.region is not None:
            r = src.region
            array = array[r.start_y:r.end_y, r.start_x:r.end_x]
        if params is not None and params.sample_format == SampleFormat.P_RGB:
            array = array.transpose(2, 0, 1)
        return Image(np.ascontiguousarray(array))


def install(monkeypatch: object) -> None:
    """Make this module `nvidia.nvimgcodec` for the test that owns `monkeypatch` (pytest's fixture), with no
    decoder made yet."""
    import sys
    import types

    nvidia = sys.modules.get("nvidia") or types.ModuleType("nvidia")
    monkeypatch.setitem(sys.modules, "nvidia", nvidia)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", sys.modules[__name__])  # type: ignore[attr-defined]
    monkeypatch.setattr(nvidia, "nvimgcodec", sys.modules[__name__], raising=False)  # type: ignore[attr-defined]
    Decoder.created.clear()
