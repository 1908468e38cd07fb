"""Griffe extension for the API reference: `converters/` installs as `fastdata.converters` (a package-dir mapping),
which griffe's static finder does not follow, so `fastdata.convert_imagefolder` and `fastdata.convert_text` (aliases
into it) would not resolve. Load the folder and attach it to the `fastdata` package under its installed name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import griffe

CONVERTERS = Path(__file__).resolve().parents[2] / "converters"


class ConvertersAsSubpackage(griffe.Extension):
    """Attach `converters/` to the loaded `fastdata` package as `fastdata.converters`."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name == "fastdata" and "converters" not in pkg.members:
            converters = loader.load(CONVERTERS)
            pkg.set_member("converters", converters)
