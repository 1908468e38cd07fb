"""fastdata: fast data pipelines for PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"

from fastdata.convert import convert_imagefolder  # noqa: E402
from fastdata.info import info  # noqa: E402
from fastdata.loader import dataset, loader  # noqa: E402

__all__ = ["__version__", "convert_imagefolder", "dataset", "info", "loader"]
