"""Remote datasets: a converted WebDataset directory (manifest + shards) at an http(s):// or s3:// URL, read
through fsspec (`pip install 'fastdata[remote]'`).

Every shard is checked against the manifest's size and sha256 while it streams in, and its samples are used
only once all of its bytes have been checked: a shard altered on the server is an error, never training
data. With a cache directory, each shard is downloaded once per node (`fastdata.formats.cache`); without one,
each reader spools the shards it needs to an anonymous temporary file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from fastdata.config import parse_size
from fastdata.errors import ConfigError, CorruptSampleError, NotADatasetError, RemoteError
from fastdata.formats.cache import ShardCache
from fastdata.formats.manifest import CHECKSUM_FIELD, MANIFEST_NAME, FileEntry, Manifest, content_checksum

SCHEMES = ("http", "https", "s3")
CHUNK = 1 << 20
ATTEMPTS = 3


def is_url(path: Any) -> bool:
    """Whether `path` names a remote location (scheme://...) rather than a local path."""
    return isinstance(path, str) and "://" in path


def _filesystem(url: str, storage_options: dict[str, Any]) -> tuple[Any, str]:
    """A fresh fsspec file system for `url` (never a cached instance: those do not survive a fork) and the
    path of `url` on it."""
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigError(f"{url}: unsupported URL scheme {scheme!r}; fastdata reads {', '.join(SCHEMES)} URLs")
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec is a dependency
        raise ConfigError("remote datasets need fsspec: pip install 'fastdata[remote]'") from exc
    options = {"skip_instance_cache": True, **storage_options}
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise ConfigError(f"{url}: {exc}; install the remote extras: pip install 'fastdata[remote]'") from exc


@dataclass(frozen=True)
class RemoteOptions:
    """How a remote dataset is read: `storage_options` for fsspec, and the node-wide shard cache (`cache_dir`,
    at most `cache_max_bytes`, e.g. "500GB")."""

    cache_dir: str | os.PathLike[str] | None = None
    cache_max_bytes: int | str | None = None
    storage_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        """Checked when the object is made (one line naming the option that is wrong)."""
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise ConfigError(f"cache_dir must be a folder (a str or os.PathLike), got {self.cache_dir!r} "
                              f"({type(self.cache_dir).__name__})")
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise ConfigError(f"storage_options must be a dict of fsspec options, got {self.storage_options!r} "
                              f"({type(self.storage_options).__name__})")
        if self.cache_max_bytes is not None:
            object.__setattr__(self, "cache_max_bytes", parse_size(self.cache_max_bytes))

    @property
    def given(self) -> bool:
        return self.cache_dir is not None or self.cache_max_bytes is not None or self.storage_options is not None

    def shards(self, url: str) -> RemoteShards:
        """The remote shards of the dataset at `url`, read with these options."""
        return RemoteShards(url, self.storage_options, self.cache_dir,
                            self.cache_max_bytes)  # type: ignore[arg-type]  # an int since __post_init__


class RemoteShards:
    """The shards of a remote dataset: `open(i)` gives a local, seekable file of shard i's verified bytes
    (from the cache, downloading it on a miss; or a temporary file). Picklable for DataLoader workers; each
    process opens its own connections."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, cache_max_bytes: int | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._fs: Any = None
        self._root = ""
        self._pid = -1
        self._inherited: list[Any] = []
        self.manifest = self._read_manifest()
        self.files: list[FileEntry] = self.manifest.files
        self.locations: list[str] = [f"{self.url}/{f.name}" for f in self.files]
        if cache_max_bytes is not None and cache_dir is None:
            raise ConfigError("cache_max_bytes bounds the cache: give cache_dir as well")
        largest = max(self.files, key=lambda f: f.bytes, default=None)
        if cache_max_bytes is not None and largest is not None and largest.bytes > cache_max_bytes:
            raise ConfigError(f"cache_max_bytes={cache_max_bytes:,} cannot hold {largest.name} "
                              f"({largest.bytes:,} bytes); give at least the size of the largest shard")
        self.cache = ShardCache(Path(cache_dir), cache_max_bytes) if cache_dir is not None else None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_pid": -1, "_inherited": []}

    def _connection(self) -> tuple[Any, str]:
        if self._fs is None or self._pid != os.getpid():
            if self._fs is not None:  # the parent's, copied by fork: keep it from being collected here, where
                self._inherited.append(self._fs)  # its finalizer would wait on the parent's event loop
            self._fs, self._root = _filesystem(self.url, self.storage_options)
            self._pid = os.getpid()
        return self._fs, self._root.rstrip("/")

    def _read_manifest(self) -> Manifest:
        from fastdata.formats.manifest import parse_manifest

        fs, root = self._connection()
        where = f"{self.url}/{MANIFEST_NAME}"
        try:
            raw = fs.cat_file(f"{root}/{MANIFEST_NAME}")
        except FileNotFoundError as exc:
            raise NotADatasetError(f"{self.url}: not a fastdata dataset ({MANIFEST_NAME} is missing)") from exc
        except Exception as exc:
            raise RemoteError(f"{where}: cannot be read ({type(exc).__name__}: {exc})") from exc
        manifest = parse_manifest(raw, where)
        data = json.loads(raw)
        if CHECKSUM_FIELD in data and data[CHECKSUM_FIELD] != content_checksum(data):
            raise NotADatasetError(f"{where}: the manifest does not match its own checksum (changed or damaged)")
        if manifest.kind != "image" or manifest.format != "wds":
            raise NotADatasetError(f"{self.url}: holds a {manifest.kind} {manifest.format} dataset; remote loading "
                                   "reads WebDataset image datasets (convert with --format wds)")
        return manifest

    def open(self, shard_id: int) -> tuple[BinaryIO, bool]:
        """(local binary file of the verified shard, seekable=True)."""
        entry = self.files[shard_id]
        if self.cache is not None:
            return self.cache.open(entry.sha256, entry.bytes, lambda out: self.fetch(shard_id, out)), True
        spool = tempfile.TemporaryFile()  # noqa: SIM115 (returned open; the reader closes it)
        try:
            self.fetch(shard_id, spool)
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        return spool, True

    def fetch(self, shard_id: int, out: BinaryIO) -> None:
        """Stream shard `shard_id` into `out` (from its start), checking size and sha256 as the bytes come in;
        a network failure is retried a few times, altered bytes are an error at once."""
        entry = self.files[shard_id]
        where = self.locations[shard_id]
        failure: Exception | None = None
        for _attempt in range(ATTEMPTS):
            out.seek(0)
            out.truncate()
            try:
                received, digest = self._stream(shard_id, out)
            except Exception as exc:  # a dropped connection, a server error (fsspec, aiohttp, botocore types)
                failure = exc
                continue
            if received < entry.bytes:  # cut short (or shortened on the server: then every attempt ends so)
                failure = RemoteError(f"received {received:,} of the {entry.bytes:,} bytes the manifest lists")
                continue
            if received > entry.bytes or digest != entry.sha256:
                raise CorruptSampleError(
                    f"{where}: the shard's bytes do not match the manifest "
                    f"({received:,}{'+' * (received > entry.bytes)} bytes, sha256 {digest[:16]}...; the manifest "
                    f"says {entry.bytes:,} bytes, sha256 {entry.sha256[:16]}...): it was changed on the server "
                    "after conversion or damaged on the way; convert and upload the dataset again (or restore the "
                    "shard)")
            return
        raise RemoteError(f"{where}: download failed {ATTEMPTS} times, last: {type(failure).__name__}: {failure}")

    def _stream(self, shard_id: int, out: BinaryIO) -> tuple[int, str]:
        fs, root = self._connection()
        digest = hashlib.sha256()
        received = 0
        limit = self.files[shard_id].bytes
        options = {"block_size": 0} if self.url.split("://", 1)[0].lower() in ("http", "https") else {}
        with fs.open(f"{root}/{self.files[shard_id].name}", "rb", **options) as remote:
            while chunk := remote.read(CHUNK):
                received += len(chunk)
                if received > limit:  # longer than the manifest says: altered; no need to read the rest
                    break
                digest.update(chunk)
                out.write(chunk)
        return received, digest.hexdigest()
