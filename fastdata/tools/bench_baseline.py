"""The torchvision baseline of `fastdata bench`, reading what fastdata reads: an ImageFolder over the source tree,
or for a dataset converted from a file list (`fastdata convert list`), a torchvision-style Dataset over the images
the list names (PIL decode, the same transform; multi-label targets as multi-hot float32 rows).

A dataset stored as its source's own bytes is compared with the source, less the files the conversion rejected
(the manifest lists them; torchvision would crash on them). A dataset whose images were re-encoded at conversion
(`--max-size`) is compared by default with its stored bytes exported as files: an ImageFolder
(`EXPORT/<class>/<path>`) for an ImageFolder source, numbered files with their labels for a list, so that both
loaders decode the same bytes. Comparing with the original source instead is explicit (`baseline_source=True`) and
marked as "different inputs".
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, cast

from fastdata.errors import ConfigError, NotADatasetError
from fastdata.formats.manifest import MANIFEST_NAME, Manifest, content_checksum, read_manifest
from fastdata.formats.records import EXT_OF_FORMAT, Label

if TYPE_CHECKING:
    from fastdata.image.batch import EncodedSample
    from fastdata.tools.bench_fair import BenchConfig

#: manifest options that make the stored bytes differ from the source's (each with its "off" value)
REENCODING_OPTIONS = {"max_size": None}
EXPORT_MARKER = ".fastdata-export.json"
_SAME_EXT = {"jpeg": "jpg", "tif": "tiff", "pgm": "ppm"}


def reencoding(manifest: Manifest) -> dict[str, Any]:
    """The conversion options recorded in the manifest that re-encoded images (empty: stored as in the source)."""
    return {name: manifest.options[name] for name, off in REENCODING_OPTIONS.items()
            if manifest.options.get(name, off) != off}


@dataclass
class Baseline:
    """What the baseline reads: an ImageFolder root, less `excluded` files, and how it relates to the dataset."""

    root: Path
    inputs: str  # one line: what the baseline reads, against what fastdata reads
    different_inputs: bool = False
    excluded: list[dict[str, str]] = field(default_factory=list)  # {"path", "reason"}: rejected by the conversion
    files: list[Path] = field(default_factory=list)  # every image file the baseline reads
    # a list dataset's baseline: (image file, label) of every sample, read by a Dataset over them (None: `root` is an
    # ImageFolder); labels as the dataset's (`label_kind`, over `num_classes` classes)
    samples: list[tuple[Path, Label]] | None = None
    num_classes: int = 0
    label_kind: str = "single"

    @property
    def excluded_paths(self) -> frozenset[str]:
        return frozenset(item["path"] for item in self.excluded)

    def notes(self) -> list[str]:
        """What a reader of the table must know about the baseline's inputs, one line each."""
        lines = [f"baseline inputs{' (DIFFERENT INPUTS)' if self.different_inputs else ''}: {self.inputs}"]
        if self.excluded:
            shown = "; ".join(f"{item['path']} ({item['reason']})" for item in self.excluded[:3])
            more = f"; ... and {len(self.excluded) - 3} more" if len(self.excluded) > 3 else ""
            lines.append(f"baseline: {len(self.excluded):,} file(s) of {self.root} left out because the conversion "
                         f"rejected them (listed in the dataset's {MANIFEST_NAME}): {shown}{more}")
        return lines


def choose_baseline(dataset: Path, src: Path, baseline_source: bool = False, export_dir: Path | None = None,
                    progress: Callable[[str], None] | None = None) -> Baseline:
    """The baseline for `dataset` given its source tree `src`: the source (less rejected files) when the stored
    bytes are the source's own or when `baseline_source` asks for it, else an ImageFolder exported from the
    dataset into `export_dir` (which must be given: the caller owns it, e.g. a temporary directory)."""
    manifest = read_manifest(dataset)
    changed = reencoding(manifest)
    if manifest.source.get("kind") == "list":
        return _list_baseline(Path(dataset), Path(src), manifest, changed, baseline_source, export_dir, progress)
    if not changed or baseline_source:
        baseline = source_baseline(src, manifest)
        if changed:
            baseline.different_inputs = True
            baseline.inputs = (f"the original files of {src}, while fastdata reads the dataset's re-encoded "
                               f"copies ({_options_text(changed)}): the ratios compare inputs as well as loaders")
        return baseline
    if export_dir is None:
        raise ConfigError(f"{dataset} was re-encoded at conversion ({_options_text(changed)}): the baseline reads an "
                          "ImageFolder exported from it, and needs a directory to export into")
    if progress:
        progress(f"bench: {dataset} was re-encoded at conversion ({_options_text(changed)}); exporting its stored "
                 f"bytes as an ImageFolder into {export_dir} for the baseline")
    files = export_imagefolder(dataset, export_dir)
    return Baseline(export_dir, f"an ImageFolder exported from {dataset}: the same stored bytes fastdata reads "
                                f"(the dataset was re-encoded at conversion: {_options_text(changed)}; "
                                f"--baseline-source compares with the original files in {src} instead)",
                    files=files)


def _list_baseline(dataset: Path, src: Path, manifest: Manifest, changed: dict[str, Any], baseline_source: bool,
                   export_dir: Path | None, progress: Callable[[str], None] | None) -> Baseline:
    """The baseline of a dataset converted from the file list `src`: the images the list names (less the rejected
    ones), or the dataset's stored bytes exported as numbered files when it was re-encoded."""
    facts: dict[str, Any] = {"num_classes": len(manifest.classes), "label_kind": manifest.label_kind}
    if changed and not baseline_source:
        if export_dir is None:
            raise ConfigError(f"{dataset} was re-encoded at conversion ({_options_text(changed)}): the baseline reads "
                              "its stored bytes exported as files, and needs a directory to export into")
        return export_baseline(dataset, export_dir, progress,
                               why=f"the dataset was re-encoded at conversion: {_options_text(changed)}; "
                                   f"--baseline-source compares with the images {src} names instead")
    from fastdata.converters.filelist import relist

    listing = relist(src, manifest)
    if listing.classes != manifest.classes:
        raise ConfigError(f"{src}: its classes ({len(listing.classes)}) are not the dataset's "
                          f"({len(manifest.classes)}); pass the list the dataset was converted from")
    rejected = {item["path"]: item["reason"] for item in manifest.rejected}
    excluded = [{"path": key, "reason": rejected[key]} for key, _ in listing.samples if key in rejected]
    samples = [(listing.root / key, label) for key, label in listing.samples if key not in rejected]
    baseline = Baseline(listing.root, f"the images the list {src} names, the bytes the dataset stores",
                        excluded=excluded, files=[path for path, _ in samples], samples=samples, **facts)
    if changed:
        baseline.different_inputs = True
        baseline.inputs = (f"the original images {src} names, while fastdata reads the dataset's re-encoded copies "
                           f"({_options_text(changed)}): the ratios compare inputs as well as loaders")
    return baseline


def export_baseline(dataset: Path, export_dir: Path, progress: Callable[[str], None] | None = None,
                    why: str = "") -> Baseline:
    """The baseline of a dataset whose source is not files torchvision reads (a Hugging Face dataset, WebDataset
    shards), or of a re-encoded list dataset: a torchvision-style Dataset over its stored bytes exported as files
    into `export_dir` (`export_samples`), so that both loaders decode the same bytes with the same labels."""
    manifest = read_manifest(dataset)
    if manifest.kind != "image":
        raise NotADatasetError(f"{dataset}: holds a {manifest.kind!r} dataset; only images have a torchvision "
                               "baseline")
    _refuse_pairs(dataset, manifest)
    if progress:
        progress(f"bench: exporting the stored bytes of {dataset} into {export_dir} for the baseline")
    samples = export_samples(dataset, export_dir)
    return Baseline(Path(export_dir), f"the stored bytes of {dataset} exported as files: the same bytes fastdata "
                                      f"reads{f' ({why})' if why else ''}",
                    files=[path for path, _ in samples], samples=samples, num_classes=len(manifest.classes),
                    label_kind=manifest.label_kind)


def _refuse_pairs(dataset: str | os.PathLike[str], manifest: Manifest) -> None:
    """A baseline reads (image, label) samples; image-text pairs carry captions instead."""
    if manifest.target_kind == "pairs":
        raise ConfigError(f"{dataset}: image-text pairs carry captions, not labels, and a torchvision baseline reads "
                          "(image, label) samples; bench it without a baseline")


def export_samples(dataset: str | os.PathLike[str], out: str | os.PathLike[str]) -> list[tuple[Path, Label]]:
    """Write every stored sample's bytes, unchanged, to `out/<number>.<ext>` (numbered in stored order) and return
    each file with its label; the labels are kept in the marker written last, so that an export of the same
    dataset already at `out` is reused. Built beside `out` and renamed into place when complete."""
    from fastdata.loader import dataset as open_dataset

    root, out = Path(dataset), Path(out)
    manifest = read_manifest(root)
    _refuse_pairs(root, manifest)
    stamp = {"dataset": str(root.resolve()), "manifest": content_checksum(manifest.to_dict()),
             "samples": manifest.num_samples}
    try:
        saved = json.loads((out / EXPORT_MARKER).read_text())
        if {k: saved.get(k) for k in stamp} == stamp:
            return [(out / name, tuple(label) if isinstance(label, list) else label)
                    for name, label in saved["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not an export of {root}; give an empty or new --export-dir")
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    files: list[tuple[str, Label]] = []
    for number, sample in enumerate(_stored_samples(open_dataset(root))):
        name = f"{number:08d}.{_stored_ext(sample.data, sample.key)}"
        (partial / name).write_bytes(sample.data)
        files.append((name, cast(Label, sample.label)))  # not a caption: pairs are refused above
    marker = {**stamp, "files": [[name, list(label) if isinstance(label, tuple) else label] for name, label in files]}
    (partial / EXPORT_MARKER).write_text(json.dumps(marker) + "\n")  # last: its presence means complete
    if out.exists():
        out.rmdir()
    os.replace(partial, out)
    return [(out / name, label) for name, label in files]


def _options_text(options: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in options.items())


def source_baseline(src: Path, manifest: Manifest) -> Baseline:
    """The source tree as torchvision's ImageFolder lists it, less the files the manifest lists as rejected."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    src = Path(src)
    if not src.is_dir():
        raise ConfigError(f"{src}: the baseline's ImageFolder does not exist or is not a folder")
    classes, class_to_idx = find_classes(str(src))
    if classes != manifest.classes:
        raise ConfigError(f"{src}: its classes ({len(classes)}) are not the dataset's ({len(manifest.classes)}); "
                          "pass the tree the dataset was converted from")
    rejected = {item["path"]: item["reason"] for item in manifest.rejected}
    listed = make_dataset(str(src), class_to_idx, extensions=IMG_EXTENSIONS, allow_empty=True)
    excluded, files = [], []
    for path, _label in listed:
        relative = Path(path).relative_to(src).as_posix()
        if relative in rejected:
            excluded.append({"path": relative, "reason": rejected[relative]})
        else:
            files.append(Path(path))
    return Baseline(src, f"the source files in {src}, the bytes the dataset stores", excluded=excluded, files=files)


def export_imagefolder(dataset: str | os.PathLike[str], out: str | os.PathLike[str]) -> list[Path]:
    """Write every stored sample's bytes, unchanged, to `out/<class>/<path>` (the key's path inside its class
    folder, with the stored format's extension added when the key's differs), so that torchvision's
    ImageFolder reads the bytes fastdata reads, with the same labels. Every class folder is made, empty ones
    included. Built beside `out` and renamed into place when complete; an export of the same dataset already
    at `out` is reused. Returns the image files."""
    from fastdata.loader import dataset as open_dataset

    root, out = Path(dataset), Path(out)
    manifest = read_manifest(root)
    if manifest.kind != "image":
        raise NotADatasetError(f"{root}: holds a {manifest.kind!r} dataset; only images export as an ImageFolder")
    if manifest.label_kind != "single":
        raise ConfigError(f"{root}: a multi-label dataset has no one class folder per sample; it does not export as "
                          "an ImageFolder")
    _refuse_pairs(root, manifest)
    stamp = {"dataset": str(root.resolve()), "manifest": content_checksum(manifest.to_dict()),
             "samples": manifest.num_samples}
    if _is_export_of(out, stamp):
        return sorted(p for p in out.rglob("*") if p.is_file() and p.name != EXPORT_MARKER)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out}: exists and is not an export of {root}; give an empty or new --export-dir")
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    for name in manifest.classes:
        (partial / name).mkdir(parents=True, exist_ok=True)
    written: dict[Path, str] = {}
    for sample in _stored_samples(open_dataset(root)):
        label = cast(int, sample.label)  # single-label, not pairs (checked above)
        target = partial.joinpath(export_path(sample.key, manifest.classes[label],
                                              _stored_ext(sample.data, sample.key)))
        if target in written:
            raise ConfigError(f"{root}: samples {written[target]!r} and {sample.key!r} would both be exported as "
                              f"{target.relative_to(partial)}")
        written[target] = sample.key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(sample.data)
    (partial / EXPORT_MARKER).write_text(json.dumps(stamp) + "\n")  # last: its presence means complete
    if out.exists():
        out.rmdir()
    os.replace(partial, out)
    return sorted(out / target.relative_to(partial) for target in written)


def _is_export_of(out: Path, stamp: dict[str, Any]) -> bool:
    try:
        return json.loads((out / EXPORT_MARKER).read_text()) == stamp
    except (OSError, ValueError):
        return False


def _stored_samples(ds: Any) -> Iterator[EncodedSample]:
    if hasattr(ds, "encoded"):  # LMDB
        return (ds.encoded(i) for i in range(len(ds)))
    return ds.encoded_samples(list(range(len(ds.shards))))


def export_path(key: str, class_name: str, ext: str) -> PurePosixPath:
    """Where sample `key` (a source-relative path) goes in an exported ImageFolder: `<class>/<rest of the key>`,
    with `.<ext>` appended when the key's own extension does not name the stored format."""
    parts = PurePosixPath(key.replace("\\", "/")).parts
    if not parts or key.startswith("/") or ".." in parts:
        raise ConfigError(f"sample key {key!r} is not a relative path; it cannot name an exported file")
    inner = parts[1:] if len(parts) > 1 and parts[0] == class_name else parts
    name = PurePosixPath(*inner)
    suffix = name.suffix.lower().lstrip(".")
    if _SAME_EXT.get(suffix, suffix) != _SAME_EXT.get(ext, ext):
        name = name.with_name(f"{name.name}.{ext}")
    return PurePosixPath(class_name) / name


def _stored_ext(data: bytes, key: str) -> str:
    """The extension of the format the bytes are in (from their header), else the key's own."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            ext = EXT_OF_FORMAT.get(im.format or "")
    except Exception:  # not an image Pillow knows: keep the key's extension
        ext = None
    return ext or PurePosixPath(key).suffix.lower().lstrip(".") or "bin"


def torchvision_transform(config: BenchConfig) -> Any:
    """The torchvision transform that does what fastdata's `config.augment` preset does."""
    from torchvision import transforms as T

    size = config.image_size
    if config.augment == "train":
        return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()])
    return T.Compose([T.Resize(int(size / 0.875)), T.CenterCrop(size), T.PILToTensor()])


class ListImages:
    """A torchvision-style map-style Dataset over (image file, label) pairs: PIL decode (torchvision's
    `default_loader`, RGB), `transform`, and the label as torchvision gives a target (the class id), or for a
    multi-label dataset its multi-hot float32 row over `num_classes` classes."""

    def __init__(self, samples: list[tuple[Path, Label]], transform: Any, num_classes: int, multi: bool) -> None:
        self.samples, self.transform, self.num_classes, self.multi = samples, transform, num_classes, multi

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        import torch
        from torchvision.datasets.folder import default_loader

        path, label = self.samples[index]
        target: Any
        if self.multi:
            target = torch.zeros(self.num_classes, dtype=torch.float32)
            target[list(label)] = 1.0  # type: ignore[arg-type]
        else:
            target = label
        return self.transform(default_loader(str(path))), target


def list_baseline(samples: list[tuple[Path, Label]], config: BenchConfig, num_classes: int,
                  label_kind: str = "single") -> Callable[[], Any]:
    """A factory of DataLoader over a torchvision-style Dataset of `samples` (ListImages), with the bench's
    transform and batch size and fastdata.loader's DataLoader settings: the baseline of a list dataset."""
    import torch

    settings = config.settings
    data = ListImages(samples, torchvision_transform(config), num_classes, label_kind == "multi")

    def make() -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(data, batch_size=config.batch_size,  # type: ignore[arg-type]  # map-style
                                           shuffle=True, **settings.dataloader_kwargs())

    return make


def imagefolder_baseline(root: Path, config: BenchConfig, exclude: Iterable[str] = ()) -> Callable[[], Any]:
    """A factory of torchvision ImageFolder + DataLoader over `root` (less the `exclude`d source-relative
    paths), with the bench's transform and batch size and fastdata.loader's DataLoader settings."""
    import torch
    from torchvision import datasets
    from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

    transform = torchvision_transform(config)
    root, skip = Path(root), frozenset(exclude)
    settings = config.settings

    def valid(path: str) -> bool:
        return has_file_allowed_extension(path, IMG_EXTENSIONS) and Path(path).relative_to(root).as_posix() not in skip

    def make() -> torch.utils.data.DataLoader:
        data = datasets.ImageFolder(str(root), transform=transform, is_valid_file=valid, allow_empty=True)
        return torch.utils.data.DataLoader(data, batch_size=config.batch_size, shuffle=True,
                                           **settings.dataloader_kwargs())

    return make
