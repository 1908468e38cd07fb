"""Tar shards of about `shard_size` bytes, written sample after sample, that survive a kill: what the image and the
text WebDataset writers both hold (each composes one; neither is the other).

A shard is written as `shard-N.tar.tmp`, fsynced and renamed when complete. `checkpoint(progress)` records the
caller's progress record (which lists the finished shards) in `progress.json`; `resume()` continues after the
finished shards it lists and drops anything else; `continue_shard()` reopens an unfinished shard at a recorded
length (a checkpoint inside a shard). Members are written with mtime 0 and mode 0444: the same input gives the
same bytes.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

from fastdata.errors import START_AGAIN, StagingDamagedError
from fastdata.formats.manifest import FileEntry, write_atomic

SHARD_PATTERN = "shard-{:06d}.tar"
PENDING = "pending-sha256:"  # a finished shard's digest in its entry while another process hashes it
PROGRESS_FILE = "progress.json"
_BLOCK = 512  # tar block size


def check_kept_files(directory: Path, files: list[tuple[str, int]], what: str) -> None:
    """Raise StagingDamagedError naming the first of `files` ((name, bytes) a checkpoint recorded in the staging
    `directory`) that is missing or of another size: resuming over it would commit a broken dataset."""
    for name, size in files:
        path = directory / name
        if not path.is_file():
            raise StagingDamagedError(f"{path}: a {what} of the last checkpoint is missing; {START_AGAIN}")
        if path.stat().st_size != size:
            raise StagingDamagedError(f"{path}: a {what} of the last checkpoint holds {path.stat().st_size:,} bytes, "
                                      f"it had {size:,}; {START_AGAIN}")


def member_info(name: str, size: int) -> tarfile.TarInfo:
    """The header of a shard member: read-only, mtime 0 (reproducible shards: same input, same bytes)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o444
    info.mtime = 0
    return info


def tar_members(members: list[tuple[str, bytes]]) -> bytes:
    """Members (name, payload) as `ShardWriter.append` writes them into a shard, header, data and padding, byte for
    byte: what a conversion worker lays out so that the writer only appends the bytes (`append_blob`)."""
    parts: list[bytes] = []
    for name, payload in members:
        parts += (member_header(name, len(payload)), payload, bytes(-len(payload) % _BLOCK))
    return b"".join(parts)


def member_header(name: str, size: int) -> bytes:
    """The tar header block(s) of a member, exactly as `tarfile` writes `member_info(name, size)` in PAX format.

    A plain ASCII name of at most 100 characters needs one ustar block, and that block differs from member to
    member only in its name, size and checksum fields: those are patched into a template `tarfile` made (so the
    bytes are tarfile's own), at a few microseconds instead of tarfile's ~30 per member (about an eighth of a
    WebDataset conversion worker's time per image). Other names (long, non-ASCII) go through tarfile itself."""
    if len(name) <= _NAME_FIELD and name.isascii() and size < _SIZE_LIMIT:
        encoded = name.encode("ascii")
        size_field = b"%011o\0" % size
        header = bytearray(_TEMPLATE)
        header[:len(encoded)] = encoded
        header[_SIZE_AT:_SIZE_AT + 12] = size_field
        checksum = _TEMPLATE_SUM + sum(encoded) + sum(size_field) - _TEMPLATE_SIZE_SUM
        header[_CHECKSUM_AT:_CHECKSUM_AT + 8] = b"%06o\0 " % checksum
        return bytes(header)
    return member_info(name, size).tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def _ustar_template() -> tuple[bytes, int, int]:
    """tarfile's header of a member with an empty name and size 0, the byte sum of the header as its checksum
    is computed (checksum field as spaces), and the byte sum of its size field."""
    header = member_info("", 0).tobuf(tarfile.USTAR_FORMAT, "ascii", "strict")
    assert len(header) == _BLOCK, "tarfile wrote more than one block for a plain member"
    blank = header[:_CHECKSUM_AT] + b" " * 8 + header[_CHECKSUM_AT + 8:]
    return blank, sum(blank), sum(header[_SIZE_AT:_SIZE_AT + 12])


# ustar fields: name[100] mode[8] uid[8] gid[8] size[12] mtime[12] chksum[8] ...
_NAME_FIELD, _SIZE_AT, _CHECKSUM_AT = 100, 124, 148
_SIZE_LIMIT = 8**11  # sizes that fit the 11 octal digits of the size field
_TEMPLATE, _TEMPLATE_SUM, _TEMPLATE_SIZE_SUM = _ustar_template()


class ShardWriter:
    """Samples (groups of named members) into tar shards, in order. `on_shard_closed(name)` runs when a shard is
    complete, before it is renamed into place (the text writer writes the shard's index then)."""

    def __init__(self, directory: Path, shard_size: int, on_shard_closed: Callable[[str], None] | None = None,
                 assembly: Any = None) -> None:
        """`assembly`, when given, has the shards written, flushed to disk and hashed by other processes
        (`fastdata.convert.engines.assembly.ShardAssembly`: `begin(path)`, `write(path, at, pieces, shared)`,
        `finish(path, trailer, size)` -> the future of the digest, `ready()` and `get()`): this writer then only
        decides where each sample's bytes go, the same places as when it writes them itself, and a checkpoint that
        lists a shard still being finished elsewhere is written once its digest is in (`checkpoint`). Samples come
        to `append_blob` with the shared memory they lie in."""
        if assembly is not None and on_shard_closed is not None:
            raise ValueError("a shard assembled elsewhere has no on_shard_closed step")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.shard_size = shard_size
        self.on_shard_closed = on_shard_closed
        self.assembly = assembly
        self._hashing: dict[str, Any] = {}  # shard name -> the future of its digest
        self._held: list[bytes] = []  # checkpoints waiting for digests, oldest first
        self.count = 0  # samples written, finished shards included
        self.shard_samples = 0  # samples in the open shard
        self._entries: list[FileEntry] = []
        self._tar: tarfile.TarFile | None = None
        self._shard_finished = False
        # with an assembly: the open shard's bytes so far, and the run of pieces not yet handed over
        self._assembled: int | None = None
        self._run: list[Any] = []
        self._run_at = 0
        self._run_memory: Any = None
        self._run_inline = 0

    def saved_progress(self) -> bytes | None:
        """The progress record of the last checkpoint, if the directory holds one."""
        path = self.directory / PROGRESS_FILE
        return path.read_bytes() if path.is_file() else None

    def resume(self, entries: list[FileEntry], keep_files: Iterable[str] = ()) -> None:
        """Continue after the finished shards `entries` (from the saved progress): drop anything else in the
        directory but the files named in `keep_files`. Raises StagingDamagedError when a finished shard is not
        there as the progress recorded it."""
        check_kept_files(self.directory, [(entry.name, entry.bytes) for entry in entries], "finished shard")
        self._entries = list(entries)
        self.count = sum(e.samples for e in entries)
        keep = {e.name for e in entries} | {PROGRESS_FILE} | set(keep_files)
        for path in self.directory.iterdir():
            if path.name not in keep:
                path.unlink()

    @property
    def shard_name(self) -> str:
        """The name of the open shard (or of the next one)."""
        return SHARD_PATTERN.format(len(self._entries))

    def _open_shard(self, file: BinaryIO | None = None) -> None:
        if file is None:
            file = open(self.directory / (self.shard_name + ".tmp"), "wb")  # noqa: SIM115 (spans add() calls)
        self._shard_file = _HashedFile(file)
        self._tar = tarfile.open(fileobj=self._shard_file, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        self.shard_samples = 0

    def continue_shard(self, file: BinaryIO, samples: int) -> None:
        """Go on writing the unfinished shard open in `file` (positioned at the end of its last complete member),
        which holds `samples` samples: the same bytes as if it had never stopped."""
        self._open_shard(file)
        self.shard_samples = samples
        self.count += samples

    def append(self, members: list[tuple[str, bytes]]) -> list[int]:
        """Write one sample's members into the open shard (opened if needed); returns the byte offset of each
        member's data in the shard. Call `sample_done()` once the caller has recorded them."""
        if self._tar is None:
            self._open_shard()
        assert self._tar is not None
        offsets = []
        for name, payload in members:
            self._tar.addfile(member_info(name, len(payload)), io.BytesIO(payload))
            offsets.append(self._tar.offset - -(-len(payload) // _BLOCK) * _BLOCK)
        return offsets

    def append_blob(self, blob: Any, shared: Any = None) -> None:
        """Write one sample's members, laid out by `tar_members`, into the open shard (opened if needed). Call
        `sample_done()` after it. With an assembly, `shared` is the shared memory (`SharedMemory`) that `blob` came
        in, if any: only the place of the bytes is handed on."""
        if self.assembly is not None:
            self._assemble(blob, shared)
            return
        if self._tar is None:
            self._open_shard()
        assert self._tar is not None
        self._shard_file.write(blob)
        self._tar.offset += len(blob)

    def _assemble(self, blob: Any, shared: Any) -> None:
        """Add `blob` to the open shard's run of pieces for the assembly (opening the shard if needed)."""
        if self._assembled is None:
            self.assembly.begin(str(self.directory / self.shard_name))
            self._assembled = self._run_at = self.shard_samples = 0
        offset = shared.locate(blob) if shared is not None else None
        if offset is not None and shared is not self._run_memory:
            if self._run_memory is not None:
                self._hand_over()
            self._run_memory = shared
        if offset is None:
            self._run.append(bytes(blob))
            self._run_inline += len(blob)
        elif self._run and isinstance(self._run[-1], tuple) and sum(self._run[-1]) == offset:
            self._run[-1] = (self._run[-1][0], self._run[-1][1] + len(blob))  # the next bytes of the same memory
        else:
            self._run.append((offset, len(blob)))
        self._assembled += len(blob)
        if self._run_inline >= _RUN_INLINE_MAX:
            self._hand_over()

    def _hand_over(self) -> None:
        """Send the run of pieces gathered so far to the assembly."""
        if self._run:
            self.assembly.write(str(self.directory / self.shard_name), self._run_at, self._run, self._run_memory)
        self._run, self._run_memory, self._run_inline = [], None, 0
        self._run_at = self._assembled or 0

    def sample_done(self) -> None:
        """Count the sample just appended; close the shard once it has reached the shard size."""
        self.shard_samples += 1
        self.count += 1
        if self.assembly is not None:
            assert self._assembled is not None
            if self._assembled >= self.shard_size:
                self._close_shard()
            return
        assert self._tar is not None
        if self._tar.fileobj.tell() >= self.shard_size:
            self._close_shard()

    @property
    def open_shard(self) -> tuple[str, int, int] | None:
        """(name, bytes of complete members, samples) of the open shard, None without one (or an empty one)."""
        if self._tar is None or not self.shard_samples:
            return None
        return self.shard_name, self._tar.offset, self.shard_samples

    def sync(self) -> None:
        """Put what the open shard holds so far on disk (nothing to do without one)."""
        if self._tar is not None:
            self._shard_file.flush()
            os.fsync(self._shard_file.fileno())

    def _close_shard(self) -> None:
        if self.assembly is not None:
            self._finish_elsewhere()
            return
        if self._tar is None:
            return
        self._tar.close()
        self.sync()
        self._shard_file.close()
        name = self.shard_name
        if self.on_shard_closed is not None:
            self.on_shard_closed(name)
        path = self.directory / name
        os.replace(self.directory / (name + ".tmp"), path)
        self._entries.append(FileEntry(name, path.stat().st_size, self._shard_file.hexdigest(), self.shard_samples))
        self._tar = None
        self._shard_finished = True

    def _finish_elsewhere(self) -> None:
        """Hand the open shard's last run and its trailer to the assembly; its entry waits for the digest (no
        checkpoint lists it before that is in)."""
        if self._assembled is None:
            return
        self._hand_over()
        name, trailer = self.shard_name, tar_trailer(self._assembled)
        size = self._assembled + len(trailer)
        self._hashing[name] = self.assembly.finish(str(self.directory / name), trailer, size)
        self._entries.append(FileEntry(name, size, PENDING + name, self.shard_samples))
        self._assembled = None
        self._shard_finished = True

    def checkpoint_due(self) -> bool:
        """Whether a shard was finished since the last checkpoint (held checkpoints whose digests have come in
        are written meanwhile)."""
        if self._held:
            self._write_held(wait=False)
        return self._shard_finished

    @property
    def finished_shards(self) -> list[FileEntry]:
        return list(self._entries)

    @property
    def finished_count(self) -> int:
        """How many shards are finished (what `finished_shards` lists, without the copy)."""
        return len(self._entries)

    def checkpoint(self, progress: bytes) -> None:
        """Record `progress` (which must list `finished_shards`) as the point to resume from; one that lists a shard
        still being hashed elsewhere is held and written, digests filled in, once they are all in."""
        self._shard_finished = False
        if PENDING.encode() in progress or self._held:
            self._held.append(progress)
            self._write_held(wait=False)
        else:
            write_atomic(self.directory / PROGRESS_FILE, progress)

    def _write_held(self, wait: bool) -> None:
        """Write the held checkpoints, in order, whose shards' digests are in (with `wait`: all, waiting)."""
        while self._held:
            progress = self._held[0]
            names = [name for name in self._hashing if (PENDING + name).encode() in progress]
            if not wait and not all(self._hashing[name].ready() for name in names):
                return
            for name in names:
                digest = self._digest(name)
                progress = progress.replace(f'"{PENDING}{name}"'.encode(), f'"{digest}"'.encode())
            write_atomic(self.directory / PROGRESS_FILE, progress)
            self._held.pop(0)

    def _digest(self, name: str) -> str:
        """The digest of shard `name` hashed elsewhere (waiting for it), filled into its entry."""
        digest = self._hashing[name].get()
        for i, entry in enumerate(self._entries):
            if entry.name == name and entry.sha256 == PENDING + name:
                self._entries[i] = FileEntry(entry.name, entry.bytes, digest, entry.samples)
        return digest

    def close(self) -> list[FileEntry]:
        """Finish the last shard; returns every shard, every digest in. `progress.json` stays until the dataset is
        committed."""
        self._close_shard()
        for name in self._hashing:
            self._digest(name)
        self._write_held(wait=True)
        return list(self._entries)

    def abort(self) -> None:
        """Close the open shard (left as .tmp, dropped on resume); finished shards and progress stay."""
        self._assembled, self._run, self._run_memory = None, [], None
        if self._tar is not None:
            self._tar.close()
            self._shard_file.close()
            self._tar = None


def tar_trailer(size: int) -> bytes:
    """What `tarfile` writes when it closes an archive of `size` bytes: two zero blocks, then zeros up to a whole
    record (20 blocks)."""
    end = size + 2 * _BLOCK
    return bytes(2 * _BLOCK + -end % tarfile.RECORDSIZE)


_RUN_INLINE_MAX = 1 << 22  # bytes of samples that came inside the pickle gathered before they are handed over


class _HashedFile:
    """A shard's file, its sha256 computed from the bytes as they are written (the part before the position it is
    opened at, on a resume, read back once): closing a shard does not read it all back to hash it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self._digest = hashlib.sha256()
        end, fd, position = file.tell(), file.fileno(), 0
        while position < end:
            piece = os.pread(fd, min(1 << 22, end - position), position)
            if not piece:
                break
            self._digest.update(piece)
            position += len(piece)

    def write(self, data: Any) -> int:
        self._digest.update(data)
        return self.file.write(data)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close, name, mode: the file's own
        return getattr(self.file, name)
