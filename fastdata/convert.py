"""Composition root for writing: source listing -> parallel verify/encode -> format writer -> manifest.

The output is built under `OUT.partial` and renamed into place only after the manifest (written last) is
on disk, so an interrupted conversion never leaves anything that opens as a complete dataset.
"""

from __future__ import annotations

import multiprocessing
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastdata import __version__
from fastdata.config import available_cores, parse_size
from fastdata.converters.imagefolder import EncodeOptions, ImageFolderListing, load_record, scan
from fastdata.errors import ConfigError, OutputExistsError, RejectedFileError
from fastdata.formats.lmdb import LmdbWriter
from fastdata.formats.manifest import MANIFEST_NAME, FileEntry, Manifest, fsync_dir, partial_path
from fastdata.formats.records import ImageRecord
from fastdata.formats.wds import WdsWriter

DEFAULT_SHARD_SIZE = "256MB"
FORMATS = ("lmdb", "wds")


@dataclass
class ConversionSummary:
    """What a conversion did; `str()` gives the end-of-run summary the CLI prints."""

    out: Path
    format: str
    images: int
    classes: int
    files: list[FileEntry]
    rejected: list[dict[str, str]]
    ignored: int
    bytes_in: int
    bytes_out: int
    seconds: float
    empty_classes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        rate = self.images / self.seconds if self.seconds > 0 else float("inf")
        lines = [
            f"wrote {self.out} ({self.format}, {len(self.files)} file{'s' * (len(self.files) != 1)})",
            f"  images    {self.images:,} in {self.classes} classes",
            f"  bytes     {self.bytes_in / 1e6:,.1f} MB in -> {self.bytes_out / 1e6:,.1f} MB out",
            f"  time      {self.seconds:.1f} s ({rate:,.0f} images/s, "
            f"{self.bytes_in / 1e6 / max(self.seconds, 1e-9):,.1f} MB/s)",
            f"  ignored   {self.ignored:,} non-image files",
            f"  rejected  {len(self.rejected):,} files",
        ]
        lines += [f"    {r['path']}: {r['reason']}" for r in self.rejected[:50]]
        if len(self.rejected) > 50:
            lines.append(f"    ... and {len(self.rejected) - 50} more (all listed in {MANIFEST_NAME})")
        if self.empty_classes:
            lines.append(f"  warning   classes with no images: {', '.join(self.empty_classes)}")
        return "\n".join(lines)


def _work(task: tuple[str, str, int, EncodeOptions]) -> tuple[str, int, ImageRecord | None, str, int]:
    """Pool task: (root, path, label, options) -> (path, label, record or None, reject reason, source bytes)."""
    root, relative_path, label, options = task
    source = Path(root) / relative_path
    try:
        size = source.stat().st_size
    except OSError:
        size = 0
    try:
        return relative_path, label, load_record(Path(root), relative_path, label, options), "", size
    except ValueError as exc:
        return relative_path, label, None, str(exc), size


def _worker_init() -> None:
    import cv2

    cv2.setNumThreads(1)


def _results(tasks: list[tuple[str, str, int, EncodeOptions]], workers: int) -> Iterator[tuple]:
    if workers <= 1:
        yield from map(_work, tasks)
        return
    with multiprocessing.get_context().Pool(workers, initializer=_worker_init) as pool:
        yield from pool.imap(_work, tasks, chunksize=8)


def _check_output(out: Path, overwrite: bool) -> None:
    partial = partial_path(out)
    if partial.exists() and not overwrite:
        raise OutputExistsError(
            f"{partial}: leftovers of an interrupted conversion into {out}; pass --overwrite to discard "
            "them and convert again")
    if not out.exists():
        return
    is_dataset = (out / MANIFEST_NAME).is_file()
    is_empty_dir = out.is_dir() and not any(out.iterdir())
    if is_empty_dir:
        return
    if not is_dataset:
        raise OutputExistsError(f"{out}: already exists and is not a fastdata dataset; refusing to touch it "
                                "(choose another OUT)")
    if not overwrite:
        raise OutputExistsError(f"{out}: already holds a dataset; pass --overwrite to replace it")


def _resolve_format(out: Path, format: str | None) -> str:
    if format is None:
        if out.suffix.lower() == ".lmdb":
            return "lmdb"
        raise ConfigError(f"{out}: cannot tell the output format; name it *.lmdb for LMDB or pass "
                          "--format wds for WebDataset shards")
    if format not in FORMATS:
        raise ConfigError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    return format


def convert_imagefolder(
    src: str | Path,
    out: str | Path,
    *,
    format: str | None = None,
    shard_size: str | int = DEFAULT_SHARD_SIZE,
    seed: int = 0,
    max_size: int | None = None,
    quality: int = 90,
    workers: int | None = None,
    overwrite: bool = False,
    strict: bool = False,
    progress: bool = True,
) -> ConversionSummary:
    """Pack the ImageFolder tree `src` into `out` (LMDB if it ends in `.lmdb`, or `format="wds"` shards).

    Unreadable or undecodable files are rejected, listed in the summary and the manifest, and the rest is
    written; with `strict=True` the first one raises instead and nothing is written.
    """
    src, out = Path(src), Path(out)
    fmt = _resolve_format(out, format)
    shard_bytes = parse_size(shard_size)
    if max_size is not None and max_size < 1:
        raise ConfigError(f"--max-size must be a positive number of pixels, got {max_size}")
    if not 1 <= quality <= 100:
        raise ConfigError(f"--quality must be within 1..100, got {quality}")
    workers = available_cores() if workers is None else workers
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    listing = scan(src)
    _check_output(out, overwrite)

    order = np.arange(len(listing.samples))
    if fmt == "wds":  # shards are read sequentially: spread classes over all of them
        order = np.random.default_rng(seed).permutation(len(listing.samples))
    options = EncodeOptions(max_size=max_size, quality=quality)
    tasks = [(str(listing.root), *listing.samples[i], options) for i in order]

    partial = partial_path(out)
    if partial.exists():
        shutil.rmtree(partial)
    partial.parent.mkdir(parents=True, exist_ok=True)
    writer = LmdbWriter(partial) if fmt == "lmdb" else WdsWriter(partial, shard_bytes)
    started = time.perf_counter()
    try:
        counts, rejected, bytes_in = _write_all(writer, tasks, len(listing.classes), workers, strict, progress)
        files = writer.close()
    except BaseException:
        writer.abort()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    seconds = time.perf_counter() - started
    manifest = Manifest(
        format=fmt, kind="image", num_samples=sum(counts), classes=listing.classes, class_counts=counts,
        files=files, fastdata_version=__version__,
        options={"format": fmt, "shard_size": shard_bytes if fmt == "wds" else None, "seed": seed,
                 "max_size": max_size, "quality": quality, "strict": strict},
        source=_source_info(listing), rejected=rejected,
        stats={"bytes_in": bytes_in, "bytes_out": sum(f.bytes for f in files), "seconds": round(seconds, 3)},
    )
    _commit(manifest, partial, out)
    return ConversionSummary(out, fmt, manifest.num_samples, len(listing.classes), files, rejected,
                             len(listing.ignored), bytes_in, manifest.stats["bytes_out"], seconds,
                             listing.empty_classes)


def _write_all(writer, tasks, num_classes, workers, strict, progress):
    from tqdm import tqdm

    counts = [0] * num_classes
    rejected: list[dict[str, str]] = []
    bytes_in = 0
    last_postfix = time.perf_counter()
    started = last_postfix
    with tqdm(total=len(tasks), unit="img", desc="converting", disable=not progress, smoothing=0.1) as bar:
        for relative_path, label, record, reason, size in _results(tasks, workers):
            bytes_in += size
            if record is None:
                if strict:
                    raise RejectedFileError(
                        f"{Path(tasks[0][0]) / relative_path}: {reason} (--strict: nothing written)")
                rejected.append({"path": relative_path, "reason": reason})
            else:
                writer.add(record)
                counts[label] += 1
            bar.update()
            now = time.perf_counter()
            if now - last_postfix > 0.5:
                bar.set_postfix_str(f"{bytes_in / 1e6 / (now - started):.1f} MB/s, {len(rejected)} rejected")
                last_postfix = now
    return counts, rejected, bytes_in


def _source_info(listing: ImageFolderListing) -> dict:
    return {"kind": "imagefolder", "path": str(listing.root.resolve()), "files": len(listing.samples),
            "ignored": len(listing.ignored), "ignored_examples": listing.ignored[:20],
            "empty_classes": listing.empty_classes}


def _commit(manifest: Manifest, partial: Path, out: Path) -> None:
    """Manifest last, then one rename: `out` is either absent/old or complete."""
    manifest.write(partial)
    fsync_dir(partial)
    old = None
    if out.exists():
        old = out.with_name(f"{out.name}.old-{time.time_ns()}")
        out.rename(old)
    partial.rename(out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() else old.unlink()
