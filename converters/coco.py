"""COCO instances annotations -> the image conversion driver (`fastdata.convert.images`), with a detection target per
image: `fastdata convert coco ANNOTATIONS.json IMAGES_DIR OUT`.

- Samples: the annotation file's `images`, in its order; each image's `file_name`, relative to IMAGES_DIR, is its
  key. Images without annotations are kept (an empty target) unless `--skip-empty`. Every image is verified by
  decoding it; a missing or undecodable image file is rejected like any source's, named in the summary and the
  manifest with its image id, and so is an image that does not decode to the `width` x `height` its entry says.
- Classes: the `categories`, sorted by id; category id -> contiguous label 0..C-1 (that order), names = the
  manifest's classes, the category ids in the manifest (`targets.category_ids`). A sample's label is the set of the
  classes its annotations hold (a multi-label dataset: `class_counts` count images per class).
- Targets (`fastdata.formats.targets`): per annotation its id, label, box (COCO's `[x, y, w, h]` stored as xyxy in
  source pixels, as given), `iscrowd`, `area` (the annotation's own, as COCO's evaluation uses it; without one, the
  mask's area, else the box's), and its mask as COCO compressed RLE: polygons and uncompressed RLE are converted
  exactly as pycocotools' `COCO.annToRLE` converts them. A dataset holds masks when its annotations have
  segmentations (all of them: a file where only some do is refused). Polygons of fewer than 3 points or an odd
  number of coordinates are left out of their masks (as detectron2 does), counted in the manifest
  (`targets.degenerate_polygons`) and warned about once; an annotation left with none has an empty mask.
- Bad input is refused before anything is written, in one line naming the annotation or image id: a box outside
  its image (beyond a 1-pixel tolerance; boxes within it are kept as given, not clipped) or with a negative side,
  a category id not in `categories`, an annotation for an image id not in `images`, an RLE segmentation whose size
  differs from its image's (or uncompressed counts that do not add up to its pixels), duplicate ids or file names,
  missing fields.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import posixpath
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from fastdata.config import check_bool
from fastdata.convert.images import ConversionSummary, convert_images
from fastdata.convert.options import ImageConversionOptions, spelled
from fastdata.convert.sources import ImageSource
from fastdata.errors import ConfigError, SourceError
from fastdata.formats.manifest import Manifest
from fastdata.formats.targets import DetectionRecord, encode_detection

BOX_TOLERANCE = 1.0  # pixels a box may reach past its image's edge (rounding in annotation tools)


def _mask_api() -> Any:  # pycocotools.mask (untyped)
    try:
        from pycocotools import mask
    except ImportError as exc:
        raise ConfigError("convert coco converts masks with pycocotools: pip install 'fastdata[coco]'") from exc
    return mask


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _load(path: Path) -> tuple[dict[str, Any], str]:
    """The annotation file's JSON object and the sha256 of its bytes."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SourceError(f"{path}: no such annotation file") from None
    except OSError as exc:
        raise SourceError(f"{path}: unreadable ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: not a JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: not a COCO annotation file (expected a JSON object with images, annotations "
                          "and categories)")
    for name in ("images", "annotations", "categories"):
        if not isinstance(data.get(name), list):
            raise SourceError(f"{path}: not a COCO instances file: no {name!r} list")
    return data, hashlib.sha256(raw).hexdigest()


def _entries(path: Path, data: dict[str, Any], name: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    """The `name` list's entries, each a JSON object with `fields` (name -> check) all valid."""
    entries = data[name]
    for number, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise SourceError(f"{path}: {name}[{number}] is not a JSON object")
        for field, check in fields.items():
            if not check(entry.get(field)):
                singular = {"images": "image", "annotations": "annotation", "categories": "category"}[name]
                what = f"{singular} {entry['id']}" if _is_id(entry.get("id")) else f"{name}[{number}]"
                raise SourceError(f"{path}: {what} has no valid {field!r} (got {entry.get(field)!r})")
    return entries


def _unique(path: Path, entries: list[dict[str, Any]], field: str, what: str) -> None:
    seen: set[Any] = set()
    for entry in entries:
        if entry[field] in seen:
            raise SourceError(f"{path}: {what} {entry[field]!r} appears twice (each must be unique)")
        seen.add(entry[field])


def _key(path: Path, image: dict[str, Any]) -> str:
    name = image["file_name"].replace("\\", "/")
    key = posixpath.normpath(name)
    if posixpath.isabs(key) or key == ".." or key.startswith("../"):
        raise SourceError(f"{path}: image {image['id']} has file_name {image['file_name']!r}, outside IMAGES_DIR "
                          "(file names are relative to it)")
    return key


class CocoTargets:
    """The detection targets of the listed images (`fastdata.convert.sources.TargetSource`): annotations checked at
    listing, each record built (polygons -> RLE) when the driver stores its image."""

    kind = "detection"

    def __init__(self, images: list[dict[str, Any]], annotations: list[list[dict[str, Any]]],
                 label_of: dict[int, int], masks: bool, digest: str, info: dict[str, Any]) -> None:
        self.images = images
        self.annotations = annotations  # per image, in the file's order
        self.label_of = label_of  # category id -> contiguous label
        self.masks = masks
        self._digest = digest
        self._info = info

    def size(self, index: int) -> tuple[int, int]:
        image = self.images[index]
        return image["width"], image["height"]

    def digest(self) -> str:
        return self._digest

    def info(self) -> dict[str, Any]:
        return self._info

    def record(self, index: int) -> bytes:
        image, found = self.images[index], self.annotations[index]
        width, height = image["width"], image["height"]
        boxes = np.zeros((len(found), 4), np.float32)
        areas = np.zeros(len(found), np.float32)
        rles: list[bytes] = []
        for i, ann in enumerate(found):
            x, y, w, h = ann["bbox"]
            boxes[i] = (x, y, x + w, y + h)
            rle = self._rle(ann, height, width) if self.masks else None
            if rle is not None:
                rles.append(rle["counts"] if isinstance(rle["counts"], bytes) else rle["counts"].encode("ascii"))
            if _is_number(ann.get("area")):
                areas[i] = ann["area"]
            elif rle is not None:
                areas[i] = float(_mask_api().area(rle))
            else:
                areas[i] = w * h
        return encode_detection(DetectionRecord(
            image["id"], width, height, np.array([a["id"] for a in found], np.int64),
            np.array([self.label_of[a["category_id"]] for a in found], np.int64), boxes, areas,
            np.array([a.get("iscrowd", 0) for a in found], np.uint8), rles if self.masks else None))

    @staticmethod
    def _rle(ann: dict[str, Any], height: int, width: int) -> dict[str, Any]:
        """The annotation's mask as compressed RLE, as pycocotools' COCO.annToRLE makes it."""
        mask = _mask_api()
        segmentation = ann["segmentation"]
        if isinstance(segmentation, list):
            if not segmentation:  # every polygon of it was degenerate (see scan): an empty mask
                return mask.encode(np.zeros((height, width), np.uint8, order="F"))
            return mask.merge(mask.frPyObjects(segmentation, height, width))
        if isinstance(segmentation["counts"], list):
            return mask.frPyObjects(segmentation, height, width)
        return segmentation


def _has_segmentation(ann: dict[str, Any]) -> bool:
    segmentation = ann.get("segmentation")
    return segmentation is not None and segmentation != []


def _drop_degenerate_polygons(ann: dict[str, Any], example: list[int]) -> int:
    """Leave out of a polygon segmentation the polygons of fewer than 3 points or an odd number of coordinates
    (pycocotools would read 4 numbers as a box, and refuses fewer); how many were left out. The first annotation
    that had one is put in `example`."""
    segmentation = ann["segmentation"]
    if not isinstance(segmentation, list):
        return 0
    kept = [p for p in segmentation if len(p) >= 6 and len(p) % 2 == 0]
    if len(kept) != len(segmentation):
        ann["segmentation"] = kept  # the in-memory copy: an annotation left with none gets an empty mask
        if not example:
            example.append(ann["id"])
    return len(segmentation) - len(kept)


def _check_annotation(path: Path, ann: dict[str, Any], image: dict[str, Any]) -> None:
    """One annotation against its image: box inside it (within the tolerance), iscrowd 0/1, segmentation usable."""
    where = f"{path}: annotation {ann['id']} (image {image['id']}, {image['file_name']})"
    bbox = ann.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
        raise SourceError(f"{where}: bbox must be 4 finite numbers [x, y, width, height], got {bbox!r}")
    x, y, w, h = bbox
    width, height = image["width"], image["height"]
    if w < 0 or h < 0:
        raise SourceError(f"{where}: box {bbox} has a negative width or height")
    if x < -BOX_TOLERANCE or y < -BOX_TOLERANCE or x + w > width + BOX_TOLERANCE or y + h > height + BOX_TOLERANCE:
        raise SourceError(f"{where}: box {bbox} (xywh) reaches outside the {width}x{height} image (more than "
                          f"{BOX_TOLERANCE:g} px past its edge)")
    if ann.get("iscrowd", 0) not in (0, 1) or isinstance(ann.get("iscrowd"), bool):
        raise SourceError(f"{where}: iscrowd must be 0 or 1, got {ann.get('iscrowd')!r}")
    if "area" in ann and not (_is_number(ann["area"]) and ann["area"] >= 0):
        raise SourceError(f"{where}: area must be a non-negative number, got {ann['area']!r}")
    segmentation = ann.get("segmentation")
    if not _has_segmentation(ann):
        return
    if isinstance(segmentation, list):
        if not all(isinstance(p, list) and p and all(_is_number(v) for v in p) for p in segmentation):
            raise SourceError(f"{where}: segmentation polygons must be lists of numbers")
        return
    if not isinstance(segmentation, dict) or not isinstance(segmentation.get("counts"), (str, list)):
        raise SourceError(f"{where}: segmentation must be polygons or an RLE {{size, counts}}, got "
                          f"{type(segmentation).__name__}")
    size = segmentation.get("size")
    if size != [height, width]:
        raise SourceError(f"{where}: RLE segmentation of size {size} (height, width) differs from its "
                          f"{width}x{height} image's [{height}, {width}]")
    counts = segmentation["counts"]
    if isinstance(counts, str) and not counts.isascii():
        raise SourceError(f"{where}: compressed RLE counts must be ASCII text (pycocotools' encoding)")
    if isinstance(counts, list) and (not all(_is_id(c) and c >= 0 for c in counts) or sum(counts) != width * height):
        raise SourceError(f"{where}: uncompressed RLE counts must be non-negative integers adding up to the "
                          f"image's {width * height} pixels")


def scan(annotations_path: str | os.PathLike[str], images_dir: str | os.PathLike[str],
         skip_empty: bool = False) -> ImageSource:
    """List the images of a COCO instances file with their detection targets (see the module docstring);
    SourceError naming the annotation or image id of the first problem."""
    path, root = Path(annotations_path), Path(images_dir)
    if not root.is_dir():
        raise SourceError(f"{root}: the images folder does not exist or is not a folder")
    data, digest = _load(path)
    categories = _entries(path, data, "categories", {"id": _is_id, "name": lambda v: isinstance(v, str)})
    _unique(path, categories, "id", "category id")
    _unique(path, categories, "name", "category name")
    categories = sorted(categories, key=lambda c: c["id"])
    label_of = {c["id"]: label for label, c in enumerate(categories)}
    images = _entries(path, data, "images", {
        "id": _is_id, "file_name": lambda v: isinstance(v, str) and v != "",
        "width": lambda v: _is_id(v) and v > 0, "height": lambda v: _is_id(v) and v > 0})
    _unique(path, images, "id", "image id")
    keys = [_key(path, image) for image in images]
    _unique(path, [{"key": k} for k in keys], "key", "image file")
    annotations = _entries(path, data, "annotations", {"id": _is_id, "image_id": _is_id, "category_id": _is_id})
    _unique(path, annotations, "id", "annotation id")
    index_of = {image["id"]: i for i, image in enumerate(images)}
    per_image: list[list[dict[str, Any]]] = [[] for _ in images]
    with_masks = without_masks = None
    degenerate, degenerate_example = 0, list[int]()  # polygons left out of masks, and the first annotation holding one
    for ann in annotations:
        if ann["image_id"] not in index_of:
            raise SourceError(f"{path}: annotation {ann['id']} is for image id {ann['image_id']}, which is not in "
                              "'images'")
        if ann["category_id"] not in label_of:
            raise SourceError(f"{path}: annotation {ann['id']} (image {ann['image_id']}) has category id "
                              f"{ann['category_id']}, which is not in 'categories'")
        image = images[index_of[ann["image_id"]]]
        _check_annotation(path, ann, image)
        if _has_segmentation(ann):
            with_masks = with_masks or ann
            degenerate += _drop_degenerate_polygons(ann, degenerate_example)
        else:
            without_masks = without_masks or ann
        per_image[index_of[ann["image_id"]]].append(ann)
    if degenerate:
        warnings.warn(f"{path}: {degenerate} polygon(s) of fewer than 3 points or an odd number of coordinates "
                      f"(first: annotation {degenerate_example[0]}) left out of their masks, as detectron2 leaves "
                      "them out; their boxes are kept", stacklevel=2)
    if with_masks is not None and without_masks is not None:
        raise SourceError(f"{path}: annotation {without_masks['id']} has no segmentation while annotation "
                          f"{with_masks['id']} has one; a dataset's annotations all have masks or none has")
    kept = [i for i in range(len(images)) if per_image[i] or not skip_empty]
    if not kept:
        raise SourceError(f"{path}: no images to convert ({len(images)} listed"
                          f"{', none with annotations (--skip-empty)' if images else ''})")
    samples = [(keys[i], tuple(sorted({label_of[a["category_id"]] for a in per_image[i]}))) for i in kept]
    classes = [c["name"] for c in categories]
    counts = np.zeros(len(classes), np.int64)
    for _, label in samples:
        counts[list(label)] += 1
    stored = [a for i in kept for a in per_image[i]]
    info = {"category_ids": [c["id"] for c in categories], "masks": with_masks is not None,
            "annotations": len(stored), "crowd": sum(1 for a in stored if a.get("iscrowd", 0)),
            "box_format": "xyxy", "degenerate_polygons": degenerate}
    targets = CocoTargets([images[i] for i in kept], [per_image[i] for i in kept], label_of,
                          with_masks is not None, f"{digest} skip_empty={skip_empty}", info)
    details = {"annotations": str(path.absolute()), "root": str(root.absolute()), "skip_empty": skip_empty,
               "images_listed": len(images), "images_without_annotations": sum(1 for a in per_image if not a)}
    kept_images = [images[i] for i in kept]
    return ImageSource("coco", root, classes, samples,
                       empty_classes=[name for name, n in zip(classes, counts.tolist(), strict=True) if n == 0],
                       label_kind="multi", targets=targets, details=details,
                       origin=lambda index: {"annotations": str(path), "image_id": kept_images[index]["id"]})


def relist(src: str | os.PathLike[str], manifest: Manifest) -> ImageSource:
    """The COCO file a dataset was converted from (`src`: the annotation file; the images folder the manifest
    records), listed again as its conversion listed it (`fastdata verify --source`)."""
    return scan(src, manifest.source["root"], bool(manifest.source.get("skip_empty", False)))


@dataclass(frozen=True, kw_only=True)
class CocoOptions(ImageConversionOptions):
    """How `fastdata.convert_coco` converts a COCO instances file: the options of every image conversion
    (`fastdata.convert.options.ImageConversionOptions`) but `max_size`, and the one below. Checked when made.

    Attributes:
        max_size: refused (None only): COCO boxes and masks are in source pixels, which a re-encoded smaller image
            would no longer match.
        skip_empty: leave out the images without annotations (kept by default, with an empty target).
    """

    skip_empty: bool = False

    def __post_init__(self) -> None:
        """Each value checked (one line naming the option and the value)."""
        super().__post_init__()
        check_bool("skip_empty", self.skip_empty)
        if self.max_size is not None:
            raise ConfigError("--max-size: COCO boxes and masks are in source pixels, which a re-encoded smaller "
                              "image would no longer match; convert without --max-size")


def convert_coco(annotations: str | os.PathLike[str], images_dir: str | os.PathLike[str],
                 out: str | os.PathLike[str], options: CocoOptions | None = None, **keywords: Any
                 ) -> ConversionSummary:
    """Pack the images of a COCO instances file, with their boxes, labels and masks, into `out` (LMDB if it ends in
    `.lmdb`, or `format="wds"` shards); see the module docstring. Every image is verified by decoding it; missing or
    unusable ones are rejected and named with their image id (`strict=True`: the first raises and nothing is
    written); bad annotations are refused before anything is written. `fastdata.dataset(out)[i]` gives `(image,
    target dict)`.

    Args:
        annotations: the COCO instances JSON file (`images`, `annotations`, `categories`).
        images_dir: the folder the images' `file_name`s are relative to.
        out: the dataset to write: `OUT.lmdb`, or a directory of WebDataset shards with `format="wds"`.
        options: how to convert (`fastdata.options.CocoOptions`; None: its defaults).
        **keywords: the options as flat keywords (deprecated: put them in `options`).
    """
    settings = spelled(CocoOptions, options, keywords, "fastdata.convert_coco")
    _mask_api()
    return convert_images(lambda: scan(annotations, images_dir, settings.skip_empty), out, settings)


#: the option object of `fastdata convert coco`, and its parameters that are not options (its arguments)
OPTIONS = CocoOptions
ARGUMENTS = ("annotations", "images_dir", "out")


def cli_command() -> click.Command:
    """`fastdata convert coco ANNOTATIONS IMAGES_DIR OUT ...`"""
    from fastdata.converters.options import convert_options, options_from_flags

    @click.command("coco")
    @click.argument("annotations", metavar="ANNOTATIONS", type=click.Path(path_type=Path))
    @click.argument("images_dir", metavar="IMAGES_DIR", type=click.Path(path_type=Path))
    @click.argument("out", type=click.Path(path_type=Path))
    @click.option("--skip-empty", is_flag=True, help="Leave out images without annotations (kept by default).")
    @convert_options(max_size=False)
    def command(annotations: Path, images_dir: Path, out: Path, **flags: Any) -> None:
        """Pack the images of the COCO instances file ANNOTATIONS (file names relative to IMAGES_DIR), with their
        boxes, labels and masks, into OUT.

        OUT ending in .lmdb writes one LMDB dataset (sample i = the i-th image of the file); --format wds writes
        WebDataset tar shards into the directory OUT. fastdata.dataset(OUT)[i] gives (image, target dict).
        """
        click.echo(str(convert_coco(annotations, images_dir, out, options_from_flags(OPTIONS, flags, ARGUMENTS))))

    return command
