"""Atomic dataset output: decide what may be written at OUT, and put a finished dataset in place.

A conversion writes into `OUT.partial`; the manifest is written last and the directory renamed to `OUT`, so
`OUT` is always either absent, the previous dataset, or a complete new one."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from fastdata.errors import OutputExistsError
from fastdata.formats.manifest import MANIFEST_NAME, Manifest, fsync_dir, partial_path


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse to write over anything that is not ours to replace: an existing dataset needs `overwrite`,
    and a path that holds something other than a fastdata dataset (or an empty directory) is never touched."""
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


def fresh_partial(out: Path) -> Path:
    """An empty `OUT.partial` directory (anything left there before is discarded)."""
    partial = partial_path(out)
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    return partial


def commit_output(manifest: Manifest, partial: Path, out: Path, scratch: tuple[str, ...] = ()) -> None:
    """Manifest last, then one rename: `out` is either absent/old or complete. Files named in `scratch`
    (resume bookkeeping) are removed once the manifest is on disk."""
    manifest.write(partial)
    for name in scratch:
        (partial / name).unlink(missing_ok=True)
    fsync_dir(partial)
    old = None
    if out.exists():
        old = out.with_name(f"{out.name}.old-{time.time_ns()}")
        out.rename(old)
    partial.rename(out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old) if old.is_dir() else old.unlink()
