"""Custom transforms over detection samples: an albumentations `Compose` with `bbox_params` (boxes in
"pascal_voc", i.e. xyxy pixels), or a torchvision transforms.v2 transform (called with `tv_tensors.Image`,
`BoundingBoxes` and, with masks, `Mask`). Each box's row index travels as its label (every albumentations label
field; torchvision's "labels", which `SanitizeBoundingBoxes` filters by), so that the labels, iscrowd, area, ids and
masks of the boxes a transform keeps follow them, whatever it drops. Areas are scaled by how much each box's area
changed; boxes left with no area are dropped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from fastdata.errors import ConfigError
from fastdata.image.augment import torchvision_convention
from fastdata.image.targets.boxes import box_areas, nonempty
from fastdata.image.targets.detection import DetectionTarget

DetectionTransform = Callable[[np.ndarray, DetectionTarget, int], tuple[Any, DetectionTarget]]

ACCEPTED = ("augment for a detection dataset must be 'train', 'val', a detection preset (ScaleJitterCrop, "
            "ResizeLongerPad), an albumentations Compose with bbox_params=A.BboxParams(format='pascal_voc', "
            "label_fields=[...]), or a torchvision transforms.v2 transform")


def wrap_detection_custom(transform: Any) -> DetectionTransform:
    """`fn(hwc_uint8_rgb, whole_target, sample_seed) -> (image result, target in the result's pixels)`; ConfigError
    (one line, saying what is accepted) for any other transform."""
    try:
        import albumentations as A

        is_album = isinstance(transform, A.BaseCompose)
    except ImportError:  # pragma: no cover - albumentations is a dependency
        is_album = False
    if is_album:
        processor = getattr(transform, "processors", {}).get("bboxes")
        if processor is None or processor.params.format != "pascal_voc" or not processor.params.label_fields:
            raise ConfigError(ACCEPTED + f"; got an albumentations {type(transform).__name__} without them")
        return _albumentations(transform, list(processor.params.label_fields))
    if torchvision_convention(transform) == "v2":
        return _torchvision(transform)
    raise ConfigError(ACCEPTED + f"; got {type(transform).__name__}")


def _follow(target: DetectionTarget, rows: np.ndarray, boxes: np.ndarray, masks: Any) -> DetectionTarget:
    """`target` after a transform kept the boxes at `rows` as `boxes` (output pixels), with `masks` (all rows)."""
    rows = np.asarray(rows, np.int64).reshape(-1)
    before = box_areas(target.boxes[rows])
    kept = target.keep(rows)
    kept.boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    ratio = np.divide(box_areas(kept.boxes), before, out=np.zeros(len(rows)), where=before > 0)
    kept.area = (kept.area * ratio).astype(np.float32)
    if target.masks is not None:
        stacked = np.stack([np.asarray(m) for m in masks]) if len(masks) else None
        kept.masks = stacked[rows].astype(np.uint8) if stacked is not None else np.zeros((0, 0, 0), np.uint8)
    return kept.keep(nonempty(kept.boxes))


def _albumentations(compose: Any, label_fields: list[str]) -> DetectionTransform:
    def run(image: np.ndarray, target: DetectionTarget, seed: int) -> tuple[Any, DetectionTarget]:
        compose.set_random_seed(seed)
        rows = np.arange(len(target))
        given: dict[str, Any] = {"image": image, "bboxes": target.boxes, **{field: rows for field in label_fields}}
        if target.masks is not None:
            given["masks"] = list(target.masks)
        out = compose(**given)
        return out["image"], _follow(target, out[label_fields[0]], out["bboxes"], out.get("masks", []))

    return run


def _torchvision(transform: Any) -> DetectionTransform:
    from fastdata.image.augment import SeededGlobalRngs

    def run(image: np.ndarray, target: DetectionTarget, seed: int) -> tuple[Any, DetectionTarget]:
        import torch
        from torchvision import tv_tensors

        height, width = image.shape[:2]
        sample: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(torch.from_numpy(target.boxes), format="XYXY",
                                              canvas_size=(height, width)),
            "labels": torch.arange(len(target))}
        if target.masks is not None:
            sample["masks"] = tv_tensors.Mask(torch.from_numpy(target.masks))
        with SeededGlobalRngs(seed):
            result, out = transform(tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1).contiguous()), sample)
        masks = out["masks"].as_subclass(torch.Tensor).numpy() if "masks" in out else np.zeros(0, np.uint8)
        rows = out["labels"].numpy()
        all_masks: np.ndarray | list[np.ndarray] = []
        if len(masks):
            all_masks = np.zeros((len(target), *masks.shape[1:]), np.uint8)
            all_masks[rows] = masks  # torchvision filters masks with their boxes; put them back by row
        return result, _follow(target, rows, out["boxes"].as_subclass(torch.Tensor).numpy(), all_masks)

    return run
