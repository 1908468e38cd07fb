"""Build the optional C extension `fastdata.image._jpeg_region` (everything else is in pyproject.toml).

It needs only a C compiler and Python's headers: libjpeg-turbo's headers are vendored in csrc/libjpeg-turbo and
the library itself is found at run time (Pillow's wheels ship one). Where it cannot be built, installation still
succeeds and fastdata decodes with OpenCV instead (`fastdata doctor` says which decoder is in use).
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "fastdata.image._jpeg_region",
            sources=["csrc/jpeg_region.c", "csrc/jpeg_restart.c"],
            include_dirs=["csrc/libjpeg-turbo"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],
            extra_compile_args=["-O2"] if sys.platform != "win32" else [],
            optional=True,
        )
    ]
)
