"""fastdata: fast data pipelines for PyTorch."""

from __future__ import annotations

from fastdata._version import __version__
from fastdata.converters.filelist import convert_list
from fastdata.converters.hf import convert_hf
from fastdata.converters.imagefolder import convert_imagefolder
from fastdata.converters.text import convert_text
from fastdata.converters.webdataset import convert_webdataset
from fastdata.loader import dataset, loader
from fastdata.meter.loop import meter
from fastdata.tools.info import info

__all__ = ["__version__", "convert_hf", "convert_imagefolder", "convert_list", "convert_text", "convert_webdataset",
           "dataset", "info", "loader", "meter"]
