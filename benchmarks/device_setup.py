"""What a lent GPU machine lacks, made ready before the device suite runs (`python -m benchmarks run device`).

Such a machine has torch/torchvision with CUDA, numpy, pillow, opencv, psutil and pytest but no network: the
rest travels as wheels in `.whl/` at the repository's root (`pip download --no-deps --only-binary=:all:
--python-version 3.12 --platform manylinux2014_x86_64 ...`: lmdb, webdataset, braceexpand, albumentations,
albucore, pydantic(-core), annotated_types, typing_inspection, typing_extensions, stringzilla, simsimd,
nvidia-nvimgcodec-cu13, nvidia-nvjpeg 13.x; ../shared/notes/gpu.md). They are installed into a folder of their own
and the C extension is built in place; the benchmarks then run with that folder on their path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = Path("/tmp/fastdata-device-site")
#: Seconds the set-up may take in all (installing the wheels, building the extension): part of the device suite's
#: budget (registry.DEVICE_SUITE_S). Each step is stopped at its share; a step stopped is said, and the suite goes on.
SETUP_TIMEOUT = 60
INSTALL_TIMEOUT, BUILD_TIMEOUT, CHECK_TIMEOUT = 15, 20, 12  # the check runs twice: 59 in all
assert INSTALL_TIMEOUT + BUILD_TIMEOUT + 2 * CHECK_TIMEOUT <= SETUP_TIMEOUT


def prepare(log: Path) -> dict[str, str]:
    """Install the carried wheels (when `.whl/` has any), build the C extension in place, and return the
    environment the benchmarks run in. What each step printed goes to `log`."""
    env = dict(os.environ)
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    with open(log, "a", encoding="utf-8") as out:
        if wheels:
            marker = SITE / ".fastdata-wheels"  # what an earlier run on this (still warm) machine installed
            listed = "\n".join(f"{w.name} {w.stat().st_size}" for w in wheels)
            if marker.exists() and marker.read_text() == listed:
                print(f"the {len(wheels)} carried wheels are installed in {SITE} already", flush=True)
            else:
                print(f"installing {len(wheels)} carried wheels into {SITE}", flush=True)
                done = _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                             "--target", str(SITE), *map(str, wheels)], INSTALL_TIMEOUT, stdout=out,
                            stderr=subprocess.STDOUT)
                if done == 0:
                    marker.write_text(listed)
            libraries = [str(p) for p in sorted(SITE.glob("nvidia/*/lib"))]
            env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            env["LD_LIBRARY_PATH"] = os.pathsep.join([*libraries, env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
        if (ROOT / "setup.py").exists():
            built = _run([sys.executable, "setup.py", "build_ext", "--inplace"], BUILD_TIMEOUT, cwd=ROOT, stdout=out,
                         stderr=subprocess.STDOUT, env=env)
            if built != 0:
                print(f"the C extension did not build (see {log}): the region decoder's rows fall back", flush=True)
    installed = _run([sys.executable, "-c", "import fastdata.converters"], CHECK_TIMEOUT, env=env, cwd=ROOT,
                     capture_output=True) == 0
    if not installed and not (ROOT / "fastdata" / "converters").exists():  # fastdata not installed here: what
        shutil.copytree(ROOT / "converters", ROOT / "fastdata" / "converters")  # its package-dir mapping does
    return env


def _run(command: list[str], timeout: float, **options: object) -> int | str:
    """A step's exit status, or "timeout" when it ran past its share of SETUP_TIMEOUT (said)."""
    try:
        return subprocess.run(command, check=False, timeout=timeout, **options).returncode  # type: ignore
    except subprocess.TimeoutExpired:
        print(f"set-up: {' '.join(command[1:3])} stopped after {timeout:.0f} s", flush=True)
        return "timeout"


def describe_gpu(env: dict[str, str]) -> str:
    """The GPU, torch and nvImageCodec, and the GPU's driver (nvidia-smi), as one line (what the results
    record)."""
    code = ("import torch, torchvision; from fastdata.image.device.decoders import nvimgcodec_missing as m; "
            "print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device', "
            "'| torch', torch.__version__, 'torchvision', torchvision.__version__, '| nvimgcodec:', m() or 'ok')")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False,
                              cwd=ROOT, timeout=CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"unknown (the check took over {CHECK_TIMEOUT} s)"
    lines = (done.stdout or done.stderr).strip().splitlines()
    smi = shutil.which("nvidia-smi")
    driver = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                            text=True, check=False).stdout.strip().splitlines() if smi else []
    return (lines[-1] if lines else "unknown") + f" | driver {driver[0] if driver else 'not recorded'}"
