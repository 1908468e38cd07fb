"""Atomic dataset output: decide what may be written at OUT, and put a finished dataset in place.

A conversion writes into `OUT.partial`; the manifest is written last and the directory renamed to `OUT`, so
`OUT` is always either absent, the previous dataset, or a complete new one. `Staging(out)` is that pair of
places, the `.partial` path computed once, with what a conversion does to them: check, start afresh, commit."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from fastdata.errors import OutputError, OutputExistsError
from fastdata.formats.manifest import MANIFEST_NAME, Manifest, fsync_dir, partial_path


@dataclass(frozen=True)
class Staging:
    """Where a conversion builds `out`: the directory `partial` (`OUT.partial`) until `commit` renames it."""

    out: Path
    partial: Path = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partial", partial_path(self.out))

    def check(self, overwrite: bool, source: Path | None = None) -> None:
        """Refuse, before anything is written, an output that cannot be made or is not ours to replace: one inside
        the `source` folder (the next conversion of the source would take it in: a new class), one whose folder
        cannot be created (under a file, on a read-only or virtual file system, without permission), an existing
        path that holds something other than a fastdata dataset (or an empty directory; never touched), and an
        existing dataset without `overwrite`."""
        out = self.out
        if source is not None and source.is_dir():
            inside = Path(os.path.abspath(out)).resolve()
            root = source.resolve()
            if inside == root or root in inside.parents:
                raise OutputError(f"{out}: is inside the source folder {source}; the next conversion of {source} "
                                  "would take it in as data: choose an OUT outside the source")
        if not out.exists():
            _check_creatable(out)
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

    def fresh(self) -> Path:
        """An empty `partial` directory (anything left there before is discarded)."""
        if self.partial.exists():
            shutil.rmtree(self.partial)
        self.partial.mkdir(parents=True)
        return self.partial

    def commit(self, manifest: Manifest, scratch: tuple[str, ...] = ()) -> None:
        """Manifest last, then one rename: `out` is either absent/old or complete. Files named in `scratch`
        (resume bookkeeping) are removed once the manifest is on disk."""
        partial, out = self.partial, self.out
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


def _check_creatable(out: Path) -> None:
    """Prove that the folders `OUT.partial` and `OUT` can be made where asked: the nearest existing ancestor is
    a folder in which a directory can be created (and is removed again: nothing is left behind)."""
    ancestor = Path(os.path.abspath(out)).parent
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"{out}: cannot be created: {ancestor} is a file, not a folder; choose another OUT")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fastdata-probe-", dir=ancestor))
    except OSError as exc:
        raise OutputError(f"{out}: cannot be created: making a folder in {ancestor} fails "
                          f"({exc.strerror or exc}); choose another OUT") from None


#: Shard sizes below this warn: nearly every sample would close a shard of its own.
SMALL_SHARD_BYTES = 1 << 20


def shard_bytes(fmt: str, shard_size: str | int | None) -> int:
    """The WebDataset shard size in bytes for `fmt`: None is the default; given with LMDB (one file, no shards) it
    warns that it is ignored; below SMALL_SHARD_BYTES it warns (a byte count given without its unit, `256` for
    `256MB`, makes a shard per sample)."""
    from fastdata.config import parse_size
    from fastdata.formats.registry import DEFAULT_SHARD_SIZE

    if shard_size is None:
        return parse_size(DEFAULT_SHARD_SIZE)
    size = parse_size(shard_size)
    if fmt != "wds":
        warnings.warn(f"--shard-size {shard_size} applies to WebDataset shards (--format wds); an {fmt} dataset is "
                      "one file: ignored", UserWarning, stacklevel=3)
        return size
    if size < SMALL_SHARD_BYTES:
        warnings.warn(f"--shard-size {shard_size} is {size:,} bytes: nearly every sample will close a shard of its "
                      "own; sizes take a unit, e.g. 256MB", UserWarning, stacklevel=3)
    return size
