"""torchvision ImageFolder's `.samples` and `.targets` of an LMDB dataset, as sequences read from storage when they are
asked for: opening a dataset of millions of samples builds no Python object per sample, and a loop over them
streams the keys with one cursor and the labels from their arrays. They compare equal to the lists ImageFolder has,
and `np.asarray(ds.targets)` of a single-label dataset is its label array, without a Python int per sample."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from fastdata.formats.lmdb import LmdbReader


class _StoredList(Sequence):
    """A read-only sequence over the samples of an LMDB dataset; equal to a list with the same items."""

    def __init__(self, reader: LmdbReader) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return self.reader.num_samples

    def _item(self, index: int) -> Any:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        number = index + len(self) if index < 0 else index
        if not 0 <= number < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        return self._item(number)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, _StoredList)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like a list

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} samples of {self.reader.directory})"


def _as_list(label: int | tuple[int, ...]) -> int | list[int]:
    return list(label) if isinstance(label, tuple) else label


class StoredSamples(_StoredList):
    """`(source-relative path, label)` per index, as torchvision's ImageFolder.samples (a multi-label sample's
    label: the list of its class ids)."""

    def _item(self, index: int) -> tuple[str, Any]:
        return self.reader.key(index), _as_list(self.reader.label(index))

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return zip(self.reader.iter_keys(), self.reader.iter_labels(), strict=True)


class StoredTargets(_StoredList):
    """Every sample's label, as torchvision's ImageFolder.targets: class ids, or (multi-label) lists of them."""

    def _item(self, index: int) -> Any:
        return _as_list(self.reader.label(index))

    def __iter__(self) -> Iterator[Any]:
        return self.reader.iter_labels()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """A single-label dataset's labels as an array (int32 as stored, or `dtype`), made from the label array."""
        if self.reader.label_kind != "single":
            raise TypeError(f"{self.reader.directory}: a multi-label dataset's targets are lists of class ids of "
                            "varying length, not an array; use reader.label(i)")
        labels = self.reader.labels
        return labels.astype(dtype if dtype is not None else labels.dtype, copy=True if copy is None else copy)
