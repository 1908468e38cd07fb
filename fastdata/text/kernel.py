"""The packed-batch C extension (`fastdata.text._rows`, csrc/text_rows.c, built by setup.py where a C compiler and
Python's headers are present): it makes a packed batch's arrays from the rows a worker handed over in one pass,
where numpy (`fastdata.text.forms`, the reference) takes a pass per array. Without it the batches are the same,
made more slowly: said once per process. setup.py runs this file without importing fastdata (to say what was not
built), so it imports nothing of fastdata."""

from __future__ import annotations

import functools
import importlib
import warnings
from importlib.util import find_spec
from types import ModuleType

EXTENSION = "fastdata.text._rows"
NOT_BUILT = f"the packed-batch kernel (the C extension {EXTENSION}) was not built"
WITHOUT_IT = "packed text batches are made with numpy instead: the same batches, more work per batch"
HOW_TO_BUILD = ("to build it, install a C compiler and Python's headers (Debian/Ubuntu: sudo apt install "
                "build-essential python3-dev; Fedora/RHEL: sudo dnf install gcc python3-devel; macOS: "
                "xcode-select --install) and run the same pip install again")


def extension_built() -> bool:
    """Whether the extension is installed (`rows_kernel` says why, should it still not load)."""
    return find_spec(EXTENSION) is not None


def not_built_message(detail: str = "", consequence: bool = False) -> str:
    """One line: the extension was not built (`detail`: why), with `consequence` what that changes, and what to
    install."""
    why = f" ({detail})" if detail else ""
    changes = f": {WITHOUT_IT}" if consequence else ""
    return f"{NOT_BUILT}{why}{changes}; {HOW_TO_BUILD}"


def unavailable_reason() -> str | None:
    """Why the extension does not load here (`NOT_BUILT` where the install had no compiler), or None where it
    does (for `fastdata doctor`; nothing is said)."""
    if not extension_built():
        return NOT_BUILT
    try:
        importlib.import_module(EXTENSION)
    except ImportError as exc:
        return f"{EXTENSION} does not load ({exc})"
    return None


@functools.cache
def rows_kernel() -> ModuleType | None:
    """The extension, or None (said once per process, with the reason) where it does not load."""
    try:
        return importlib.import_module(EXTENSION)
    except ImportError as exc:
        warnings.warn(not_built_message(str(exc), consequence=True), RuntimeWarning, stacklevel=2)
        return None
