"""`fastdata doctor [PATH]`: check the machine before a long job, with a PASS / WARN / FAIL row and the fix
for each: torch and its CUDA build against the driver and each GPU's compute capability, GPUs and their
interconnect, CPU cores and a recommended `num_workers`, the JPEG decoder in use, RAM, /dev/shm, the open-file
limit, pinned memory, and the storage and dataset at PATH. Needs no network and no GPU (a missing GPU is a WARN);
each check is a pure function of the facts it is given, so every verdict is tested with made-up facts too."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastdata.config import available_cores

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
GiB, MiB = 2**30, 2**20


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table."""

    name: str
    status: str  # PASS, WARN or FAIL
    detail: str
    fix: str = ""


def exit_code(checks: list[Check]) -> int:
    """1 when any check FAILs, else 0."""
    return 1 if any(c.status == FAIL for c in checks) else 0


def format_checks(checks: list[Check]) -> str:
    """The table: status, check, what was found, and under it the fix for each WARN / FAIL."""
    width = max([len(c.name) for c in checks] + [5])
    lines = [f"{'status':<6}  {'check':<{width}}  detail", f"{'-' * 6}  {'-' * width}  {'-' * 40}"]
    for c in checks:
        lines.append(f"{c.status:<6}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status != PASS:
            lines.append(f"{'':<6}  {'':<{width}}  fix: {c.fix}")
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, WARN, FAIL)}
    lines.append(f"\n{counts[PASS]} PASS, {counts[WARN]} WARN, {counts[FAIL]} FAIL")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------
# the checks, as functions of facts


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


def recommended_workers(cores: int, gpus: int) -> int:
    """Loader workers per training process: one per core of its share of the machine, at most 16."""
    return max(1, min(16, cores // max(1, gpus)))


def check_cores(cores: int, gpus: int) -> Check:
    """Enough cores per GPU to decode images at GPU speed."""
    workers = recommended_workers(cores, gpus)
    per_gpu = cores / max(1, gpus)
    detail = f"{cores} cores" + (f" for {gpus} GPU(s) ({per_gpu:.0f} per GPU)" if gpus else "") + \
        f"; use num_workers={workers} per training process"
    if gpus and per_gpu < 4:
        return Check("CPU cores", WARN, detail + " (few cores per GPU: decoding will likely be the wall)",
                     "convert with `--max-size` so there is less to decode, or use a machine with more cores per GPU")
    if cores < 2:
        return Check("CPU cores", WARN, detail, "loading and training will share one core")
    return Check("CPU cores", PASS, detail)


def check_jpeg_decoder(library: str | None, reason: str, proof: str = "") -> Check:
    """Whether the CPU path decodes only crop regions (fastdata's libjpeg-turbo extension, `proof`: its
    self-check) or whole images. The fallback's cost is not given as a figure: it is the region decoder's saving,
    which cannot be measured where the region decoder is unavailable, and it depends on the images and crops."""
    if library is not None:
        checked = f"; self-check: {proof}" if proof else ""
        return Check("JPEG decoder", PASS, f"crop-region decoding with DCT scaling (libjpeg-turbo: {library}"
                                           f"{checked})")
    return Check("JPEG decoder", WARN, "whole-image decoding with OpenCV (same pixels, but every pixel of every "
                                       f"JPEG is decoded, not only the crop's): {reason}",
                 "reinstall fastdata where a C compiler and the Python headers are present (pip install .), "
                 "with Pillow from its wheel (it ships libjpeg-turbo)")


def check_memory(total: int | None, available: int | None, dataset_bytes: int | None = None) -> Check:
    """RAM, and whether the dataset fits in the page cache."""
    if total is None:
        return Check("RAM", WARN, "unknown (psutil is not installed)", "pip install psutil")
    detail = f"{total / GiB:.1f} GiB, {available / GiB:.1f} GiB available" if available is not None else \
        f"{total / GiB:.1f} GiB"
    if dataset_bytes:
        fits = available is not None and dataset_bytes < available
        detail += f"; the dataset ({dataset_bytes / GiB:.2f} GiB) {'fits' if fits else 'does not fit'} in the " \
                  "page cache"
    if total < 8 * GiB or (available is not None and available < 2 * GiB):
        return Check("RAM", WARN, detail + " (little memory for workers and prefetched batches)",
                     "lower num_workers / prefetch_factor / batch size, or use a machine with more memory")
    return Check("RAM", PASS, detail)


def check_shm(size: int | None, exists: bool, platform: str = sys.platform) -> Check:
    """/dev/shm carries every batch from a DataLoader worker; containers default to 64 MB."""
    if not exists:
        if platform.startswith("linux"):
            return Check("/dev/shm", FAIL, "missing: DataLoader workers cannot hand over batches",
                         "mount a tmpfs at /dev/shm (docker run --shm-size=8g, or --ipc=host)")
        return Check("/dev/shm", PASS, f"not used on {platform} (torch shares memory another way)")
    detail = f"{(size or 0) / GiB:.2f} GiB"
    fix = "docker run --shm-size=8g (or --ipc=host); in Kubernetes mount an emptyDir with medium: Memory at /dev/shm"
    if (size or 0) < 256 * MiB:
        return Check("/dev/shm", FAIL, detail + ": too small, DataLoader workers will die with 'bus error' or "
                                                 "'No space left on device'", fix)
    if (size or 0) < 2 * GiB:
        return Check("/dev/shm", WARN, detail + ": tight for many workers with large batches", fix)
    return Check("/dev/shm", PASS, detail)


def check_open_files(soft: int | None, hard: int | None) -> Check:
    """Workers share tensors through file descriptors; a low limit ends in 'Too many open files'."""
    if soft is None:
        return Check("open files", PASS, "unlimited (or not limited on this platform)")
    detail = f"soft limit {soft:,}, hard limit {'unlimited' if hard in (None, -1) else f'{hard:,}'}"
    target = 65536 if hard in (None, -1) else min(hard, 65536)
    fix = f"ulimit -n {target} before training" + (
        "" if hard in (None, -1) or hard >= 4096 else
        ", after raising the hard limit (limits.conf / docker --ulimit nofile=65536:65536)")
    if soft < 256:
        return Check("open files", FAIL, detail, fix)
    if soft < 4096:
        return Check("open files", WARN, detail + ": many workers or shards can run out", fix)
    return Check("open files", PASS, detail)


def check_storage(where: str, mount: Any, disk: str | None, rotational: bool | None, packed: bool = False) -> Check:
    """Network filesystems and spinning disks make small random reads slow (`packed`: the data already is
    a fastdata dataset, so the fix is where it lives, not how)."""
    if mount is None:
        return Check("storage", WARN, f"{where}: could not find its mount", "")
    detail = f"{where}: {mount.fstype} on {mount.device} (mounted at {mount.mountpoint})"
    pack = "" if packed else \
        "pack the data into LMDB / WebDataset shards (`fastdata convert`), so reads are few and sequential, or "
    if mount.network:
        return Check("storage", WARN, detail + ": a network filesystem, every file open is a round trip",
                     pack + "copy it to a local SSD first")
    if rotational:
        return Check("storage", WARN, detail + f": the kernel reports {disk} as a rotational disk (virtual disks "
                                               "often claim this; check what is behind it)",
                     pack + "move it to an SSD")
    kind = "SSD / non-rotational" if rotational is False else "disk type unknown"
    return Check("storage", PASS, detail + f" ({kind})")


def check_free_space(where: str, free: int, total: int) -> Check:
    """Free space where the data (and conversion output) goes."""
    detail = f"{where}: {free / GiB:,.1f} GiB free of {total / GiB:,.1f} GiB"
    if free < 512 * MiB:
        return Check("free space", FAIL, detail, "free some space before converting or checkpointing here")
    if free < 10 * GiB or (total and free / total < 0.05):
        return Check("free space", WARN, detail, "conversions and checkpoints need room: free some space")
    return Check("free space", PASS, detail)


def check_dataset(path: Path) -> Check:
    """A packed fastdata dataset, or a folder of small files (one open and read per sample)."""
    from fastdata.errors import IncompleteDatasetError, NotADatasetError
    from fastdata.formats.manifest import read_manifest
    from fastdata.tools.disks import scan_folder

    if not path.exists():
        return Check("dataset", FAIL, f"{path} does not exist", "check the path")
    try:
        m = read_manifest(path)
    except IncompleteDatasetError as exc:
        return Check("dataset", WARN, f"{path}: {exc}", "run the conversion again to finish it")
    except NotADatasetError:
        pass
    else:
        per = m.data_bytes / max(1, m.num_samples)
        return Check("dataset", PASS, f"{path}: packed fastdata dataset ({m.kind}, {m.format}, {m.num_samples:,} "
                                      f"samples, {m.data_bytes / 1e6:,.1f} MB, {per / 1e3:,.1f} KB per sample)")
    if path.is_file():
        return Check("dataset", PASS, f"{path}: a single file of {path.stat().st_size / 1e6:,.1f} MB")
    scan = scan_folder(path)
    count = f"{scan.files:,}{'+' if scan.truncated else ''} files"
    convert = f"fastdata convert imagefolder {path} OUT.lmdb (one file, sequential reads, batches built in workers)"
    if scan.tars and scan.tars * 2 >= scan.files:
        return Check("dataset", PASS, f"{path}: {scan.tars:,} tar shards (WebDataset-style), no fastdata manifest")
    if scan.images:
        return Check("dataset", WARN, f"{path}: a folder of {count} ({scan.images:,} images, "
                                      f"{scan.mean_bytes / 1e3:,.1f} KB on average): one open + read per sample",
                     convert)
    return Check("dataset", WARN, f"{path}: not a fastdata dataset, {count}, no images found",
                 "point PATH at a converted dataset or an ImageFolder tree")


def check_pinned(cuda: bool, attempt: Any = None) -> Check:
    """Page-locked host memory makes host-to-device copies fast and asynchronous; pin 64 MiB to be sure."""
    if not cuda:
        return Check("pinned memory", WARN, "no CUDA: pin_memory is not available (and not needed on the CPU)",
                     "nothing to do for CPU work")
    try:
        seconds = attempt()
    except Exception as exc:
        return Check("pinned memory", FAIL, f"pinning 64 MiB failed: {exc}",
                     "raise the locked-memory limit (ulimit -l unlimited / docker --ulimit memlock=-1), or use "
                     "pin_memory=False")
    return Check("pinned memory", PASS, f"pinned 64 MiB in {seconds * 1e3:.1f} ms")


# -------------------------------------------------------------------------------------------------
# gathering the facts of this machine


def run_checks(path: str | os.PathLike[str] | None = None) -> list[Check]:
    """Every check on this machine (and PATH, when given)."""
    import torch

    from fastdata.meter.gpu import Nvml

    checks: list[Check] = []
    nvml, nvml_reason = Nvml.open()
    facts = None
    if nvml is not None:
        try:
            facts = nvml.facts()
        finally:
            nvml.close()
    cuda_build = torch.version.cuda
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    checks.append(check_torch(torch.__version__, cuda_build, len(facts.gpus) if facts else 0))
    checks.append(check_gpus(count, names, None if facts else nvml_reason, cuda_build))
    if count or facts:
        checks.append(check_driver(cuda_build, facts.cuda_driver_version if facts else None,
                                   facts.driver_version if facts else None, nvml_reason))
    if cuda:
        arch_list = list(torch.cuda.get_arch_list())
        for i in range(count):
            checks.append(check_capability(i, names[i], tuple(torch.cuda.get_device_capability(i)), arch_list))
        peer = torch.cuda.can_device_access_peer(0, 1) if count > 1 else None
        nvlinks = [g["nvlinks"] for g in facts.gpus] if facts else []
        checks.append(check_interconnect(count, nvlinks, peer))
    elif facts:  # the driver sees GPUs torch cannot use: still check the capabilities NVML reports
        for g in facts.gpus:
            if g["capability"]:
                checks.append(check_capability(g["index"], g["name"] or "GPU", tuple(g["capability"]),
                                               list(torch.cuda.get_arch_list())))
    checks.append(check_cores(available_cores(), count))
    from fastdata.image.region import region_decoder, unavailable_reason

    decoder = region_decoder()
    checks.append(check_jpeg_decoder(decoder.library if decoder else None, unavailable_reason(),
                                     decoder.proof if decoder else ""))
    total, available = _memory()
    target = Path(path) if path is not None else None
    dataset_bytes = _dataset_bytes(target)
    checks.append(check_memory(total, available, dataset_bytes))
    shm = Path("/dev/shm")
    checks.append(check_shm(shutil.disk_usage(shm).total if shm.is_dir() else None, shm.is_dir()))
    checks.append(check_open_files(*_open_file_limits()))
    checks.append(check_pinned(cuda, _pin_attempt(torch)))
    where = target if target is not None and target.exists() else (target.parent if target else Path.cwd())
    while not where.exists() and where != where.parent:
        where = where.parent
    from fastdata.tools.disks import block_device, mount_of

    disk, rotational = block_device(where)
    checks.append(check_storage(str(where), mount_of(where), disk, rotational, packed=dataset_bytes is not None))
    usage = shutil.disk_usage(where)
    checks.append(check_free_space(str(where), usage.free, usage.total))
    if target is not None:
        checks.append(check_dataset(target))
    return checks


def _memory() -> tuple[int | None, int | None]:
    try:
        import psutil
    except ImportError:
        return None, None
    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


def _open_file_limits() -> tuple[int | None, int | None]:
    try:
        import resource
    except ImportError:  # Windows
        return None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinity = resource.RLIM_INFINITY
    return (None if soft == infinity else soft), (-1 if hard == infinity else hard)


def _dataset_bytes(path: Path | None) -> int | None:
    if path is None or not path.exists():
        return None
    from fastdata.errors import NotADatasetError
    from fastdata.formats.manifest import read_manifest

    try:
        return read_manifest(path).data_bytes
    except NotADatasetError:
        return None


def _pin_attempt(torch: Any):
    def attempt() -> float:
        import time

        started = time.perf_counter()
        torch.empty(64 * MiB, dtype=torch.uint8).pin_memory()
        return time.perf_counter() - started

    return attempt
