"""Deprecations: every old spelling fastdata still takes, its replacement, and the release that removes it, in one
table (`DEPRECATIONS`, which docs/reference/deprecations.md lists row for row), and the one way to say so.

An old spelling keeps working and warns with `FastdataDeprecationWarning`, a `FutureWarning` subclass: Python shows
FutureWarning to the users of a library by default (a plain DeprecationWarning is hidden unless the call is made in
`__main__` or under a test runner), and the subclass lets a user or a test filter fastdata's deprecations alone.
The warning is attributed to the first frame outside fastdata (the user's call), so Python's default filter says
it once per call site and spelling: a loop that makes a loader each epoch is told once.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from types import FrameType
from typing import Any

#: The release that removes the spellings deprecated in this one.
REMOVED_IN = "0.3.0"


class FastdataDeprecationWarning(FutureWarning):
    """An old fastdata spelling was used: it works until `REMOVED_IN`; the message names the replacement."""


@dataclass(frozen=True)
class Deprecation:
    """One old spelling (`old`), what replaces it (`new`), and the release that removes it."""

    old: str
    new: str
    removed_in: str = REMOVED_IN

    def message(self) -> str:
        return f"{self.old} is deprecated: use {self.new} (the old spelling goes in fastdata {self.removed_in})"


def _keyword_rows(functions: str, field_names: tuple[str, ...], obj: str, keyword: str) -> list[Deprecation]:
    return [Deprecation(f"{function}({name}=...)", f"{function}({keyword}={obj}({name}=...))")
            for function in functions.split() for name in field_names]


_OUTPUT = ("dtype", "mean", "std", "channels_last")
_TEXT = ("seq_len", "packing", "max_length", "bucketing", "eos_token", "boundaries", "mask_cross_document")
_REMOTE = ("cache_dir", "cache_max_bytes", "storage_options")
_MIXING = ("samples_per_epoch", "epoch_end", "exhausted")

#: the conversion functions whose flat option keywords (`convert_imagefolder(src, out, workers=2)`) gave way to an
#: option object (`convert_imagefolder(src, out, ImageFolderOptions(workers=2))`), with the object
_CONVERTERS = {
    "fastdata.convert_imagefolder": "fastdata.options.ImageFolderOptions",
    "fastdata.convert_list": "fastdata.options.FileListOptions",
    "fastdata.convert_pairs": "fastdata.options.PairsOptions",
    "fastdata.convert_coco": "fastdata.options.CocoOptions",
    "fastdata.convert_hf": "fastdata.options.HfOptions",
    "fastdata.convert_webdataset": "fastdata.options.WebDatasetOptions",
    "fastdata.convert_text": "fastdata.options.TextConversionOptions",
    "fastdata.convert.images.convert_images": "fastdata.convert.options.ImageConversionOptions",
    "fastdata.convert.text.convert_documents": "fastdata.convert.options.DocumentConversionOptions",
}


def converter_keyword(function: str) -> str:
    """The `DEPRECATIONS` key of a conversion function's flat option keywords (any of them)."""
    return f"{function}(..., OPTION=...)"


#: Every deprecated spelling, by its old form (the key `warn_deprecated` takes).
DEPRECATIONS: dict[str, Deprecation] = {row.old: row for row in [
    Deprecation("fastdata.options.Output", "fastdata.options.OutputOptions"),
    Deprecation("fastdata.DeviceDecode", "fastdata.DeviceDecodeOptions"),
    Deprecation("fastdata.options.DeviceDecode", "fastdata.options.DeviceDecodeOptions"),
    Deprecation("DeviceDecodeOptions(decode_ahead=...)",
                "nothing: it is ignored (the device path always decodes ahead); remove the argument"),
    *_keyword_rows("fastdata.loader", _OUTPUT, "OutputOptions", "output"),
    *_keyword_rows("fastdata.dataset", _OUTPUT, "OutputOptions", "output"),
    *_keyword_rows("fastdata.loader", _TEXT, "TextOptions", "text"),
    *_keyword_rows("fastdata.dataset", ("max_length",), "TextOptions", "text"),
    *_keyword_rows("fastdata.loader fastdata.dataset", _REMOTE, "RemoteOptions", "remote"),
    *_keyword_rows("fastdata.loader fastdata.mix", _MIXING, "MixOptions", "mixing"),
    *[Deprecation(f"{function}({name}=...)",
                  f"{function}(augment=fastdata.presets.RandomResizedCrop(size, {name}=...)) (detection and "
                  "segmentation: augment=fastdata.presets.ScaleJitterCrop(size, scale_range=...))"
                  if name == "scale" else
                  f"{function}(augment=fastdata.presets.RandomResizedCrop(size, ratio=...))")
      for function in ("fastdata.loader", "fastdata.dataset", "fastdata.mix") for name in ("scale", "ratio")],
    *[Deprecation(converter_keyword(function), f"{function}(..., {obj}(OPTION=...))")
      for function, obj in _CONVERTERS.items()],
]}


def _inside(frame: FrameType) -> bool:
    """Whether `frame` runs fastdata's code: a module of the `fastdata` package, `fastdata.converters` included
    (a folder of its own in a source checkout, installed inside the package)."""
    name = frame.f_globals.get("__name__", "")
    return name == "fastdata" or name.startswith("fastdata.")


def _caller_level() -> int:
    """The stacklevel of the first frame outside the fastdata package (the user's code), counted as
    `warnings.warn` counts from its caller, `warn_deprecated`."""
    frame: FrameType | None = sys._getframe(2)  # warn_deprecated's caller
    level = 2
    while frame is not None and frame.f_back is not None and _inside(frame):
        frame, level = frame.f_back, level + 1
    return level


def warn_deprecated(old: str) -> None:
    """Say that the spelling `old` (a key of `DEPRECATIONS`) is deprecated, naming its replacement, at the user's
    call (Python's default filter: once per call site)."""
    warnings.warn(DEPRECATIONS[old].message(), FastdataDeprecationWarning, stacklevel=_caller_level())


def deprecated_alias(module: str, name: str, aliases: dict[str, tuple[str, Any]]) -> Any:
    """For a module's `__getattr__`: the object an old name (`aliases`: old -> (its `DEPRECATIONS` key, the
    object)) stands for, said deprecated; AttributeError for any other name, as Python raises it."""
    if name not in aliases:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    old, value = aliases[name]
    warn_deprecated(old)
    return value
