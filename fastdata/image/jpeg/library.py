"""Where to find a libjpeg-turbo for the region decoder (fastdata.image.jpeg.region), best first.

1. The libjpeg that Pillow's own `PIL._imaging` extension is linked against, as the dynamic linker resolved it
   (so a Pillow built against conda's or the distribution's libjpeg-turbo is covered, and the library is already
   mapped: loading it again costs nothing).
2. The libjpeg-turbo bundled in Pillow's wheel, beside the package: `pillow.libs/` on Linux (older wheels and some
   repackagers spell it `Pillow.libs`, so the folder is matched whatever its case), `PIL/.dylibs/` on macOS.
3. The system's libjpeg (looked up only when the others fail: ctypes.util.find_library runs ldconfig, which takes
   milliseconds, in every worker process).

Finding a library proves nothing: every candidate must still pass the region decoder's self-check before use.
"""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Iterator
from pathlib import Path


def wheel_libraries(site_dir: Path) -> list[str]:
    """The libjpeg builds a Pillow wheel installed in `site_dir` (the folder holding the `PIL` package) bundles,
    whatever the case of its `pillow.libs` folder."""
    found: list[str] = []
    if site_dir.is_dir():
        for folder in sorted(site_dir.iterdir()):
            if folder.name.lower() == "pillow.libs" and folder.is_dir():
                found += sorted(str(p) for p in folder.glob("libjpeg*.so*"))  # manylinux wheels
    found += sorted(str(p) for p in (site_dir / "PIL" / ".dylibs").glob("libjpeg*.dylib"))  # macOS wheels
    return found


def pillow_linked_library() -> str | None:
    """The file of the libjpeg that the loaded `PIL._imaging` takes `jpeg_std_error` from (the dynamic linker's
    answer, through dlsym + dladdr), or None (no Pillow, no extension, or a Pillow without JPEG support)."""
    try:
        from PIL import _imaging

        from fastdata.image import _jpeg_region
    except ImportError:
        return None
    found = _jpeg_region.linked_library(_imaging.__file__, "jpeg_std_error")
    return os.path.normpath(found) if found else None  # "PIL/../pillow.libs/..." -> "pillow.libs/..."


def library_candidates(site_dir: Path | None, linked: str | None, system: str | None) -> list[str]:
    """The libraries to try, best first, each once: `linked` (Pillow's own), those of a Pillow wheel in
    `site_dir`, then `system` (a path or a name the dynamic linker resolves)."""
    ordered = ([linked] if linked else []) + (wheel_libraries(site_dir) if site_dir is not None else [])
    ordered += [system] if system else []
    seen: set[str] = set()
    candidates = []
    for path in ordered:
        identity = os.path.realpath(path) if os.sep in path else path
        if identity not in seen:
            seen.add(identity)
            candidates.append(path)
    return candidates


def default_candidates() -> Iterator[str]:
    """The candidates of this process, best first: its Pillow's linked and bundled libjpeg, then (looked up only
    when asked for the next candidate after those) the system's."""
    try:
        import PIL

        site_dir: Path | None = Path(PIL.__file__).parent.parent
    except ImportError:  # pragma: no cover - Pillow is a dependency
        site_dir = None
    pillows = library_candidates(site_dir, pillow_linked_library(), None)
    yield from pillows
    system = ctypes.util.find_library("jpeg")
    if system and system not in pillows:
        yield system
