"""Optional peer loaders for the image benchmarks: FFCV and NVIDIA DALI (CPU operators), each built from the
same source files as fastdata's conversion and run with the bench's settings (workers, batch size, transform,
warm-up: `fastdata.tools.bench.run_contenders`). Neither is a dependency of fastdata; install them with
benchmarks/requirements-peers.txt (see benchmarks/README.md). A peer that cannot be imported or built raises
`PeerUnavailable` with the reason, and the script leaves its row out and prints why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fastdata.tools.bench import BenchConfig, Contender, LoaderResult
from fastdata.tools.bench_baseline import Baseline


class PeerUnavailable(Exception):
    """The peer cannot run here; the message says why."""


def _need(module: str, peer: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken native library
        raise PeerUnavailable(f"{peer} is not importable here ({type(exc).__name__}: {exc}); "
                              "install it with benchmarks/requirements-peers.txt (see benchmarks/README.md)") from exc


# ---------------------------------------------------------------------------------------------------- FFCV


def ffcv_beton(source: Baseline, out: Path, max_resolution: int | None, workers: int, quality: int = 90) -> Path:
    """FFCV's own dataset file, written by FFCV's writer from the source images (the files fastdata's conversion
    accepted): RGBImageField(write_mode="jpg") re-encodes every image at JPEG `quality` (as FFCV always does),
    with its longer side capped at `max_resolution` if given (FFCV's counterpart of `--max-size`). Built once
    under a temporary name; prints the writer's images/s."""
    _need("ffcv", "FFCV")
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from torchvision.datasets import ImageFolder

    if out.is_file():
        return out
    skip = source.excluded_paths
    data = ImageFolder(str(source.root), allow_empty=True,
                       is_valid_file=lambda p: Path(p).relative_to(source.root).as_posix() not in skip
                       and p.lower().endswith((".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff")))
    tmp = out.with_name(out.name + ".tmp")
    fields = {"image": RGBImageField(write_mode="jpg", max_resolution=max_resolution, jpeg_quality=quality),
              "label": IntField()}
    started = time.perf_counter()
    DatasetWriter(str(tmp), fields, num_workers=workers).from_indexed_dataset(data)
    seconds = time.perf_counter() - started
    os.replace(tmp, out)
    print(f"  FFCV's writer: {len(data):,} images in {seconds:.1f} s ({len(data) / seconds:,.0f} images/s) -> "
          f"{out.name}, {out.stat().st_size / 1e6:,.1f} MB")
    return out


def ffcv_contender(beton: Path, config: BenchConfig, name: str) -> Contender:
    """FFCV's Loader over `beton`: random order, its own crop decoders (RandomResizedCrop + flip for "train",
    centre crop of ratio 224/256 for "val"), uint8 [B, 3, H, W] batches like the other loaders' (in FFCV's default
    channels_last memory format, which its examples use and which spares a copy); `num_workers` threads
    and as many batches ahead as the DataLoaders keep in flight (prefetch_factor x workers)."""
    _need("ffcv", "FFCV")
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    size, settings = config.image_size, config.settings
    workers = max(1, settings.num_workers)

    def make() -> Iterable:
        if config.augment == "train":
            image = [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip()]
        else:
            image = [CenterCropRGBImageDecoder((size, size), ratio=size / int(size / 0.875))]
        image += [ToTensor(), ToTorchImage()]  # FFCV's default and its examples': channels_last, no copy
        return Loader(str(beton), batch_size=config.batch_size, num_workers=workers, order=OrderOption.RANDOM,
                      os_cache=True, drop_last=False, batches_ahead=settings.prefetch_factor * workers,
                      pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]})

    count = _beton_samples(beton)
    return Contender(LoaderResult(name), make, beton.stat().st_size / max(1, count), [beton])


def _beton_samples(beton: Path) -> int:
    from ffcv.reader import Reader

    return int(Reader(str(beton)).num_samples)


# ---------------------------------------------------------------------------------------------------- DALI


def dali_contender(source: Baseline, config: BenchConfig, name: str) -> Contender:
    """NVIDIA DALI on the CPU (device_id=None) over the same files as the ImageFolder baseline: its file reader
    (shuffled), ROI decode `decoders.image_random_crop` + resize + flip for "train", decode + resize shorter side
    + centre crop for "val", the flip and crop fused with the layout change (`crop_mirror_normalize`, as DALI's
    examples do); uint8 NCHW; `num_workers` threads."""
    _need("nvidia.dali", "NVIDIA DALI")
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    size, settings = config.image_size, config.settings
    from torchvision.datasets.folder import find_classes

    _, class_to_idx = find_classes(str(source.root))  # ImageFolder's labels
    files = [str(p) for p in source.files]
    labels = [class_to_idx[Path(p).relative_to(source.root).parts[0]] for p in files]

    @pipeline_def
    def pipeline():
        jpegs, label = fn.readers.file(files=files, labels=labels, random_shuffle=True, name="Reader")
        # DALI's own ResNet-50 example: flip (and, for val, the centre crop) fused with the HWC -> CHW layout
        # change in one crop_mirror_normalize, here with uint8 output (mean 0, std 1) like the other loaders'
        if config.augment == "train":
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_x=size, resize_y=size)
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                              mirror=fn.random.coin_flip())
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=int(size / 0.875))
            images = fn.crop_mirror_normalize(images, crop=(size, size), dtype=types.UINT8, output_layout="CHW")
        return images, label

    def make() -> Iterable:
        pipe = pipeline(batch_size=config.batch_size, num_threads=max(1, settings.num_workers), device_id=None,
                        seed=0, prefetch_queue_depth=settings.prefetch_factor)
        pipe.build()
        return DaliBatches(DALIGenericIterator([pipe], ["images", "labels"], reader_name="Reader",
                                               last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True))

    per_image = sum(p.stat().st_size for p in source.files) / max(1, len(source.files))
    return Contender(LoaderResult(name), make, per_image, list(source.files))


class DaliBatches:
    """A DALI iterator as `(images, labels)` batches, one epoch per iteration."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for (batch,) in self.iterator:
            yield batch["images"], batch["labels"].reshape(-1)
