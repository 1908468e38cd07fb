"""ImageFolder trees (`SRC/<class>/**/<image>`) -> image records.

Class names, label ids and sample order are torchvision's own (`find_classes` / `make_dataset` are called
directly, so they cannot drift): sorted class folders, recursive walk, torchvision's extension list,
case-insensitive. Every file is verified by decoding it (JPEGs at 1/8 scale: the entropy data is still read
in full, so truncation is caught at a fraction of the cost), so a broken file is rejected at conversion time,
not at sample 9,999,999 of an epoch.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path

import click

from fastdata.errors import SourceError
from fastdata.formats.records import DEFAULT_MAX_PIXELS, EXT_OF_FORMAT, IMAGE_EXTENSIONS, ImageRecord, codec_for


@dataclass
class ImageFolderListing:
    """What a scan of the source tree found, in torchvision ImageFolder's order."""

    root: Path
    classes: list[str]
    samples: list[tuple[str, int]]  # (source-relative path with '/' separators, label)
    ignored: list[str] = field(default_factory=list)  # files skipped for their extension
    empty_classes: list[str] = field(default_factory=list)


def scan(src: str | os.PathLike[str]) -> ImageFolderListing:
    """List the samples of an ImageFolder tree exactly as torchvision's ImageFolder would."""
    from torchvision.datasets.folder import find_classes, make_dataset

    root = Path(src)
    if not root.exists():
        raise SourceError(f"{root}: source folder does not exist")
    if not root.is_dir():
        raise SourceError(f"{root}: source is not a folder (expected SRC/<class>/<image>...)")
    try:
        classes, class_to_idx = find_classes(str(root))
    except FileNotFoundError as exc:
        has_files = any(root.iterdir())
        what = "holds no class folders" if has_files else "is empty"
        raise SourceError(f"{root}: source {what} (expected SRC/<class>/<image>..., one folder per class)") from exc
    samples = make_dataset(str(root), class_to_idx, extensions=IMAGE_EXTENSIONS, allow_empty=True)
    relative = [(Path(path).relative_to(root).as_posix(), label) for path, label in samples]
    counts = [0] * len(classes)
    for _, label in relative:
        counts[label] += 1
    if not relative:
        raise SourceError(f"{root}: no image files found in its {len(classes)} class folders "
                          f"(extensions: {', '.join(IMAGE_EXTENSIONS)})")
    return ImageFolderListing(root, classes, relative, _ignored_files(root, classes),
                              [name for name, n in zip(classes, counts, strict=True) if n == 0])


def _ignored_files(root: Path, classes: list[str]) -> list[str]:
    """Files that ImageFolder skips: wrong extension inside class folders, or anything outside them."""
    ignored = [entry.name for entry in os.scandir(root) if entry.is_file()]
    for name in classes:
        for dirpath, _, filenames in os.walk(root / name, followlinks=True):
            for filename in filenames:
                if not filename.lower().endswith(IMAGE_EXTENSIONS):
                    ignored.append(Path(dirpath, filename).relative_to(root).as_posix())
    return sorted(ignored)



@dataclass(frozen=True)
class EncodeOptions:
    """Per-image options of a conversion."""

    max_size: int | None = None  # re-encode images whose longer side exceeds this to JPEG
    quality: int = 90
    max_pixels: int = DEFAULT_MAX_PIXELS  # refuse larger images from their header, before any decoding


class _Refused(Exception):
    """An image refused on purpose (not a decoding failure)."""


def load_record(root: Path, relative_path: str, label: int, options: EncodeOptions) -> ImageRecord:
    """Read and verify one source file; return the record to store. Raises ValueError with the reason if
    the file cannot be used."""
    from PIL import Image

    path = root / relative_path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"unreadable ({exc.strerror or exc})") from exc
    if not data:
        raise ValueError("empty file")
    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt, mode, (width, height) = im.format, im.mode, im.size
            if width * height > options.max_pixels:
                raise _Refused(f"refused: {width}x{height} = {width * height:,} pixels exceeds the limit of "
                               f"{options.max_pixels:,} (--max-pixels); decompression bomb or unusually large image")
            if options.max_size is not None and max(width, height) > options.max_size:
                return _downscaled(im, relative_path, label, options)
            if fmt == "JPEG":
                im.draft(im.mode, (max(1, width // 8), max(1, height // 8)))
            im.load()
    except _Refused as exc:
        raise ValueError(str(exc)) from None
    except Image.DecompressionBombError as exc:  # Pillow's own hard limit, checked while opening
        raise ValueError(f"refused: {exc} (--max-pixels cannot go above Pillow's limit)") from None
    except Exception as exc:  # Pillow raises many types for bad data
        raise ValueError(f"not a decodable image ({exc})") from exc
    ext = EXT_OF_FORMAT.get(fmt or "", relative_path.rsplit(".", 1)[-1].lower())
    return ImageRecord(relative_path, data, ext, label, width, height, codec_for(fmt, mode))


def _downscaled(im, relative_path: str, label: int, options: EncodeOptions) -> ImageRecord:
    """Re-encode an oversized image to JPEG with its longer side = max_size (FFCV's max_resolution)."""
    from PIL import Image

    width, height = im.size
    scale = options.max_size / max(width, height)
    target = (max(1, round(width * scale)), max(1, round(height * scale)))
    if im.format == "JPEG":
        im.draft("RGB", target)  # DCT-domain downscale first: much less to decode
    rgb = im.convert("RGB").resize(target, Image.Resampling.BICUBIC, reducing_gap=3.0)
    out = io.BytesIO()
    rgb.save(out, "JPEG", quality=options.quality)
    return ImageRecord(relative_path, out.getvalue(), "jpg", label, target[0], target[1],
                       codec_for("JPEG", "RGB"))


def cli_command() -> click.Command:
    """`fastdata convert imagefolder SRC OUT ...`"""
    from fastdata.converters.options import convert_options

    @click.command("imagefolder")
    @click.argument("src", type=click.Path(path_type=Path))
    @click.argument("out", type=click.Path(path_type=Path))
    @convert_options
    def command(src: Path, out: Path, **options) -> None:
        """Pack an ImageFolder tree SRC (SRC/<class>/**/<image>) into OUT.

        OUT ending in .lmdb writes one LMDB dataset (sample i = torchvision ImageFolder's sample i);
        --format wds writes WebDataset tar shards into the directory OUT.
        """
        from fastdata.converters.options import run_conversion

        run_conversion(src, out, **options)

    return command
