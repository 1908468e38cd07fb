"""The doctor's GPU checks, each a pure function of the facts it is given: torch's CUDA build against the driver,
the GPUs seen (torch and NVML), each GPU's compute capability against the kernels torch ships, and how the GPUs
are linked."""

from __future__ import annotations

from fastdata.tools.doctor.table import FAIL, INFO, PASS, WARN, Check


def check_torch(version: str, cuda_build: str | None, nvml_gpus: int) -> Check:
    """torch's version and the CUDA version it was built for."""
    if cuda_build:
        return Check("torch", PASS, f"torch {version}, built for CUDA {cuda_build}")
    if nvml_gpus:
        return Check("torch", WARN, f"torch {version} is a CPU-only build, but the driver sees {nvml_gpus} GPU(s)",
                     "install a CUDA build of torch (pip install torch --index-url "
                     "https://download.pytorch.org/whl/cuXYZ, matching your driver)")
    return Check("torch", PASS, f"torch {version}, CPU-only build (no GPU seen here either)")


def check_gpus(count: int, names: list[str], nvml_reason: str | None, cuda_build: str | None) -> Check:
    """How many GPUs torch can use."""
    if count == 0 and not cuda_build and nvml_reason is not None:  # CPU-only torch, and NVML shows no GPU
        return Check("GPU", INFO, f"none (a CPU-only torch build; {nvml_reason}): nothing to do for CPU work; GPU "
                                  "training needs a CUDA build of torch on a machine with a GPU")
    if count == 0:
        why = "torch.cuda.is_available() is False" + (f"; {nvml_reason}" if nvml_reason else "")
        return Check("GPU", WARN, f"no GPU visible ({why})",
                     "fine for CPU work; for GPU training check `nvidia-smi`, the driver, CUDA_VISIBLE_DEVICES and "
                     "that the container was started with GPUs (--gpus all)" if cuda_build else
                     "fine for CPU work; for GPU training install a CUDA build of torch on a machine with a GPU")
    listed = ", ".join(sorted(set(names))) if names else "unnamed"
    return Check("GPU", PASS, f"{count} GPU(s): {listed}")


def parse_cuda(version: str | None) -> tuple[int, int] | None:
    """'12.4' -> (12, 4)."""
    if not version:
        return None
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def check_driver(cuda_build: str | None, driver_cuda: tuple[int, int] | None, driver_version: str | None,
                 nvml_reason: str | None) -> Check:
    """The driver must support the CUDA version torch was built for (same major, minor compatibility)."""
    build = parse_cuda(cuda_build)
    if build is None:
        return Check("CUDA driver", PASS, f"driver {driver_version or '?'}; torch is CPU-only, nothing to match")
    if driver_cuda is None:
        return Check("CUDA driver", WARN, f"driver's CUDA version unknown ({nvml_reason or 'NVML gave none'})",
                     "pip install 'fastdata[gpu]' (nvidia-ml-py) so the driver can be checked, or compare "
                     "`nvidia-smi` with torch.version.cuda yourself")
    found = f"driver {driver_version or '?'} supports CUDA up to {driver_cuda[0]}.{driver_cuda[1]}; torch is built " \
            f"for CUDA {build[0]}.{build[1]}"
    if driver_cuda[0] < build[0]:
        return Check("CUDA driver", FAIL, found,
                     f"update the NVIDIA driver to one for CUDA {build[0]}.{build[1]}+, or install a torch wheel "
                     f"built for CUDA {driver_cuda[0]}.x (e.g. --index-url "
                     f"https://download.pytorch.org/whl/cu{driver_cuda[0]}{driver_cuda[1]})")
    if driver_cuda < build:
        return Check("CUDA driver", WARN, found + " (minor-version compatibility: most, not all, of CUDA works)",
                     f"update the NVIDIA driver to one for CUDA {build[0]}.{build[1]}+")
    return Check("CUDA driver", PASS, found)


def check_capability(index: int, name: str, capability: tuple[int, int], arch_list: list[str]) -> Check:
    """Whether this torch build has kernels for the GPU's compute capability: a cubin for the same major
    and a minor at or below the GPU's, or else PTX it can compile for it (slow first start)."""
    major, minor = capability
    label = f"GPU {index} capability"
    have = f"torch has kernels for {', '.join(arch_list) or 'nothing'}"
    cubins = [_arch_number(a) for a in arch_list if a.startswith("sm_")]
    ptx = [_arch_number(a) for a in arch_list if a.startswith("compute_")]
    cap = major * 10 + minor
    if any(c is not None and c // 10 == major and c <= cap for c in cubins):
        return Check(label, PASS, f"{name} has capability ({major}, {minor}); {have}")
    if any(p is not None and p <= cap for p in ptx):
        return Check(label, WARN, f"{name} has ({major}, {minor}); no kernels built for it, only PTX to compile "
                                  f"at start-up; {have}",
                     f"install a torch build with sm_{major}{minor} kernels (newer torch / CUDA wheel)")
    supported = [c for c in cubins if c is not None]
    span = f"({min(supported) // 10},{min(supported) % 10}) to ({max(supported) // 10},{max(supported) % 10})" \
        if supported else "none"
    return Check(label, FAIL, f"{name} has capability ({major}, {minor}) but this torch supports {span}: "
                              "CUDA kernels will fail with 'no kernel image is available'",
                 f"install a torch build that supports sm_{major}{minor} (a newer torch and CUDA wheel)"
                 if supported and cap > max(supported) else
                 f"install an older torch build that still supports sm_{major}{minor}")


def _arch_number(arch: str) -> int | None:
    digits = "".join(ch for ch in arch.split("_", 1)[-1] if ch.isdigit())
    return int(digits) if digits else None


def check_interconnect(count: int, nvlinks: list[int], peer_access: bool | None) -> Check:
    """How several GPUs talk (NVLink or PCIe), where NVML shows it."""
    if count <= 1:
        return Check("GPU interconnect", PASS, "one GPU: nothing to connect")
    peer = "" if peer_access is None else f"; peer access {'yes' if peer_access else 'no'}"
    if nvlinks and all(n > 0 for n in nvlinks):
        return Check("GPU interconnect", PASS, f"{count} GPUs with NVLink ({', '.join(map(str, nvlinks))} active "
                                               f"links){peer}")
    return Check("GPU interconnect", WARN, f"{count} GPUs, no active NVLink seen (PCIe){peer}",
                 "expect slower gradient all-reduce than over NVLink; prefer larger batches per GPU")


def check_gpu_decoder(cuda: bool, nvimgcodec: str | None, missing: str, torchvision: str,
                      jpeg_util: float | None = None) -> Check:
    """What decode="device" decodes with: nvImageCodec (its version; the JPEG engines' utilisation when NVML
    reports it) or torchvision's nvjpeg, said with how to install the faster one; nothing without CUDA."""
    if not cuda:
        return Check("GPU decoder", INFO, "no CUDA: decode=\"device\" runs on the CPU with torchvision's libjpeg "
                                          "(how CI tests it); nothing to do for CPU work")
    engines = "" if jpeg_util is None else f"; JPEG engines {jpeg_util:.0f}% busy now"
    if nvimgcodec is not None:
        return Check("GPU decoder", PASS, f"nvImageCodec {nvimgcodec} (the hardware JPEG engines alone for a "
                                          f"dataset of baseline JPEGs, + hybrid otherwise){engines}")
    return Check("GPU decoder", WARN, f"torchvision {torchvision} decode_jpeg (nvjpeg), which blocks the host around "
                                      f"each batch: nvImageCodec is not usable ({missing}){engines}",
                 "pip install 'fastdata[gpu-cu13]' (CUDA 13 torch; gpu-cu12 for CUDA 12)")

