"""The image conversion driver, generic over the source: a source's listing (`fastdata.convert.sources.ImageSource`,
made by a converter in `fastdata.converters`) -> per-sample work in the workers (`fastdata.convert.image_work`:
read with the source's `SampleReader`, verify / encode with `fastdata.convert.encode`, lay the record out as the
writer stores it; local forked processes, `fastdata.convert.engines.pool`, or Ray) -> this process writes the laid-out
records in order (format writer) -> manifest.

The output is built under `OUT.partial` and renamed into place only after the manifest (written last) is
on disk, so an interrupted conversion never leaves anything that opens as a complete dataset.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, cast

import numpy as np

from fastdata._version import __version__
from fastdata.config import available_cores
from fastdata.convert.checkpoints import ProgressRecord, fingerprint, keep_checkpoint_on_failure, open_or_resume
from fastdata.convert.encode import EncodeOptions
from fastdata.convert.engines.assembly import ShardAssembly, assembly_processes
from fastdata.convert.engines.pool import PoolStats, chunk_results
from fastdata.convert.engines.ray import RayWork, require_ray
from fastdata.convert.image_work import ChunkResult, SampleJob
from fastdata.convert.kept import check_kept, rejection_limit
from fastdata.convert.layout import LayoutCounts, check_rewriter
from fastdata.convert.options import ImageConversionOptions, spelled
from fastdata.convert.sources import CountingTargets, ImageSource
from fastdata.convert.staging import Staging, check_shard_count
from fastdata.convert.staging import shard_bytes as staged_shard_bytes
from fastdata.errors import ConfigError, RejectedFileError
from fastdata.formats.lmdb import LmdbWriter
from fastdata.formats.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    rejected_place,
    write_atomic,
)
from fastdata.formats.registry import WriterOptions, resolve_format, storage
from fastdata.formats.tar_shards import PROGRESS_FILE
from fastdata.formats.wds import WdsWriter, target_member
from fastdata.image.decode import opencv_single_threaded
from fastdata.image.jpeg.header import GPU_KINDS


@dataclass
class ConversionSummary:
    """What a conversion did; `str()` gives the end-of-run summary the CLI prints."""

    out: Path
    format: str
    images: int
    classes: int
    files: list[FileEntry]
    rejected: list[dict[str, Any]]
    ignored: int
    bytes_in: int
    bytes_out: int
    seconds: float
    empty_classes: list[str] = field(default_factory=list)
    resumed_at: int | None = None  # images already done by an interrupted run this one resumed
    engine: str = "local"
    ray: RayWork | None = None  # with engine="ray": the Ray tasks and actors that ran the work, as Ray told them
    writer_waited: float = 0.0  # share of the writing time the writer (this process) waited for the workers' results
    jpeg_layout: str = "original"
    layout: LayoutCounts | None = None  # jpeg_layout "restart" or "baseline": what the rewrite did
    non_jpeg_quality: int | None = None  # non_jpeg="jpeg": the quality the images that were not JPEGs were stored at
    warning: str | None = None  # most of the input rejected (fastdata.convert.kept): the summary's first line

    def __str__(self) -> str:
        done_here = self.images - (self.resumed_at or 0)  # a resumed run's rate counts only what it converted
        rate = done_here / self.seconds if self.seconds > 0 else float("inf")
        lines = [] if self.warning is None else [self.warning]
        if self.resumed_at is not None:
            lines.append(f"resumed an interrupted conversion after {self.resumed_at:,} images")
        lines += [
            f"wrote {self.out} ({self.format}, {len(self.files)} file{'s' * (len(self.files) != 1)})",
            f"  images    {self.images:,} in {self.classes} class{'es' * (self.classes != 1)}",
            f"  bytes     {self.bytes_in / 1e6:,.1f} MB in -> {self.bytes_out / 1e6:,.1f} MB out",
            f"  time      {self.seconds:.1f} s ({rate:,.0f} images/s{' in this run' if self.resumed_at else ''}, "
            f"{self.bytes_in / 1e6 / max(self.seconds, 1e-9):,.1f} MB/s, the writer waited for the workers "
            f"{self.writer_waited:.0%} of the writing time)",
            f"  ignored   {self.ignored:,} non-image file{'s' * (self.ignored != 1)}",
        ]
        if self.layout is not None:
            lines += self.layout.summary_lines(self.jpeg_layout)
        if self.non_jpeg_quality is not None:
            lines.append(f"  non-JPEG  images that were not JPEGs stored as JPEGs at quality {self.non_jpeg_quality} "
                         "(--non-jpeg jpeg: lossy)")
        lines.append(f"  rejected  {len(self.rejected):,} file{'s' * (len(self.rejected) != 1)}")
        lines += [f"    {rejected_place(r)}: {r['reason']}" for r in self.rejected[:50]]
        if len(self.rejected) > 50:
            lines.append(f"    ... and {len(self.rejected) - 50} more (all listed in {MANIFEST_NAME})")
        if self.empty_classes:
            lines.append(f"  warning   classes with no images: {', '.join(self.empty_classes)}")
        if self.ray is not None:
            lines.append(f"  engine    ray: {len(self.ray.task_ids):,} Ray tasks on {len(self.ray.actor_ids):,} Ray "
                         "workers")
        return "\n".join(lines)


# The job of a Ray worker process, installed once by the pool's initializer: pickled once per worker rather than
# with every chunk, since it holds the source's listing and its reader
_WORKER: dict[str, SampleJob] = {}

#: write positions per Ray task: enough tasks for every Ray worker to get about RAY_TASKS_PER_WORKER (so that a
#: slow node does not hold up the end), each big enough that Ray's cost per task (a remote call, its result's
#: trip through the object store; a few ms) stays small beside its work (about 0.6 ms per image per core)
RAY_CHUNK_RANGE = (1, 512)
RAY_TASKS_PER_WORKER = 16


def ray_chunk(positions: int, workers: int) -> int:
    """Write positions per Ray task for `positions` positions on `workers` Ray workers."""
    low, high = RAY_CHUNK_RANGE
    return max(low, min(high, positions // max(1, workers * RAY_TASKS_PER_WORKER)))


def _worker_init(job: SampleJob | None = None) -> None:
    """Set up a conversion worker: one OpenCV thread if OpenCV was imported (never imported just for this: a
    conversion worker does not need it), and for Ray, the job."""
    if "cv2" in sys.modules:
        opencv_single_threaded()
    if job is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver handles Ctrl-C
        _WORKER["job"] = job


def _installed_chunk(task: tuple[int, int]) -> ChunkResult:
    return _WORKER["job"].run_chunk(*task)


def _results(job: SampleJob, start: int, stop: int, workers: int, stats: PoolStats, engine: str = "local",
             ray_address: str | None = None, requested_workers: int | None = None,
             ray_seen: RayWork | None = None, keep_shared: bool = False) -> Iterator[ChunkResult]:
    """The job's chunk results over write positions start..stop-1, in order, from the local pool or Ray (local,
    `keep_shared`: with the shared memory their bytes came in, for a writer that hands them on)."""
    if engine == "ray":
        from fastdata.convert.engines.ray import ray_results

        ray_workers = requested_workers if ray_address else workers  # None: every CPU of the cluster
        size = ray_chunk(stop - start, ray_workers or workers)
        chunks = [(p, min(p + size, stop)) for p in range(start, stop, size)]
        for result in ray_results(_installed_chunk, chunks, ray_workers, ray_address, _worker_init, ray_seen,
                                  initargs=(job,)):
            stats.items += len(result.results)
            stats.worker_seconds += result.seconds
            stats.worker_cpu_seconds += result.cpu_seconds
            yield result
        return
    yield from chunk_results(job, start, stop, workers, stats, worker_init=_worker_init, keep_shared=keep_shared)


@dataclass
class _Progress(ProgressRecord):
    """Where an image conversion stands at a checkpoint; stored with the data so that the two always agree."""

    next_task: int = 0
    counts: list[int] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    bytes_in: int = 0
    files: list[dict] = field(default_factory=list)  # finished WebDataset shards
    target_state: dict[str, Any] = field(default_factory=dict)  # what the source's targets counted so far
    layout: dict[str, Any] = field(default_factory=dict)  # jpeg_layout not "original": LayoutCounts.to_json() so far
    gpu_kinds: dict[str, int] = field(default_factory=dict)  # stored images by GPU_KINDS so far

    def to_json(self) -> bytes:
        """The record as JSON, each rejected entry serialised once: a checkpoint comes every few MiB of records,
        and the list of rejected samples only grows (a damaged source can hold many thousands)."""
        made = self.__dict__.setdefault("_rejected_json", [])
        made.extend(json.dumps(entry) for entry in self.rejected[len(made):])
        head = json.dumps({name: getattr(self, name) for name in self.__dataclass_fields__ if name != "rejected"})
        return f'{head[:-1]}, "rejected": [{", ".join(made)}]}}'.encode()


def _fingerprint(fmt: str, options: dict, listing: ImageSource) -> dict:
    """What must not change between an interrupted conversion and its resumption."""
    return fingerprint(fmt, options, listing.fingerprint())


def _make_writer(fmt: str, directory: Path, shard_bytes: int, commit_every: int, listing: ImageSource,
                 assembly: ShardAssembly | None = None) -> LmdbWriter | WdsWriter:
    options = WriterOptions(shard_bytes=shard_bytes, commit_every=commit_every, targets=listing.targets is not None,
                            pairs=listing.captions is not None, target_ext=target_member(listing.target_kind),
                            assembly=assembly)
    return storage("image", fmt).open_writer(directory, options)


def convert_images(list_source: Callable[[], ImageSource], out: str | os.PathLike[str],
                   options: ImageConversionOptions | None = None, **keywords: Any) -> ConversionSummary:
    """Pack the images `list_source()` lists into `out` (LMDB if it ends in `.lmdb`, or `format="wds"` shards); the
    source is listed once the options have been checked.

    Unreadable or undecodable files are rejected, listed in the summary and the manifest, and the rest is
    written; with `strict=True` the first one raises instead and nothing is written; more rejections than
    `max_rejected` fail the conversion before it commits (`fastdata.convert.kept`). An interrupted
    conversion (killed, crashed, Ctrl-C) resumes when the same call is made again: LMDB from its last
    checkpoint (every `commit_every` images), WebDataset from its first unfinished shard.
    `engine="ray"` verifies and encodes the images on a Ray cluster (`ray_address`, or a local Ray instance)
    while this process writes them: the same dataset as the local engine makes.

    Args:
        list_source: lists the source (a converter's scan, e.g. of an ImageFolder tree).
        out: the dataset to write: `OUT.lmdb`, or a directory of WebDataset shards.
        options: how to convert (`fastdata.convert.options.ImageConversionOptions`; None: its defaults).
        **keywords: the options as flat keywords (deprecated: put them in `options`).
    """
    settings = spelled(ImageConversionOptions, options, keywords, "fastdata.convert.images.convert_images")
    return _convert(list_source, Path(out), settings)


def _convert(list_source: Callable[[], ImageSource], out: Path, settings: ImageConversionOptions) -> ConversionSummary:
    """`convert_images` with its options checked."""
    limit = rejection_limit(settings.max_rejected)
    fmt = resolve_format(out, settings.format)
    shard_bytes = staged_shard_bytes(fmt, settings.shard_size)
    seed, quality, commit_every = settings.seed, settings.quality, settings.commit_every
    max_size, max_pixels, non_jpeg, jpeg_layout = settings.max_size, settings.max_pixels, settings.non_jpeg, \
        settings.jpeg_layout
    overwrite, strict, progress, engine = settings.overwrite, settings.strict, settings.progress, settings.engine
    if jpeg_layout != "original":
        check_rewriter()  # no libjpeg-turbo that passes the restart self-check: say so before any work
    if engine == "ray":
        require_ray()  # a missing extra is said before OUT.partial exists
    requested_workers = settings.workers
    workers = available_cores() if settings.workers is None else settings.workers
    staging = Staging(out)
    staging.check_free()  # a conversion writing OUT now: said at once, before the source is listed
    listing = list_source()
    if listing.targets is not None and max_size is not None:
        raise ConfigError(f"--max-size: a {listing.kind} source has {listing.targets.kind} targets in source pixels, "
                          "which a re-encoded smaller image would no longer match; convert without --max-size")
    # one writer per output: a second conversion into OUT is refused (naming this one) until this one ends
    with staging.owned(overwrite, source=listing.root if listing.walks_root else None):
        order = np.arange(len(listing.samples))
        if fmt == "wds":  # shards are read sequentially: spread classes over all of them
            order = np.random.default_rng(seed).permutation(len(listing.samples))
        options = {"format": fmt, "shard_size": shard_bytes if fmt == "wds" else None, "seed": seed,
                   "max_size": max_size, "quality": quality, "max_pixels": max_pixels, "strict": strict,
                   "jpeg_layout": jpeg_layout, **({} if non_jpeg == "keep" else {"non_jpeg": non_jpeg})}
        encode = EncodeOptions(max_size=max_size, quality=quality, max_pixels=max_pixels, jpeg_layout=jpeg_layout,
                               non_jpeg=non_jpeg)
        wanted = _fingerprint(fmt, options, listing)
        # WebDataset shards written and hashed by processes of their own (local engine): this process then only
        # says where each sample's bytes go
        assembly = (ShardAssembly(assembly_processes(workers)) if fmt == "wds" and engine == "local"
                    and workers > 1 else None)
        writer, resumed = open_or_resume(staging, overwrite, wanted,
                                         lambda directory: _make_writer(fmt, directory, shard_bytes, commit_every,
                                                                        listing, assembly),
                                         _Progress.parse)
        state = resumed or _Progress(wanted, counts=[0] * len(listing.classes))
        if resumed is not None and isinstance(listing.targets, CountingTargets):
            listing.targets.restore(resumed.target_state)
        resumed_at = resumed.next_task if resumed else None  # `state` moves on from here
        if isinstance(writer, WdsWriter) and resumed is not None:
            rejected_paths = {r["path"] for r in resumed.rejected}
            keys = (listing.samples[i][0] for i in order[: resumed.next_task].tolist())
            written = [key for key in keys if key not in rejected_paths]
            writer.resume([FileEntry(**f) for f in resumed.files], written)
        partial = staging.partial
        ray_seen = RayWork() if engine == "ray" else None
        started = time.perf_counter()
        with (keep_checkpoint_on_failure(writer, partial),
              assembly.start() if assembly else contextlib.nullcontext()):
            if resumed is None:
                writer.checkpoint(_progress_json(state, listing))  # records the fingerprint at once
            job = SampleJob(listing.sample_reader, listing.samples, order, encode, writer.lay_out, listing.targets,
                            listing.metadata, listing.captions, listing.caption_tokens)
            stats = _write_all(writer, job, listing, state, workers, strict, progress,
                               engine={"engine": engine, "ray_address": settings.ray_address,
                                       "requested_workers": requested_workers, "ray_seen": ray_seen,
                                       "keep_shared": assembly is not None})
            if isinstance(writer, WdsWriter):  # the final state is kept until the manifest is on disk
                files = writer.close()
                state.files = [asdict(entry) for entry in files]
                writer.checkpoint(_progress_json(state, listing))
            else:
                writer.checkpoint(_progress_json(state, listing))
                files = writer.close()
        seconds = time.perf_counter() - started
        layout = LayoutCounts.from_json(state.layout) if jpeg_layout != "original" else None
        manifest = Manifest(
            format=fmt, kind="image", num_samples=sum(f.samples for f in files), classes=listing.classes,
            class_counts=state.counts, files=files, fastdata_version=__version__, options=options,
            source=listing.info(), rejected=state.rejected,
            stats={"bytes_in": state.bytes_in, "bytes_out": sum(f.bytes for f in files),
                   "seconds": round(seconds, 3), "resumed_at": resumed_at,
                   "gpu_kinds": {kind: state.gpu_kinds.get(kind, 0) for kind in GPU_KINDS},
                   **({} if layout is None else {"jpeg_layout": layout.to_json()})},
            jpeg_layout=jpeg_layout, label_kind=listing.label_kind, metadata_fields=listing.metadata_fields(),
            target_kind=listing.target_kind, pairs=listing.pairs,
            targets=None if listing.targets is None else listing.targets.info(),
            record_digests=getattr(writer, "record_digests", None),
        )
        manifest.format_version = manifest.needed_format_version
        if fmt == "wds":
            check_shard_count(settings.shard_size, len(files), manifest.num_samples)
        warning = check_kept(out, partial, manifest.num_samples, len(state.rejected),
                             [r["reason"] for r in state.rejected], "images", listing.looked(), limit)
        for name, data in listing.files.items():  # after the writer, which keeps only its own files on a resume
            write_atomic(partial / name, data)
        staging.commit(manifest, scratch=(PROGRESS_FILE,))
    return ConversionSummary(out, fmt, manifest.num_samples, len(listing.classes), files, state.rejected,
                             len(listing.ignored), state.bytes_in, manifest.stats["bytes_out"], seconds,
                             listing.empty_classes, resumed_at=resumed_at, engine=engine, ray=ray_seen,
                             writer_waited=stats.waited / max(stats.seconds, 1e-9), jpeg_layout=jpeg_layout,
                             layout=layout, non_jpeg_quality=quality if non_jpeg == "jpeg" else None,
                             warning=warning)


def _progress_json(state: _Progress, listing: ImageSource) -> bytes:
    """`state` as a checkpoint stores it, with what the source's targets have counted (segmentation: class ids)."""
    if isinstance(listing.targets, CountingTargets):
        state.target_state = listing.targets.state()
    return state.to_json()


def _write_all(writer: LmdbWriter | WdsWriter, job: SampleJob, listing: ImageSource, state: _Progress, workers: int,
               strict: bool, progress: bool, engine: dict | None = None) -> PoolStats:
    """Write the laid-out records of the write positions from `state.next_task` on, in order, as the workers hand
    them over; checkpoint `state`. Returns what the pool measured."""
    from tqdm import tqdm

    stats = PoolStats()
    total = len(job.order)
    last_postfix = started = time.perf_counter()
    bytes_at_start = state.bytes_in

    def figures() -> str:
        elapsed = max(time.perf_counter() - started, 1e-9)
        rate = (state.bytes_in - bytes_at_start) / 1e6 / elapsed
        return f"{rate:.1f} MB/s, writer waited {stats.waited / elapsed:.0%}, {len(state.rejected)} rejected"

    counts, samples, order = state.counts, listing.samples, job.order
    layout = LayoutCounts.from_json(state.layout)
    gpu_kinds = state.gpu_kinds  # counted in place: every checkpoint stores it as it stands
    with tqdm(total=total, initial=state.next_task, unit="img", desc="converting", disable=not progress,
              smoothing=0.1) as bar:
        for chunk in _results(job, state.next_task, total, workers, stats, **(engine or {})):
            for (laid, reason, size), note, outcome, gpu_kind in zip(
                    chunk.results, chunk.notes or repeat(None), chunk.layouts or repeat(None),
                    chunk.gpu_kinds or repeat(""), strict=False):
                index = int(order[state.next_task])
                state.bytes_in += size
                state.next_task += 1
                if note is not None:  # what the worker's target source counted (segmentation: class ids)
                    cast(CountingTargets, listing.targets).observe(note)
                if laid is None:
                    _reject(listing, index, reason, state, strict)
                else:
                    if chunk.shared is not None:  # the bytes are handed on, not copied (`ShardAssembly`)
                        cast(WdsWriter, writer).add(laid, chunk.shared)
                    else:
                        writer.add(laid)
                    if outcome is not None:
                        layout.add(outcome)
                    if gpu_kind:
                        gpu_kinds[gpu_kind] = gpu_kinds.get(gpu_kind, 0) + 1
                    label = samples[index][1]
                    if isinstance(label, tuple):
                        for class_id in label:
                            counts[class_id] += 1
                    else:
                        counts[label] += 1
                if writer.checkpoint_due():
                    if job.options.jpeg_layout != "original":
                        state.layout = layout.to_json()
                    if isinstance(writer, WdsWriter):
                        state.files = [asdict(entry) for entry in writer.finished_shards]
                    writer.checkpoint(_progress_json(state, listing))
            bar.update(len(chunk.results))
            now = time.perf_counter()
            if now - last_postfix > 0.5:
                bar.set_postfix_str(figures())
                last_postfix = now
        bar.set_postfix_str(figures())  # the bar is left showing the final count, the summary's
    stats.seconds = time.perf_counter() - started  # the summary's "writer waited" is over this, as the bar's
    if job.options.jpeg_layout != "original":
        state.layout = layout.to_json()
    return stats


def _reject(listing: ImageSource, index: int, reason: str, state: _Progress, strict: bool) -> None:
    """Record sample `index` as rejected for `reason` (with `strict`, raise instead)."""
    key = listing.samples[index][0]
    entry = {"path": key, "reason": reason, **listing.origin_of(index)}
    if strict:
        where = rejected_place({**entry, "path": listing.sample_reader.locate(key)})
        raise RejectedFileError(f"{where}: {reason} (--strict: nothing written)")
    state.rejected.append(entry)
