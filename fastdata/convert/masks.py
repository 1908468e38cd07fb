"""Semantic segmentation targets from label map files (`fastdata.formats.masks`), for any converter whose samples
name one per image (`fastdata convert list --mask-column`): a `TargetSource` of kind "segmentation".

At listing, `scan_label_maps` reads each map's PNG header: a missing file, a file that is not a lossless
single-channel PNG (JPEG, RGB colour map, alpha) is refused there, before anything is written, with the place the
caller names it by (list file and row). When the driver stores a sample, `record` reads the map whole, checks that
it still has the header it was listed with and that its ids are below `num_classes` (the ignore index apart), and
gives its stored bytes; the driver has checked its size against the decoded image's just before (`size`). Those
later problems reject the sample, named like an unreadable image. The ids the stored maps hold are counted into the
manifest's `targets` block, and kept with each checkpoint (`state` / `restore`) so that a resumed conversion counts
them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.convert.checkpoints import files_digest
from fastdata.errors import SourceError
from fastdata.formats.masks import HEADER_BYTES, LabelMapHeader, encode_label_map, label_map_header, label_map_ids


def scan_label_maps(paths: Sequence[Path], where: Callable[[int], str]) -> list[LabelMapHeader]:
    """The PNG header of each label map file; SourceError `"{where(i)}: label map PATH ..."` for the first that is
    missing, unreadable or not a lossless single-channel PNG."""
    headers = []
    for index, path in enumerate(paths):
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_BYTES)
        except FileNotFoundError:
            raise SourceError(f"{where(index)}: label map {path} does not exist") from None
        except OSError as exc:
            raise SourceError(f"{where(index)}: label map {path} is unreadable ({exc.strerror or exc})") from None
        try:
            headers.append(label_map_header(head))
        except ValueError as exc:
            raise SourceError(f"{where(index)}: label map {path} {exc}") from None
    return headers


class LabelMapTargets:
    """The label maps of a source's samples, in its samples' order (`fastdata.convert.sources.TargetSource`)."""

    kind = "segmentation"

    def __init__(self, paths: Sequence[Path], headers: Sequence[LabelMapHeader], ignore_index: int,
                 num_classes: int | None = None) -> None:
        self.paths = list(paths)
        self.headers = list(headers)
        self.ignore_index = ignore_index
        self.num_classes = num_classes
        self.wide = any(h.wide for h in self.headers)  # 16-bit ids somewhere: masks load as int64
        self.seen: set[int] = set()  # the class ids the stored maps hold (not the ignore index)

    def size(self, index: int) -> tuple[int, int]:
        header = self.headers[index]
        return header.width, header.height

    def record(self, index: int) -> bytes:
        """Sample `index`'s label map as stored (`noted_record`), its class ids counted."""
        data, ids = self.noted_record(index)
        self.observe(ids)
        return data

    def noted_record(self, index: int) -> tuple[bytes, list[int]]:
        """(sample `index`'s label map as stored: the file's bytes (greyscale), or its palette indices re-encoded
        as greyscale; the class ids it holds, for `observe`), without counting them: a conversion worker makes the
        record, the writer process counts. ValueError (the reject reason) when the map changed since listing or
        holds an id too large."""
        data, ids = self.read(index)
        values = np.unique(ids).tolist()
        if self.num_classes is not None:
            bad = [v for v in values if v >= self.num_classes and v != self.ignore_index]
            if bad:
                raise ValueError(f"label map {self.paths[index]} holds class id {bad[0]}, not below --num-classes "
                                 f"{self.num_classes} (nor the ignore index {self.ignore_index})")
        return (encode_label_map(ids) if self.headers[index].palette else data), values

    def observe(self, ids: list[int]) -> None:
        """Count the class ids a stored label map holds (the ignore index apart)."""
        self.seen.update(v for v in ids if v != self.ignore_index)

    def read(self, index: int) -> tuple[bytes, np.ndarray]:
        """The map's file bytes and its ids; ValueError naming the file when it no longer matches its listing."""
        path, listed = self.paths[index], self.headers[index]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"label map {path} unreadable ({exc.strerror or exc})") from None
        try:
            header = label_map_header(data[:HEADER_BYTES])
            if header != listed:
                raise ValueError(f"changed since it was listed ({header}, listed as {listed})")
            return data, label_map_ids(data, header)
        except ValueError as exc:
            raise ValueError(f"label map {path} {exc}") from None

    def digest(self) -> str:
        """Changes when a label map file is replaced, resized or touched, or the checks change."""
        return (f"{files_digest((str(p), p) for p in self.paths)} ignore_index={self.ignore_index} "
                f"num_classes={self.num_classes}")

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the class ids counted so far."""
        return {"seen": sorted(self.seen)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue counting from a checkpoint's `state`."""
        self.seen = set(state.get("seen", []))

    def info(self) -> dict[str, Any]:
        """The manifest's `targets` block."""
        return {"masks": "png", "mask_dtype": "int64" if self.wide else "uint8", "ignore_index": self.ignore_index,
                "num_classes": self.num_classes, "classes_seen": len(self.seen),
                "max_class_id": max(self.seen) if self.seen else None}
