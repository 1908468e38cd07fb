"""fastdata: fast data pipelines for PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"

from fastdata.convert import convert_imagefolder
from fastdata.convert_text import convert_text
from fastdata.info import info
from fastdata.loader import dataset, loader
from fastdata.meter import meter

__all__ = ["__version__", "convert_imagefolder", "convert_text", "dataset", "info", "loader", "meter"]
