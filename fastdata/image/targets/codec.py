"""What every target kind's codec does, and the one registry that picks it: a dataset's `target_kind` (the
manifest's) -> the codec that reads its samples' targets from storage (`read`, `from_json`), says what it holds
(`describe`), makes them a batch (`batch`) or one sample's target (`one`) and gives the loader's batches their
shape (`deliver`); one `fastdata.image.loader.ImageLoader` serves every kind. A new target kind is one codec class
and one entry in CODECS; the sample pipeline and the datasets ask here and never switch on the kind themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from fastdata.errors import ConfigError, NotADatasetError
from fastdata.formats.manifest import TARGET_KINDS, Manifest
from fastdata.image.targets.captions import CaptionCodec
from fastdata.image.targets.detection import DetectionCodec
from fastdata.image.targets.detection_custom import wrap_detection_custom
from fastdata.image.targets.labels import LabelCodec
from fastdata.image.targets.segmentation import SegmentationCodec
from fastdata.image.targets.segmentation_custom import wrap_segmentation_custom


class TargetCodec(Protocol):
    """How one kind of target travels from storage to a batch."""

    def read(self, reader: Any, index: int) -> Any:
        """Sample `index`'s stored target (LMDB)."""

    def from_json(self, meta: dict) -> Any:
        """A sample's stored target from its WebDataset metadata."""

    def describe(self) -> dict[str, Any]:
        """What the targets are, for the loader's description."""

    def batch(self, targets: Sequence[Any]) -> Any:
        """A batch's targets as the loader gives them."""

    def one(self, target: Any) -> Any:
        """One sample's target as `fastdata.dataset` gives it."""

    #: whether the targets follow the pixels' geometry: then the codec is a `SpatialCodec`, and has an entry in
    #: CUSTOM_WRAPPERS
    spatial: ClassVar[bool]
    #: whether augment=None gives each batch's images as a list (whole images of different sizes)
    whole_images_as_lists: ClassVar[bool]

    def deliver(self, batch: tuple) -> Any:
        """A batch `(images, targets[, metadata])` in the shape the loader gives it (a tuple, or a dict)."""


class SpatialCodec(TargetCodec, Protocol):
    """A TargetCodec whose targets follow the pixels' geometry (`spatial`): the sample pipeline gives each
    sample's stored target (its record) the crop, resize and flip of its image."""

    def record(self, sample: Any, where: str) -> Any:
        """The sample's stored target, checked against its image (CorruptSampleError naming `where`)."""

    def boxes_of(self, record: Any) -> Any:
        """The record's boxes (source pixels) that a detection preset's IoU-safe crop draws around, or None."""

    def whole(self, record: Any) -> Any:
        """The record's target as stored (augment=None)."""

    def placed(self, record: Any, placement: Any, canvas: tuple[int, int]) -> Any:
        """The record's target after `placement` (a preset's crop, resized to the top-left of `canvas`)."""

    def custom_input(self, record: Any) -> Any:
        """What a custom transform gets beside the image."""


def _no_caption_length(where: str, max_length: int | None) -> None:
    if max_length is not None:
        raise ConfigError(f"max_length: for text datasets and image-text pairs only; {where} holds images")


def _classes(manifest: Manifest, where: str, max_length: int | None, masks: bool) -> TargetCodec:
    _no_caption_length(where, max_length)
    return LabelCodec.of(manifest, where)


def _pairs(manifest: Manifest, where: str, max_length: int | None, masks: bool) -> TargetCodec:
    return CaptionCodec.of(manifest, where, max_length)


def _detection(manifest: Manifest, where: str, max_length: int | None, masks: bool) -> TargetCodec:
    _no_caption_length(where, max_length)
    return DetectionCodec(masks, LabelCodec.of(manifest, where))


def _segmentation(manifest: Manifest, where: str, max_length: int | None, masks: bool) -> TargetCodec:
    _no_caption_length(where, max_length)
    return SegmentationCodec.of(manifest, where)


#: target kind -> its codec, made from (manifest, where, max_length, masks)
CODECS: dict[str, Callable[[Manifest, str, int | None, bool], TargetCodec]] = {
    "class": _classes, "pairs": _pairs, "detection": _detection, "segmentation": _segmentation,
}
assert set(CODECS) == set(TARGET_KINDS), "every target kind the manifest knows has a codec"


#: codec type whose targets follow the pixels -> how a custom transform is adapted to carry them with the image
CUSTOM_WRAPPERS: dict[type, Callable[[Any, Any], Any]] = {
    DetectionCodec: lambda codec, augment: wrap_detection_custom(augment),
    SegmentationCodec: lambda codec, augment: wrap_segmentation_custom(augment, codec.dtype),
}


def wrap_spatial_custom(codec: Any, augment: Any) -> Any:
    """`augment` (a custom transform) adapted to carry the targets of `codec` (a spatial codec) with the pixels."""
    return CUSTOM_WRAPPERS[type(codec)](codec, augment)


def target_codec(manifest: Manifest, where: str, max_length: int | None = None, masks: bool = False
                 ) -> LabelCodec | CaptionCodec | DetectionCodec | SegmentationCodec:
    """How the samples of an image dataset carry their targets: class labels, captions (image-text pairs),
    detection targets (with their instance masks when `masks`) or semantic segmentation masks."""
    make = CODECS.get(manifest.target_kind)
    if make is None:
        raise NotADatasetError(f"{where}: unknown target kind {manifest.target_kind!r} in the manifest (known: "
                               f"{', '.join(TARGET_KINDS)}); upgrade fastdata")
    return make(manifest, where, max_length, masks)  # type: ignore[return-value]
