"""Detection targets as the read side hands them over: a stored record (`fastdata.formats.targets`) -> the dict of
tensors torchvision's detection models take, masks decoded from their COCO RLE with pycocotools only when asked."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fastdata.errors import ConfigError
from fastdata.formats.manifest import Manifest
from fastdata.formats.targets import DetectionRecord, decode_detection


def check_targets(manifest: Manifest, where: str, masks: bool) -> None:
    """Refuse `masks=True` where there are no masks to give (an unknown target kind is refused by
    `fastdata.image.captions.target_codec`)."""
    if manifest.target_kind != "detection":
        if masks:
            what = {"pairs": "image-text pairs", "segmentation": "semantic segmentation label maps, which every "
                    "sample gives as its mask without masks=True"}.get(manifest.target_kind, "class labels only")
            raise ConfigError(f"{where}: masks=True applies to detection datasets (fastdata convert coco); this one "
                              f"holds {what}")
        return
    if masks and not (manifest.targets or {}).get("masks"):
        raise ConfigError(f"{where}: masks=True, but this detection dataset holds no masks (its annotations had no "
                          "segmentations)")


def decode_masks(record: DetectionRecord) -> torch.Tensor:
    """The record's masks, uint8 `[N, H, W]` (0/1), decoded from their RLE with pycocotools."""
    if record.rles is None:
        raise ConfigError(f"image {record.image_id}: its detection target holds no masks")
    if not record.rles:
        return torch.zeros((0, record.height, record.width), dtype=torch.uint8)
    try:
        from pycocotools import mask
    except ImportError as exc:
        raise ConfigError("masks=True decodes COCO RLE masks with pycocotools: pip install 'fastdata[coco]'") from exc
    size = [record.height, record.width]
    decoded = mask.decode([{"size": size, "counts": rle} for rle in record.rles])  # [H, W, N], Fortran order
    return torch.from_numpy(np.ascontiguousarray(decoded.transpose(2, 0, 1)))


def detection_target(raw: bytes, where: str, masks: bool = False) -> dict[str, Any]:
    """One sample's target: `boxes` float32 `[N, 4]` (xyxy, source pixels), `labels` int64 `[N]`, `iscrowd` int64
    `[N]`, `area` float32 `[N]`, `annotation_ids` int64 `[N]`, `image_id` (int), and with `masks` uint8 `[N, H, W]`.
    `where` names the sample in errors."""
    record = decode_detection(raw, where)
    target: dict[str, Any] = {
        "boxes": torch.from_numpy(record.boxes.astype(np.float32)),  # astype copies: the record's bytes are read-only
        "labels": torch.from_numpy(record.labels.astype(np.int64)),
        "iscrowd": torch.from_numpy(record.iscrowd.astype(np.int64)),
        "area": torch.from_numpy(record.areas.astype(np.float32)),
        "annotation_ids": torch.from_numpy(record.ids.astype(np.int64)),
        "image_id": int(record.image_id),
    }
    if masks:
        target["masks"] = decode_masks(record)
    return target
