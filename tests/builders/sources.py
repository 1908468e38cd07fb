"""Sources whose samples are not files (fastdata.convert.sources): the solid tree's bytes read from a zip
archive, with multi-labels and per-sample metadata."""

from __future__ import annotations

import errno
import zipfile
from pathlib import Path

from .images import SOLID_CLASSES, Tree, solid_id_of_path, solid_label


class ZipReader:
    """A SampleReader over the members of a zip archive: a source whose samples are not files (key = member name).
    Opens the archive lazily, once per process, and drops the handle when pickled into a conversion worker."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._zip: zipfile.ZipFile | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_zip": None}

    def read(self, key: str) -> bytes:
        if self._zip is None:
            self._zip = zipfile.ZipFile(self.path)
        try:
            return self._zip.read(key)
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "no such member in the archive", key) from None

    def locate(self, key: str) -> str:
        return f"{self.path}!{key}"

    def describe(self) -> str:
        return str(self.path.resolve())

    def digest(self, keys) -> str:
        stat = self.path.stat()
        return f"{stat.st_size}:{stat.st_mtime_ns}"


def multi_labels(sample_id: int) -> tuple[int, ...]:
    """The classes of solid sample `sample_id` in multi-label tests: the bits of `sample_id % 8` over the 3 solid
    classes (every subset, the empty one included)."""
    return tuple(c for c in range(len(SOLID_CLASSES)) if (sample_id % 8) >> c & 1)


def solid_metadata(sample_id: int) -> dict:
    """The metadata of solid sample `sample_id` in metadata tests: one JSON scalar of each kind."""
    return {"id": sample_id, "name": f"sample {sample_id} é", "score": sample_id / 4, "odd": bool(sample_id % 2),
            "note": None if sample_id % 3 else "third"}


def write_zip(tree: Tree, archive: Path, missing: tuple[str, ...] = ()) -> Path:
    """The solid `tree`'s images as the (stored) members of the zip `archive`, but those in `missing`."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as out:
        for relative in tree.images:
            if relative not in missing:
                out.write(tree.path(relative), relative)
    return archive


def zip_source(tree: Tree, archive: Path, multi: bool = False, metadata: bool = False):
    """Every image of the solid `tree` listed as an ImageSource whose bytes are read from the members of `archive`
    (`write_zip`) through ZipReader. Labels: the solid classes, or with `multi` the `multi_labels` of each sample
    id; with `metadata`, each sample's `solid_metadata`."""
    from fastdata.convert.sources import ImageSource

    ids = [solid_id_of_path(relative) for relative in tree.images]
    labels = [multi_labels(i) if multi else solid_label(i) for i in ids]
    return ImageSource("zip", archive.parent, list(SOLID_CLASSES), list(zip(tree.images, labels, strict=True)),
                       reader=ZipReader(archive), label_kind="multi" if multi else "single",
                       metadata=[solid_metadata(i) for i in ids] if metadata else None)


def multi_hot(ids: tuple[int, ...], classes: int = len(SOLID_CLASSES)) -> list[float]:
    return [1.0 if c in ids else 0.0 for c in range(classes)]
