"""Build the optional C extensions `fastdata.image._jpeg_region` and `fastdata.text._rows` (everything else is in
pyproject.toml).

It needs only a C compiler and Python's headers: libjpeg-turbo's headers are vendored in csrc/libjpeg-turbo and
the library itself is found at run time (Pillow's wheels ship one). Where it cannot be built, installation still
succeeds, says once what was not built and what to install (fastdata/image/jpeg/extension.py), and fastdata
decodes with OpenCV instead (`fastdata doctor` and `fastdata demo` say so too). `fastdata.text._rows` (csrc/text_rows.c)
needs nothing but Python's headers; without it packed text batches are made with numpy, the same batches, slower
(fastdata/text/kernel.py says so once). Wheel builds (cibuildwheel, see
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
            self._not_built(ext, exc)

    def _not_built(self, ext: Extension, exc: Exception) -> None:
        where = ("image", "jpeg", "extension.py") if ext.name.endswith("_jpeg_region") else ("text", "kernel.py")
        say = runpy.run_path(str(HERE.joinpath("fastdata", *where)))["not_built_message"]
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
        ),
        Extension(
            "fastdata.text._rows",
            sources=["csrc/text_rows.c"],
            extra_compile_args=["-O3"] if sys.platform != "win32" else [],
            optional=not REQUIRED,
        ),
    ],
)
