"""GPU facts from NVML (the `nvidia-ml-py` package, extra `fastdata[gpu]`): utilisation and memory for the
meter, driver / CUDA version / capability / NVLink for the doctor. Every failure becomes a reason string,
never an exception: no NVML, no driver and no GPU are ordinary situations."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuUse:
    """One GPU's utilisation sample."""

    util_percent: float
    memory_used_mb: float
    memory_total_mb: float
    jpeg_util_percent: float | None = None  # the JPEG engines (NVJPG), where NVML exposes them


@dataclass
class GpuFacts:
    """What NVML says about the driver and each GPU (for `fastdata doctor`)."""

    driver_version: str | None = None
    cuda_driver_version: tuple[int, int] | None = None  # the newest CUDA the driver supports
    gpus: list[dict[str, Any]] = field(default_factory=list)  # index, name, capability, memory_total_mb, nvlinks


class Nvml:
    """An open NVML session. `Nvml.open()` returns `(session, None)` or `(None, reason)`; `close()` ends it."""

    def __init__(self, module: Any) -> None:
        self._nv = module
        self._handles = [module.nvmlDeviceGetHandleByIndex(i) for i in range(module.nvmlDeviceGetCount())]

    @classmethod
    def open(cls) -> tuple[Nvml | None, str | None]:
        try:
            import pynvml
        except ImportError:
            return None, "NVML is not installed (pip install 'fastdata[gpu]' for nvidia-ml-py)"
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            return None, f"NVML could not start: {_nvml_reason(exc)} (no NVIDIA driver or GPU on this machine?)"
        try:
            session = cls(pynvml)
        except Exception as exc:
            _shutdown(pynvml)
            return None, f"NVML could not list the GPUs: {_nvml_reason(exc)}"
        if not session._handles:
            session.close()
            return None, "NVML sees no GPU"
        return session, None

    @property
    def count(self) -> int:
        return len(self._handles)

    def close(self) -> None:
        _shutdown(self._nv)

    def utilization(self) -> list[GpuUse | None]:
        """Utilisation (percent of the last sample period with a kernel running) and memory of each GPU."""
        out: list[GpuUse | None] = []
        for handle in self._handles:
            try:
                util = self._nv.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nv.nvmlDeviceGetMemoryInfo(handle)
                out.append(GpuUse(float(util.gpu), memory.used / 2**20, memory.total / 2**20,
                                  self._jpeg_util(handle)))
            except Exception:
                out.append(None)
        return out

    def _jpeg_util(self, handle: Any) -> float | None:
        """The JPEG engines' utilisation (percent), None where this NVML or GPU has none."""
        read = getattr(self._nv, "nvmlDeviceGetJpgUtilization", None)
        if read is None:
            return None
        try:
            value = read(handle)
        except Exception:  # NVML_ERROR_NOT_SUPPORTED on GPUs without JPEG engines
            return None
        return float(value[0] if isinstance(value, tuple | list) else value)

    def facts(self) -> GpuFacts:
        """Driver version, the CUDA version it supports, and each GPU's name, capability, memory and NVLinks."""
        nv = self._nv
        result = GpuFacts()
        result.driver_version = _try(lambda: _text(nv.nvmlSystemGetDriverVersion()))
        cuda = _try(nv.nvmlSystemGetCudaDriverVersion_v2) or _try(nv.nvmlSystemGetCudaDriverVersion)
        if cuda:
            result.cuda_driver_version = (int(cuda) // 1000, int(cuda) % 1000 // 10)
        for index, handle in enumerate(self._handles):
            capability = _try(lambda h=handle: tuple(nv.nvmlDeviceGetCudaComputeCapability(h)))
            memory = _try(lambda h=handle: nv.nvmlDeviceGetMemoryInfo(h).total / 2**20)
            result.gpus.append({"index": index, "name": _try(lambda h=handle: _text(nv.nvmlDeviceGetName(h))),
                                "capability": capability, "memory_total_mb": memory,
                                "nvlinks": self._active_nvlinks(handle)})
        return result

    def _active_nvlinks(self, handle: Any) -> int:
        links = 0
        for link in range(int(getattr(self._nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if self._nv.nvmlDeviceGetNvLinkState(handle, link):
                    links += 1
            except Exception:  # not supported, or no such link
                break
        return links


def _shutdown(module: Any) -> None:
    with contextlib.suppress(Exception):
        module.nvmlShutdown()


def _try(call: Any) -> Any:
    try:
        return call()
    except Exception:
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
