"""What lies behind a path (for `fastdata doctor`): the mount and filesystem type, whether the kernel calls
the disk rotational, and what a folder holds (many small files, or a few shards)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fastdata.formats.records import IMAGE_EXTENSIONS

NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "sshfs", "fuse.sshfs", "lustre", "gpfs", "beegfs",
    "glusterfs", "fuse.glusterfs", "ceph", "cephfs", "fuse.ceph", "fuse.cephfs", "9p", "afs", "ncpfs", "davfs",
    "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.juicefs", "fuse.goofys", "fuse.mountpoint-s3",
    "fuse.blobfuse", "fuse.blobfuse2", "wekafs", "panfs", "orangefs", "pvfs2", "fuse.alluxio-fuse",
})
IMAGE_SUFFIXES = frozenset(IMAGE_EXTENSIONS)


@dataclass(frozen=True)
class Mount:
    """The mount a path lives on."""

    mountpoint: str
    device: str
    fstype: str

    @property
    def network(self) -> bool:
        return self.fstype.lower() in NETWORK_FILESYSTEMS


def mount_of(path: str | os.PathLike[str]) -> Mount | None:
    """The mount holding `path` (the longest mount point that is a prefix of its real path), or None."""
    target = os.path.realpath(path)
    best: Mount | None = None
    for mount in _mounts():
        point = mount.mountpoint
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.mountpoint)):
            best = mount
    return best


def _mounts() -> list[Mount]:
    try:
        import psutil

        return [Mount(p.mountpoint, p.device, p.fstype) for p in psutil.disk_partitions(all=True)]
    except Exception:
        pass
    try:  # without psutil: the kernel's own table
        with open("/proc/self/mounts") as f:
            rows = [line.split() for line in f]
        return [Mount(r[1].replace("\\040", " "), r[0], r[2]) for r in rows if len(r) >= 3]
    except OSError:
        return []


def block_device(path: str | os.PathLike[str]) -> tuple[str | None, bool | None]:
    """(disk name, rotational?) of the block device holding `path`, from /sys (None where unknown: not
    Linux, not a block device, or the kernel does not say)."""
    try:
        dev = os.stat(path).st_dev
        sys_dir = Path(os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"))
    except (OSError, AttributeError):
        return None, None
    for candidate in (sys_dir, sys_dir.parent):  # a partition's queue/ is its disk's
        flag = candidate / "queue" / "rotational"
        if flag.is_file():
            try:
                return candidate.name, flag.read_text().strip() == "1"
            except OSError:
                return candidate.name, None
    return (sys_dir.name if sys_dir.name else None), None


@dataclass(frozen=True)
class FolderScan:
    """What a walk over (at most `limit` files of) a folder found."""

    files: int
    bytes: int
    images: int
    tars: int
    truncated: bool  # the walk stopped at the limit

    @property
    def mean_bytes(self) -> float:
        return self.bytes / self.files if self.files else 0.0


def scan_folder(path: str | os.PathLike[str], limit: int = 20000) -> FolderScan:
    """Count files, bytes, image files and tar files under `path`, stopping after `limit` files."""
    files = size = images = tars = 0
    stack = [os.fspath(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                if not entry.is_file():
                    continue
                size += entry.stat().st_size
            except OSError:
                continue
            files += 1
            suffix = os.path.splitext(entry.name)[1].lower()
            images += suffix in IMAGE_SUFFIXES
            tars += suffix == ".tar"
            if files >= limit:
                return FolderScan(files, size, images, tars, True)
    return FolderScan(files, size, images, tars, False)
