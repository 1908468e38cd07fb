"""Datasets of many samples written straight through the storage writers (start-up at scale)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .images import encode, pattern


def _commit_written(manifest, partial: Path, out: Path) -> Path:
    (partial / "progress.json").unlink(missing_ok=True)
    manifest.write(partial)
    partial.rename(out)
    return out


def write_many_images(out: Path, count: int, fmt: str = "lmdb", classes: int = 10) -> Path:
    """`count` samples of one tiny JPEG (sample i: key `c{label}/{i}.jpg`, label i % classes), written by the
    storage writer of `fmt` with a manifest: a real dataset of many samples in well under a second per 10k."""
    from fastdata.formats.manifest import Manifest
    from fastdata.formats.records import CODEC_CV_JPEG, ImageRecord
    from fastdata.formats.registry import WriterOptions, storage

    data = encode(pattern(0, 8, 8), "JPEG")
    partial = out.with_name(out.name + ".partial")
    writer = storage("image", fmt).open_writer(partial, WriterOptions())
    for i in range(count):
        writer.add(ImageRecord(f"c{i % classes}/{i}.jpg", data, "jpg", i % classes, 8, 8, CODEC_CV_JPEG))
    files = writer.close()
    counts = np.bincount(np.arange(count) % classes, minlength=classes).tolist()
    return _commit_written(Manifest(format=fmt, kind="image", num_samples=count,
                                    classes=[f"c{c}" for c in range(classes)], class_counts=counts, files=files),
                           partial, out)


def many_document(index: int) -> np.ndarray:
    """Document `index` of `write_many_documents`: 1..9 token ids that encode its index (ids 2..257)."""
    return (2 + (index + np.arange(1 + index % 9)) % 256).astype(np.uint16)


def write_many_documents(out: Path, count: int, fmt: str = "lmdb", **writer_options) -> Path:
    """`count` short documents (`many_document`), written by the text storage writer of `fmt` with a manifest
    (end-of-text id 0)."""
    from fastdata.formats.manifest import Manifest
    from fastdata.formats.registry import WriterOptions, storage

    partial = out.with_name(out.name + ".partial")
    writer = storage("text", fmt).open_writer(partial, WriterOptions(dtype=np.dtype("<u2"), **writer_options))
    total = longest = 0
    for i in range(count):
        doc = many_document(i)
        writer.add(doc)
        total, longest = total + len(doc), max(longest, len(doc))
    files, layout = writer.close()
    text = {"dtype": "uint16", "documents": count, "total_tokens": total, "max_document_tokens": longest,
            "vocab_size": 258, "eos_token": "<eos>", "eos_token_id": 0, "pad_token": None, "pad_token_id": None,
            **layout}
    return _commit_written(Manifest(format=fmt, kind="text", num_samples=count, classes=[], class_counts=[],
                                    files=files, text=text), partial, out)
