"""ImageFolder trees (`SRC/<class>/**/<image>`) -> the image conversion driver (`fastdata.convert.images`).

Class names, label ids and sample order are torchvision's own: `find_classes` / `make_dataset` are repeated here
step for step (sorted class folders, a sorted recursive walk that follows links, torchvision's extension list,
case-insensitive), without importing torchvision, which would cost the command seconds and every conversion worker
a copy of torch; the tests hold the two listings equal on tricky trees. Every file is verified by decoding it
(`fastdata.convert.encode`), so a broken file is rejected at conversion time, not at sample 9,999,999 of an epoch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from fastdata.convert.images import ConversionSummary, convert_images
from fastdata.convert.options import ImageConversionOptions, spelled
from fastdata.convert.sources import ImageSource
from fastdata.errors import SourceError
from fastdata.formats.manifest import Manifest
from fastdata.formats.records import IMAGE_EXTENSIONS


def scan(src: str | os.PathLike[str]) -> ImageSource:
    """List the samples of an ImageFolder tree exactly as torchvision's ImageFolder would."""
    root = Path(src)
    if not root.exists():
        raise SourceError(f"{root}: source folder does not exist")
    if not root.is_dir():
        raise SourceError(f"{root}: source is not a folder (expected SRC/<class>/<image>...)")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        has_files = any(root.iterdir())
        what = "holds no class folders" if has_files else "is empty"
        raise SourceError(f"{root}: source {what} (expected SRC/<class>/<image>..., one folder per class)")
    relative = _image_files(root, classes)
    counts = [0] * len(classes)
    for _, label in relative:
        counts[label] += 1
    if not relative:
        raise SourceError(f"{root}: no image files found in its {len(classes)} class folders "
                          f"(extensions: {', '.join(IMAGE_EXTENSIONS)})")
    empty = [name for name, n in zip(classes, counts, strict=True) if n == 0]
    # a folder with files but no image (a converted dataset, notes, ...) is not a class: refused, as torchvision's
    # ImageFolder refuses any class without images; a folder with nothing in it stays an empty class (torchvision's
    # allow_empty=True), said in the summary
    not_classes = [name for name in empty if any(files for _, _, files in os.walk(root / name))]
    if not_classes:
        shown = ", ".join(not_classes[:5]) + (f", ... ({len(not_classes)} folders)" if len(not_classes) > 5 else "")
        one = len(not_classes) == 1
        raise SourceError(f"{root}: class folder{'' if one else 's'} {shown} hold{'s' if one else ''} files but no "
                          f"image file (extensions: {', '.join(IMAGE_EXTENSIONS)}): not a class (a converted dataset? "
                          "torchvision's ImageFolder refuses it too); move it out of the tree")
    return ImageSource("imagefolder", root, classes, relative, _ignored_files(root, classes), empty,
                       walks_root=True)


def _image_files(root: Path, classes: list[str]) -> list[tuple[str, int]]:
    """(path relative to `root` with '/' separators, class id) of every image file, in torchvision's
    `make_dataset` order."""
    found = []
    for label, name in enumerate(classes):
        class_dir = os.path.join(root, name)
        if not os.path.isdir(class_dir):
            continue
        for dirpath, _, filenames in sorted(os.walk(class_dir, followlinks=True)):
            folder = (name + dirpath[len(class_dir):]).replace(os.sep, "/")
            found += [(f"{folder}/{filename}", label) for filename in sorted(filenames)
                      if filename.lower().endswith(IMAGE_EXTENSIONS)]
    return found


def relist(src: str | os.PathLike[str], manifest: Manifest) -> ImageSource:
    """The source of a dataset this converter made, listed again as the conversion listed it (`fastdata verify
    --source`)."""
    return scan(src)


def _ignored_files(root: Path, classes: list[str]) -> list[str]:
    """Files that ImageFolder skips: wrong extension inside class folders, or anything outside them."""
    ignored = [entry.name for entry in os.scandir(root) if entry.is_file()]
    for name in classes:
        for dirpath, _, filenames in os.walk(root / name, followlinks=True):
            for filename in filenames:
                if not filename.lower().endswith(IMAGE_EXTENSIONS):
                    ignored.append(Path(dirpath, filename).relative_to(root).as_posix())
    return sorted(ignored)


@dataclass(frozen=True, kw_only=True)
class ImageFolderOptions(ImageConversionOptions):
    """How `fastdata.convert_imagefolder` converts an ImageFolder tree: the options of every image conversion
    (`fastdata.convert.options.ImageConversionOptions`); the tree itself takes none (classes, labels and order are
    torchvision's). Checked when made."""


def convert_imagefolder(src: str | os.PathLike[str], out: str | os.PathLike[str],
                        options: ImageFolderOptions | None = None, **keywords: Any) -> ConversionSummary:
    """Pack the ImageFolder tree `src` into `out` (LMDB if it ends in `.lmdb`, or `format="wds"` shards): every
    file verified by decoding it, unusable ones rejected and listed (`strict=True`: the first raises and nothing is
    written), interrupted conversions resumed by the same call.

    Args:
        src: the ImageFolder tree (`src/<class>/**/<image>`); classes, labels and order are torchvision's.
        out: the dataset to write: `OUT.lmdb`, or a directory of WebDataset shards with `format="wds"`.
        options: how to convert (`fastdata.options.ImageFolderOptions`; None: its defaults).
        **keywords: the options as flat keywords (deprecated: put them in `options`).
    """
    settings = spelled(ImageFolderOptions, options, keywords, "fastdata.convert_imagefolder")
    return convert_images(lambda: scan(src), out, settings)


#: the option object of `fastdata convert imagefolder`, and its parameters that are not options (its arguments)
OPTIONS = ImageFolderOptions
ARGUMENTS = ("src", "out")


def cli_command() -> click.Command:
    """`fastdata convert imagefolder SRC OUT ...`"""
    from fastdata.converters.options import convert_options, options_from_flags

    @click.command("imagefolder")
    @click.argument("src", type=click.Path(path_type=Path))
    @click.argument("out", type=click.Path(path_type=Path))
    @convert_options
    def command(src: Path, out: Path, **flags: Any) -> None:
        """Pack an ImageFolder tree SRC (SRC/<class>/**/<image>) into OUT.

        OUT ending in .lmdb writes one LMDB dataset (sample i = torchvision ImageFolder's sample i);
        --format wds writes WebDataset tar shards into the directory OUT.
        """
        click.echo(str(convert_imagefolder(src, out, options_from_flags(OPTIONS, flags, ARGUMENTS))))

    return command
