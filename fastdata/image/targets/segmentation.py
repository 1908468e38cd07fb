"""Semantic segmentation targets as the read side hands them over: a stored label map (`fastdata.formats.masks`) -> a
mask of class ids `[H, W]`, uint8, or int64 when the dataset's maps are 16-bit (ids above 255).

`SegmentationCodec` takes the place of `LabelCodec` in the sample pipeline (as `DetectionCodec` does for detection):
the pipeline reads each sample's stored label map (`EncodedSample.target`), maps it with exactly the geometry its
pixels got (`placed`: the detection presets' crop, nearest-centre sampling of `fastdata.image.targets.boxes`, the
canvas' padding filled with the dataset's ignore index) and leaves the result as `EncodedSample.made`, so that a
mask travels with its image through every path of the loader; `batch` stacks a batch's masks into one `[B, H, W]`
tensor (in shared memory inside a DataLoader worker, as torch's default_collate makes it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.formats.manifest import Manifest
from fastdata.formats.masks import DEFAULT_IGNORE_INDEX, decode_label_map
from fastdata.formats.records import Label
from fastdata.image.detection_presets import Placement
from fastdata.image.targets.boxes import map_masks
from fastdata.image.targets.labels import LabelCodec
from fastdata.workers import new_shared


def mask_dtype(manifest: Manifest) -> torch.dtype:
    """The dtype of a segmentation dataset's masks: uint8, or int64 when it holds 16-bit label maps."""
    return torch.int64 if (manifest.targets or {}).get("mask_dtype") == "int64" else torch.uint8


def as_mask(ids: Any, dtype: torch.dtype) -> torch.Tensor:
    """Class ids (a numpy array or tensor `[H, W]`, any integer dtype) as a mask tensor of `dtype`, its own
    memory."""
    if isinstance(ids, torch.Tensor):
        return ids.as_subclass(torch.Tensor).to(dtype, copy=True)
    ids = np.asarray(ids)
    return torch.from_numpy(ids.astype(np.uint8 if dtype == torch.uint8 else np.int64))


@dataclass(frozen=True)
class SegmentationCodec:
    """How a semantic segmentation dataset's masks follow its images: each sample's stored label map (read with
    it: `EncodedSample.target`), mapped by the pipeline with the sample's geometry into masks of `dtype`, the
    canvas' padding set to `ignore_index`, and stacked per batch. A sample's `label` stays what the dataset
    stores beside its map (`classes`)."""

    dtype: torch.dtype = torch.uint8
    ignore_index: int = DEFAULT_IGNORE_INDEX
    classes: LabelCodec = field(default_factory=LabelCodec)

    @classmethod
    def of(cls, manifest: Manifest, where: str) -> SegmentationCodec:
        ignore = int((manifest.targets or {}).get("ignore_index", DEFAULT_IGNORE_INDEX))
        dtype = torch.int64 if ignore > 255 else mask_dtype(manifest)  # masks hold the ignore index as padding
        return cls(dtype, ignore, LabelCodec.of(manifest, where))

    def read(self, reader: Any, index: int) -> Label:
        """Sample `index`'s stored label (its label map travels as `EncodedSample.target`)."""
        return self.classes.read(reader, index)

    def from_json(self, meta: dict) -> Label:
        """A WebDataset sample's stored label (its label map is its `.seg.png` member)."""
        return self.classes.from_json(meta)

    def describe(self) -> dict[str, Any]:
        """What a loader state must match to resume."""
        return {"masks": str(self.dtype).removeprefix("torch."), "ignore_index": self.ignore_index}

    spatial: ClassVar[bool] = True  # the sample pipeline maps each label map with its image's geometry
    whole_images_as_lists: ClassVar[bool] = False

    @staticmethod
    def deliver(batch: tuple) -> tuple:
        """A batch as the loader gives it: `(images, masks)` (+ metadata)."""
        return batch

    @staticmethod
    def custom_input(record: np.ndarray) -> np.ndarray:
        """What the wrapped custom transform gets beside the image: the stored label map."""
        return record

    def record(self, sample: Any, where: str) -> np.ndarray:
        """The sample's stored label map (uint8 or uint16 `[H, W]`), checked against its image: CorruptSampleError
        naming `where` when it is missing, damaged, or of another size than the image."""
        if sample.target is None:
            raise CorruptSampleError(f"{where}: has no stored label map")
        ids = decode_label_map(sample.target, where)
        if ids.shape != (sample.height, sample.width):
            raise CorruptSampleError(f"{where}: its label map is {ids.shape[1]}x{ids.shape[0]}, but the image is "
                                     f"{sample.width}x{sample.height}")
        return ids

    def boxes_of(self, record: np.ndarray) -> None:
        """No boxes steer a segmentation sample's crop (the detection presets' IoU-safe crop is for boxes)."""
        return None

    def whole(self, record: np.ndarray) -> torch.Tensor:
        """The label map as stored, as a mask of `dtype`."""
        return as_mask(record, self.dtype)

    def placed(self, record: np.ndarray, placement: Placement, canvas: tuple[int, int]) -> torch.Tensor:
        """The label map after the crop of `placement` was resized to its size at the top-left of `canvas`:
        sampled nearest-centre (`fastdata.image.targets.boxes.map_masks`, the pixels' exact crop, scale and flip),
        the rest of the canvas set to the ignore index."""
        if self.ignore_index > np.iinfo(record.dtype).max:  # an ignore index an 8-bit map cannot hold
            record = record.astype(np.uint16)
        mapped = map_masks(record[None], placement.crop, *placement.size, canvas, fill=self.ignore_index)[0]
        return as_mask(mapped, self.dtype)

    def batch(self, masks: Sequence[torch.Tensor]) -> torch.Tensor:
        """The masks of a batch stacked, `[B, H, W]` of `dtype`; ConfigError when their sizes differ (whole
        images of different sizes)."""
        if not masks:
            return torch.empty((0, 0, 0), dtype=self.dtype)
        shapes = {tuple(mask.shape) for mask in masks}
        if len(shapes) > 1:
            raise ConfigError(f"cannot batch masks of different sizes {sorted(shapes)}: use augment='train'/'val' "
                              "(a padded canvas) or a transform that ends in a fixed size")
        shape = (len(masks), *masks[0].shape)
        out = torch.empty(shape, dtype=self.dtype) if torch.utils.data.get_worker_info() is None \
            else new_shared(shape, self.dtype)
        return torch.stack([mask.to(self.dtype) for mask in masks], out=out)

    def one(self, mask: torch.Tensor) -> torch.Tensor:
        """One sample's mask `[H, W]`."""
        return mask
