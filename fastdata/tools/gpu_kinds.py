"""How a dataset's stored images meet the GPU's JPEG decoders (`fastdata info`'s "GPU decode" line): how many are
baseline JPEGs, which NVIDIA's hardware JPEG engines decode; how many progressive, which only the CUDA/hybrid
decoders take; and how many the device path leaves to the CPU (`fastdata.image.jpeg.header.GPU_KINDS`).

A conversion counts them in its workers from the bytes it stores (the manifest's `stats["gpu_kinds"]`); for a
dataset converted before that, `scan_gpu_kinds` reads each stored image's frame header (a few hundred bytes of
each record, no decoding).
"""

from __future__ import annotations

import os
from collections import Counter

from fastdata.formats.manifest import Manifest
from fastdata.image.jpeg.header import GPU_KINDS, image_gpu_kind


def recorded_gpu_kinds(manifest: Manifest) -> dict[str, int] | None:
    """The counts the conversion recorded, by GPU_KINDS; None when it recorded none (an older dataset, text)."""
    kinds = manifest.stats.get("gpu_kinds")
    if not isinstance(kinds, dict):
        return None
    return {kind: int(kinds.get(kind, 0)) for kind in GPU_KINDS}


def scan_gpu_kinds(path: str | os.PathLike[str]) -> dict[str, int]:
    """Count the stored images of the image dataset at `path` (LMDB or WebDataset, local or remote) by GPU_KINDS,
    reading each one's header."""
    from fastdata.errors import ConfigError
    from fastdata.image.datasets import LmdbImageDataset, WdsImageDataset
    from fastdata.loader import dataset

    data = dataset(path)
    if isinstance(data, LmdbImageDataset):
        stored = (data.encoded(index).data for index in range(len(data)))
    elif isinstance(data, WdsImageDataset):
        stored = (sample.data for sample in data.encoded_samples(list(range(len(data.manifest.files)))))
    else:
        raise ConfigError(f"{path}: not an image dataset; only stored images have a GPU decode kind")
    counts = Counter(image_gpu_kind(image) for image in stored)
    return {kind: counts.get(kind, 0) for kind in GPU_KINDS}


def gpu_kinds_line(kinds: dict[str, int] | None, jpeg_layout: str = "original") -> str:
    """`fastdata info`'s line about `kinds` (None: not recorded at conversion, and not scanned)."""
    if kinds is None:
        return ("  GPU decode  not recorded at conversion (an older dataset): `fastdata info --scan-gpu PATH` reads "
                "each stored image's header to count the JPEGs the GPU's hardware engines take")
    total = sum(kinds.values())
    line = (f"  GPU decode  {kinds['baseline']:,} of {total:,} stored images are baseline JPEGs, which the GPU's "
            f"hardware JPEG engines decode; {kinds['progressive']:,} progressive (the CUDA/hybrid decoder only")
    if kinds["progressive"] and jpeg_layout == "original":
        line += "; `--jpeg-layout baseline` at conversion stores them baseline, losslessly"
    line += f"), {kinds['other_jpeg'] + kinds['not_jpeg']:,} decoded on the CPU"
    if kinds["not_jpeg"]:
        line += (f" ({kinds['not_jpeg']:,} not JPEGs: `--non-jpeg jpeg` at conversion stores them as JPEGs, "
                 "lossy)")
    return line
