"""Every storage format, both directions, behind one registry: (kind, format) -> how to open a writer for a
conversion and a reader for a dataset. The conversion drivers, the datasets and the loader ask here instead of
switching on format names themselves; a new format is one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import ConfigError, NotADatasetError
from fastdata.formats.lmdb import LmdbReader, LmdbWriter
from fastdata.formats.lmdb_text import CHUNK_TOKENS, COMMIT_EVERY_CHUNKS, TextLmdbReader, TextLmdbWriter
from fastdata.formats.manifest import Manifest
from fastdata.formats.wds import LocalShards, WdsWriter
from fastdata.formats.wds_text import TextWdsReader, TextWdsWriter

FORMATS = ("lmdb", "wds")
KINDS = ("image", "text")
DEFAULT_SHARD_SIZE = "256MB"


@dataclass(frozen=True)
class WriterOptions:
    """What a writer may need; each format takes its own (shards: `shard_bytes`; image LMDB: `commit_every`
    records per transaction; text: the token `dtype`, LMDB chunking)."""

    shard_bytes: int = 256 * 2**20
    commit_every: int = 2048
    dtype: np.dtype | None = None
    chunk_tokens: int = CHUNK_TOKENS
    commit_every_chunks: int = COMMIT_EVERY_CHUNKS
    targets: bool = False  # images: the samples carry target records (detection)
    pairs: bool = False  # images: the samples carry captions and maybe token ids (image-text pairs)
    target_ext: str = "det"  # images, WebDataset: the member holding a sample's target (`wds.TARGET_MEMBERS`)
    # images, WebDataset: hashes a finished shard in another process (`tar_shards.ShardWriter`); None: the writer
    assembly: Any = None  # image WebDataset: shards written and hashed elsewhere (`ShardWriter`)


@dataclass(frozen=True)
class Storage:
    """One storage format of one kind of dataset."""

    kind: str
    format: str
    random_access: bool  # any sample by index (LMDB), or a stream of shards read in order (WebDataset)
    open_writer: Callable[[Path, WriterOptions], Any]  # (staging directory, options) -> writer
    open_reader: Callable[[Path, Manifest], Any]  # (dataset directory, its manifest) -> reader


def _token_dtype(options: WriterOptions) -> np.dtype:
    """The token dtype a text writer stores (without it, numpy would take float64)."""
    if options.dtype is None:
        raise ValueError("a text dataset's writer needs the token dtype: WriterOptions(dtype=...)")
    return options.dtype


def _text(manifest: Manifest, root: Path) -> dict[str, Any]:
    if not manifest.text:
        raise NotADatasetError(f"{root}: the manifest of this text dataset has no 'text' section; it is damaged")
    return manifest.text


STORAGE: dict[tuple[str, str], Storage] = {
    ("image", "lmdb"): Storage(
        "image", "lmdb", True,
        lambda directory, o: LmdbWriter(directory, commit_every=o.commit_every, targets=o.targets,
                                                pairs=o.pairs),
        lambda root, manifest: LmdbReader(root, manifest.num_samples, len(manifest.classes), manifest.label_kind)),
    ("image", "wds"): Storage(
        "image", "wds", False,
        lambda directory, o: WdsWriter(directory, o.shard_bytes, o.target_ext, o.assembly),
        lambda root, manifest: LocalShards(root, manifest.files)),
    ("text", "lmdb"): Storage(
        "text", "lmdb", True,
        lambda directory, o: TextLmdbWriter(directory, _token_dtype(o), o.chunk_tokens,
                                            commit_every_chunks=o.commit_every_chunks),
        lambda root, manifest: TextLmdbReader(root, _text(manifest, root))),
    ("text", "wds"): Storage(
        "text", "wds", True,
        lambda directory, o: TextWdsWriter(directory, o.shard_bytes, _token_dtype(o)),
        lambda root, manifest: TextWdsReader(root, manifest.files, _text(manifest, root))),
}


def storage(kind: str, format: str, where: str | Path = "") -> Storage:
    """The registered storage of `kind` datasets in `format`; NotADatasetError naming `where` otherwise."""
    found = STORAGE.get((kind, format))
    if found is None:
        prefix = f"{where}: " if where else ""
        raise NotADatasetError(f"{prefix}no {kind} datasets in storage format {format!r} (known: "
                               f"{', '.join(f'{k}/{f}' for k, f in STORAGE)})")
    return found


def resolve_format(out: Path, format: str | None) -> str:
    """The output format of a conversion: as given, or LMDB for an OUT named *.lmdb."""
    if format is None:
        if out.suffix.lower() == ".lmdb":
            return "lmdb"
        raise ConfigError(f"{out}: cannot tell the output format; name it *.lmdb for LMDB or pass "
                          "--format wds for WebDataset shards")
    if format not in FORMATS:
        raise ConfigError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    return format
