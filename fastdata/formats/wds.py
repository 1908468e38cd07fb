"""WebDataset storage: a directory of tar shards plus the manifest.

Each sample is three tar members sharing a key: `{key}.{jpg|png|...}` (the image bytes as stored),
`{key}.cls` (the label as ASCII) and `{key}.json` ({"path", "label", "width", "height", "codec"}), so the
`webdataset` library reads the shards as they are. A multi-label sample has no `.cls` (webdataset reads it as
one integer): its `.json` "label" is the list of its class ids. A sample with metadata has it in its `.json`
too ("metadata": {...}). An image-text pair (`target_kind: "pairs"`) has no `.cls`: its caption is the member
`{key}.txt` (UTF-8, as img2dataset writes it) and the `.json` "caption", and with a tokenizer its token ids are the
`.json` "tokens" (a list of integers). A sample with a target has a member
holding it, the same bytes LMDB stores, and its `.json` names that member ("target": "det"): detection,
`{key}.det`, the target record of `fastdata.formats.targets`; segmentation, `{key}.seg.png`, the label map of
`fastdata.formats.masks`. Keys
are the source-relative path without its extension, with dots replaced and no leading '/', so that webdataset's
"key = name up to the first dot" grouping holds and every member name is a relative path.

Record digests (as LMDB's, `fastdata.formats.lmdb.record_digest`): beside `shard-NNNNNN.tar`, the file
`shard-NNNNNN.digests` holds a 32-byte sha256 per sample, in stored order, of the sample's bytes in the shard (its
members' headers, payloads and padding: what the conversion worker laid out, hashed there); the manifest's
`record_digests` holds the sha256 of all of them, shard after shard (the root). The shards stay plain tar files the
`webdataset` library reads as they are; `fastdata verify` names a damaged sample by shard and key. A dataset
converted before has no digests and is verified by its shards' sha256 alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from fastdata.errors import START_AGAIN, CorruptSampleError, StagingDamagedError
from fastdata.formats.manifest import FileEntry, write_atomic
from fastdata.formats.masks import MASK_EXT
from fastdata.formats.records import IMAGE_EXTENSIONS, ImageRecord, label_to_json
from fastdata.formats.tar_shards import SHARD_PATTERN, ShardWriter, check_kept_files, tar_members

IMAGE_EXTS = frozenset(ext[1:] for ext in IMAGE_EXTENSIONS)  # image members: without the dot
TARGET_EXT = "det"  # the member holding a sample's detection target record
#: The member that holds a sample's target, per target kind (segmentation: a PNG label map, which webdataset's own
#: decoders read as an image).
TARGET_MEMBERS = {"detection": TARGET_EXT, "segmentation": MASK_EXT}


#: The file beside each shard that holds its samples' digests (`digests_name`).
DIGESTS_SUFFIX = ".digests"
DIGEST_BYTES = 32


def digests_name(shard_name: str) -> str:
    """The name of the record digests file of the shard `shard_name` (`shard-000001.digests`)."""
    return shard_name.rsplit(".", 1)[0] + DIGESTS_SUFFIX


def sample_digest(blob: Any) -> bytes:
    """A sample's record digest: sha256 of its bytes in the shard, members as `tar_members` lays them out."""
    return hashlib.sha256(blob).digest()


def target_member(target_kind: str) -> str:
    """The extension of the member holding a sample's target in a dataset of `target_kind`."""
    return TARGET_MEMBERS.get(target_kind, TARGET_EXT)


def sanitize_key(relative_path: str) -> str:
    """A webdataset-safe key for a source-relative path: extension dropped, no dots, '/' kept."""
    stem = relative_path.rsplit(".", 1)[0] if "." in relative_path.rsplit("/", 1)[-1] else relative_path
    return stem.replace(".", "_").replace("\\", "/").lstrip("/")


def split_member_name(name: str) -> tuple[str, str]:
    """webdataset's grouping rule: key = everything up to the first dot of the last path component."""
    directory, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), (ext if dot else "")


class WdsWriter:
    """Writes image records into tar shards of about `shard_size` bytes each, in the order given (a
    `ShardWriter`: `.tmp` until complete, `checkpoint()` after each completed shard records the caller's progress,
    so a killed conversion resumes at the first unfinished shard and redoes nothing else)."""

    def __init__(self, directory: Path, shard_size: int, target_ext: str = TARGET_EXT,
                 assembly: Any = None) -> None:
        self.shards = ShardWriter(directory, shard_size, assembly=assembly)
        self.target_ext = target_ext  # the member holding a sample's target (TARGET_MEMBERS)
        self.directory = self.shards.directory
        self._used_keys: set[str] = set()
        self._digests: list[bytes] = []  # the open shard's record digests, in order
        self.record_digests: dict[str, Any] | None = None  # set by `close`: the manifest's `record_digests`

    @property
    def count(self) -> int:
        return self.shards.count

    def saved_progress(self) -> bytes | None:
        return self.shards.saved_progress()

    def resume(self, entries: list[FileEntry], written_paths: list[str], keep_files: Iterable[str] = ()) -> None:
        """Continue after the finished shards `entries` (from the saved progress), whose samples came from
        `written_paths` in order (their keys are taken again, so new keys stay unique): drop anything else
        (but the files named in `keep_files`). Raises StagingDamagedError when a finished shard is not there as
        the progress recorded it."""
        digests = [(digests_name(entry.name), DIGEST_BYTES * entry.samples) for entry in entries]
        check_kept_files(self.directory, digests, "shard's record digests file")
        self.shards.resume(entries, [*keep_files, *(name for name, _ in digests)])
        for relative_path in written_paths:
            self._unique_key(relative_path)

    def _unique_key(self, relative_path: str) -> str:
        key = base = sanitize_key(relative_path)
        n = 1
        while key in self._used_keys:
            key = f"{base}_{n}"
            n += 1
        self._used_keys.add(key)
        return key

    @property
    def lay_out(self) -> Callable[[ImageRecord], tuple[str, str, bytes, bytes]]:
        """A picklable function: record -> (source path, key, the sample's tar members as they are written into
        the shard, their record digest): what a conversion worker prepares so that the writer only appends them
        (`add`). The key is the sanitized path; the writer renames the members in the rare case that another sample
        took it first."""
        return partial(lay_out, target_ext=self.target_ext)

    def add(self, record: ImageRecord | tuple[str, str, bytes, bytes], shared: Any = None) -> None:
        """Append the next sample: an `ImageRecord`, or its members as `lay_out` laid them out (in a worker);
        `shared`: the shared memory those came in (`ShardWriter.append_blob`)."""
        path, key, blob, digest = self.lay_out(record) if isinstance(record, ImageRecord) else record
        unique = self._unique_key(path)
        if unique != key:  # two paths that sanitize alike: the later one's members get the unique key
            blob = _renamed(bytes(blob), key, unique)
            digest = sample_digest(blob)
        finished = self.shards.finished_count
        self.shards.append_blob(blob, shared)
        self._digests.append(digest)
        self.shards.sample_done()
        if self.shards.finished_count > finished:  # the sample closed its shard
            self._write_digests(finished)

    def _write_digests(self, shard: int) -> None:
        """Put the record digests of shard number `shard` (just finished) beside it, before any checkpoint lists
        the shard."""
        write_atomic(self.directory / digests_name(SHARD_PATTERN.format(shard)), b"".join(self._digests))
        self._digests = []

    def checkpoint_due(self) -> bool:
        return self.shards.checkpoint_due()

    @property
    def finished_shards(self) -> list[FileEntry]:
        return self.shards.finished_shards

    def checkpoint(self, progress: bytes) -> None:
        """Record `progress` (which must list `finished_shards`) as the point to resume from."""
        self.shards.checkpoint(progress)

    def close(self) -> list[FileEntry]:
        """Finish the last shard; returns every shard, and sets `record_digests` (every shard's record digests,
        read back: a few bytes per sample). `progress.json` stays until the dataset is committed."""
        finished = self.shards.finished_count
        entries = self.shards.close()
        if len(entries) > finished:
            self._write_digests(finished)
        table = bytearray()
        for entry in entries:
            digests = (self.directory / digests_name(entry.name)).read_bytes()
            if len(digests) != DIGEST_BYTES * entry.samples:
                raise StagingDamagedError(f"{self.directory / digests_name(entry.name)}: holds "
                                          f"{len(digests) // DIGEST_BYTES:,} record digests for the "
                                          f"{entry.samples:,} samples of {entry.name}; {START_AGAIN}")
            table += digests
        self.record_digests = {"algorithm": "sha256", "records": len(table) // DIGEST_BYTES,
                               "root": hashlib.sha256(table).hexdigest(), "files": DIGESTS_SUFFIX}
        return entries

    def abort(self) -> None:
        """Close the open shard (left as .tmp, dropped on resume); finished shards and progress stay."""
        self._digests = []
        self.shards.abort()


def lay_out(record: ImageRecord, target_ext: str = TARGET_EXT) -> tuple[str, str, bytes, bytes]:
    """(source path, key, tar members, their record digest) of `record`, laid out as `WdsWriter.add` appends them;
    `target_ext`: the member holding its target (`TARGET_MEMBERS`). Hashed here, in the worker that holds the
    bytes."""
    key = sanitize_key(record.key)
    blob = tar_members(_members(record, key, target_ext))
    return record.key, key, blob, sample_digest(blob)


def _members(record: ImageRecord, key: str, target_ext: str = TARGET_EXT) -> list[tuple[str, bytes]]:
    """A sample's members (name, payload), in the order they are written."""
    meta: dict = {"path": record.key, "label": label_to_json(record.label), "width": record.width,
                  "height": record.height, "codec": record.codec}
    if record.metadata is not None:
        meta["metadata"] = record.metadata
    if record.target is not None:
        meta["target"] = target_ext
    members = [(f"{key}.{record.ext}", record.data)]
    if record.caption is not None:  # an image-text pair: no class
        meta["caption"] = record.caption
        if record.tokens is not None:
            meta["tokens"] = record.tokens.tolist()
        members.append((f"{key}.txt", record.caption.encode("utf-8")))
    elif not isinstance(record.label, tuple):
        members.append((f"{key}.cls", str(record.label).encode("ascii")))
    members.append((f"{key}.json", json.dumps(meta).encode("ascii")))  # ASCII: a key may hold lone surrogates
    if record.target is not None:
        members.append((f"{key}.{target_ext}", record.target))
    return members


def _renamed(blob: bytes, key: str, new_key: str) -> bytes:
    """The members of `blob` (`tar_members`), each named `new_key` + what followed `key` in its name."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
        members = []
        for member in tar:
            payload = tar.extractfile(member)
            assert payload is not None and member.name.startswith(key)
            members.append((new_key + member.name[len(key):], payload.read()))
    return tar_members(members)


#: Member types that can execute code when loaded with pickle (webdataset's default decoders do): never read.
PICKLE_EXTS = frozenset({"pyd", "pickle", "pkl", "pth", "pt", "ckpt", "joblib"})
_USED_EXTS = IMAGE_EXTS | {"json", "cls", *TARGET_MEMBERS.values()}


def unsafe_member_reason(ext: str, payload: bytes) -> str | None:
    """Why a member with extension `ext` (and first bytes `payload`) must not be loaded, or None when it is safe."""
    last = ext.lower().rsplit(".", 1)[-1]
    if last in PICKLE_EXTS:
        return f"a pickle-capable member (.{last}); fastdata never unpickles data"
    if last == "npy":
        import numpy as np

        try:
            stream = io.BytesIO(payload)
            major, _ = np.lib.format.read_magic(stream)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            dtype = read_header(stream)[2]
        except Exception:
            return "an unreadable .npy member"
        if dtype.hasobject:
            return "an object-dtype .npy member (loading it needs pickle)"
    return None


def iter_shard(path: Path, unsafe_members: str = "error") -> Iterator[tuple[str, bytes, str, dict]]:
    """Stream one shard: yields (key, image bytes, image ext, metadata dict) per sample, in stored order.
    Members that are not regular files, or whose names escape the shard, are refused by name. Members that
    could run code if loaded (pickles, object .npy) are refused too, or skipped with
    `unsafe_members="ignore"`; other members fastdata does not use are skipped unread."""
    with open(path, "rb") as f:
        for _offset, sample in read_shard(f, path, unsafe_members=unsafe_members):
            assert sample is not None
            yield sample


def sample_positions(fileobj: BinaryIO, where: str | Path) -> list[int]:
    """The byte position of each sample's first member header in an open, seekable shard, in stored order: where
    `read_shard` can start to read that sample alone (the members' bytes are seeked past, not read)."""
    positions: list[int] = []
    current_key: str | None = None
    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as tar:
            for member in tar:
                key, _ext = split_member_name(member.name)
                if key != current_key:
                    positions.append(member.offset)
                    current_key = key
    except tarfile.TarError as exc:
        raise CorruptSampleError(f"{where}: not a readable tar shard ({exc})") from exc
    return positions


def read_shard(fileobj: BinaryIO, where: str | Path, want: Callable[[int], bool] | None = None,
               unsafe_members: str = "error", seekable: bool = False
               ) -> Iterator[tuple[int, tuple[str, bytes, str, dict] | None]]:
    """`(offset, sample)` for every sample of an open shard, in stored order (offset = its number in the
    shard); `sample` is `(key, image bytes, image ext, metadata)` as `iter_shard` gives (a sample with a target:
    metadata["target"] holds its target member's bytes), or None for the
    offsets `want` rejects: their member headers are still checked, their bytes are not read (skipped by
    seeking when `seekable`, else read past in the stream). `where` names the shard in errors."""
    current_key: str | None = None
    parts: dict[str, bytes] = {}
    offset, wanted = -1, False

    def finish() -> tuple[int, tuple[str, bytes, str, dict] | None]:
        assert current_key is not None
        if not wanted:
            return offset, None
        image_ext = next((ext for ext in parts if ext.lower() in IMAGE_EXTS), None)
        if image_ext is None or "json" not in parts:
            raise CorruptSampleError(f"{where}: sample {current_key!r} lacks an image or .json member "
                                     f"(has {sorted(parts)})")
        try:
            meta = json.loads(parts["json"])
        except ValueError as exc:
            raise CorruptSampleError(f"{where}: sample {current_key!r} has unreadable .json ({exc})") from exc
        target_ext = meta.get("target") if isinstance(meta, dict) else None
        if target_ext in TARGET_MEMBERS.values():
            if target_ext not in parts:
                raise CorruptSampleError(f"{where}: sample {current_key!r} lacks its .{target_ext} member (its .json "
                                         "says it has a target)")
            meta["target"] = parts[target_ext]
        return offset, (current_key, parts[image_ext], image_ext, meta)

    try:
        with tarfile.open(fileobj=fileobj, mode="r:" if seekable else "r|") as tar:
            for member in tar:
                if not member.isfile():
                    raise CorruptSampleError(f"{where}: member {member.name!r} is not a regular file")
                if member.name.startswith("/") or ".." in member.name.split("/"):
                    raise CorruptSampleError(f"{where}: member {member.name!r} has an unsafe path")
                key, ext = split_member_name(member.name)
                if key != current_key:
                    if current_key is not None:
                        yield finish()
                    current_key, parts = key, {}
                    offset += 1
                    wanted = want is None or want(offset)
                if not wanted:
                    continue
                member_file = tar.extractfile(member)
                assert member_file is not None
                if ext.lower() not in _USED_EXTS:
                    reason = unsafe_member_reason(ext, member_file.read(4096))
                    if reason and unsafe_members == "error":
                        raise CorruptSampleError(f"{where}: member {member.name!r} is {reason}; remove it from "
                                                 "the shard")
                    continue
                parts[ext] = member_file.read()
            if current_key is not None:
                yield finish()
    except GeneratorExit:  # closed early (at interpreter exit too, when `tarfile` below may be gone): nothing to say
        raise
    except tarfile.TarError as exc:
        raise CorruptSampleError(f"{where}: damaged shard ({exc})") from exc


def shard_paths(directory: Path, entries: list[FileEntry]) -> list[Path]:
    return [Path(directory) / entry.name for entry in entries]


class LocalShards:
    """The shards of a dataset on a local file system: opened for seeking, so that samples a reader does not
    want are skipped without reading their bytes."""

    def __init__(self, directory: Path, entries: list[FileEntry]) -> None:
        self.locations: list[Path] = shard_paths(directory, entries)

    def open(self, shard_id: int) -> tuple[BinaryIO, bool]:
        """(open binary file, whether it can seek) for shard `shard_id`."""
        return open(self.locations[shard_id], "rb"), True  # the caller closes it
