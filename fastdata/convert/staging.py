"""Atomic dataset output with one writer: decide what may be written at OUT, hold OUT against every other
conversion while this one writes it, and put a finished dataset in place.

A conversion writes into `OUT.partial`; the manifest is written last and the directory renamed to `OUT`, so
`OUT` is always either absent, the previous dataset, or a complete new one. `Staging(out)` is that pair of
places, the `.partial` path computed once, with what a conversion does to them: claim (check, and hold the
output's lock, `fastdata.output_lock`, for as long as the conversion runs), start afresh, commit. Every
converter's writing goes through `Staging.owned`, so no two conversions ever write one OUT."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fastdata.errors import OutputError, OutputExistsError
from fastdata.formats.manifest import MANIFEST_NAME, Manifest, fsync_dir, partial_path
from fastdata.output_lock import OutputLock, check_free

#: What a Ctrl-C says, by how far the conversion had come (`Staging.owned`).
RESUME_HINT = "rerun the same command to resume the conversion"
NOT_STARTED_HINT = "the conversion had not started writing: nothing to resume (the same command starts it)"


@dataclass
class Staging:
    """Where a conversion builds `out`: the directory `partial` (`OUT.partial`) until `commit` renames it."""

    out: Path
    partial: Path = field(init=False)
    started: bool = field(default=False, init=False)  # `partial` holds this conversion's work (fresh or resumed)
    committed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.partial = partial_path(self.out)

    @contextmanager
    def owned(self, overwrite: bool, source: Path | None = None) -> Iterator[Staging]:
        """Around everything a conversion does to `out`: `check` it, take its lock (OutputBusyError naming the
        other process when a conversion holds it, before anything is changed), `check` again under the lock (a
        conversion that finished meanwhile has put a dataset there), and hold it until the block ends. A Ctrl-C
        inside says whether there is anything to resume."""
        self.check(overwrite, source)  # refused at once, before the lock creates anything
        with OutputLock(self.out):
            self.check(overwrite, source)
            try:
                yield self
            except KeyboardInterrupt as exc:
                if exc.args:
                    raise
                raise KeyboardInterrupt(self.interrupted_hint()) from None

    def check_free(self) -> None:
        """Stop at once (OutputBusyError, naming it) when a running conversion holds `out`: before the source is
        listed, which may take long. `owned` is what decides."""
        check_free(self.out)

    def interrupted_hint(self) -> str:
        """What to do after a Ctrl-C, by how far the conversion had come."""
        if self.committed:
            return f"the conversion had completed: {self.out} is in place"
        if self.started and self.partial.exists():
            return RESUME_HINT
        return NOT_STARTED_HINT

    def check(self, overwrite: bool, source: Path | None = None) -> None:
        """Refuse, before anything is written, an output that cannot be made or is not ours to replace: one inside
        the `source` folder, the folder a converter walks to find its samples (`ImageSource.walks_root`: the next
        conversion of it would take the output in, a new class; a source that names its files passes None), one
        whose folder cannot be created (under a file, on a read-only or virtual file system, without permission),
        an existing path that holds something other than a fastdata dataset (or an empty directory; never
        touched), and an existing dataset without `overwrite`."""
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
        self.started = True
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
        self.committed = True
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


#: A shard size given without a unit below this warns that it is read as a byte count (`256` for `256MB`).
SMALL_SHARD_BYTES = 1 << 20
#: A conversion whose shards hold fewer samples than this on average says so once it has written them.
FEW_PER_SHARD = 2


def shard_bytes(fmt: str, shard_size: str | int | None) -> int:
    """The WebDataset shard size in bytes for `fmt`: None is the default; given with LMDB (one file, no shards) it
    warns that it is ignored; a size without a unit below SMALL_SHARD_BYTES warns that it is a byte count (what
    that makes of the shards is said once they are written: `check_shard_count`)."""
    from fastdata.config import parse_size
    from fastdata.formats.registry import DEFAULT_SHARD_SIZE

    if shard_size is None:
        return parse_size(DEFAULT_SHARD_SIZE)
    size = parse_size(shard_size)
    if fmt != "wds":
        warnings.warn(f"--shard-size {shard_size} applies to WebDataset shards (--format wds); an {fmt} dataset is "
                      "one file: ignored", UserWarning, stacklevel=3)
        return size
    if size < SMALL_SHARD_BYTES and str(shard_size).strip().isdigit():
        warnings.warn(f"--shard-size {shard_size} has no unit: it is read as {size:,} bytes; sizes take a unit, "
                      "e.g. 256MB", UserWarning, stacklevel=3)
    return size


def check_shard_count(shard_size: str | int | None, shards: int, samples: int, what: str = "samples") -> None:
    """Once the shards are written: warn when they hold fewer than FEW_PER_SHARD `what` each on average (the shard
    size is smaller than a sample or two), saying how many there are. Nothing is said of a size that made
    shards of several samples each, however small it is."""
    if shards < 2 or samples >= FEW_PER_SHARD * shards:
        return
    if shard_size is None:
        from fastdata.formats.registry import DEFAULT_SHARD_SIZE

        shard_size = f"{DEFAULT_SHARD_SIZE} (the default)"
    warnings.warn(f"--shard-size {shard_size} made {shards:,} shards for {samples:,} {what} ({samples / shards:.1f} "
                  f"per shard): nearly every sample closed a shard of its own; a larger size (e.g. 256MB) makes "
                  "fewer, fuller shards", UserWarning, stacklevel=3)
