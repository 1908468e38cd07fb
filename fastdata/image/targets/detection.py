"""Detection targets as the read side hands them over: a stored record (`fastdata.formats.targets`) -> the dict of
tensors torchvision's detection models take, masks decoded from their COCO RLE with pycocotools only when asked.

`DetectionCodec` takes the place of `LabelCodec` in the sample pipeline (as `CaptionCodec` does for pairs): the
pipeline reads each sample's stored record (`EncodedSample.target`), maps it with the geometry its pixels got
(`placed`) and leaves the result as the sample's label, so that a target travels with its image through every path
of the loader (a skipped image drops its target, a borrowed sample brings its own); `batch` packs a batch's targets
into a `DetectionBatch` of a few concatenated tensors (cheap to hand over from a worker, pinnable)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch

from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.formats.manifest import Manifest
from fastdata.formats.records import Label
from fastdata.formats.targets import DetectionRecord, decode_detection
from fastdata.image.detection_presets import Placement, scale_area
from fastdata.image.handover import fields_by_value, rebuilt
from fastdata.image.targets.boxes import map_boxes, map_masks, nonempty
from fastdata.image.targets.labels import LabelCodec


def check_targets(manifest: Manifest, where: str, masks: bool) -> None:
    """Refuse `masks=True` where there are no masks to give (an unknown target kind is refused by
    `fastdata.image.targets.codec.target_codec`)."""
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
    if masks:
        _rle_decoder()  # missing: said when the dataset is opened, not at its first sample


def _rle_decoder() -> Any:
    """pycocotools' mask module (COCO RLE decoding), or ConfigError with the install command."""
    try:
        from pycocotools import mask
    except ImportError as exc:
        raise ConfigError("masks=True decodes COCO RLE masks with pycocotools: pip install 'fastdata[coco]'") from exc
    return mask


def mask_array(record: DetectionRecord) -> np.ndarray:
    """The record's masks as a C-contiguous uint8 array `[N, H, W]` (0/1), decoded from their RLE (pycocotools)."""
    if record.rles is None:
        raise ConfigError(f"image {record.image_id}: its detection target holds no masks")
    if not record.rles:
        return np.zeros((0, record.height, record.width), np.uint8)
    mask = _rle_decoder()
    size = [record.height, record.width]
    decoded = mask.decode([{"size": size, "counts": rle} for rle in record.rles])  # [H, W, N], Fortran order
    return np.ascontiguousarray(decoded.transpose(2, 0, 1))


#: Each annotation's fields, as targets and batches name them, in their order: name -> (the stored record's
#: attribute, dtype, the shape of one annotation's value). Everything that goes over them goes over this table.
ANNOTATION_FIELDS: dict[str, tuple[str, type, tuple[int, ...]]] = {
    "boxes": ("boxes", np.float32, (4,)), "labels": ("labels", np.int64, ()), "iscrowd": ("iscrowd", np.int64, ()),
    "area": ("areas", np.float32, ()), "annotation_ids": ("ids", np.int64, ())}


@dataclass
class DetectionTarget:
    """One sample's target as the pipeline made it (output pixels): `boxes` float32 [N, 4] xyxy, `labels`,
    `iscrowd`, `annotation_ids` int64 [N], `area` float32 [N], `image_id`, and `masks` uint8 [N, H, W] or None."""

    image_id: int
    boxes: np.ndarray
    labels: np.ndarray
    iscrowd: np.ndarray
    area: np.ndarray
    annotation_ids: np.ndarray
    masks: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.boxes)

    def keep(self, rows: np.ndarray) -> DetectionTarget:
        """The annotations at `rows` (a bool mask or indices) only."""
        return replace(self, **{name: getattr(self, name)[rows] for name in ANNOTATION_FIELDS},
                       masks=None if self.masks is None else self.masks[rows])

    def as_dict(self) -> dict[str, Any]:
        """The dict torchvision's detection references use (tensors; `image_id` an int)."""
        out: dict[str, Any] = {name: torch.from_numpy(getattr(self, name)) for name in ANNOTATION_FIELDS}
        out["image_id"] = self.image_id
        if self.masks is not None:
            out["masks"] = torch.from_numpy(self.masks)
        return out


def _of_record(record: DetectionRecord) -> DetectionTarget:
    """The record's annotations as stored (source pixels), copied (a record's arrays are read-only)."""
    return DetectionTarget(int(record.image_id), **{
        name: getattr(record, stored).astype(dtype).reshape(-1, *shape)
        for name, (stored, dtype, shape) in ANNOTATION_FIELDS.items()})


_TENSORS = (*ANNOTATION_FIELDS, "image_ids", "counts", "masks")


@dataclass
class DetectionBatch:
    """The targets of a batch, in the batch's order, as a few concatenated tensors (one pickle and one pin per
    field, however many boxes): annotation fields over all M boxes of the batch (`boxes` float32 [M, 4], `labels`,
    `iscrowd`, `annotation_ids` int64 [M], `area` float32 [M], `masks` uint8 [M, H, W], or None; whole images of
    different sizes: a list of each image's uint8 [N_i, H_i, W_i]), and per image `image_ids` and `counts` (int64
    [B]: image i's boxes follow the `counts[:i].sum()` before them)."""

    boxes: torch.Tensor
    labels: torch.Tensor
    iscrowd: torch.Tensor
    area: torch.Tensor
    annotation_ids: torch.Tensor
    image_ids: torch.Tensor
    counts: torch.Tensor
    masks: torch.Tensor | list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.counts)

    def _apply(self, fn: Any) -> DetectionBatch:
        def apply(value: Any) -> Any:
            return [fn(part) for part in value] if isinstance(value, list) else fn(value)

        values: dict[str, Any] = {name: None if getattr(self, name) is None else apply(getattr(self, name))
                                  for name in _TENSORS}
        return DetectionBatch(**values)

    def pin_memory(self) -> DetectionBatch:
        return self._apply(lambda tensor: tensor.pin_memory())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """From a worker to the main process: each small field by value, masks as shared memory
        (fastdata.image.handover: each shared tensor costs the main process a handshake with the worker)."""
        return rebuilt, (DetectionBatch, fields_by_value(self))

    def to(self, device: torch.device, non_blocking: bool = False) -> DetectionBatch:
        return self._apply(lambda tensor: tensor.to(device, non_blocking=non_blocking))

    def as_list(self) -> list[dict[str, Any]]:
        """One target dict per image (views of the batch's tensors): `boxes`, `labels`, `iscrowd`, `area`,
        `annotation_ids`, `image_id` (int), and `masks` when the batch has them."""
        counts = self.counts.tolist()
        parts = {name: getattr(self, name).split(counts) for name in ANNOTATION_FIELDS}
        if self.masks is not None:
            parts["masks"] = self.masks if isinstance(self.masks, list) else self.masks.split(counts)
        image_ids = self.image_ids.tolist()
        return [{**{name: parts[name][row] for name in parts}, "image_id": image_ids[row]}
                for row in range(len(counts))]


@dataclass(frozen=True)
class DetectionCodec:
    """How a detection dataset's targets follow its images: the stored record of each sample (read with it:
    `EncodedSample.target`), mapped by the pipeline with the sample's geometry (`EncodedSample.made`), and
    batched; `masks`: with the instance masks (decoded from their RLE). A sample's `label` stays its stored class
    set (`classes`), which `fastdata verify` checks."""

    masks: bool = False
    classes: LabelCodec = field(default_factory=lambda: LabelCodec("multi"))

    def read(self, reader: Any, index: int) -> Label:
        """Sample `index`'s stored class set (its target travels as `EncodedSample.target`)."""
        return self.classes.read(reader, index)

    def from_json(self, meta: dict) -> Label:
        """A WebDataset sample's stored class set (its target is its `.det` member)."""
        return self.classes.from_json(meta)

    def describe(self) -> dict[str, Any]:
        """What a loader state must match to resume."""
        return {"detection": True, "masks": self.masks}

    spatial: ClassVar[bool] = True  # the sample pipeline maps each record with its image's geometry
    whole_images_as_lists: ClassVar[bool] = True  # augment=None: images of different sizes, a list per batch

    @staticmethod
    def deliver(batch: tuple) -> tuple:
        """A batch as the loader gives it: `(images, targets)`, targets a list of B dicts
        (`DetectionBatch.as_list`) (+ metadata)."""
        images, targets, *metadata = batch
        return (images, targets.as_list(), *metadata)

    def custom_input(self, record: DetectionRecord) -> Any:
        """What the wrapped custom transform gets beside the image: the whole image's target."""
        return self.whole(record)

    def record(self, sample: Any, where: str) -> DetectionRecord:
        """The sample's stored record, checked against its image: CorruptSampleError naming `where` when it is
        missing, damaged, or made for an image of another size."""
        if sample.target is None:
            raise CorruptSampleError(f"{where}: has no stored detection target")
        record = decode_detection(sample.target, where)
        if (record.width, record.height) != (sample.width, sample.height):
            raise CorruptSampleError(f"{where}: its detection target (image {record.image_id}) is for a "
                                     f"{record.width}x{record.height} image, but the image is "
                                     f"{sample.width}x{sample.height}")
        return record

    def boxes_of(self, record: DetectionRecord) -> np.ndarray:
        """The record's boxes (source pixels), which the IoU-safe crop of a preset draws around."""
        return record.boxes

    def whole(self, record: DetectionRecord) -> DetectionTarget:
        """The record's target as stored (source pixels; masks decoded when asked)."""
        target = _of_record(record)
        if self.masks:
            target.masks = mask_array(record)
        return target

    def placed(self, record: DetectionRecord, placement: Placement, canvas: tuple[int, int]) -> DetectionTarget:
        """The record's target after the crop of `placement` was resized to its size at the top-left of `canvas`:
        boxes mapped and clipped to the placed image, those left with no area dropped with their other fields,
        areas scaled, masks mapped by nearest neighbour into the canvas (padded with 0)."""
        target = _of_record(record)
        crop, (out_h, out_w) = placement.crop, placement.size
        target.boxes = map_boxes(target.boxes, crop, out_h, out_w)
        target.area = scale_area(target.area, crop, out_h, out_w)
        kept = nonempty(target.boxes)
        target = target.keep(kept)
        if self.masks:
            target.masks = map_masks(mask_array(record)[kept], crop, out_h, out_w, canvas)
        return target

    def batch(self, targets: Sequence[DetectionTarget]) -> DetectionBatch:
        def cat(name: str, dtype: Any, shape: tuple[int, ...]) -> torch.Tensor:
            arrays = [getattr(t, name) for t in targets]
            return torch.from_numpy(np.concatenate(arrays) if arrays else np.zeros((0, *shape), dtype))

        masks: torch.Tensor | list[torch.Tensor] | None = None
        if self.masks and len({t.masks.shape[1:] for t in targets if t.masks is not None}) > 1:
            # whole images (augment=None) of different sizes: each image's masks in its own geometry
            masks = [torch.from_numpy(t.masks) for t in targets]
        elif self.masks:
            shapes = {t.masks.shape[1:] for t in targets if t.masks is not None and len(t.masks)}
            size = shapes.pop() if shapes else (0, 0)
            arrays = [t.masks if t.masks is not None and len(t.masks) else np.zeros((0, *size), np.uint8)
                      for t in targets]
            masks = torch.from_numpy(np.concatenate(arrays) if arrays else np.zeros((0, *size), np.uint8))
        annotations = {name: cat(name, dtype, shape) for name, (_, dtype, shape) in ANNOTATION_FIELDS.items()}
        return DetectionBatch(**annotations,
                              image_ids=torch.tensor([t.image_id for t in targets], dtype=torch.int64),
                              counts=torch.tensor([len(t) for t in targets], dtype=torch.int64), masks=masks)

    def one(self, target: DetectionTarget) -> dict[str, Any]:
        """One sample's target dict (`DetectionTarget.as_dict`)."""
        return target.as_dict()
