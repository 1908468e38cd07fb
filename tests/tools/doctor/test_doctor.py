"""fastdata doctor: run here (no GPU: a WARN or INFO, never a crash) and check the rows it prints; every check's
PASS / INFO / WARN / FAIL from made-up facts, including the failures this machine cannot show."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from builders.images import build_solid_tree

import fastdata
from fastdata.cli import main
from fastdata.errors import IncompleteDatasetError, NotADatasetError
from fastdata.formats.manifest import MANIFEST_NAME, partial_path
from fastdata.image.jpeg.extension import HOW_TO_BUILD, NOT_BUILT
from fastdata.tools.doctor import (
    check_cores,
    check_dataset,
    check_free_space,
    check_jpeg_decoder,
    check_memory,
    check_open_files,
    check_pinned,
    check_png_decoder,
    check_shm,
    check_storage,
    check_text_kernel,
    recommended_workers,
    run_checks,
)
from fastdata.tools.doctor.disks import Mount, block_device, mount_of, scan_folder
from fastdata.tools.doctor.gpu import (
    check_capability,
    check_driver,
    check_gpus,
    check_interconnect,
    check_torch,
)
from fastdata.tools.doctor.table import (
    FAIL,
    INFO,
    PASS,
    WARN,
    Check,
    exit_code,
    format_checks,
)

ROW = re.compile(r"^(PASS|INFO|WARN|FAIL)\s{2,}(\S.*?)\s{2,}(\S.*)$")
GiB, MiB = 2**30, 2**20


def rows(text: str) -> dict[str, tuple[str, str]]:
    found = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match:
            found[match.group(2)] = (match.group(1), match.group(3))
    return found


def run_doctor(capsys, *args: str) -> tuple[int, str]:
    code = main(["doctor", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out


def test_doctor_runs_here_and_prints_its_rows(capsys, solid_lmdb):
    code, out = run_doctor(capsys, str(solid_lmdb))
    table = rows(out)
    for name in ("torch", "GPU", "CPU cores", "RAM", "/dev/shm", "open files", "pinned memory", "storage",
                 "free space", "dataset"):
        assert name in table, out
    assert code == (1 if any(status == FAIL for status, _ in table.values()) else 0)
    assert table["dataset"][0] == PASS and "packed fastdata dataset (image, lmdb, 45 samples" in table["dataset"][1]
    assert re.search(r"use num_workers=\d+", table["CPU cores"][1])
    assert re.search(r"\d+ PASS, \d+ INFO, \d+ WARN, \d+ FAIL", out)
    if not torch.cuda.is_available():
        assert table["GPU"][0] in (INFO, WARN)  # INFO with a CPU-only torch build, WARN with a CUDA one
        assert table["pinned memory"][0] == INFO  # nothing to do on a CPU-only machine
        assert table["storage"][0] in (PASS, INFO)  # 45 tiny images fit in RAM, whatever the disk
    else:  # pragma: no cover - on a GPU machine
        assert table["GPU"][0] == PASS and "GPU 0 capability" in table


def test_doctor_on_a_folder_of_small_files(capsys, tmp_path):
    tree = build_solid_tree(tmp_path / "src", count=12)
    _, out = run_doctor(capsys, str(tree.root))
    status, detail = rows(out)["dataset"]
    assert status == WARN and "a folder of 12 files (12 images" in detail
    assert f"fix: fastdata convert imagefolder {tree.root} OUT.lmdb" in out


def loader_message(path: Path, error: type[Exception]) -> str:
    """What fastdata.loader says when it cannot open `path`."""
    with pytest.raises(error) as info:
        fastdata.loader(path, num_workers=0)
    return str(info.value)


def test_doctor_on_a_missing_path_says_what_the_loader_says(capsys, tmp_path):
    missing = tmp_path / "nope.lmdb"
    code, out = run_doctor(capsys, str(missing))
    assert code == 1
    assert rows(out)["dataset"] == (FAIL, loader_message(missing, NotADatasetError))


def test_doctor_on_an_interrupted_conversion_says_what_the_loader_says(capsys, tmp_path):
    out_path = tmp_path / "train.lmdb"
    partial_path(out_path).mkdir()  # what an interrupted conversion leaves: OUT.partial only
    code, out = run_doctor(capsys, str(out_path))
    assert code == 1
    message = loader_message(out_path, IncompleteDatasetError)
    assert rows(out)["dataset"] == (FAIL, message) and "rerun the same convert command" in message


def test_doctor_on_a_damaged_manifest_says_what_the_loader_says(capsys, tmp_path):
    damaged = tmp_path / "train.lmdb"
    damaged.mkdir()
    (damaged / MANIFEST_NAME).write_text("{not json")
    code, out = run_doctor(capsys, str(damaged))
    assert code == 1
    assert rows(out)["dataset"] == (FAIL, loader_message(damaged, NotADatasetError))


def test_doctor_without_path(capsys):
    _, out = run_doctor(capsys)
    table = rows(out)
    assert "dataset" not in table and "storage" in table and str(Path.cwd()) in table["storage"][1]


# ---------------------------------------------------------------------------------------------------
# every check from made-up facts


def test_capability_mismatch_is_the_known_failure():
    arch = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
    check = check_capability(0, "NVIDIA RTX PRO 6000", (12, 0), arch)
    assert check.status == FAIL
    assert "has capability (12, 0) but this torch supports (5,0) to (9,0)" in check.detail
    assert "sm_120" in check.fix and "newer" in check.fix
    assert check_capability(0, "A10", (8, 6), ["sm_80", "sm_90"]).status == PASS  # same major, lower minor
    assert check_capability(0, "H100", (9, 0), ["sm_80", "sm_90a"]).status == PASS
    ptx = check_capability(0, "B200", (10, 0), ["sm_80", "sm_90", "compute_90"])
    assert ptx.status == WARN and "PTX" in ptx.detail
    old = check_capability(0, "GTX 1080", (6, 1), ["sm_75", "sm_80"])
    assert old.status == FAIL and "older torch" in old.fix


def test_driver_against_the_cuda_build():
    old = check_driver("13.0", (12, 2), "535.104", None)
    assert old.status == FAIL and "supports CUDA up to 12.2; torch is built for CUDA 13.0" in old.detail
    assert "cu122" in old.fix
    assert check_driver("12.4", (12, 2), "535.104", None).status == WARN
    assert check_driver("12.4", (13, 0), "580.1", None).status == PASS
    assert check_driver(None, None, None, None).status == PASS
    unknown = check_driver("12.4", None, None, "NVML is not installed")
    assert unknown.status == WARN and "fastdata[gpu]" in unknown.fix


def test_torch_gpus_and_interconnect():
    assert check_torch("2.5.0", "12.4", 0).status == PASS
    assert check_torch("2.5.0+cpu", None, 2).status == WARN
    assert check_torch("2.5.0+cpu", None, 0).status == PASS
    assert check_gpus(0, [], "NVML sees no GPU", "12.4").status == WARN  # a CUDA build: check the container
    cpu_machine = check_gpus(0, [], "NVML could not start: Driver Not Loaded", None)
    assert cpu_machine.status == INFO and "CPU-only torch build" in cpu_machine.detail
    assert check_gpus(2, ["H100", "H100"], None, "12.4") == Check("GPU", PASS, "2 GPU(s): H100")
    assert check_interconnect(1, [], None).status == PASS
    assert check_interconnect(4, [18, 18, 18, 18], True).status == PASS
    pcie = check_interconnect(2, [0, 0], False)
    assert pcie.status == WARN and "PCIe" in pcie.detail


def test_cores_and_workers():
    assert recommended_workers(64, 4) == 16 and recommended_workers(8, 4) == 2 and recommended_workers(2, 0) == 2
    few = check_cores(8, 4)
    assert few.status == WARN and "num_workers=2" in few.detail and "--max-size" in few.fix
    assert check_cores(64, 4).status == PASS
    assert check_cores(1, 0).status == WARN


def test_memory_shm_and_open_files():
    assert check_memory(64 * GiB, 50 * GiB, 10 * GiB).detail.endswith("fits in the page cache")
    assert check_memory(4 * GiB, 3 * GiB).status == WARN
    assert check_memory(None, None).status == WARN
    docker_default = check_shm(64 * MiB, True)
    assert docker_default.status == FAIL and "--shm-size" in docker_default.fix
    assert check_shm(1 * GiB, True).status == WARN
    assert check_shm(16 * GiB, True).status == PASS
    assert check_shm(None, False, platform="linux").status == FAIL
    assert check_shm(None, False, platform="darwin").status == PASS
    low = check_open_files(1024, 1_048_576)
    assert low.status == WARN and "ulimit -n 65536" in low.fix
    assert check_open_files(100, 100).status == FAIL
    assert check_open_files(65536, -1).status == PASS and check_open_files(None, None).status == PASS


def test_storage_free_space_and_pinning():
    nfs = check_storage("/data", Mount("/data", "server:/export", "nfs4"), None, None)
    assert nfs.status == WARN and "network filesystem" in nfs.detail and "fastdata convert" in nfs.fix
    spinning = check_storage("/data", Mount("/", "/dev/sdb1", "ext4"), "sdb", True, packed=True)
    assert spinning.status == WARN and "rotational" in spinning.detail and "convert" not in spinning.fix
    assert check_storage("/data", Mount("/", "/dev/nvme0n1p1", "ext4"), "nvme0n1", False).status == PASS
    assert check_free_space("/", 100 * MiB, 100 * GiB).status == FAIL
    assert check_free_space("/", 5 * GiB, 100 * GiB).status == WARN
    assert check_free_space("/", 500 * GiB, 1000 * GiB).status == PASS

    def refuse():
        raise RuntimeError("out of locked memory")

    assert check_pinned(True, refuse).status == FAIL
    assert check_pinned(True, lambda: 0.002) == Check("pinned memory", PASS, "pinned 64 MiB in 2.0 ms")
    cpu_only = check_pinned(False)
    assert cpu_only.status == INFO and "nothing to do" in cpu_only.detail and not cpu_only.fix


def test_a_dataset_that_fits_in_ram_is_not_called_slow():
    """Only the first pass reads the disk when the whole dataset fits in the page cache."""
    hdd = Mount("/", "/dev/sdb1", "ext4")
    fits = check_storage("/data", hdd, "sdb", True, packed=True, dataset_bytes=2 * GiB, available=20 * GiB)
    assert fits.status == INFO and "rotational" in fits.detail and "fits in the page cache" in fits.detail
    too_big = check_storage("/data", hdd, "sdb", True, packed=True, dataset_bytes=200 * GiB, available=20 * GiB)
    assert too_big.status == WARN and "SSD" in too_big.fix
    assert check_storage("/data", hdd, "sdb", True, dataset_bytes=2 * GiB, available=None).status == WARN
    assert check_storage("/data", hdd, "sdb", True).status == WARN  # size unknown
    small_folder = check_storage("/data", hdd, "sdb", True, packed=False, dataset_bytes=GiB, available=20 * GiB)
    assert small_folder.status == INFO
    nfs = Mount("/data", "server:/export", "nfs4")
    assert check_storage("/data", nfs, None, None, packed=True, dataset_bytes=GiB, available=20 * GiB).status == INFO
    # a folder of small files on NFS: every open is a round trip, cached or not
    assert check_storage("/data", nfs, None, None, packed=False, dataset_bytes=GiB, available=20 * GiB).status == WARN
    assert check_memory(64 * GiB, 50 * GiB, 10 * GiB).status == PASS


def test_doctor_here_on_a_small_dataset_does_not_warn_about_storage(capsys, solid_lmdb):
    """The 45-image dataset fits in this machine's memory: its disk cannot be the wall after the first pass."""
    _, out = run_doctor(capsys, str(solid_lmdb))
    status, detail = rows(out)["storage"]
    assert status in (PASS, INFO), detail


def test_exit_code_and_table():
    checks = [Check("a", PASS, "fine", "never shown"), Check("b", WARN, "hmm", "do this")]
    assert exit_code(checks) == 0
    assert exit_code([*checks, Check("c", FAIL, "broken", "fix that")]) == 1
    text = format_checks(checks)
    assert "never shown" not in text and "fix: do this" in text and "1 PASS, 0 INFO, 1 WARN, 0 FAIL" in text
    info = [Check("a", PASS, "fine"), Check("p", INFO, "nothing to do here", "not a fix")]
    assert exit_code(info) == 0
    text = format_checks(info)
    assert "INFO    p" in text and "not a fix" not in text and "1 PASS, 1 INFO, 0 WARN, 0 FAIL" in text


def test_storage_facts_of_this_machine(tmp_path):
    mount = mount_of(tmp_path)
    assert mount is not None and mount.fstype and str(tmp_path).startswith(mount.mountpoint)
    _disk, rotational = block_device(tmp_path)
    assert rotational in (True, False, None)
    for i in range(5):
        (tmp_path / f"d{i % 2}").mkdir(exist_ok=True)
        (tmp_path / f"d{i % 2}" / f"{i}.jpg").write_bytes(b"x" * 100)
    (tmp_path / "shard.tar").write_bytes(b"t" * 50)
    scan = scan_folder(tmp_path)
    assert (scan.files, scan.bytes, scan.images, scan.tars, scan.truncated) == (6, 550, 5, 1, False)
    assert scan_folder(tmp_path, limit=3).truncated
    assert check_dataset(tmp_path / "shard.tar").status == PASS  # a single file


def test_jpeg_decoder_verdicts():
    found = check_jpeg_decoder("/x/pillow.libs/libjpeg-1.so.62", "", "48 decodes bit-exact in 4.2 ms")
    assert found.status == PASS and "libjpeg-1.so.62" in found.detail and "crop-region" in found.detail
    assert "self-check: 48 decodes bit-exact in 4.2 ms" in found.detail
    missing = check_jpeg_decoder(None, "the C extension fastdata._jpeg_region is not built")
    assert missing.status == WARN and "not built" in missing.detail and "compiler" in missing.fix
    assert not re.search(r"\d\s*(x|times|%)", missing.detail + missing.fix)  # no figure the doctor did not measure


def test_text_kernel_verdicts_and_the_row_here():
    """The packed-text kernel: PASS where it loads, WARN with what to install where it was not built; the doctor's
    own row says what this install has."""
    from fastdata.text import kernel

    assert check_text_kernel(None).status == PASS
    missing = check_text_kernel(kernel.NOT_BUILT)
    assert missing.status == WARN and kernel.NOT_BUILT in missing.detail and "numpy" in missing.detail
    assert missing.fix == kernel.HOW_TO_BUILD
    row = next(c for c in run_checks() if c.name == "text kernel")
    assert (row.status == PASS) == (kernel.unavailable_reason() is None)


def test_png_decoder_verdicts_and_the_row_here(monkeypatch):
    """libspng: PASS with pyspng's version; OpenCV's libpng where pyspng does not import: WARN with the reason and
    what to install. The doctor's own row follows what this install has."""
    import sys

    import pyspng

    assert check_png_decoder("0.1.4", "").status == PASS
    row = next(c for c in run_checks() if c.name == "PNG decoder")
    assert row.status == PASS and pyspng.__version__ in row.detail
    monkeypatch.setitem(sys.modules, "pyspng", None)  # import pyspng raises ImportError
    row = next(c for c in run_checks() if c.name == "PNG decoder")
    assert row.status == WARN and "pyspng" in row.detail and row.fix == "pip install pyspng"
    assert not re.search(r"\d\s*(x|times|%)", row.detail + row.fix)  # no figure the doctor did not measure


def test_without_the_extension_the_doctor_says_it_was_not_built_and_what_to_install(without_extension, capsys):
    """Installed where no C compiler or no Python headers were (the install went on without the extension): the
    JPEG decoder row WARNs that it was not built, and its fix is what to install."""
    row = next(c for c in run_checks() if c.name == "JPEG decoder")
    assert row.status == WARN and row.detail.endswith(NOT_BUILT) and row.fix == HOW_TO_BUILD
    assert "build-essential python3-dev" in row.fix
    assert main(["doctor"]) in (0, 1)  # a FAIL elsewhere on this machine is not this test's business
    assert NOT_BUILT in capsys.readouterr().out


@pytest.mark.region_extension
def test_doctor_reports_the_decoder_in_use_here():
    from fastdata.image.jpeg.region import region_decoder
    from fastdata.tools.doctor import run_checks

    row = next(c for c in run_checks() if c.name == "JPEG decoder")
    assert row.status == PASS and region_decoder().library in row.detail
    assert region_decoder().proof in row.detail and "bit-exact" in row.detail


def test_the_gpu_decoder_is_reported_with_its_version_and_the_engines_use():
    from fastdata.tools.doctor.gpu import check_gpu_decoder

    here = check_gpu_decoder(False, None, "", "0.29.1")
    assert here.status == "INFO" and "no CUDA" in here.detail
    fast = check_gpu_decoder(True, "0.9.0", "", "0.29.1", jpeg_util=37.0)
    assert fast.status == "PASS" and "nvImageCodec 0.9.0" in fast.detail and "JPEG engines 37% busy" in fast.detail
    slow = check_gpu_decoder(True, None, "ModuleNotFoundError: No module named 'nvidia.nvimgcodec'", "0.29.1")
    assert slow.status == "WARN" and "torchvision 0.29.1" in slow.detail and "fastdata[gpu-cu13]" in slow.fix


def test_doctor_prints_the_gpu_decoder_row(capsys):
    from fastdata.cli import main

    assert main(["doctor"]) in (0, 1)
    assert any(line.split()[1:3] == ["GPU", "decoder"] for line in capsys.readouterr().out.splitlines()
               if line.split())
