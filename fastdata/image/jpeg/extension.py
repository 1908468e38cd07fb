"""The region decoder's C extension (`fastdata.image._jpeg_region`, built by setup.py where a C compiler and
Python's headers are present): whether it was built, and what to say when it was not. One text for every place that
says it: setup.py at build time (it runs this file without importing fastdata, so this module imports nothing of
fastdata), the region decoder's `unavailable_reason`, `fastdata doctor`, `fastdata demo` and the tests that need it."""

from importlib.util import find_spec

EXTENSION = "fastdata.image._jpeg_region"
NOT_BUILT = f"the region decoder (the C extension {EXTENSION}) was not built"
WITHOUT_IT = "JPEGs are decoded whole with OpenCV instead: the same pixels, more decoding work per crop"
HOW_TO_BUILD = ("to build it, install a C compiler and Python's headers (Debian/Ubuntu: sudo apt install "
                "build-essential python3-dev; Fedora/RHEL: sudo dnf install gcc python3-devel; macOS: "
                "xcode-select --install; conda: conda install -c conda-forge c-compiler) and run the same pip "
                "install again")


def extension_built() -> bool:
    """Whether the extension is installed (it may still fail to load: `region.unavailable_reason` says why)."""
    return find_spec(EXTENSION) is not None


def not_built_message(detail: str = "", consequence: bool = False) -> str:
    """One line: the extension was not built (`detail`: why, e.g. the compiler's error), with `consequence` what that
    changes, and what to install."""
    why = f" ({detail})" if detail else ""
    changes = f": {WITHOUT_IT}" if consequence else ""
    return f"{NOT_BUILT}{why}{changes}; {HOW_TO_BUILD}"
