"""`fastdata doctor [PATH]`: check the machine before a long job, with a PASS / INFO / WARN / FAIL row and the fix
for each: torch and its CUDA build against the driver and each GPU's compute capability, GPUs and their
interconnect, CPU cores and a recommended `num_workers`, the JPEG and PNG decoders in use, the packed-text kernel, RAM,
/dev/shm, the open-file limit, pinned memory, and the storage and dataset at PATH. Needs no network and no GPU (on
a CPU-only machine what needs nothing there, such as pinned memory, is INFO); each check is a pure function of the
facts it is given, so every verdict is tested with made-up facts too."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastdata.config import available_cores
from fastdata.image.jpeg.extension import HOW_TO_BUILD, NOT_BUILT
from fastdata.tools.doctor.gpu import (
    check_capability,
    check_driver,
    check_gpus,
    check_interconnect,
    check_torch,
)
from fastdata.tools.doctor.table import FAIL, INFO, PASS, WARN, Check, GiB, MiB

# -------------------------------------------------------------------------------------------------
# the checks, as functions of facts


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


def check_gpu_decoder_here(cuda: bool, facts: Any) -> Check:
    """The GPU decoder check (fastdata.tools.doctor.gpu.check_gpu_decoder) with this process's facts."""
    import torchvision

    from fastdata.image.device.decoders import nvimgcodec_missing
    from fastdata.tools.doctor.gpu import check_gpu_decoder

    missing = nvimgcodec_missing() if cuda else ""
    version = None
    if cuda and not missing:
        from nvidia import nvimgcodec

        version = getattr(nvimgcodec, "__version__", "?")
    jpeg = None
    if cuda and facts is not None:
        from fastdata.meter.gpu import Nvml

        nvml, _ = Nvml.open()
        if nvml is not None:
            try:
                uses = [u for u in nvml.utilization() if u is not None and u.jpeg_util_percent is not None]
                jpeg = uses[0].jpeg_util_percent if uses else None
            finally:
                nvml.close()
    return check_gpu_decoder(cuda, version, missing, torchvision.__version__.split("+")[0], jpeg)


def check_jpeg_decoder(library: str | None, reason: str, proof: str = "") -> Check:
    """Whether the CPU path decodes only crop regions (fastdata's libjpeg-turbo extension, `proof`: its
    self-check) or whole images. The fallback's cost is not given as a figure: it is the region decoder's saving,
    which cannot be measured where the region decoder is unavailable, and it depends on the images and crops."""
    if library is not None:
        checked = f"; self-check: {proof}" if proof else ""
        return Check("JPEG decoder", PASS, f"crop-region decoding with DCT scaling (libjpeg-turbo: {library}"
                                           f"{checked})")
    whole = ("whole-image decoding with OpenCV (same pixels, but every pixel of every JPEG is decoded, not only the "
             "crop's)")
    if reason.startswith(NOT_BUILT):  # the build had no compiler or no Python headers: say what to install
        return Check("JPEG decoder", WARN, f"{whole}: {NOT_BUILT}", HOW_TO_BUILD)
    return Check("JPEG decoder", WARN, f"{whole}: {reason}",
                 "reinstall fastdata where a C compiler and the Python headers are present (pip install .), "
                 "with Pillow from its wheel (it ships libjpeg-turbo)")


def check_text_kernel(reason: str | None) -> Check:
    """Whether packed text batches are made by fastdata's one-pass C kernel (`fastdata.text.kernel`) or with numpy
    (the same batches, more work per batch); `reason`: why the kernel does not load (None: it does)."""
    from fastdata.text import kernel

    if reason is None:
        return Check("text kernel", PASS, f"packed text batches made in one pass ({kernel.EXTENSION})")
    return Check("text kernel", WARN, f"{kernel.WITHOUT_IT}: {reason}", kernel.HOW_TO_BUILD)


def check_png_decoder(version: str | None, reason: str) -> Check:
    """Whether PNGs are decoded by libspng (the pyspng package, `version`) or all by OpenCV's libpng (the same
    pixels, more decoding time); `reason`: why pyspng does not import."""
    if version is not None:
        return Check("PNG decoder", PASS, f"libspng (pyspng {version}), every chunk's CRC checked first")
    return Check("PNG decoder", WARN, f"OpenCV's libpng (the same pixels, more decoding time): {reason}",
                 "pip install pyspng")


def fits_in_page_cache(dataset_bytes: int | None, available: int | None) -> bool:
    """Whether the whole dataset can stay in the page cache: smaller than the memory available now (so after the
    first pass every read is served from RAM, whatever the disk)."""
    return dataset_bytes is not None and available is not None and dataset_bytes < available


def check_memory(total: int | None, available: int | None, dataset_bytes: int | None = None) -> Check:
    """RAM, and whether the dataset fits in the page cache."""
    if total is None:
        return Check("RAM", WARN, "unknown (psutil is not installed)", "pip install psutil")
    detail = f"{total / GiB:.1f} GiB, {available / GiB:.1f} GiB available" if available is not None else \
        f"{total / GiB:.1f} GiB"
    if dataset_bytes:
        fits = fits_in_page_cache(dataset_bytes, available)
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


def check_storage(where: str, mount: Any, disk: str | None, rotational: bool | None, packed: bool = False,
                  dataset_bytes: int | None = None, available: int | None = None) -> Check:
    """Network filesystems and spinning disks make small random reads slow (`packed`: the data already is
    a fastdata dataset, so the fix is where it lives, not how). A dataset of `dataset_bytes` that fits in the
    `available` memory is read from the disk once and then from the page cache, so a rotational disk (or a network
    filesystem under a packed dataset: a few files, opened once) is INFO, not a warning."""
    if mount is None:
        return Check("storage", WARN, f"{where}: could not find its mount", "")
    detail = f"{where}: {mount.fstype} on {mount.device} (mounted at {mount.mountpoint})"
    pack = "" if packed else \
        "pack the data into LMDB / WebDataset shards (`fastdata convert`), so reads are few and sequential, or "
    cached = ""
    if fits_in_page_cache(dataset_bytes, available):
        assert dataset_bytes is not None and available is not None  # what fitting takes
        cached = (f", but the dataset ({dataset_bytes / GiB:.2f} GiB) fits in the page cache ({available / GiB:.1f} "
                  "GiB available): only the first pass reads the disk")
    if mount.network:
        if cached and packed:
            return Check("storage", INFO, detail + ": a network filesystem" + cached)
        return Check("storage", WARN, detail + ": a network filesystem, every file open is a round trip",
                     pack + "copy it to a local SSD first")
    if rotational:
        disk_said = f": the kernel reports {disk} as a rotational disk"
        if cached:
            return Check("storage", INFO, detail + disk_said + cached)
        return Check("storage", WARN, detail + disk_said + " (virtual disks often claim this; check what is behind "
                                                           "it)",
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


def check_dataset(path: Path, scan: Any = None) -> Check:
    """A packed fastdata dataset, or a folder of small files (one open and read per sample; `scan`: the folder's
    `scan_folder`, when already made). A path the loader cannot open as a dataset although it should (missing, an
    interrupted conversion, a damaged manifest) FAILs with the loader's own message."""
    from fastdata.errors import IncompleteDatasetError, NotADatasetError
    from fastdata.formats.manifest import MANIFEST_NAME, read_manifest
    from fastdata.tools.doctor.disks import scan_folder

    try:
        m = read_manifest(path)  # what fastdata.loader reads first: its message is the loader's
    except IncompleteDatasetError as exc:
        return Check("dataset", FAIL, str(exc))
    except NotADatasetError as exc:
        if not path.exists():
            return Check("dataset", FAIL, str(exc), "check the path")
        if (path / MANIFEST_NAME).exists():
            return Check("dataset", FAIL, str(exc))
    else:
        per = m.data_bytes / max(1, m.num_samples)
        return Check("dataset", PASS, f"{path}: packed fastdata dataset ({m.kind}, {m.format}, {m.num_samples:,} "
                                      f"samples, {m.data_bytes / 1e6:,.1f} MB, {per / 1e3:,.1f} KB per sample)")
    if path.is_file():
        return Check("dataset", PASS, f"{path}: a single file of {path.stat().st_size / 1e6:,.1f} MB")
    scan = scan if scan is not None else scan_folder(path)
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
        return Check("pinned memory", INFO, "no CUDA: pinned memory only speeds up copies to a GPU; nothing to do "
                                            "for CPU work")
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
            checks.append(check_capability(i, names[i], torch.cuda.get_device_capability(i), arch_list))
        peer = torch.cuda.can_device_access_peer(0, 1) if count > 1 else None
        nvlinks = [g["nvlinks"] for g in facts.gpus] if facts else []
        checks.append(check_interconnect(count, nvlinks, peer))
    elif facts:  # the driver sees GPUs torch cannot use: still check the capabilities NVML reports
        for g in facts.gpus:
            if g["capability"]:
                checks.append(check_capability(g["index"], g["name"] or "GPU", tuple(g["capability"]),
                                               list(torch.cuda.get_arch_list())))
    checks.append(check_gpu_decoder_here(cuda, facts))
    checks.append(check_cores(available_cores(), count))
    from fastdata.image.jpeg.region import region_decoder, unavailable_reason

    decoder = region_decoder()
    checks.append(check_jpeg_decoder(decoder.library if decoder else None, unavailable_reason(),
                                     decoder.proof if decoder else ""))
    from fastdata.image.decode import spng_status

    checks.append(check_png_decoder(*spng_status()))
    from fastdata.text.kernel import unavailable_reason as text_kernel_reason

    checks.append(check_text_kernel(text_kernel_reason()))
    total, available = _memory()
    target = Path(path) if path is not None else None
    dataset_bytes, packed, scan = _dataset_size(target)
    checks.append(check_memory(total, available, dataset_bytes))
    shm = Path("/dev/shm")
    checks.append(check_shm(shutil.disk_usage(shm).total if shm.is_dir() else None, shm.is_dir()))
    checks.append(check_open_files(*_open_file_limits()))
    checks.append(check_pinned(cuda, _pin_attempt(torch)))
    where = target if target is not None and target.exists() else (target.parent if target else Path.cwd())
    while not where.exists() and where != where.parent:
        where = where.parent
    from fastdata.tools.doctor.disks import block_device, mount_of

    disk, rotational = block_device(where)
    checks.append(check_storage(str(where), mount_of(where), disk, rotational, packed=packed,
                                dataset_bytes=dataset_bytes, available=available))
    usage = shutil.disk_usage(where)
    checks.append(check_free_space(str(where), usage.free, usage.total))
    if target is not None:
        checks.append(check_dataset(target, scan))
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


def _dataset_size(path: Path | None) -> tuple[int | None, bool, Any]:
    """(bytes of the data at `path` or None where unknown, whether it is a packed fastdata dataset, the folder scan
    when it is a folder of files): a packed dataset's size is its manifest's, a folder's what a walk over it
    counted (unknown when the walk stopped at its limit), a file's its own."""
    if path is None or not path.exists():
        return None, False, None
    from fastdata.errors import NotADatasetError
    from fastdata.formats.manifest import MANIFEST_NAME, read_manifest
    from fastdata.tools.doctor.disks import scan_folder

    try:
        return read_manifest(path).data_bytes, True, None
    except NotADatasetError:
        pass
    if path.is_file():
        return path.stat().st_size, False, None
    if (path / MANIFEST_NAME).exists():  # a damaged dataset: the dataset row says why
        return None, False, None
    scan = scan_folder(path)
    return (None if scan.truncated else scan.bytes), False, scan


def _pin_attempt(torch: Any) -> Callable[[], float]:
    def attempt() -> float:
        import time

        started = time.perf_counter()
        torch.empty(64 * MiB, dtype=torch.uint8).pin_memory()
        return time.perf_counter() - started

    return attempt
