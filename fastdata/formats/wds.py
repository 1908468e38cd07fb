"""WebDataset storage: a directory of tar shards plus the manifest.

Each sample is three tar members sharing a key: `{key}.{jpg|png|...}` (the image bytes as stored),
`{key}.cls` (the label as ASCII) and `{key}.json` ({"path", "label", "width", "height", "codec"}), so the
`webdataset` library reads the shards as they are. Keys are the source-relative path without its extension,
with dots replaced, so that webdataset's "key = name up to the first dot" grouping holds.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

from fastdata.errors import CorruptSampleError
from fastdata.formats.manifest import FileEntry, sha256_file
from fastdata.formats.records import ImageRecord

SHARD_PATTERN = "shard-{:06d}.tar"
IMAGE_EXTS = frozenset({"jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"})


def sanitize_key(relative_path: str) -> str:
    """A webdataset-safe key for a source-relative path: extension dropped, no dots, '/' kept."""
    stem = relative_path.rsplit(".", 1)[0] if "." in relative_path.rsplit("/", 1)[-1] else relative_path
    return stem.replace(".", "_").replace("\\", "/")


def split_member_name(name: str) -> tuple[str, str]:
    """webdataset's grouping rule: key = everything up to the first dot of the last path component."""
    directory, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), (ext if dot else "")


class WdsWriter:
    """Writes image records into tar shards of about `shard_size` bytes each, in the order given."""

    def __init__(self, directory: Path, shard_size: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.shard_size = shard_size
        self._used_keys: set[str] = set()
        self._entries: list[FileEntry] = []
        self._tar: tarfile.TarFile | None = None
        self._shard_samples = 0
        self.count = 0

    def _open_shard(self) -> None:
        name = SHARD_PATTERN.format(len(self._entries))
        self._tar = tarfile.open(self.directory / name, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 (spans many add() calls)
        self._shard_name = name
        self._shard_samples = 0

    def _close_shard(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        path = self.directory / self._shard_name
        self._entries.append(FileEntry(self._shard_name, path.stat().st_size, sha256_file(path),
                                       self._shard_samples))
        self._tar = None

    def _unique_key(self, relative_path: str) -> str:
        key = base = sanitize_key(relative_path)
        n = 1
        while key in self._used_keys:
            key = f"{base}_{n}"
            n += 1
        self._used_keys.add(key)
        return key

    def _add_member(self, name: str, payload: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(payload)
        info.mode = 0o444
        info.mtime = 0  # reproducible shards: same input, same bytes
        assert self._tar is not None
        self._tar.addfile(info, io.BytesIO(payload))

    def add(self, record: ImageRecord) -> None:
        if self._tar is None:
            self._open_shard()
        key = self._unique_key(record.key)
        meta = {"path": record.key, "label": record.label, "width": record.width, "height": record.height,
                "codec": record.codec}
        self._add_member(f"{key}.{record.ext}", record.data)
        self._add_member(f"{key}.cls", str(record.label).encode("ascii"))
        self._add_member(f"{key}.json", json.dumps(meta).encode("utf-8"))
        self._shard_samples += 1
        self.count += 1
        assert self._tar is not None
        if self._tar.fileobj is not None and self._tar.fileobj.tell() >= self.shard_size:
            self._close_shard()

    def close(self) -> list[FileEntry]:
        self._close_shard()
        return list(self._entries)

    def abort(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None


def iter_shard(path: Path) -> Iterator[tuple[str, bytes, str, dict]]:
    """Stream one shard: yields (key, image bytes, image ext, metadata dict) per sample, in stored order.
    Members that are not regular files, or whose names escape the shard, are refused by name."""
    current_key: str | None = None
    parts: dict[str, bytes] = {}

    def finish() -> tuple[str, bytes, str, dict]:
        assert current_key is not None
        image_ext = next((ext for ext in parts if ext.lower() in IMAGE_EXTS), None)
        if image_ext is None or "json" not in parts:
            raise CorruptSampleError(f"{path}: sample {current_key!r} lacks an image or .json member "
                                     f"(has {sorted(parts)})")
        try:
            meta = json.loads(parts["json"])
        except ValueError as exc:
            raise CorruptSampleError(f"{path}: sample {current_key!r} has unreadable .json ({exc})") from exc
        return current_key, parts[image_ext], image_ext, meta

    try:
        with tarfile.open(path, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    raise CorruptSampleError(f"{path}: member {member.name!r} is not a regular file")
                if member.name.startswith("/") or ".." in member.name.split("/"):
                    raise CorruptSampleError(f"{path}: member {member.name!r} has an unsafe path")
                key, ext = split_member_name(member.name)
                if key != current_key:
                    if current_key is not None:
                        yield finish()
                    current_key, parts = key, {}
                fileobj = tar.extractfile(member)
                assert fileobj is not None
                parts[ext] = fileobj.read()
            if current_key is not None:
                yield finish()
    except tarfile.TarError as exc:
        raise CorruptSampleError(f"{path}: damaged shard ({exc})") from exc


def shard_paths(directory: Path, entries: list[FileEntry]) -> list[Path]:
    return [Path(directory) / entry.name for entry in entries]
