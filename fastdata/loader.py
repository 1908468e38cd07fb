"""Composition root for reading: `dataset()` and `loader()` over a converted dataset."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from fastdata.config import LoaderOptions, available_cores, check_int
from fastdata.errors import ConfigError, NotADatasetError
from fastdata.formats.manifest import read_manifest
from fastdata.formats.registry import storage
from fastdata.formats.remote import RemoteOptions, is_url
from fastdata.image.datasets import LmdbImageDataset, WdsImageDataset
from fastdata.image.loader import ImageLoader, ImageOptions
from fastdata.order.ranks import check_uneven, resolve_world
from fastdata.text.dataset import TextDataset
from fastdata.text.loader import TextLoader, TextOptions, text_loader


def dataset(path: str | os.PathLike[str], augment: Any = None, *, image_size: int = 224, seed: int = 0,
            on_error: str = "raise", cache_dir: str | os.PathLike[str] | None = None,
            cache_max_bytes: int | str | None = None, storage_options: dict[str, Any] | None = None,
            rank: int | None = None, world_size: int | None = None, uneven: str = "pad"
            ) -> LmdbImageDataset | WdsImageDataset | TextDataset:
    """Open a converted dataset for your own DataLoader.

    LMDB gives a map-style dataset (`len`, `ds[i] -> (uint8 CHW tensor, label)`, `.classes`,
    `.class_to_idx`, `.samples` as torchvision's ImageFolder has them); WebDataset shards give an iterable
    one (`len`, `.classes`, iteration in stored order). `augment` is None (full image), "train", "val",
    an albumentations transform or a callable on an HWC uint8 array.
    The iterable WebDataset dataset splits its stream between the DataLoader workers that iterate it and between
    ranks (`rank`/`world_size`, else torch.distributed's when initialised; `uneven` as for `loader`), so every
    sample comes once per pass; `len()` is this rank's count. (A map-style LMDB dataset takes your sampler, e.g.
    DistributedSampler, instead.)
    A text dataset (either format) gives `len` = documents, `ds[i] -> {"input_ids": int64 tensor}`,
    `.tokenizer`, `.total_tokens` (the image arguments do not apply).
    An http(s):// or s3:// URL of a WebDataset image conversion opens it remotely (shards verified against
    the manifest as they stream in; `cache_dir` keeps them, bounded by `cache_max_bytes`; `storage_options`
    go to fsspec).
    """
    explicit_world = rank is not None or world_size is not None
    rank, world_size = resolve_world(rank, world_size)
    check_uneven(uneven)
    data = _open_dataset(path, augment, image_size=image_size, seed=seed, on_error=on_error,
                         remote=RemoteOptions(cache_dir, cache_max_bytes, storage_options))
    if isinstance(data, WdsImageDataset):
        return data.split(rank, world_size, uneven)
    if explicit_world:
        raise ConfigError(f"{path}: rank and world_size split iterable (WebDataset) datasets; this dataset is "
                          "map-style: give your DataLoader a DistributedSampler, or use fastdata.loader")
    return data


def _open_dataset(path: str | os.PathLike[str], augment: Any = None, *, image_size: int = 224, seed: int = 0,
                  on_error: str = "raise", remote: RemoteOptions | None = None
                  ) -> LmdbImageDataset | WdsImageDataset | TextDataset:
    """The dataset at `path`, whole (the loader splits epochs between ranks itself)."""
    check_int("image_size", image_size, minimum=1)
    check_int("seed", seed)
    if augment is not None and not isinstance(augment, str) and not callable(augment):
        raise ConfigError(f"augment must be None, 'train', 'val', an albumentations transform or a callable on an "
                          f"HWC uint8 array, got {augment!r} ({type(augment).__name__})")
    remote = remote or RemoteOptions()
    if is_url(path):
        store = remote.shards(str(path))
        return WdsImageDataset(store.url, store.manifest, augment=augment, image_size=image_size, seed=seed,
                               on_error=on_error, store=store)
    if remote.given:
        raise ConfigError(f"cache_dir, cache_max_bytes and storage_options apply to remote URLs; {path} is local")
    root = Path(path)
    manifest = read_manifest(root)
    if manifest.kind == "text":
        return TextDataset(root, manifest)
    if manifest.kind != "image":
        raise NotADatasetError(f"{root}: holds a {manifest.kind!r} dataset, not images")
    cls = LmdbImageDataset if storage("image", manifest.format, root).random_access else WdsImageDataset
    return cls(root, manifest, augment=augment, image_size=image_size, seed=seed, on_error=on_error)


def loader(
    path: str | os.PathLike[str],
    batch_size: int = 256,
    augment: Any = "train",
    image_size: int = 224,
    shuffle: bool = True,
    num_workers: int | None = None,
    seed: int = 0,
    drop_last: bool = False,
    *,
    pin_memory: bool | None = None,
    prefetch_factor: int = 2,
    persistent_workers: bool = True,
    multiprocessing_context: Any = None,
    on_error: str = "raise",
    timeout: float = 0,
    rank: int | None = None,
    world_size: int | None = None,
    uneven: str = "pad",
    cache_dir: str | os.PathLike[str] | None = None,
    cache_max_bytes: int | str | None = None,
    storage_options: dict[str, Any] | None = None,
    device: torch.device | str | None = None,
    decode: str = "auto",
    dtype: torch.dtype | None = None,
    channels_last: bool = False,
    seq_len: int | None = None,
    packing: bool | None = None,
    max_length: int | None = None,
    bucketing: bool | None = None,
    eos_token: str | None = None,
) -> ImageLoader | TextLoader:
    """A tuned loader over a converted dataset, yielding `(images, labels)` like an ImageFolder DataLoader.

    Defaults: one worker per available core, persistent workers, pinned memory when CUDA is available,
    whole batches decoded inside workers (JPEGs at the smallest DCT scale the crop allows).
    `on_error="skip"` drops undecodable samples from their batch and lists them in `loader.skipped`.
    A worker that dies (OOM killer) raises WorkerError naming the worker and the batch it was loading; with
    `timeout` > 0, so does one that takes longer than `timeout` seconds for a batch.

    With `device` (e.g. "cuda"), batches arrive on that device, as uint8 or, with a floating `dtype`, normalised
    with the ImageNet mean/std (`channels_last` on request). `decode="device"` has the workers ship only the
    JPEGs' compressed bytes and crop parameters (other images are decoded in the workers) and decodes whole batches
    on the device (nvjpeg on CUDA), overlapped with the training step; `loader.device_fallbacks` and
    `loader.device_errors` count what the device did not decode. `"worker"` decodes in the workers; `"auto"` picks
    "device" for CUDA when nvjpeg works.

    Distributed: each rank gets its own part of every epoch and every rank yields the same number of batches;
    `rank` and `world_size` come from torch.distributed when it is initialised, or are given. `uneven="pad"`
    repeats the first samples of the epoch's order to even it out (as DistributedSampler does), `"drop"`
    leaves its last `n % world_size` samples out. `loader.state_dict()` / `load_state_dict()` resume exactly.

    `path` may be the http(s):// or s3:// URL of a converted WebDataset directory: shards stream through
    fsspec (`storage_options` go to the file system), are checked against the manifest's sha256 before use,
    and are kept in `cache_dir` (at most `cache_max_bytes`, e.g. "20GB") when it is given.

    Text datasets yield dicts of int64 tensors instead: packed blocks of `seq_len` tokens (default 1024;
    `{"input_ids", "labels"}`, labels shifted by one), or with `packing=False` one document per row truncated
    to `max_length` (`{"input_ids", "attention_mask", "labels"}`, optional length `bucketing`);
    `eos_token` overrides the end-of-text token that follows each document. These apply to text only.
    """
    rank, world_size = resolve_world(rank, world_size)
    options = LoaderOptions(
        batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
        num_workers=min(available_cores(), 16) if num_workers is None else num_workers,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory, prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers, multiprocessing_context=multiprocessing_context, timeout=timeout,
        rank=rank, world_size=world_size, uneven=check_uneven(uneven))
    text = TextOptions(seq_len=seq_len, packing=packing, max_length=max_length, bucketing=bucketing,
                       eos_token=eos_token)
    image = ImageOptions(device=device, decode=decode, dtype=dtype, channels_last=channels_last)
    data = _open_dataset(path, augment, image_size=image_size, seed=seed, on_error=on_error,
                         remote=RemoteOptions(cache_dir, cache_max_bytes, storage_options))
    if not isinstance(data, (LmdbImageDataset, WdsImageDataset)):
        return text_loader(data, options, text)
    if text.given():
        raise ConfigError(f"{', '.join(text.given())}: for text datasets only; {path} holds images")
    return ImageLoader(data, options, image)
