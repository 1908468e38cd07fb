"""What a converter (`fastdata.converters.<kind>`) hands the image conversion driver (`fastdata.convert.images`):
the listing of a source, `ImageSource`, and where each sample's bytes come from, its `SampleReader`.

A new source kind lists its samples once, in their order, and says where their bytes are:

- `ImageSource(kind, root, classes, samples)`: `samples` is `[(key, label), ...]`. The key names the sample in the
  dataset (unique; for files, the path relative to `root` with '/' separators). The label is a class id (`int`,
  `label_kind="single"`), or for a multi-label source (`label_kind="multi"`) the sorted tuple of the class ids the
  sample holds (possibly empty). Class ids index `classes`.
- `reader`: where the bytes of a sample come from. Default `FileReader(root)`: the file `root/key`, read whole (the
  ImageFolder path). A source whose samples are not files (rows of parquet files, members of tar shards) gives its
  own `SampleReader`: a module-level class, pickled once into each conversion worker process (local or Ray; never
  once per sample, so it may hold a table of where each key is), that may open handles lazily and keep them for the
  process (drop them in `__getstate__`).
- `metadata` (optional): one dict per sample, in `samples`' order, of JSON scalars (str, int, float, bool, None):
  the source's other columns (a list, or any sequence that makes each dict when asked, with a `fields` attribute
  naming the keys). Stored with each sample (JSON, never pickle), returned by
  `fastdata.dataset(OUT, metadata=True)`; not read by the loader.
- `origin` (optional): `origin(index) -> dict` of JSON scalars added to a rejected sample's manifest entry, to find
  it in the source (`{"list": "train.csv", "row": 17}`; `fastdata.formats.manifest.rejected_place` prints it).
- `captions` (optional): image-text pairs (`fastdata.converters.pairs`): one caption (text) per sample, in
  `samples`' order, stored with its image; with `caption_tokens` (each caption's token ids, a uint16/uint32 array)
  stored as well, `pairs` (the manifest's `pairs` section: the tokens' dtype and padding, ...) and `files` (name ->
  bytes written beside the data, e.g. the tokenizer). The labels of a pair source are all class 0 of one class.
- `targets` (optional): per-sample targets beyond the label (detection boxes and masks, segmentation label maps:
  `fastdata.convert.masks`), a `TargetSource`: the driver stores `targets.record(index)` with each sample it keeps
  (`fastdata.formats.targets`, `fastdata.formats.masks`), after checking that the image decodes to the size the
  targets refer to (a sample that does not, or whose `size`/`record` raises OSError or ValueError, is rejected,
  named with that reason); its `digest()` joins the resume fingerprint and its `info()` the manifest
  (`target_kind`, `targets`). A TargetSource that counts what it stores (for `info()`) may also have
  `state() -> dict` (JSON, kept with each checkpoint) and `restore(state)` (called on a resumption); as records
  are made in the conversion workers, such a source makes them with `noted_record(index) -> (record, note)` and
  the writer process counts the note with `observe(note)`.
- `details` (optional): more facts for the manifest's `source` block (what `verify --source` needs to list the
  source again the same way, say).

The driver verifies every sample by decoding it, rejects (and names) those whose bytes cannot be read or decoded,
and fingerprints the listing and the reader's `digest` so that an interrupted conversion resumes only over the same
source.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fastdata.convert.checkpoints import files_digest
from fastdata.errors import SourceError
from fastdata.formats.records import LABEL_KINDS, Label

#: the one class of a source whose samples carry no label (a segmentation list without a label column, shards
#: without label members, image-text pairs)
NO_LABEL_CLASS = "unlabelled"


class SampleReader(Protocol):
    """Where the bytes of a source's samples come from (see the module docstring)."""

    def read(self, key: str) -> bytes:
        """The bytes of sample `key`, whole; OSError when they cannot be read (the sample is then rejected with
        the error's reason, the same on every run)."""
        ...

    def locate(self, key: str) -> str:
        """Where sample `key`'s bytes are, for messages (a file's path; a shard and member ...)."""
        ...

    def describe(self) -> str:
        """Where the bytes come from, in one line (the manifest's source path; part of the resume fingerprint)."""
        ...

    def digest(self, keys: Sequence[str]) -> str:
        """A digest that changes whenever the bytes behind `keys` may have changed (e.g. the sizes and mtimes of
        the files they are read from); part of the resume fingerprint, so it must not read the bytes themselves."""
        ...


class FileReader:
    """Samples that are files: the bytes of `key` are the file `root/key` (ImageFolder trees, file lists)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def locate(self, key: str) -> str:
        return str(self.root / key)

    def describe(self) -> str:
        return str(self.root.resolve())

    def digest(self, keys: Sequence[str]) -> str:
        """sha256 over each file's name, size and mtime (a missing file counts as size and mtime -1)."""
        root = str(self.root)  # joined as strings: a Path per file costs more than its stat
        return files_digest((key, os.path.join(root, key)) for key in keys)


class TargetSource(Protocol):
    """A source's per-sample targets (see the module docstring), indexed like `ImageSource.samples`."""

    kind: str  # the manifest's target_kind ("detection", "segmentation")

    def record(self, index: int) -> bytes:
        """Sample `index`'s target record, as stored (`fastdata.formats.targets`)."""
        ...

    def size(self, index: int) -> tuple[int, int]:
        """(width, height): the image size sample `index`'s targets refer to."""
        ...

    def digest(self) -> str:
        """A digest that changes whenever any target may have changed (part of the resume fingerprint)."""
        ...

    def info(self) -> dict[str, Any]:
        """The manifest's `targets` block."""
        ...


@runtime_checkable
class CountingTargets(TargetSource, Protocol):
    """A TargetSource that counts what it stores, for `info()` (see the module docstring): each record made in a
    worker comes with a note that the writer process counts, and the count is kept with each checkpoint."""

    def noted_record(self, index: int) -> tuple[bytes, Any]:
        """Sample `index`'s target record and its note for `observe`."""
        ...

    def observe(self, note: Any) -> None:
        """Count the note of a stored record (in the writer process)."""
        ...

    def state(self) -> dict[str, Any]:
        """The count so far, as JSON kept with each checkpoint."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Continue counting from a checkpoint's `state`."""
        ...


@dataclass
class ImageSource:
    """What a converter hands the driver: the samples to store, in their order, with their labels, where their
    bytes come from, and what the summary and manifest say about the source (see the module docstring)."""

    kind: str  # the converter's name, recorded in the manifest ("imagefolder", "list", ...)
    root: Path  # what keys are relative to (and where FileReader reads them)
    classes: list[str]
    samples: Sequence[tuple[str, Label]]  # (key, class id or tuple of class ids)
    ignored: list[str] = field(default_factory=list)  # files the listing left out (not images)
    empty_classes: list[str] = field(default_factory=list)
    reader: SampleReader | None = None  # None: FileReader(root)
    label_kind: str = "single"  # "single" (int labels) or "multi" (tuples of class ids)
    metadata: Sequence[dict[str, Any]] | None = None  # per sample, in `samples`' order
    origin: Callable[[int], dict[str, Any]] | None = None  # sample index -> where it is in the source
    details: dict[str, Any] = field(default_factory=dict)  # more facts for the manifest's source block
    captions: Sequence[str] | None = None  # image-text pairs: per sample, in `samples`' order
    caption_tokens: Sequence[Any] | None = None  # with a tokenizer: each caption's token ids
    pairs: dict[str, Any] | None = None  # image-text pairs: the manifest's `pairs` section
    files: dict[str, bytes] = field(default_factory=dict)  # written beside the data (a pair source's tokenizer)
    targets: TargetSource | None = None  # per-sample targets (detection), in `samples`' order
    # the converter finds its samples by walking `root` (ImageFolder: every image file under it is a sample): an
    # output inside it would be taken in as data by the next conversion of it, so it is refused. A source that names
    # its files (a list, pairs, COCO annotations, Hugging Face tables, shards) reads nothing else from their folders:
    # an output may sit beside the list or inside the folder the images are read from
    walks_root: bool = False

    def __post_init__(self) -> None:
        if self.reader is None:
            self.reader = FileReader(self.root)
        self._check_labels()
        for name, rows in (("metadata", self.metadata), ("caption", self.captions),
                           ("caption token", self.caption_tokens)):
            if rows is not None and len(rows) != len(self.samples):
                raise SourceError(f"{self.kind} source: {len(rows)} {name} rows for {len(self.samples)} samples")

    def looked(self) -> str:
        """Where the samples' bytes were looked for, for messages: the absolute folder their paths are read
        relative to (a source whose reader is not a folder names itself)."""
        if isinstance(self.reader, FileReader):
            return f"for files under {Path(self.root).resolve()}"
        return f"in the {self.kind} source {self.root}"

    def _check_labels(self) -> None:
        """Every label is of the source's kind and names a class (a converter bug otherwise, named here rather
        than found in the middle of a conversion)."""
        if self.label_kind not in LABEL_KINDS:
            raise SourceError(f"{self.kind} source: label kind {self.label_kind!r} is none of {LABEL_KINDS}")
        count, multi = len(self.classes), self.label_kind == "multi"
        labels = [label for _, label in self.samples]
        if not multi and all(type(label) is int for label in labels) and (
                not labels or (min(labels) >= 0 and max(labels) < count)):  # type: ignore[operator]  # all int
            return  # the common case, checked at a fraction of the cost of the loop below
        for key, label in self.samples:
            ids = label if multi and isinstance(label, tuple) else (label,)
            if (multi != isinstance(label, tuple) or not all(isinstance(i, int) and 0 <= i < count for i in ids)):
                raise SourceError(f"{self.kind} source: sample {key!r} has label {label!r}, which is not "
                                  f"{'a tuple of class ids' if multi else 'a class id'} in 0..{count - 1}")

    @property
    def sample_reader(self) -> SampleReader:
        assert self.reader is not None  # set by __post_init__
        return self.reader

    def origin_of(self, index: int) -> dict[str, Any]:
        """Where sample `index` is in the source, for its rejection entry ({} when its key says it all)."""
        return self.origin(index) if self.origin is not None else {}

    @property
    def target_kind(self) -> str:
        """"pairs" for a source of image-text pairs, its targets' kind ("detection") for one with targets, "class"
        for labelled images (`fastdata.formats.manifest`)."""
        if self.captions is not None:
            return "pairs"
        return "class" if self.targets is None else self.targets.kind

    def metadata_fields(self) -> list[str]:
        """The keys the samples' metadata holds, in the order first met."""
        if self.metadata is None:
            return []
        fields = getattr(self.metadata, "fields", None)  # a column store knows its names without a pass
        if fields is not None:
            return list(fields)
        return list(dict.fromkeys(name for row in self.metadata for name in row))

    def fingerprint(self) -> dict[str, Any]:
        """The resume fingerprint's `source` block: changes when the listing (keys, labels, metadata, targets) or the
        bytes behind it (the reader's digest) may have changed."""
        digest = hashlib.sha256(self.sample_reader.digest([key for key, _ in self.samples]).encode())
        for index, (key, label) in enumerate(self.samples):
            extra = f"\t{sorted(self.metadata[index].items())!r}" if self.metadata is not None else ""
            if self.captions is not None:
                extra += f"\t{self.captions[index]!r}"
            digest.update(f"{key}\t{label!r}{extra}\n".encode("utf-8", "surrogateescape"))  # keys: file names
        if self.pairs is not None:  # how the captions are stored (the tokenizer's digest, ...)
            digest.update(repr(sorted(self.pairs.items())).encode())
        if self.targets is not None:  # only then: a conversion without targets resumes as before
            digest.update(f"targets\t{self.targets.digest()}\n".encode())
        return {"path": self.sample_reader.describe(), "files": len(self.samples), "classes": len(self.classes),
                "digest": digest.hexdigest()}

    def info(self) -> dict[str, Any]:
        """The manifest's `source` block."""
        return {"kind": self.kind, "path": self.sample_reader.describe(), "files": len(self.samples),
                "ignored": len(self.ignored), "ignored_examples": self.ignored[:20],
                "empty_classes": self.empty_classes, **self.details}


def labels_of(parts: Sequence[Sequence[Any]], multi: bool, class_count: int | None = None
              ) -> tuple[list[str], list[Label]]:
    """Class names and labels from each sample's label parts (checked by the converter first): class names (strings)
    give the sorted unique names as classes (as ImageFolder sorts its folders), integer class ids (`class_count`
    given, every id below it) the classes "0".."class_count - 1". A multi-label sample's label is the sorted tuple of
    its distinct ids; a single-label sample's, its one id."""
    if class_count is None:
        classes = sorted({part for row in parts for part in row})
        index = {name: i for i, name in enumerate(classes)}
        parts = [[index[part] for part in row] for row in parts]
    else:
        classes = [str(i) for i in range(class_count)]
    return classes, [tuple(sorted(set(row))) if multi else row[0] for row in parts]
