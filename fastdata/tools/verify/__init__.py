"""`fastdata verify`: check a converted dataset against its manifest, optionally against its source tree and
by decoding every sample. Names every problem found; an empty problem list means the dataset is intact."""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fastdata.config import available_cores
from fastdata.errors import FastdataError
from fastdata.formats.manifest import (
    CHECKSUM_FIELD,
    MANIFEST_NAME,
    RECORD_TARGET_KINDS,
    Manifest,
    content_checksum,
    read_manifest,
    sha256_file,
    sha256_files,
)
from fastdata.formats.records import Label
from fastdata.loader.tuning import TUNE_FILE

if TYPE_CHECKING:
    from fastdata.image.batch import EncodedSample

# Files a dataset directory may hold beside the ones its manifest lists.
_ALLOWED_EXTRA = {MANIFEST_NAME, TUNE_FILE}  # TUNE_FILE: `fastdata tune`'s result (fastdata.loader.tuning)


@dataclass
class VerifyReport:
    """What `verify` checked and every problem it found."""

    path: Path
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        lines = [f"  problem: {p}" for p in self.problems]
        verdict = "OK" if self.ok else f"FAILED ({len(self.problems)} problem{'s' * (len(self.problems) != 1)})"
        lines.append(f"{verdict}: {self.path} — checked {', '.join(self.checked)}")
        return "\n".join(lines)


def verify(path: str | os.PathLike[str], source: str | os.PathLike[str] | None = None, decode: bool = False,
           progress: Callable[[str], None] | None = None) -> VerifyReport:
    """Check the dataset at `path`: manifest integrity, every data file's presence, size and sha256, no
    unexpected files, sample counts and labels in the data against the manifest; with `source`, the samples
    against the source they came from (an ImageFolder tree, a file list, ...: the one the manifest names, listed
    again as the conversion listed it); with `decode`, that every image decodes.

    A damaged file does not stop the check: its samples are still read (and decoded), so that the report names
    the samples the damage broke, and the other files are checked as usual."""
    root = Path(path)
    report = VerifyReport(root)
    manifest = read_manifest(root)  # not a dataset at all: raises with the reason
    _check_manifest_checksum(root, report)
    missing = _check_files(root, manifest, report, progress, decode)
    if manifest.kind == "image":
        try:
            _check_image_samples(root, manifest, report, source, decode, progress, missing)
        except FastdataError as exc:
            report.problems.append(str(exc))
    elif source is not None:
        _check_text_source(Path(source), manifest, report)
    return report


def _check_text_source(source: Path, manifest: Manifest, report: VerifyReport) -> None:
    """A text dataset against `source`: the files it lists (as `fastdata convert text` lists them) must be the
    conversion's source files, by name, size and content (the sha256 of each that the conversion recorded; a
    dataset converted before those were recorded is compared by names and sizes, and the report says so)."""
    from fastdata.converters.text import list_sources

    entries = manifest.source.get("files", [])
    recorded = [(Path(f["name"]).name, int(f["bytes"])) for f in entries]
    try:
        paths = list_sources([source])
        listed = [(path.name, path.stat().st_size) for path in paths]
    except (FastdataError, OSError) as exc:
        report.problems.append(f"cannot check against the source {source}: {exc}")
        return
    with_content = bool(entries) and all(f.get("sha256") for f in entries)
    if listed != recorded:
        def show(files: list[tuple[str, int]]) -> str:
            shown = ", ".join(f"{name} ({size:,} bytes)" for name, size in files[:4])
            return shown + (f", ... ({len(files)} files)" if len(files) > 4 else "")

        report.problems.append(f"the source {source} is not the one converted: it lists {show(listed) or 'nothing'};"
                               f" the conversion read {show(recorded) or 'nothing'}")
    elif with_content:
        changed = [str(path) for path, entry, digest in zip(paths, entries, sha256_files(paths, available_cores()),
                                                            strict=True) if digest != entry["sha256"]]
        if changed:
            report.problems.append(f"the source {source} is not the one converted: the content of "
                                   f"{len(changed)} file(s) differs from what the conversion read (sha256): "
                                   f"{', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}")
    report.checked.append(f"against the source {source} (its files' names, sizes and content)" if with_content else
                          f"against the source {source} (its files' names and sizes only: this dataset records no "
                          "digest of their content, converted by an older fastdata)")


def _check_manifest_checksum(root: Path, report: VerifyReport) -> None:
    data = json.loads((root / MANIFEST_NAME).read_text())
    saved = data.get(CHECKSUM_FIELD)
    if saved is None:
        report.problems.append(f"{MANIFEST_NAME}: has no {CHECKSUM_FIELD} (written by hand or by an old version)")
    elif saved != content_checksum(data):
        report.problems.append(f"{MANIFEST_NAME}: its content does not match its checksum (edited after the "
                               "conversion: label map, counts or file list may be wrong)")
    report.checked.append("manifest checksum")


def _check_files(root: Path, manifest: Manifest, report: VerifyReport, progress: Callable[[str], None] | None,
                 decode: bool) -> set[str]:
    """Presence, size and sha256 of every listed file, and no unlisted ones; returns the names of the missing."""
    missing = set()
    hint = "" if decode else "; --decode names the samples that no longer decode"
    listed = {entry.name for entry in manifest.files}
    # the tokenizer copied beside the data (text datasets, image-text pairs with tokens), with its recorded sha256
    beside = {section["tokenizer"]: section.get("tokenizer_sha256")
              for section in (manifest.text, manifest.pairs) if section and section.get("tokenizer")}
    # a text WebDataset's shard indexes (one `.idx` per shard), with their recorded sha256
    beside.update({entry["name"]: entry.get("sha256") for entry in (manifest.text or {}).get("index_files", [])})
    # a WebDataset image dataset's record digests, a file beside each shard (none: converted before they were kept)
    tables: dict[str, bytes] | None = None
    if manifest.format == "wds" and manifest.kind == "image":
        if manifest.record_digests is not None:
            from fastdata.formats.wds import digests_name
            from fastdata.tools.verify.records import shard_digest_tables

            tables = shard_digest_tables(root, manifest, report.problems)
            listed |= {digests_name(entry.name) for entry in manifest.files}
            report.checked.append(f"{manifest.record_digests.get('records', 0):,} samples' record digests")
        else:
            report.checked.append("no record digests (converted by an older fastdata: a damaged shard is named, not "
                                  "its samples)")
    for name, digest in beside.items():
        what = "shard index" if name.endswith(".idx") else "tokenizer"
        if not (root / name).is_file():
            report.problems.append(f"{name}: the dataset's {what} is missing")
        elif digest and sha256_file(root / name) != digest:
            report.problems.append(f"{name}: sha256 differs from the manifest's (the {what} was altered)")
    for entry in manifest.files:
        path = root / entry.name
        if not path.is_file():
            report.problems.append(f"{entry.name}: listed in the manifest but missing")
            missing.add(entry.name)
            continue
        size = path.stat().st_size
        by_record = not entry.sha256 and manifest.record_digests is not None  # a digest per record
        if tables is not None and entry.name in tables:
            hint = ""  # the damaged samples are named below
        if size != entry.bytes:
            report.problems.append(f"{entry.name}: {size:,} bytes, the manifest says {entry.bytes:,}"
                                   f"{'' if by_record else hint}")
            if tables is not None and entry.name in tables:
                _name_damaged_samples(path, tables[entry.name], report)
            if not by_record:
                continue
        if by_record:  # checked on every core, each damaged record named
            from fastdata.tools.verify.records import check_records

            records = check_records(root, manifest, report.problems, progress)
            report.checked.append(f"{entry.name}: {records:,} records against their digests")
            continue
        if progress:
            progress(f"hashing {entry.name}")
        if sha256_file(path) != entry.sha256:
            report.problems.append(f"{entry.name}: sha256 differs from the manifest (the file was altered{hint})")
            if tables is not None and entry.name in tables:
                _name_damaged_samples(path, tables[entry.name], report)
    for name in sorted(os.listdir(root)):
        if name not in listed and name not in _ALLOWED_EXTRA and name not in beside and not (root / name).is_dir():
            report.problems.append(f"{name}: not part of the dataset (not in the manifest)")
    if sum(entry.samples for entry in manifest.files) != manifest.num_samples:
        report.problems.append(f"{MANIFEST_NAME}: files hold {sum(e.samples for e in manifest.files):,} samples, "
                               f"num_samples says {manifest.num_samples:,}")
    report.checked.append(f"{len(manifest.files)} file(s): presence, size, sha256")
    return missing


def _name_damaged_samples(path: Path, table: bytes, report: VerifyReport) -> None:
    """A damaged shard's samples against their record digests: each damaged one named (shard and key)."""
    from fastdata.tools.verify.records import damaged_samples

    found = damaged_samples(path, table)
    report.problems += found or [f"{path.name}: every sample matches its record digest: the damage is in the tar "
                                 "file's own blocks (its end)"]


def _check_image_samples(root: Path, manifest: Manifest, report: VerifyReport, source: str | os.PathLike | None,
                         decode: bool, progress: Callable[[str], None] | None, missing: set[str]) -> None:
    from fastdata.image.targets.captions import Caption
    from fastdata.loader import dataset

    single = manifest.label_kind == "single"  # a multi-label sample counts once for each of its classes
    if (single and sum(manifest.class_counts) != manifest.num_samples) or len(manifest.class_counts) != len(
            manifest.classes):
        report.problems.append(f"{MANIFEST_NAME}: class_counts do not add up to num_samples / the class list")
    ds = dataset(root)
    relisted = _Relisting(Path(source), manifest) if source is not None else None  # listed once, if at all
    restart = _restart_check(manifest, relisted) if decode else None
    keys: list[str] = []
    labels: list[Label] = []
    with_metadata = source is not None and bool(manifest.metadata_fields)
    metadata: dict[str, dict] = {}  # key -> stored metadata, to compare with the source's
    captions: dict[str, tuple] = {}  # image-text pairs: key -> (caption, token ids), to compare with the source's
    with_targets = source is not None and manifest.target_kind in RECORD_TARGET_KINDS
    targets: dict[str, bytes | None] = {}  # key -> stored target record, to compare with the source's
    undecodable = 0
    complete = True  # every sample of every file was read
    for file_id, entry in enumerate(manifest.files):
        if entry.name in missing:
            complete = False
            continue
        read = 0
        for sample in _file_samples(ds, file_id, entry.name, with_metadata, with_targets):
            if isinstance(sample, str):  # a sample (LMDB) or the rest of the file (WDS) could not be read
                complete = False
                report.problems.append(sample)
                continue
            read += 1
            keys.append(sample.key)
            if isinstance(sample.label, Caption):  # image-text pairs: one class, and the caption
                ids = sample.label.ids
                captions[sample.key] = (sample.label.text, None if ids is None else ids.tolist())
                labels.append(0)
            else:
                labels.append(sample.label)
            if with_metadata:
                metadata[sample.key] = sample.metadata or {}
            if with_targets:
                targets[sample.key] = sample.target
            if decode:
                image = _decodes(ds, sample, report)
                if image is None:
                    undecodable += 1
                elif restart is not None:
                    restart.check(sample, image)
            if progress and len(labels) % 10000 == 0:
                progress(f"checked {len(labels):,} samples")
        if complete and read != entry.samples:
            report.problems.append(f"{entry.name}: holds {read:,} samples, the manifest says {entry.samples:,}")
    if complete:
        _check_labels(manifest, labels, report)
        report.checked.append(f"{len(labels):,} samples' labels and counts")
    else:
        report.checked.append(f"the {len(labels):,} readable samples (labels and counts not compared: some data "
                              "could not be read)")
    if decode:
        report.checked.append(f"decoded every readable sample ({undecodable} failed)")
    if restart is not None:
        problems, checked = restart.finish(complete)
        report.problems += problems
        report.checked.append(checked)
    if relisted is not None:  # a source was given
        _check_against_source(relisted, manifest, dict(zip(keys, labels, strict=True)), report,
                              metadata if with_metadata else None, captions, targets if with_targets else None)


def _file_samples(ds: Any, file_id: int, name: str, with_metadata: bool = False, with_targets: bool = False
                  ) -> Iterator[EncodedSample | str]:
    """The stored samples of one data file, in order; a problem string (naming the file and what failed) in
    place of what cannot be read: one LMDB sample, or the rest of a WebDataset shard. `with_metadata` /
    `with_targets`: LMDB samples carry their stored metadata / target record too (WebDataset samples always do)."""
    if not hasattr(ds, "encoded"):  # WebDataset: a damaged tar member ends the shard
        read = 0
        try:
            for sample in ds.encoded_samples([file_id]):
                read += 1
                yield sample
        except (FastdataError, OSError, EOFError, tarfile.TarError) as exc:
            yield f"{name}: unreadable after its first {read:,} samples ({exc})"
        return
    import lmdb

    for index in range(len(ds)):  # LMDB: one damaged record does not hide the others
        try:
            sample = ds.encoded(index)
            if with_metadata:
                sample.metadata = ds.reader.metadata(index)
            if with_targets:
                sample.target = ds.reader.target(index)
            yield sample
        except (FastdataError, lmdb.Error, ValueError) as exc:
            yield f"{name}: sample #{index} unreadable ({type(exc).__name__}: {exc})"


class _Relisting:
    """The source a dataset was converted from, listed again as its conversion listed it (by the converter the
    manifest names: its `relist`), once for the whole verify: what listing it says (a note about the source) is
    said once."""

    def __init__(self, source: Path, manifest: Manifest) -> None:
        self.source, self.manifest = source, manifest
        self._listing: Any = None

    @property
    def kind(self) -> str:
        return self.manifest.source.get("kind", "imagefolder")

    @property
    def possible(self) -> bool:
        """Whether this fastdata can list a source of this kind again."""
        from fastdata.converters import REGISTRY, load

        return self.kind in REGISTRY and getattr(load(self.kind), "relist", None) is not None

    def get(self) -> Any:
        """The listing (an ImageSource); the converter's errors (FastdataError) as it raises them."""
        if self._listing is None:
            from fastdata.converters import load

            self._listing = load(self.kind).relist(self.source, self.manifest)
        return self._listing


def _restart_check(manifest: Manifest, relisted: _Relisting | None) -> Any:
    """The JPEG-layout checks of `--decode` (`fastdata.tools.verify.layout`: restart or baseline), comparing pixels
    with the source files when the source is given and the conversion stored them unchanged but for the rewrite (no
    --max-size); None for the original layout."""
    from fastdata.tools.verify.layout import layout_check

    check = layout_check(manifest)
    if check is None:
        return None
    reader = None
    if relisted is not None and manifest.options.get("max_size") is None and relisted.possible:
        try:
            reader = relisted.get().sample_reader
        except FastdataError:
            reader = None  # the source check reports why the source cannot be listed
    return check(manifest, reader)


def _decodes(ds: Any, sample: EncodedSample, report: VerifyReport) -> Any:
    """`sample`'s whole decode when it decodes to its stored size, else None (a problem naming the sample is
    reported)."""
    try:
        image = ds.pipeline.process(sample, 0)
        if image.shape[:2] != (sample.height, sample.width):
            where = f" in {sample.origin}" if sample.origin else ""
            raise FastdataError(f"sample {sample.key!r}{where} decodes to {image.shape[1]}x{image.shape[0]}, "
                                f"its stored size says {sample.width}x{sample.height}")
    except FastdataError as exc:  # the message names the sample and its file
        report.problems.append(f"undecodable: {exc}")
        return None
    return image


def _check_labels(manifest: Manifest, labels: list[Label], report: VerifyReport) -> None:
    """Sample count, class ids in range, and per-class counts (a multi-label sample counts once for each class it
    holds) against the manifest."""
    ids = np.asarray([i for label in labels for i in (label if isinstance(label, tuple) else (label,))], np.int64)
    if len(labels) != manifest.num_samples:
        report.problems.append(f"data holds {len(labels):,} samples, the manifest says {manifest.num_samples:,}")
    if len(ids) and (ids.min() < 0 or ids.max() >= len(manifest.classes)):
        report.problems.append(f"labels outside 0..{len(manifest.classes) - 1} in the data")
    elif np.bincount(ids, minlength=len(manifest.classes)).tolist() != list(manifest.class_counts):
        report.problems.append("per-class sample counts in the data differ from the manifest's class_counts")


def _check_against_source(relisted: _Relisting, manifest: Manifest, stored: dict[str, Label], report: VerifyReport,
                          metadata: dict[str, dict] | None = None, captions: dict[str, tuple] | None = None,
                          targets: dict[str, bytes | None] | None = None) -> None:
    """The dataset's samples, labels (and `metadata`, `captions` and `targets`, when given) against its source,
    listed again as the conversion listed it (`relisted`)."""
    if not relisted.possible:
        report.problems.append(f"cannot check against the source: this fastdata cannot list a {relisted.kind!r} "
                               "source again")
        return
    src = relisted.source
    listing = relisted.get()
    if listing.classes != manifest.classes:
        report.problems.append(f"class list differs from the source's ({len(listing.classes)} classes there, "
                               f"{len(manifest.classes)} in the manifest)")
    rejected = {r["path"] for r in manifest.rejected}
    missing = [p for p, _ in listing.samples if p not in stored and p not in rejected]
    wrong = [p for p, label in listing.samples if p in stored and stored[p] != label]
    extra = sorted(set(stored) - {p for p, _ in listing.samples})
    changed = []
    if metadata is not None:
        changed = [p for i, (p, _) in enumerate(listing.samples)
                   if p in metadata and metadata[p] != (listing.metadata[i] if listing.metadata else {})]
    recaptioned = []
    if captions and listing.captions is not None:
        tokens = listing.caption_tokens
        recaptioned = [p for i, (p, _) in enumerate(listing.samples) if p in captions and captions[p] != (
            listing.captions[i], None if tokens is None else tokens[i].tolist())]
    other_targets = []
    if targets is not None and listing.targets is not None:
        other_targets = [p for i, (p, _) in enumerate(listing.samples)
                         if p in targets and targets[p] != _source_target(listing.targets, i)]
    what_targets = "label maps" if manifest.target_kind == "segmentation" else "boxes, labels, masks, ..."
    for what, paths in (("in the source but not in the dataset", missing), ("labelled differently", wrong),
                        ("in the dataset but not in the source", extra), ("with other metadata", changed),
                        ("with another caption or other token ids", recaptioned),
                        (f"with other targets ({what_targets})", other_targets)):
        if paths:
            report.problems.append(f"{len(paths)} sample(s) {what}: {', '.join(paths[:5])}"
                                   + (" ..." if len(paths) > 5 else ""))
    report.checked.append(f"against the source {src}")


def _source_target(targets: Any, index: int) -> bytes | None:
    """The source's target record of sample `index`, as the conversion would store it (None when it no longer can
    be: the stored one then differs)."""
    try:
        return targets.record(index)
    except (OSError, ValueError):
        return None
