"""Semantic segmentation lists (fastdata convert list --mask-column): images with PNG label maps, written
with PIL."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from .coco import rect_of, rect_picture, rect_size
from .images import solid_pattern, write_image
from .lists import write_list

# ----------------------------------------------------------------------------------------------------
# semantic segmentation lists (fastdata convert list --mask-column): images with PNG label maps, written with PIL

SEG_COUNT = 9
SEG_CLASSES = 21  # VOC's
SEG_IGNORE = 255


def seg_ids(sample_id: int, width: int, height: int, wide: bool = False) -> np.ndarray:
    """Sample `sample_id`'s label map: class ids that depend on the sample and the pixel, with an ignore-index
    border (VOC-like); `wide`: uint16 ids up to ~1000."""
    y, x = np.mgrid[0:height, 0:width]
    if wide:
        return ((x * 37 + y * 11 + sample_id * 101) % 1000).astype(np.uint16)
    ids = ((x // 3 + y // 2 + sample_id) % SEG_CLASSES).astype(np.uint8)
    ids[0, :] = SEG_IGNORE
    return ids


def write_label_map(path: Path, ids: np.ndarray, mode: str = "L") -> Path:
    """`ids` saved as a PNG label map: "L" (8-bit greyscale), "P" (palette indices = ids, VOC's colours),
    "I;16" (16-bit greyscale), "RGB" (a colour map: ids as red), "JPEG" (a lossy 8-bit map)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "P":
        image = Image.fromarray(ids, mode="P")
        image.putpalette([(i * 67 + c * 29) % 256 for i in range(256) for c in range(3)])
    elif mode == "I;16":
        image = Image.frombytes("I;16", (ids.shape[1], ids.shape[0]), ids.astype("<u2").tobytes())
    elif mode == "RGB":
        image = Image.fromarray(np.stack([ids, ids * 0, ids * 0], axis=-1).astype(np.uint8))
    else:
        image = Image.fromarray(ids.astype(np.uint8), mode="L")
    image.save(path, "JPEG" if mode == "JPEG" else "PNG")
    return path


def seg_size(sample_id: int) -> tuple[int, int]:
    return 19 + 2 * sample_id, 13 + sample_id  # odd sizes, one per sample


def build_segmentation_list(root: Path, suffix: str = ".csv", wide: bool = False, labels: bool = False):
    """Images `img/sNN.png` (the solid pattern of their sample id) with label maps `ann/sNN.png` (mode "L" and
    "P" alternating; all "I;16" when `wide`), listed in a shuffled order by a `suffix` list file written with
    pandas: columns `path`, `mask`, `note` (and `label`, a class name, with `labels`). Returns (list path, frame)."""
    import pandas as pd

    rows = []
    for sample_id in np.random.default_rng(3).permutation(SEG_COUNT).tolist():
        width, height = seg_size(sample_id)
        Image.fromarray(solid_pattern(sample_id, width, height)).save(_mkdir(root / f"img/s{sample_id:02d}.png"))
        mode = "I;16" if wide else ("P" if sample_id % 2 else "L")
        write_label_map(root / f"ann/s{sample_id:02d}.png", seg_ids(sample_id, width, height, wide), mode)
        row = {"path": f"img/s{sample_id:02d}.png", "mask": f"ann/s{sample_id:02d}.png", "note": f"n{sample_id}"}
        if labels:
            row["label"] = ("indoor", "outdoor")[sample_id % 2]
        rows.append(row)
    frame = pd.DataFrame(rows)
    return write_list(frame, root / f"list{suffix}"), frame


def _mkdir(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# ----------------------------------------------------------------------------------------------------
# segmentation rectangles (fastdata convert list --mask-column): the rectangles' pictures (rect_picture: the
# background's green encodes the list position, a red rectangle) as JPEGs and PNGs alternating, each with a label
# map holding SEG_RECT_CLASS over exactly the rectangle's pixels and SEG_BACKGROUND0 + number elsewhere

SEG_RECT_CLASS, SEG_BACKGROUND0 = 7, 30


def seg_rect_ids(number: int) -> np.ndarray:
    """Picture `number`'s label map: its own background class, the rectangle's class over the red pixels."""
    width, height = rect_size(number)
    ids = np.full((height, width), SEG_BACKGROUND0 + number, np.uint8)
    x0, y0, x1, y1 = rect_of(number, width, height)
    ids[y0:y1, x0:x1] = SEG_RECT_CLASS
    return ids


def build_segmentation_rects(root: Path, count: int = 23) -> Path:
    """Write the segmentation rectangles source (see SEG_RECT_CLASS) of `count` samples under `root`; returns its
    CSV list (columns `path`, `mask`)."""
    import pandas as pd

    rows = []
    for number in range(count):
        kind = "png" if number % 2 else "jpeg"
        name = f"img/{number:03d}.{'png' if kind == 'png' else 'jpg'}"
        write_image(root / name, rect_picture(number), kind)
        write_label_map(root / f"ann/{number:03d}.png", seg_rect_ids(number))
        rows.append({"path": name, "mask": f"ann/{number:03d}.png"})
    return write_list(pd.DataFrame(rows), root / "list.csv")
