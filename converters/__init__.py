"""Source converters, one module per source kind, registered by name for `fastdata convert <name>`."""

from __future__ import annotations

import importlib

#: name -> module; each module exposes `cli_command()` returning its click command, and an image converter
#: `relist(src, manifest) -> ImageSource` (its source listed again as the conversion that wrote `manifest` listed it,
#: for `fastdata verify --source`).
REGISTRY: dict[str, str] = {
    "hf": "fastdata.converters.hf",
    "imagefolder": "fastdata.converters.imagefolder",
    "list": "fastdata.converters.filelist",
    "text": "fastdata.converters.text",
    "webdataset": "fastdata.converters.webdataset",
}


def load(name: str):
    """Import the converter module registered as `name`."""
    return importlib.import_module(REGISTRY[name])
