"""Random access into local WebDataset image shards, so that a mixture can take any sample of them by index as it
does an LMDB dataset's: each shard's sample positions (the byte offset of each sample's first tar header) are read
once per process, by seeking from header to header without reading the members' bytes; a sample is then read on
its own from its position. The stream order of the shards (manifest order, each shard's stored order) gives the
indices, as `fastdata.dataset` iterates them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fastdata.errors import CorruptSampleError
from fastdata.formats.manifest import Manifest
from fastdata.formats.wds import sample_positions
from fastdata.image.batch import EncodedSample
from fastdata.image.datasets import WdsImageDataset


class IndexedShards:
    """A local WebDataset image dataset read by index (what `MixedImageDataset` needs of a source): `len`,
    `.manifest`, `.classes`, `encoded(i)`, `metadata(i)`, `.samples`, `.targets` and `.reader.key(i)`."""

    def __init__(self, data: WdsImageDataset) -> None:
        self.data = data
        self.manifest: Manifest = data.manifest
        self.root: Path | str = data.root
        self.starts = np.concatenate([[0], np.cumsum([f.samples for f in self.manifest.files])]).astype(np.int64)
        self._positions: dict[int, list[int]] = {}  # shard -> its samples' header positions, read when first asked
        self.reader = PartKeys(self)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def part_key(self, shard: int, local: int) -> str:
        """Sample `local` of shard `shard` as its messages name it: the shard's file name and the number."""
        return f"{self.manifest.files[shard].name}#{local}"

    def mapped_readers(self) -> tuple[()]:
        """None: each sample is read from its file, nothing is mapped."""
        return ()

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, sample number in that shard) of stream position `index`."""
        if not 0 <= index < len(self):
            raise IndexError(f"{self.root}: index {index} out of range for {len(self)} samples")
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        return shard, index - int(self.starts[shard])

    def positions(self, shard: int) -> list[int]:
        """Shard `shard`'s sample positions, checked against the sample count its manifest entry gives."""
        found = self._positions.get(shard)
        if found is None:
            where = self.data.shards[shard]
            fileobj, _seekable = self.data.store.open(shard)
            with fileobj:
                found = sample_positions(fileobj, where)
            expected = self.manifest.files[shard].samples
            if len(found) != expected:
                raise CorruptSampleError(f"{where}: holds {len(found)} samples, its manifest says {expected}; "
                                         "the shard was changed after conversion (fastdata verify names it)")
            self._positions[shard] = found
        return found

    def encoded(self, index: int) -> EncodedSample:
        """Stream position `index`'s sample as stored, read alone from its first tar header."""
        shard, local = self.locate(index)
        stream = self.data.shard_samples(shard, want=lambda o: o == local, start=(self.positions(shard)[local], local))
        try:
            offset, sample = next(stream)
        finally:
            stream.close()
        assert offset == local and sample is not None
        return sample

    def metadata(self, index: int) -> dict:
        """Sample `index`'s stored metadata ({} when the source had none)."""
        return dict(self.encoded(index).metadata or {})

    @property
    def samples(self) -> list[tuple[str, Any]]:
        """(path, label) per index, read from every shard (a multi-label sample's label: its list of class ids)."""
        return [(sample.key, _listed(sample.label)) for sample in self.data.encoded_samples(list(range(
            len(self.manifest.files))))]

    @property
    def targets(self) -> list[Any]:
        """Every sample's label, in index order."""
        return [label for _key, label in self.samples]


def _listed(label: Any) -> Any:
    return list(label) if isinstance(label, tuple) else label


class Parts(Protocol):
    """A dataset made of parts (shards, sources), as `PartKeys` reads it."""

    def locate(self, index: int) -> tuple[int, int]:
        """(part, number in that part) of sample `index`."""

    def part_key(self, part: int, local: int) -> str:
        """The key of sample `local` of part `part`, known without reading the sample."""

    def mapped_readers(self) -> Iterable[Any]:
        """The readers (`release_mapped()`) whose mapped pages a batch leaves behind."""


class PartKeys:
    """The reader methods a loader uses of a dataset made of parts: a sample's key for its messages (`key(i)`),
    and the mapped pages of the parts' readers given back once a batch is read (`release_mapped()`)."""

    def __init__(self, data: Parts) -> None:
        self.data = data

    def key(self, index: int) -> str:
        return self.data.part_key(*self.data.locate(index))

    def release_mapped(self) -> None:
        for reader in self.data.mapped_readers():
            reader.release_mapped()
