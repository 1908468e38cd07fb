"""Resumable conversion, shared by the image and text drivers: the progress record stored with the data at each
checkpoint, the fingerprint of what must not change between an interrupted conversion and its resumption, and
opening `OUT.partial` to resume it (or to start afresh). Leftovers that cannot be reopened are never discarded
silently: that is an error naming the cause, and `--overwrite` starts again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from fastdata.convert.staging import Staging
from fastdata.errors import START_AGAIN, OutputExistsError, RejectedFileError, StagingDamagedError
from fastdata.formats.records import key_bytes


@dataclass
class ProgressRecord:
    """Where a conversion stands at a checkpoint (subclasses add their fields, all JSON-serialisable)."""

    fingerprint: dict

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls: type[P], raw: bytes) -> P | None:
        """The record in `raw`, or None when it is unreadable or of another shape."""
        try:
            return cls.parse(raw)
        except ValueError:
            return None

    @classmethod
    def parse(cls: type[P], raw: bytes) -> P:
        """The record in `raw`; ValueError saying what is wrong when it is unreadable or of another shape."""
        try:
            data = json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError included
            raise ValueError(f"not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object but {type(data).__name__}")
        try:
            record = cls(**data)
        except TypeError as exc:
            raise ValueError(f"not a progress record of this fastdata version ({exc})") from None
        if not isinstance(record.fingerprint, dict):
            raise ValueError("its fingerprint is not a JSON object")
        return record


P = TypeVar("P", bound=ProgressRecord)


def files_digest(files: Iterable[tuple[str, str | Path]]) -> str:
    """sha256 over (name, size, mtime) of each `(name, path)`: changes when a file is added, removed, renamed,
    resized or touched (a missing file counts as size and mtime -1)."""
    digest = hashlib.sha256()
    for name, path in files:
        try:
            stat = os.stat(path)
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:
            size, mtime = -1, -1
        digest.update(key_bytes(f"{name}\t{size}\t{mtime}\n"))
    return digest.hexdigest()


def fingerprint(fmt: str, options: dict, source: dict, **identity: str) -> dict:
    """What must not change between an interrupted conversion and its resumption: format, options, the source
    (`{"path", "files", "digest"}`) and any further `identity` values (e.g. a tokenizer's sha256)."""
    return {"format": fmt, "options": options, "source": source, **identity}


def differences(saved: dict, wanted: dict) -> list[str]:
    """What differs between two fingerprints, in words ([] when a resume may go ahead)."""
    diffs = []
    if saved.get("format") != wanted["format"]:
        diffs.append(f"format {saved.get('format')} -> {wanted['format']}")
    for key, value in wanted["options"].items():
        if saved.get("options", {}).get(key) != value:
            diffs.append(f"{key} {saved.get('options', {}).get(key)} -> {value}")
    old, new = saved.get("source", {}), wanted["source"]
    if old.get("path") != new["path"]:
        diffs.append(f"source {old.get('path')} -> {new['path']}")
    elif old.get("digest") != new["digest"]:
        diffs.append(f"source files changed ({old.get('files')} -> {new['files']} files, or names/sizes/times "
                     "differ)")
    for key, value in wanted.items():
        if key not in ("format", "options", "source") and saved.get(key) != value:
            diffs.append(f"{key} changed ({saved.get(key)} -> {value})")
    return diffs


class ResumableWriter(Protocol):
    def saved_progress(self) -> bytes | None: ...

    def abort(self) -> None: ...


W = TypeVar("W", bound=ResumableWriter)


def open_or_resume(staging: Staging, overwrite: bool, wanted: dict, make_writer: Callable[[Path], W],
                   parse: Callable[[bytes], P]) -> tuple[W, P | None]:
    """A writer in `staging.partial` (made by `make_writer(directory)`) and the progress it resumes from (read by
    `parse`, which raises ValueError on a damaged record): the leftovers of an interrupted conversion with the
    fingerprint `wanted` are resumed; leftovers without a progress record (killed before its first checkpoint:
    nothing was kept) are discarded; leftovers of a conversion with other settings are refused with
    OutputExistsError naming what differs; leftovers that cannot be reopened (damaged storage or progress
    record) raise StagingDamagedError naming the cause. `overwrite` always starts afresh. Call it inside
    `staging.owned(...)`: only the conversion that holds the output's lock may resume or discard its leftovers."""
    partial = staging.partial
    if partial.exists() and not overwrite:
        try:
            writer = make_writer(partial)
        except Exception as exc:  # whatever the storage library raises on damaged files: named, never dropped
            raise StagingDamagedError(f"{partial}: an interrupted conversion whose data cannot be reopened "
                                      f"({type(exc).__name__}: {exc}); {START_AGAIN}") from exc
        try:
            saved = writer.saved_progress()
            progress = None if saved is None else parse(saved)
        except Exception as exc:
            writer.abort()
            raise StagingDamagedError(f"{partial}: the progress record of an interrupted conversion cannot be read "
                                      f"({type(exc).__name__}: {exc}); {START_AGAIN}") from exc
        if progress is None:
            writer.abort()  # interrupted before its first checkpoint: nothing was kept
            return make_writer(staging.fresh()), None
        diffs = differences(progress.fingerprint, wanted)
        if diffs:
            writer.abort()
            raise OutputExistsError(
                f"{partial}: an interrupted conversion with other settings ({'; '.join(diffs)}); rerun it "
                "with its original source and options to resume, or pass --overwrite to start again")
        staging.started = True
        return writer, progress
    return make_writer(staging.fresh()), None


@contextmanager
def keep_checkpoint_on_failure(writer: Any, partial: Path) -> Iterator[None]:
    """Around a conversion's writing: any failure (Ctrl-C and crashes included) drops only the uncommitted work,
    so rerunning the same command resumes from the last checkpoint; a --strict rejection removes everything."""
    try:
        yield
    except RejectedFileError:
        writer.abort()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except BaseException:
        writer.abort()
        raise
