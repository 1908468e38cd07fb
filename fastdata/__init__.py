"""fastdata: fast data pipelines for PyTorch.

The public functions are imported on first use, so `import fastdata` (and `fastdata --version` / `--help`) stay
fast and do not import torch. `fastdata.loader` and `fastdata.meter` are the functions, as `from fastdata import
loader` gives them, although modules of the same names exist (`fastdata/loader/`, `fastdata/meter/`).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from fastdata._version import __version__

if TYPE_CHECKING:  # what static tools see; at run time the names resolve on first use (below)
    from fastdata.converters.coco import convert_coco
    from fastdata.converters.filelist import convert_list
    from fastdata.converters.hf import convert_hf
    from fastdata.converters.imagefolder import convert_imagefolder
    from fastdata.converters.pairs import convert_pairs
    from fastdata.converters.text import convert_text
    from fastdata.converters.webdataset import convert_webdataset
    from fastdata.deprecations import FastdataDeprecationWarning
    from fastdata.loader import dataset, loader
    from fastdata.loader.mixing import mix
    from fastdata.meter.loop import meter
    from fastdata.options import (
        CocoOptions,
        DeviceDecodeOptions,
        FileListOptions,
        HfOptions,
        ImageFolderOptions,
        MixOptions,
        OutputOptions,
        PairsOptions,
        RemoteOptions,
        TextConversionOptions,
        TextOptions,
        WebDatasetOptions,
    )
    from fastdata.tools.info import info

#: public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    "convert_coco": "fastdata.converters.coco",
    "convert_hf": "fastdata.converters.hf",
    "convert_imagefolder": "fastdata.converters.imagefolder",
    "convert_list": "fastdata.converters.filelist",
    "convert_pairs": "fastdata.converters.pairs",
    "convert_text": "fastdata.converters.text",
    "convert_webdataset": "fastdata.converters.webdataset",
    "DeviceDecodeOptions": "fastdata.options",
    "FastdataDeprecationWarning": "fastdata.deprecations",
    "MixOptions": "fastdata.options",
    "OutputOptions": "fastdata.options",
    "RemoteOptions": "fastdata.options",
    "TextOptions": "fastdata.options",
    **{name: "fastdata.options" for name in ("CocoOptions", "FileListOptions", "HfOptions", "ImageFolderOptions",
                                             "PairsOptions", "TextConversionOptions", "WebDatasetOptions")},
    "dataset": "fastdata.loader",
    "loader": "fastdata.loader",
    "meter": "fastdata.meter.loop",
    "mix": "fastdata.loader.mixing",
    "info": "fastdata.tools.info",
}

__all__ = ["CocoOptions", "DeviceDecodeOptions", "FastdataDeprecationWarning", "FileListOptions", "HfOptions",
           "ImageFolderOptions", "MixOptions", "OutputOptions", "PairsOptions", "RemoteOptions",
           "TextConversionOptions", "TextOptions", "WebDatasetOptions", "__version__",
           "convert_coco", "convert_hf", "convert_imagefolder", "convert_list", "convert_pairs", "convert_text",
           "convert_webdataset", "dataset", "info", "loader", "meter", "mix"]


class _PackageFace(types.ModuleType):
    """The `fastdata` module: importing a submodule named like a public function (`fastdata.loader`,
    `fastdata.meter`) must not replace the function with the module, as Python's import system would by setting
    the attribute on its parent package."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _PUBLIC and isinstance(value, types.ModuleType):
            return  # the submodule stays reachable through sys.modules and `from fastdata.loader import ...`
        super().__setattr__(name, value)


def __getattr__(name: str) -> Any:
    """Import a public function or option object the first time it is asked for (PEP 562); an old name is said
    deprecated (fastdata.deprecations)."""
    if name == "DeviceDecode":  # the old name of DeviceDecodeOptions
        from fastdata.deprecations import deprecated_alias
        from fastdata.options import DeviceDecodeOptions

        return deprecated_alias(__name__, name, {name: ("fastdata.DeviceDecode", DeviceDecodeOptions)})
    if name not in _PUBLIC:
        raise AttributeError(f"module 'fastdata' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    types.ModuleType.__setattr__(sys.modules[__name__], name, value)
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


sys.modules[__name__].__class__ = _PackageFace
