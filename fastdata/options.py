"""Every option object of fastdata's read side, by its public name, from this one place (`from fastdata.options
import OutputOptions, TextOptions, ...`, or `fastdata.OutputOptions`, ...), so that user code never names the
modules that implement them. One pattern: a frozen dataclass named `<What>Options`, checked when it is made, passed
as the keyword it is named for:

- `OutputOptions(dtype, mean, std, channels_last)`: what image batches are made of (`output=`);
- `TextOptions(seq_len, packing, max_length, bucketing, eos_token, boundaries, mask_cross_document)`: how text is
  cut into rows (`text=`; `max_length` also for image-text pairs);
- `RemoteOptions(cache_dir, cache_max_bytes, storage_options)`: how a remote dataset is read (`remote=`);
- `MixOptions(samples_per_epoch, epoch_end, exhausted, classes)`: a mixture's epoch and labels (`mixing=`);
- `DeviceDecodeOptions(...)`: the device path's decoder (`decode=`);
- the converters' (the write side): `ImageFolderOptions`, `FileListOptions`, `PairsOptions`, `CocoOptions`,
  `HfOptions`, `WebDatasetOptions` (each the options of every image conversion plus its source's own) and
  `TextConversionOptions`, passed after SRC and OUT (`fastdata.convert_imagefolder(src, out,
  ImageFolderOptions(workers=4))`); `fastdata convert <kind>` builds the same objects from its flags.

The option objects are the API. The flat keywords they group (`dtype=`, `seq_len=`, `cache_dir=`, ...) and the old
names `Output` and `DeviceDecode` still work until fastdata 0.3.0, with a `FastdataDeprecationWarning` naming the
replacement (docs/reference/deprecations.md).
"""

from __future__ import annotations

from typing import Any

from fastdata.converters.coco import CocoOptions
from fastdata.converters.filelist import FileListOptions
from fastdata.converters.hf import HfOptions
from fastdata.converters.imagefolder import ImageFolderOptions
from fastdata.converters.pairs import PairsOptions
from fastdata.converters.text import TextConversionOptions
from fastdata.converters.webdataset import WebDatasetOptions
from fastdata.deprecations import deprecated_alias
from fastdata.formats.remote import RemoteOptions
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.loader.options import MixOptions, OutputOptions
from fastdata.text.loader import TextOptions

__all__ = ["CocoOptions", "DeviceDecodeOptions", "FileListOptions", "HfOptions", "ImageFolderOptions", "MixOptions",
           "OutputOptions", "PairsOptions", "RemoteOptions", "TextConversionOptions", "TextOptions",
           "WebDatasetOptions"]


def __getattr__(name: str) -> Any:
    """The old names, said deprecated (PEP 562)."""
    return deprecated_alias(__name__, name, {
        "Output": ("fastdata.options.Output", OutputOptions),
        "DeviceDecode": ("fastdata.options.DeviceDecode", DeviceDecodeOptions)})
