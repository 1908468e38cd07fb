"""Semantic segmentation targets as the read side hands them over: a stored label map (`fastdata.formats.masks`)
-> a mask tensor `[H, W]` of class ids, uint8, or int64 when the dataset's maps are 16-bit (ids above 255)."""

from __future__ import annotations

import numpy as np
import torch

from fastdata.formats.manifest import Manifest
from fastdata.formats.masks import decode_label_map


def mask_dtype(manifest: Manifest) -> torch.dtype:
    """The dtype of a segmentation dataset's masks: uint8, or int64 when it holds 16-bit label maps."""
    return torch.int64 if (manifest.targets or {}).get("mask_dtype") == "int64" else torch.uint8


def segmentation_mask(raw: bytes, where: str, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """One sample's mask, `[H, W]` class ids of `dtype`; CorruptSampleError naming `where` when the stored bytes
    are not a label map."""
    ids = decode_label_map(raw, where)
    if dtype == torch.uint8:
        return torch.from_numpy(np.array(ids, dtype=np.uint8))  # a writable copy
    return torch.from_numpy(ids.astype(np.int64))
