"""Source converters, one module per source kind, registered by name for `fastdata convert <name>`."""

from __future__ import annotations

import importlib
from types import ModuleType

#: name -> module; each module exposes `cli_command()` returning its click command, `OPTIONS` (its option object's
#: class, which the command builds from its flags) and `ARGUMENTS` (the command's parameters that are not options),
#: and an image converter `relist(src, manifest) -> ImageSource` (its source listed again as the conversion that
#: wrote `manifest` listed it, for `fastdata verify --source`).
REGISTRY: dict[str, str] = {
    "coco": "fastdata.converters.coco",
    "hf": "fastdata.converters.hf",
    "imagefolder": "fastdata.converters.imagefolder",
    "list": "fastdata.converters.filelist",
    "pairs": "fastdata.converters.pairs",
    "text": "fastdata.converters.text",
    "webdataset": "fastdata.converters.webdataset",
}

#: name -> the one-line description `fastdata --help` and `fastdata convert --help` list (without importing the
#: converter: they stay fast)
SUMMARIES: dict[str, str] = {
    "coco": "Pack a COCO instances file's images with their boxes, labels and masks into LMDB or WebDataset shards.",
    "hf": "Pack a Hugging Face image dataset (save_to_disk, Parquet / Arrow, cached Hub name) into LMDB or WebDataset.",
    "imagefolder": "Pack an ImageFolder tree (SRC/<class>/<image>) into LMDB or WebDataset shards.",
    "list": "Pack the images a CSV / TSV / JSONL / Parquet file list names into LMDB or WebDataset shards.",
    "pairs": "Pack image-text pairs (a CSV / JSONL / Parquet list, or img2dataset shards) into LMDB or WebDataset.",
    "text": "Tokenize .jsonl / .txt / .parquet / .arrow text into LMDB or WebDataset shards.",
    "webdataset": "Verify existing WebDataset shards (img2dataset, webdataset's writers) into LMDB or new shards.",
}


def load(name: str) -> ModuleType:
    """Import the converter module registered as `name`."""
    return importlib.import_module(REGISTRY[name])
