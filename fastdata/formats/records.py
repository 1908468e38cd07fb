"""The record every format writer takes: one encoded image and what the reader needs to know about it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageRecord:
    """One image ready to store. `key` is the source-relative path, `ext` the member extension
    (`jpg`, `png`, ...) that matches the bytes, `codec` the decoder chosen at conversion time."""

    key: str
    data: bytes
    ext: str
    label: int
    width: int
    height: int
    codec: int
