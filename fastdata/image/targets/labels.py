"""Labels as the read side hands them over: single-label datasets give class ids (int64 `[B]` per batch, an `int`
per sample, as torchvision's ImageFolder does); multi-label datasets give multi-hot float32 rows (`[B, C]` per
batch, `[C]` per sample, C = the number of classes), ready for `BCEWithLogitsLoss`. One small picklable object that
the worker pipeline, the device path and the datasets share, so that every path builds labels alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch

from fastdata.errors import NotADatasetError
from fastdata.formats.manifest import Manifest
from fastdata.formats.records import LABEL_KINDS, Label, label_from_json


@dataclass(frozen=True)
class LabelCodec:
    """How a dataset's labels become tensors: `kind` "single" or "multi", over `num_classes` classes."""

    kind: str = "single"
    num_classes: int = 0

    @classmethod
    def of(cls, manifest: Manifest, where: str = "") -> LabelCodec:
        if manifest.label_kind not in LABEL_KINDS:
            raise NotADatasetError(f"{where or 'dataset'}: unknown label kind {manifest.label_kind!r} in the "
                                   f"manifest (known: {', '.join(LABEL_KINDS)}); upgrade fastdata")
        return cls(manifest.label_kind, len(manifest.classes))

    @property
    def multi(self) -> bool:
        return self.kind == "multi"

    def parse(self, value: Any) -> Label:
        """A label as a shard's JSON holds it -> a Label of this dataset, its class ids checked against the class
        count. Raises ValueError saying what is wrong (the caller names the sample)."""
        label = label_from_json(value, self.kind)
        ids = label if isinstance(label, tuple) else (label,)
        if any(not 0 <= i < self.num_classes for i in ids):
            raise ValueError(f"label {value!r} is outside the dataset's class ids 0..{self.num_classes - 1}")
        return label

    def read(self, reader: Any, index: int) -> Label:
        """Sample `index`'s label from an LMDB reader."""
        return reader.label(index)

    def from_json(self, meta: dict) -> Label:
        """A sample's label from its WebDataset `.json` (KeyError, TypeError or ValueError: the caller names the
        sample)."""
        return self.parse(meta["label"])

    def describe(self) -> dict[str, Any]:
        """What a loader state must match to resume (nothing beyond the dataset itself)."""
        return {}

    spatial: ClassVar[bool] = False  # the targets follow the pixels' geometry (see DetectionCodec)
    whole_images_as_lists: ClassVar[bool] = False  # augment=None gives a list of images per batch

    @staticmethod
    def deliver(batch: tuple) -> tuple:
        """A batch as the loader gives it: `(images, labels)` (+ metadata)."""
        return batch

    def batch(self, labels: Sequence[Label]) -> torch.Tensor:
        """The labels of a batch: int64 `[B]`, or multi-hot float32 `[B, C]`."""
        if not self.multi:
            return torch.tensor(labels, dtype=torch.int64)
        hot = torch.zeros((len(labels), self.num_classes), dtype=torch.float32)
        sets = cast(Sequence[tuple[int, ...]], labels)  # multi-label: tuples of class ids
        rows = [row for row, ids in enumerate(sets) for _ in ids]
        if rows:
            hot[rows, [i for ids in sets for i in ids]] = 1.0
        return hot

    def one(self, label: Label) -> int | torch.Tensor:
        """One sample's label: the class id, or its multi-hot float32 `[C]` row."""
        if not self.multi:
            return label  # type: ignore[return-value]
        return self.batch([label])[0]
