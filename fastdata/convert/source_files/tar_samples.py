"""Samples of existing WebDataset tar shards: what `fastdata convert webdataset` and `fastdata convert pairs` share
when their source is shards.

Which files SRC names (`shard_files`), each uncompressed tar shard read once with `tarfile` into its samples
(`index_shards`: members grouped by key exactly as webdataset groups them; the members fastdata's own WebDataset
reader refuses refused here too; shards indexed in parallel processes when there are several), and
`TarMemberReader`, the SampleReader that reads a sample's image by its offset in its shard. Then what both
converters do with the indexed samples: refuse a key found twice (`refuse_duplicates`), choose each sample's image
member (`image_exts`, `choose_images`), read its `.json` (`parsed_json`) and keep its fields and `.txt` caption as
metadata (`sample_metadata`), and name a sample in messages (`where`). What a sample's label or caption is stays
with each converter.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import tarfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from fastdata.convert.checkpoints import files_digest
from fastdata.convert.source_files.metadata import NOT_JSON, json_value
from fastdata.errors import ConfigError, SourceError
from fastdata.formats.records import IMAGE_EXTENSIONS
from fastdata.formats.wds import unsafe_member_reason

# webdataset's own grouping rule (webdataset.tariterators.base_plus_ext and its meta-member filter).
_KEY_AND_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_MEMBER = re.compile(r"__[^/]*__($|/)")
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
_END_BLOCK = bytes(tarfile.BLOCKSIZE)
SHOWN = 5  # items named in an error that concerns many
#: Image member extensions, in the order a sample's image is chosen when it has several (`--image-ext`).
DEFAULT_IMAGE_EXTS = tuple(ext[1:] for ext in IMAGE_EXTENSIONS)


def shard_files(src: str | os.PathLike[str]) -> tuple[Path, list[Path], str]:
    """(root, shard paths in order, the source as described in the manifest) for SRC: a folder of `.tar` files, one
    `.tar`, or a brace pattern."""
    text = os.fspath(src)
    if "{" in text:
        from braceexpand import braceexpand

        paths = [Path(p) for p in braceexpand(text)]
        missing = [str(p) for p in paths if not p.is_file()]
        if len(missing) == len(paths):
            raise SourceError(f"{text}: the pattern matches no files ({len(paths)} names, e.g. {paths[0]})")
        if missing:
            raise SourceError(f"{text}: {len(missing)} of the {len(paths)} shards it names do not exist: "
                              f"{', '.join(missing[:SHOWN])}" + (" ..." if len(missing) > SHOWN else ""))
        return Path(os.path.commonpath([p.resolve().parent for p in paths])), paths, os.path.abspath(text)
    path = Path(text)
    if path.is_file():
        return path.resolve().parent, [path], str(path.resolve())
    if not path.exists():
        raise SourceError(f"{path}: source does not exist (a folder of .tar shards, a .tar, or a pattern "
                          "such as shards-{000000..000009}.tar)")
    shards = sorted(p for p in path.iterdir() if p.name.endswith(".tar") and p.is_file())
    compressed = sorted(p.name for p in path.iterdir() if re.search(r"\.(tar\.(gz|bz2|xz|zst)|tgz)$", p.name))
    if compressed:
        raise SourceError(f"{path / compressed[0]}: compressed shard; fastdata reads samples by their offset in the "
                          "tar, so decompress the shards first (gunzip / zstd -d)")
    if not shards:
        raise SourceError(f"{path}: no .tar shards in this folder")
    return path.resolve(), shards, str(path.resolve())


def _refuse_compressed(path: Path, shown: str) -> None:
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            raise SourceError(f"{shown}: {kind}-compressed shard; fastdata reads samples by their offset in the tar, "
                              "so decompress it first (gunzip / zstd -d)")


class Member(NamedTuple):
    """Where a member's bytes are in its shard (kept for every member of every shard: no TarInfo)."""

    name: str
    offset: int
    size: int


@dataclass
class IndexedSample:
    """One webdataset sample as found in a shard: its members by (lower-cased) extension."""

    shard: int
    key: str
    members: dict[str, Member] = field(default_factory=dict)
    texts: dict[str, bytes] = field(default_factory=dict)  # the small members read while indexing


def index_shard(path: Path, number: int, shown: str, read_exts: frozenset[str]
                 ) -> tuple[list[IndexedSample], list[str]]:
    """The samples of one shard, in stored order, and the members it skips (names as `shard!member`); the bytes of
    the members with an extension in `read_exts` are read on the way. Raises SourceError for what the module
    docstring refuses."""
    _refuse_compressed(path, shown)
    samples: list[IndexedSample] = []
    ignored: list[str] = []
    last: tarfile.TarInfo | None = None
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            with tarfile.open(fileobj=f, mode="r:") as tar:
                for member in tar:
                    last = member
                    if member.isdir():
                        continue
                    _check_member(member, shown, tar)
                    name = member.name
                    found = _KEY_AND_EXT.match(name)
                    if _META_MEMBER.match(name) or found is None:
                        ignored.append(f"{shown}!{name}")
                        continue
                    key, ext = found.group(1), found.group(2).lower()
                    if not samples or samples[-1].key != key:
                        samples.append(IndexedSample(number, key))
                    sample = samples[-1]
                    if ext in sample.members:
                        raise SourceError(f"{shown}: sample {key!r} has two .{ext} members "
                                          f"({sample.members[ext].name!r} and {name!r}); webdataset refuses them too")
                    sample.members[ext] = Member(name, member.offset_data, member.size)
                    if ext in read_exts:
                        reader = tar.extractfile(member)
                        assert reader is not None  # a regular member
                        sample.texts[ext] = reader.read()
                end = tar.offset
        except tarfile.TarError as exc:  # raised on opening only for the first member, which sets `last` otherwise
            if last is None:
                raise SourceError(f"{shown}: not a tar archive, or damaged at its first member ({exc})") from None
            if last.offset_data + last.size > size:
                raise SourceError(f"{shown}: truncated shard: member {last.name!r} needs bytes "
                                  f"{last.offset_data:,}..{last.offset_data + last.size:,} but the file ends at byte "
                                  f"{size:,}") from None
            raise SourceError(f"{shown}: damaged shard after member {last.name!r} ({exc})") from None
        f.seek(end)
        if f.read(tarfile.BLOCKSIZE) != _END_BLOCK:
            after = f"after member {last.name!r}" if last is not None else "at its start"
            what = "truncated shard: it ends" if end >= size else "truncated or damaged shard: no valid tar header"
            raise SourceError(f"{shown}: {what} at byte {min(end, size):,}, {after}, without the tar "
                              "end-of-archive marker")
    return samples, ignored


def _check_member(member: tarfile.TarInfo, shown: str, tar: tarfile.TarFile) -> None:
    """Refuse a member fastdata's own WebDataset reader refuses (`fastdata.formats.wds.read_shard`)."""
    name = member.name
    if name.startswith("/") or ".." in name.split("/"):
        raise SourceError(f"{shown}: member {name!r} has an unsafe path (absolute or with '..'); remove it")
    if not member.isfile() or member.issparse():
        kind = ("a symbolic link" if member.issym() else "a hard link" if member.islnk()
                else "a sparse file" if member.issparse() else "not a regular file")
        raise SourceError(f"{shown}: member {name!r} is {kind}; fastdata reads only regular members, remove it")
    ext = name.rsplit("/", 1)[-1].partition(".")[2]
    payload = b""
    if ext.lower().endswith("npy"):
        reader = tar.extractfile(member)
        assert reader is not None
        payload = reader.read(4096)
    reason = unsafe_member_reason(ext, payload)
    if reason is not None:
        raise SourceError(f"{shown}: member {name!r} is {reason}; remove it from the shard")


def _index_job(job: tuple[Path, int, str, frozenset[str]]) -> tuple[list[IndexedSample], list[str]]:
    return index_shard(*job)


def index_shards(paths: list[Path], names: list[str], read_exts: frozenset[str], workers: int
                 ) -> tuple[list[IndexedSample], list[str]]:
    """`index_shard` over every shard (`names`: as messages name them), in order, over up to `workers` processes:
    (all samples, all skipped members). The first shard in order that is refused raises its SourceError."""
    jobs = [(path, number, name, read_exts) for number, (path, name) in enumerate(zip(paths, names, strict=True))]
    samples: list[IndexedSample] = []
    ignored: list[str] = []
    if workers <= 1 or len(jobs) <= 1:
        results = list(map(_index_job, jobs))
    else:
        with multiprocessing.get_context().Pool(min(workers, len(jobs))) as pool:
            results = list(pool.imap(_index_job, jobs))  # in order: the first refused shard is the same every run
    for found, skipped in results:
        samples += found
        ignored += skipped
    return samples, ignored


class TarMemberReader:
    """A SampleReader over the members of uncompressed tar shards: sample key -> (shard, data offset, size), found
    by indexing each shard once; bytes read with `pread`. Pickled once into each conversion worker; the open
    shards (at most `open_shards` at a time) are kept per process and dropped when pickled."""

    def __init__(self, source: str, shards: list[Path], names: list[str], table: dict[str, tuple[int, int, int]],
                 open_shards: int = 64) -> None:
        self.source = source
        self.shards = shards
        self.names = names  # the shards as messages name them
        self.table = table
        self.open_shards = open_shards
        self._fds: OrderedDict[int, int] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fds": None}

    def __del__(self) -> None:
        for fd in (self._fds or {}).values():
            os.close(fd)

    def _fd(self, shard: int) -> int:
        if self._fds is None:
            self._fds = OrderedDict()
        if shard in self._fds:
            self._fds.move_to_end(shard)
            return self._fds[shard]
        if len(self._fds) >= self.open_shards:
            os.close(self._fds.popitem(last=False)[1])
        fd = self._fds[shard] = os.open(self.shards[shard], os.O_RDONLY)
        return fd

    def read(self, key: str) -> bytes:
        shard, offset, size = self.table[key]
        data = os.pread(self._fd(shard), size, offset)
        if len(data) != size:
            raise OSError(errno.EIO, f"the shard ends inside this member ({len(data):,} of {size:,} bytes)")
        return data

    def locate(self, key: str) -> str:
        return f"{self.names[self.table[key][0]]}!{key}"

    def describe(self) -> str:
        return self.source

    def digest(self, keys: Sequence[str]) -> str:
        """The shards' names, sizes and mtimes (every key is in one of them)."""
        return files_digest(zip(self.names, self.shards, strict=True))


# ----------------------------------------------------------------------------------------------------- samples


def where(sample: IndexedSample, names: list[str]) -> str:
    """A sample as messages name it: `shard!key`."""
    return f"{names[sample.shard]}!{sample.key}"


def listed(problems: list[str]) -> str:
    """The first SHOWN of `problems`, and how many there are in all when there are more."""
    return ", ".join(problems[:SHOWN]) + (f" ... ({len(problems)} in all)" if len(problems) > SHOWN else "")


def sample_metadata(sample: IndexedSample, meta: dict | None, label_field: str | None, caption: bool,
                    names: list[str]) -> dict[str, Any]:
    """A sample's metadata: its .json fields but the label (lists kept as lists, as every source keeps them:
    fastdata.convert.source_files.metadata; objects as JSON text), and its caption."""
    row = {}
    for name, value in (meta or {}).items():
        if name != label_field:
            kept = json_value(value)
            row[name] = json.dumps(value, ensure_ascii=False, sort_keys=True) if kept is NOT_JSON else kept
    if caption and "txt" in sample.texts:
        try:
            row["caption"] = sample.texts["txt"].decode("utf-8")
        except UnicodeDecodeError:
            raise SourceError(f"{where(sample, names)}: its .txt caption is not UTF-8 text") from None
    return row


def parsed_json(sample: IndexedSample, names: list[str]) -> dict | None:
    """A sample's `.json` member as a dict (None: it has none); SourceError naming the sample when it is not a
    JSON object."""
    if "json" not in sample.texts:
        return None
    try:
        meta = json.loads(sample.texts["json"])
    except ValueError as exc:
        raise SourceError(f"{where(sample, names)}: unreadable .json ({exc})") from None
    if not isinstance(meta, dict):
        raise SourceError(f"{where(sample, names)}: its .json holds {type(meta).__name__}, not an object")
    return meta


def image_exts(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The image member extensions of `--image-ext` (comma-separated text or a sequence; None: every image
    extension fastdata reads, jpg first), each checked."""
    if value is None:
        return DEFAULT_IMAGE_EXTS
    exts = tuple(e.strip().lower().lstrip(".") for e in (value.split(",") if isinstance(value, str) else value))
    unknown = [e for e in exts if e not in DEFAULT_IMAGE_EXTS]
    if not exts or unknown:
        raise ConfigError(f"--image-ext: {', '.join(unknown) or 'nothing given'}: image extensions are "
                          f"{', '.join(DEFAULT_IMAGE_EXTS)}")
    return exts


def refuse_duplicates(samples: list[IndexedSample], names: list[str]) -> None:
    """webdataset keys are unique in a dataset: one found in two places (two shards, or apart in one) is refused."""
    first: dict[str, IndexedSample] = {}
    twice = []
    for sample in samples:
        seen = first.setdefault(sample.key, sample)
        if seen is not sample:
            twice.append(f"{sample.key!r} in {names[seen.shard]} and {names[sample.shard]}")
    if twice:
        raise SourceError(f"{len(twice)} duplicate sample key(s): {listed(twice)}; keys must be unique across "
                          "the shards")


def choose_images(samples: list[IndexedSample], exts: tuple[str, ...], names: list[str]) -> list[str]:
    """Each sample's image member extension: the first of `exts` it has."""
    chosen, missing = [], []
    for sample in samples:
        image = next((ext for ext in exts if ext in sample.members), None)
        if image is None:
            missing.append(f"{where(sample, names)} (has {', '.join(sorted(sample.members)) or 'nothing'})")
        else:
            chosen.append(image)
    if missing:
        raise SourceError(f"{len(missing)} sample(s) have no image member (.{', .'.join(exts)}): {listed(missing)}")
    return chosen
