"""The manifest: a JSON file beside the data that says what a dataset holds. Written last, so its presence
means the conversion completed."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastdata.errors import IncompleteDatasetError, NotADatasetError

MANIFEST_NAME = "manifest.json"
#: The format version of a dataset that needs nothing newer (single labels, no per-sample metadata): readable by
#: every fastdata release.
FORMAT_VERSION = 1
#: The newest format version this fastdata reads: 2 adds multi-label samples (`label_kind: "multi"`), per-sample
#: metadata (`metadata_fields`) and image-text pairs (`target_kind: "pairs"`); a dataset that uses any of them is
#: written as version 2, so that an older fastdata refuses it with "upgrade fastdata" instead of misreading it.
#: 3 adds per-sample targets (`target_kind: "detection"` or "segmentation", `fastdata.formats.targets` and
#: `fastdata.formats.masks`): only a dataset that has them
#: is written as version 3.
NEWEST_FORMAT_VERSION = 3
TARGETS_FORMAT_VERSION = 3
PARTIAL_SUFFIX = ".partial"
#: What an image dataset's samples hold besides the image: "class" (class labels: one id, or a set of ids) or
#: "pairs" (image-text pairs: a caption, and token ids when converted with a tokenizer; the manifest's `pairs`
#: section says how they are stored) or "detection" (boxes, labels and masks per image: the manifest's `targets`
#: section, `fastdata.formats.targets`) or "segmentation" (a label map per image, `fastdata.formats.masks`; the
#: `targets` section: mask dtype, ignore index, class ids seen). "pairs" needs format version 2, "detection" and
#: "segmentation" 3.
TARGET_KINDS = ("class", "pairs", "detection", "segmentation")
#: The target kinds stored as a record per sample (LMDB's `targets` sub-database, a WebDataset target member):
#: detection (`fastdata.formats.targets`) and semantic segmentation label maps (`fastdata.formats.masks`).
RECORD_TARGET_KINDS = ("detection", "segmentation")


@dataclass
class FileEntry:
    """One data file of a dataset (the LMDB data file, or one WebDataset shard)."""

    name: str
    bytes: int
    sha256: str
    samples: int


@dataclass
class Manifest:
    """What a converted dataset holds; JSON round-trip, no pickle."""

    format: str  # "lmdb" | "wds"
    kind: str  # "image" | "text"
    num_samples: int
    classes: list[str]
    class_counts: list[int]
    files: list[FileEntry]
    options: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    fastdata_version: str = ""
    text: dict[str, Any] | None = None  # kind "text" only: token dtype, documents, total tokens, tokenizer, eos
    # kind "image": "single" (one class id per sample) or "multi" (a list of class ids per sample; class_counts
    # then count each class a sample holds)
    label_kind: str = "single"
    metadata_fields: list[str] = field(default_factory=list)  # the per-sample metadata's keys (none: no metadata)
    target_kind: str = "class"  # kind "image": see TARGET_KINDS (left out of the JSON when "class")
    pairs: dict[str, Any] | None = None  # target_kind "pairs": tokens (dtype, tokenizer, padding) and caption counts
    # target_kind "detection": what the targets hold (`category_ids`: the source's category id of each class;
    # `masks`: whether they hold masks; counts); "segmentation": `mask_dtype`, `ignore_index`, `num_classes`,
    # `classes_seen`, `max_class_id`
    targets: dict[str, Any] | None = None
    # kind "image": how its JPEG records are stored (`fastdata.formats.records.JPEG_LAYOUTS`; left out of the JSON
    # when "original"). Needs no newer format version: a "restart" JPEG is a baseline JPEG any decoder reads to the
    # original's pixels, so a reader that does not know the field (or a layout named here) decodes it as any JPEG;
    # the layout only tells a reader that knows it that a crop can be decoded from the MCUs it covers.
    jpeg_layout: str = "original"
    # Image datasets: a digest per record, {"algorithm": "sha256", "records": N, "root": sha256 of the digests in
    # stored order}. LMDB (`fastdata.formats.lmdb.record_digest`): they stand for the whole file's sha256 (its
    # FileEntry's is then ""), with "arrays" (the per-sample arrays' digests). WebDataset
    # (`fastdata.formats.wds.sample_digest`): beside each shard's own sha256, in a file beside it ("files": the
    # suffix of its name, ".digests"), so that verify names a damaged sample, not only its shard. Left out of the
    # JSON when None (datasets from before, verified by their files' sha256). Needs no newer format version: every
    # reader loads such a dataset; only `fastdata verify` reads the digests.
    record_digests: dict[str, Any] | None = None

    @property
    def needed_format_version(self) -> int:
        """The oldest format version that describes this dataset (see NEWEST_FORMAT_VERSION)."""
        if self.target_kind in RECORD_TARGET_KINDS:
            return TARGETS_FORMAT_VERSION
        newer = self.label_kind != "single" or self.metadata_fields or self.target_kind != "class"
        return 2 if newer else FORMAT_VERSION

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def data_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        # a dataset of class labels is written as before targets existed
        if data["target_kind"] == "class":
            del data["target_kind"]
        if data["jpeg_layout"] == "original":
            del data["jpeg_layout"]
        for name in ("pairs", "targets", "record_digests"):
            if data[name] is None:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = dict(data)
        data["files"] = [FileEntry(**f) for f in data.get("files", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, directory: Path) -> Path:
        """Write atomically (temp file, fsync, rename) into `directory`, with a checksum of its own content
        so that a hand-edited manifest (a changed label map, say) is detected by `fastdata verify`."""
        path = Path(directory) / MANIFEST_NAME
        data = self.to_dict()
        data[CHECKSUM_FIELD] = content_checksum(data)
        write_atomic(path, json.dumps(data, indent=2).encode() + b"\n")
        return path


CHECKSUM_FIELD = "manifest_sha256"


def rejected_place(entry: dict[str, Any]) -> str:
    """Where a rejected item of a manifest was (`entry` as the manifest lists it): its path, with the line of a text
    source (`path:line`), the list file and row of a listed image (`list row N: path`), the annotation file and
image id of an annotated image (`annotations image N: path`), or the tar shard of a member
    (`shard!member`; a path that already names its shard, as a reader's `locate` does, is kept as it is)."""
    if entry.get("shard"):
        shard, path = str(entry["shard"]), str(entry["path"])
        return path if path.startswith(f"{shard}!") else f"{shard}!{path}"
    if entry.get("list"):
        return f"{entry['list']} row {entry['row']}: {entry['path']}"
    if entry.get("image_id") is not None:  # an image of an annotation file (COCO)
        return f"{entry['annotations']} image {entry['image_id']}: {entry['path']}"
    if entry.get("line"):
        return f"{entry['path']}:{entry['line']}"
    return str(entry["path"])


def content_checksum(data: dict[str, Any]) -> str:
    """sha256 of a manifest's content (canonical JSON, without the checksum field itself)."""
    content = {k: v for k, v in data.items() if k != CHECKSUM_FIELD}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_path(path: Path) -> None:
    """Put what the file or directory `path` holds on disk (through a descriptor of its own)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable."""
    fsync_path(directory)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_files(paths: list[Path], threads: int = 1) -> list[str]:
    """The sha256 of each file of `paths`, in order, hashed on up to `threads` threads (hashlib lets go of the GIL
    while it hashes, so they run on as many cores)."""
    if threads <= 1 or len(paths) <= 1:
        return [sha256_file(path) for path in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(threads, len(paths)), thread_name_prefix="fastdata-sha256") as pool:
        return list(pool.map(sha256_file, paths))


def partial_path(out: Path) -> Path:
    """Where a conversion into `out` writes until it is complete."""
    out = Path(out)
    return out.with_name(out.name + PARTIAL_SUFFIX)


def incomplete_or_missing(root: Path) -> NotADatasetError:
    """Why there is no dataset at `root` (which does not exist): a conversion is writing it now (named: pid, command,
    since when; its lock, `fastdata.output_lock`), one was interrupted (only `OUT.partial` exists, no conversion
    holds it: rerunning the same command resumes it), or there is nothing at all."""
    from fastdata.output_lock import running_conversion

    partial = partial_path(root)
    holder = running_conversion(root)
    if holder is not None:
        what = f"its work so far is in {partial}" if partial.exists() else "it has written nothing yet"
        return IncompleteDatasetError(f"{root}: a conversion is writing it now: {holder.describe()} ({what}); wait "
                                      "for it to finish: the dataset appears there when it is complete")
    if partial.exists():
        return IncompleteDatasetError(f"{root}: incomplete conversion (only {partial} exists), interrupted: no "
                                      "conversion is running; rerun the same convert command to resume it")
    return NotADatasetError(f"{root}: no such file or directory")


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read the manifest of the dataset at `path`, or say clearly why `path` is not a dataset."""
    root = Path(path)
    if not root.exists():
        raise incomplete_or_missing(root)
    if not root.is_dir():
        raise NotADatasetError(
            f"{root}: not a fastdata dataset (expected a directory holding {MANIFEST_NAME}; "
            "create one with `fastdata convert imagefolder SRC OUT`)"
        )
    manifest_file = root / MANIFEST_NAME
    if not manifest_file.is_file():
        raise NotADatasetError(
            f"{root}: not a fastdata dataset ({MANIFEST_NAME} is missing; "
            "create one with `fastdata convert imagefolder SRC OUT`)"
        )
    try:
        raw = manifest_file.read_bytes()
    except OSError as exc:
        raise NotADatasetError(f"{manifest_file}: unreadable manifest ({exc})") from exc
    return parse_manifest(raw, str(manifest_file))


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """A manifest from its bytes (read from `where`, named in errors), or say clearly why it is not one."""
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NotADatasetError(f"{where}: unreadable manifest ({exc})") from exc
    if not isinstance(data, dict) or "format" not in data or "format_version" not in data:
        raise NotADatasetError(f"{where}: not a fastdata manifest (no 'format'/'format_version')")
    if data["format_version"] > NEWEST_FORMAT_VERSION:
        raise NotADatasetError(
            f"{where}: format version {data['format_version']} is newer than this fastdata "
            f"understands ({NEWEST_FORMAT_VERSION}); upgrade fastdata"
        )
    try:
        return Manifest.from_dict(data)
    except TypeError as exc:
        raise NotADatasetError(f"{where}: malformed manifest ({exc})") from exc
