"""Build the optional C extension `fastdata.image._jpeg_region` (everything else is in pyproject.toml).

It needs only a C compiler and Python's headers: libjpeg-turbo's headers are vendored in csrc/libjpeg-turbo and
the library itself is found at run time (Pillow's wheels ship one). Where it cannot be built, installation still
succeeds, says once what was not built and what to install (fastdata/image/jpeg/extension.py), and fastdata
decodes with OpenCV instead (`fastdata doctor` and `fastdata demo` say so too). Wheel builds (cibuildwheel, see
pyproject.toml) set FASTDATA_REQUIRE_EXTENSION=1, so that a wheel never ships without it.
"""

import os
import runpy
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

HERE = Path(__file__).resolve().parent
REQUIRED = os.environ.get("FASTDATA_REQUIRE_EXTENSION", "") not in ("", "0")


class OptionalBuildExt(build_ext):
    """build_ext that, where the extension cannot be compiled (no compiler, no Python headers), says so once with
    what to install, and lets the installation go on without it (unless FASTDATA_REQUIRE_EXTENSION is set)."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError) as exc:  # failed, not found, or none for this platform
            if REQUIRED:
                raise
            self._not_built(exc)

    def _not_built(self, exc: Exception) -> None:
        say = runpy.run_path(str(HERE / "fastdata" / "image" / "jpeg" / "extension.py"))["not_built_message"]
        rule = "=" * 100
        print(f"\n{rule}\nfastdata: {say(' '.join(str(exc).split()), consequence=True)}\n{rule}\n", file=sys.stderr,
              flush=True)


setup(
    cmdclass={"build_ext": OptionalBuildExt},
    ext_modules=[
        Extension(
            "fastdata.image._jpeg_region",
            sources=["csrc/jpeg_region.c", "csrc/jpeg_restart.c"],
            include_dirs=["csrc/libjpeg-turbo"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],
            extra_compile_args=["-O2"] if sys.platform != "win32" else [],
            optional=not REQUIRED,
        )
    ],
)
