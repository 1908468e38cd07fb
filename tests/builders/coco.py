"""COCO instances files (converters/coco.py), written as users have them, and the rectangles source that
detection loading is checked on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .images import pattern, write_image

# COCO instances files (converters/coco.py), written as users have them: a JSON dict of images, annotations and
# categories over image files, masks as polygons (several parts), compressed RLE and uncompressed RLE (crowds)

# category ids are not contiguous and not in order: the contiguous labels are their ranks (car 0, train 1, zebra 2)
COCO_CATEGORIES = [{"id": 90, "name": "zebra", "supercategory": "animal"},
                   {"id": 3, "name": "car", "supercategory": "vehicle"},
                   {"id": 7, "name": "train", "supercategory": "vehicle"}]
COCO_CLASSES = ["car", "train", "zebra"]
# (image id, file_name, width, height, kind): ids not contiguous, names in sub-folders, one image without annotations
COCO_IMAGES = [(101, "train/000101.jpg", 64, 48, "jpeg"), (7, "train/sub/000007.png", 40, 56, "png"),
               (55, "val/000055.jpg", 50, 50, "jpeg"), (3, "000003.png", 33, 41, "png"),
               (200, "empty.jpg", 30, 20, "jpeg")]


@dataclass
class CocoFiles:
    """A written COCO source: the annotation file, the images folder, and the dict the file holds."""

    annotations: Path
    images: Path
    data: dict


def uncompressed_rle(binary: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE counts of a 0/1 [H, W] mask: run lengths in column-major order, zeros first."""
    flat = binary.flatten(order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], changes, [len(flat)]])
    counts = np.diff(bounds).tolist()
    return [0, *counts] if flat[0] else counts


def _polygon_area(polygon: list[float]) -> float:
    xs, ys = np.array(polygon[0::2]), np.array(polygon[1::2])
    return float(abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))) / 2)


def _polygon_box(polygons: list[list[float]]) -> list[float]:
    xs = [v for p in polygons for v in p[0::2]]
    ys = [v for p in polygons for v in p[1::2]]
    return [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]


def coco_dict(masks: bool = True) -> dict:
    """The instances dict of the COCO test source (see COCO_*): per image a few annotations of each kind, listed out
    of image order; `masks=False`: boxes only (no segmentation)."""
    from pycocotools import mask

    annotations = []
    next_id = iter(range(1000, 100000, 13))
    for number, (image_id, _, width, height, _) in enumerate(COCO_IMAGES[:-1]):
        triangle = [1.0 + number, 2.0, width - 3.5, 4.0, width / 2, height - 2.0]
        parts = [[2.0, 2.0, 10.0, 2.0, 10.0, 9.0, 2.0, 9.0], [12.5, 12.0, 20.0, 12.0, 16.0, 19.5]]
        for category, polygons in ((COCO_CATEGORIES[number % 3]["id"], [triangle]), (3, parts)):
            annotations.append({"id": next(next_id), "image_id": image_id, "category_id": category, "iscrowd": 0,
                                "segmentation": polygons, "area": sum(_polygon_area(p) for p in polygons),
                                "bbox": _polygon_box(polygons)})
        binary = np.zeros((height, width), np.uint8)
        binary[height // 3:height - 2, width // 4: width // 4 + 7 + number] = 1
        binary[height - 4:, :3] = 1
        rle = mask.encode(np.asfortranarray(binary))
        counts: Any = uncompressed_rle(binary) if number % 2 else rle["counts"].decode("ascii")
        annotations.append({"id": next(next_id), "image_id": image_id, "category_id": 7, "iscrowd": 1,
                            "segmentation": {"size": [height, width], "counts": counts},
                            "area": float(mask.area(rle)), "bbox": mask.toBbox(rle).tolist()})
    # a box reaching half a pixel past the right edge: within the tolerance, kept as given
    first = COCO_IMAGES[0]
    annotations.append({"id": 7, "image_id": first[0], "category_id": 90, "iscrowd": 0, "area": 40.0,
                        "segmentation": [[first[2] - 8.0, 1.0, first[2] + 0.5, 1.0, first[2] + 0.5, 6.0]],
                        "bbox": [first[2] - 8.0, 1.0, 8.5, 5.0]})
    annotations = annotations[1::2] + annotations[0::2]  # not grouped by image
    if not masks:
        for ann in annotations:
            del ann["segmentation"]
    images = [{"id": i, "file_name": name, "width": w, "height": h, "license": 1} for i, name, w, h, _ in COCO_IMAGES]
    return {"info": {"description": "fastdata test"}, "licenses": [], "images": images, "annotations": annotations,
            "categories": [dict(c) for c in COCO_CATEGORIES]}


def write_coco(root: Path, data: dict | None = None, name: str = "instances.json") -> CocoFiles:
    """Write the COCO test images under `root/images` (pixels: `pattern(image id)`) and `data` (default
    `coco_dict()`) as `root/name`."""
    data = coco_dict() if data is None else data
    images = root / "images"
    for image_id, file_name, width, height, kind in COCO_IMAGES:
        if not (images / file_name).exists():
            write_image(images / file_name, pattern(image_id, width, height), kind)
    path = root / name
    path.write_text(json.dumps(data))
    return CocoFiles(path, images, data)


# A COCO source for detection loading: every image a background whose green encodes its position in the list
# (RECT_GREEN0 + RECT_GREEN_STEP * number; red always RECT_BACKGROUND_RED, blue 200) with one filled red rectangle,
# annotated by its box and polygon (pixel edges), and a second, smaller box elsewhere; JPEGs and PNGs of odd sizes
# alternate; ids not contiguous; the last image has no annotations.
RECT_GREEN0, RECT_GREEN_STEP, RECT_BACKGROUND_RED = 30, 9, 40


def rect_image_id(number: int) -> int:
    return 1000 + 3 * number


def rect_of(number: int, width: int, height: int) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of image `number`'s red rectangle (pixel edges): a quarter of each side, even edges."""
    x0, y0 = (width // 4 + number % 3) // 2 * 2, height // 3 // 2 * 2
    return x0, y0, x0 + max(4, width // 4) // 2 * 2, y0 + max(4, height // 4) // 2 * 2


def rect_size(number: int) -> tuple[int, int]:
    return 40 + (number * 7) % 50, 30 + (number * 11) % 40


def rect_picture(number: int, rectangle: bool = True) -> np.ndarray:
    width, height = rect_size(number)
    image = np.empty((height, width, 3), np.uint8)
    image[...] = (RECT_BACKGROUND_RED, RECT_GREEN0 + RECT_GREEN_STEP * number, 200)
    if rectangle:
        x0, y0, x1, y1 = rect_of(number, width, height)
        image[y0:y1, x0:x1] = (255, 0, 0)
    return image


def rect_number_of(green: float) -> int:
    """The list position an image's background green encodes."""
    return round((green - RECT_GREEN0) / RECT_GREEN_STEP)


def write_coco_rectangles(root: Path, count: int = 23) -> CocoFiles:
    """Write the rectangles COCO source (see RECT_*) of `count` images under `root`."""
    images, annotations = [], []
    ann_id = iter(range(5, 10**6, 7))
    for number in range(count):
        width, height = rect_size(number)
        kind = "png" if number % 2 else "jpeg"
        name = f"img/{number:03d}.{'png' if kind == 'png' else 'jpg'}"
        write_image(root / "images" / name, rect_picture(number, number < count - 1), kind)
        image_id = rect_image_id(number)
        images.append({"id": image_id, "file_name": name, "width": width, "height": height})
        if number == count - 1:
            continue
        x0, y0, x1, y1 = rect_of(number, width, height)
        polygon = [float(v) for v in (x0, y0, x1, y0, x1, y1, x0, y1)]
        annotations.append({"id": next(ann_id), "image_id": image_id, "category_id": 1, "iscrowd": 0,
                            "segmentation": [polygon], "area": float((x1 - x0) * (y1 - y0)),
                            "bbox": [x0, y0, x1 - x0, y1 - y0]})
        small = [2.0, 2.0, 8.0, 2.0, 8.0, 6.0, 2.0, 6.0]
        annotations.append({"id": next(ann_id), "image_id": image_id, "category_id": 2, "iscrowd": 0,
                            "segmentation": [small], "area": 24.0, "bbox": [2.0, 2.0, 6.0, 4.0]})
    data = {"images": images, "annotations": annotations,
            "categories": [{"id": 1, "name": "rectangle"}, {"id": 2, "name": "corner"}]}
    path = root / "instances.json"
    path.write_text(json.dumps(data))
    return CocoFiles(path, root / "images", data)
