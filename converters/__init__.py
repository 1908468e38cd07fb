"""Source converters, one module per source kind, registered by name for `fastdata convert <name>`."""

from __future__ import annotations

import importlib

#: name -> module; each module exposes `cli_command()` returning its click command.
REGISTRY: dict[str, str] = {
    "imagefolder": "fastdata.converters.imagefolder",
    "text": "fastdata.converters.text",
}

#: name -> the one-line description `fastdata --help` and `fastdata convert --help` list (without importing the
#: converter: they stay fast)
SUMMARIES: dict[str, str] = {
    "imagefolder": "Pack an ImageFolder tree (SRC/<class>/<image>) into LMDB or WebDataset shards.",
    "text": "Tokenize .jsonl / .txt / .parquet text into LMDB or WebDataset shards.",
}


def load(name: str):
    """Import the converter module registered as `name`."""
    return importlib.import_module(REGISTRY[name])
