"""Composition root for reading: `dataset()` and `loader()` over a converted dataset.

`loader()` is three steps, each a module of this room: `LoaderSpec` (spec.py: what was asked, frozen, in one
spelling), `resolve` (resolve.py: every "auto" settled in one place) and `build` (build.py: the ImageLoader,
TextLoader or mixture's loader, its worker pipeline configured once)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from fastdata.errors import ConfigError
from fastdata.formats.remote import RemoteOptions
from fastdata.image.datasets import LmdbImageDataset, WdsImageDataset
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.loader import ImageLoader, ImageOptions
from fastdata.loader.build import build
from fastdata.loader.opened import augment_given, open_dataset, refuse_image_options
from fastdata.loader.options import MixOptions, OutputOptions, resolve_spelling
from fastdata.loader.resolve import default_persistent_workers, resolve
from fastdata.loader.spec import LoaderSpec
from fastdata.order.ranks import check_uneven, resolve_world
from fastdata.text.dataset import TextDataset
from fastdata.text.loader import TextLoader, TextOptions

__all__ = ["dataset", "default_persistent_workers", "loader"]


def dataset(path: str | os.PathLike[str], augment: Any = None, *,
            image_size: int | tuple[int, int] | None = None, seed: int = 0, on_error: str = "raise",
            remote: RemoteOptions | None = None, rank: int | None = None, world_size: int | None = None,
            uneven: str = "pad", metadata: bool = False, text: TextOptions | None = None, masks: bool = False,
            output: OutputOptions | None = None, **keywords: Any) -> LmdbImageDataset | WdsImageDataset | TextDataset:
    """Open a converted dataset for your own DataLoader.

    LMDB gives a map-style dataset (`len`, `ds[i] -> (uint8 CHW tensor, label)`, `.classes`,
    `.class_to_idx`, `.samples` as torchvision's ImageFolder has them); WebDataset shards give an iterable
    one (`len`, `.classes`, iteration in stored order; `ds[i]` raises TypeError). `augment` is None (full
    image), "train", "val" (with
    `image_size`, `scale`, `ratio` as for `loader`), an albumentations or torchvision transform, or a callable
    on an HWC uint8 array.
    A multi-label dataset's label is a multi-hot float32 `[C]` tensor (C = len(ds.classes)) instead of a class
    id. `metadata=True` gives `(image, label, metadata)` per sample, metadata being the dict of the sample's other
    source columns ({} when the source had none); LMDB datasets also have `ds.metadata(i)`.
    The iterable WebDataset dataset splits its stream between the DataLoader workers that iterate it and between
    ranks (`rank`/`world_size`, else torch.distributed's when initialised; `uneven` as for `loader`), so every
    sample comes once per pass; `len()` is this rank's count. (A map-style LMDB dataset takes your sampler, e.g.
    DistributedSampler, instead.)
    An image-text pair dataset (`fastdata convert pairs`) gives `(image, caption)`: the caption's text, or when the
    dataset stores token ids `{"caption", "input_ids", "attention_mask"}` (int64 `[max_length]`, default 77;
    `text=TextOptions(max_length=...)`).
    A detection dataset (`fastdata convert coco`) gives `(uint8 CHW tensor, target dict)`: `boxes` float32 `[N, 4]`
    (xyxy, in the returned image's pixels), `labels` int64 `[N]` (indexing `ds.classes`), `iscrowd` int64 `[N]`,
    `area` float32 `[N]`, `annotation_ids` int64 `[N]`, `image_id` (int), and with `masks=True` `masks` uint8
    `[N, H, W]`; `augment` as for `loader` (None: the whole image and its target as stored).
    A semantic segmentation dataset (`fastdata convert list --mask-column`) gives `(uint8 CHW tensor, mask)`, the
    mask `[H, W]` of class ids (uint8; int64 for 16-bit label maps); `augment` as for `loader` (None: the whole
    image and its mask as stored).
    A text dataset (either format) gives `len` = documents, `ds[i] -> {"input_ids": int64 tensor}`,
    `.tokenizer`, `.total_tokens` (the image arguments do not apply, and are refused).
    An http(s):// or s3:// URL of a WebDataset image conversion opens it remotely (shards verified against
    the manifest as they stream in; `remote=RemoteOptions(...)` keeps them in a cache folder and passes options
    to fsspec).

    Args:
        path: the converted dataset: an LMDB directory, a WebDataset directory, or the http(s):// or s3:// URL
            of a WebDataset directory.
        augment: None (whole images, as stored), "train", "val", an albumentations or torchvision transform, or a
            callable on an HWC uint8 RGB array (as for `loader`).
        image_size: the side, or (height, width), of the images "train" and "val" produce (default 224; detection
            and segmentation: the canvas, default 640).
        seed: the seed of the augmentations' randomness (each sample's from `(seed, epoch, sample)`). The epoch
            counts itself: the n-th time a sample is read (WebDataset: the n-th pass of a worker) it is
            augmented for epoch n, in every worker, so each pass of your DataLoader draws new crops;
            `ds.set_epoch(e)` pins epoch e (a resumed run calls it each epoch to get exactly the crops again).
        on_error: "raise" at an undecodable sample, naming it; with "skip" a WebDataset dataset leaves it out
            of its iteration, with a warning (`ds[i]` of an LMDB dataset raises either way).
        remote: remote datasets: a `fastdata.options.RemoteOptions(cache_dir, cache_max_bytes, storage_options)`:
            a folder that keeps the verified shards, its bound ("20GB"), options for the fsspec file system.
        rank: WebDataset: this process's rank (None: torch.distributed's when initialised, else 0).
        world_size: WebDataset: the number of ranks (None: torch.distributed's when initialised, else 1).
        uneven: WebDataset: "pad" or "drop", when the samples do not divide between the ranks (as for `loader`).
        metadata: images: give `(image, label, metadata)` per sample, metadata being the dict of the sample's other
            source columns (e.g. a file list's); not read otherwise.
        text: image-text pairs stored with token ids: a `fastdata.options.TextOptions(max_length=...)`, the
            tokens per caption row (default 77, CLIP's): longer captions truncated keeping the tokenizer's closing
            special tokens, shorter ones padded (its other fields apply to `fastdata.loader` over text).
        masks: detection datasets: add each target's instance masks, uint8 `[N, H, W]` decoded from their COCO RLE
            (needs pycocotools).
        output: images: a `fastdata.options.OutputOptions(dtype, mean, std)` with a floating dtype gives each
            image as the loader's batches hold it, normalised `(x / 255 - mean) / std`, instead of uint8 (with
            augment="train"/"val", whose images are uint8; a transform of your own normalises its own output).
        **keywords: deprecated flat spellings of the option objects' fields (docs/reference/deprecations.md).
    """
    if isinstance(path, (list, tuple)):
        raise ConfigError("fastdata.dataset opens one dataset; for a weighted mixture of several use "
                          "fastdata.mix(paths, weights=...) (docs/mixing.md)")
    spelled = resolve_spelling("dataset", keywords, ("remote", "augment", "output", "text"), remote=remote,
                               augment=augment, image_size=image_size, output=output, text=text)
    loader_only = [name for name in spelled.text.given() if name != "max_length"]
    if loader_only:
        raise ConfigError(f"{', '.join(loader_only)}: cut text into rows for fastdata.loader; fastdata.dataset takes "
                          "TextOptions(max_length=...) for image-text pairs only")
    max_length = spelled.text.max_length
    augment, image_size, scale, ratio = spelled.augment, spelled.image_size, spelled.scale, spelled.ratio
    if spelled.recipe is not None and spelled.recipe.batch is not None:
        raise ConfigError(f"{spelled.recipe.batch!r} mixes whole batches: use fastdata.loader, or apply torchvision's "
                          "MixUp / CutMix to your DataLoader's batches")
    explicit_world = rank is not None or world_size is not None
    rank, world_size = resolve_world(rank, world_size)
    check_uneven(uneven)
    data = open_dataset(path, augment, image_size=image_size, seed=seed, on_error=on_error,
                        remote=spelled.remote, scale=scale, ratio=ratio, metadata=metadata, max_length=max_length,
                        masks=masks, recipe=spelled.recipe)
    spelled.check_preset(path, getattr(data, "target_kind", None))
    if isinstance(data, TextDataset):
        refuse_image_options(path, augment_given(augment, None, image_size, scale, ratio))
        if max_length is not None:
            raise ConfigError(f"{path}: max_length applies to fastdata.loader over text (padded rows) and to "
                              "image-text pairs; a text dataset's ds[i] is a whole document")
    _sample_output(path, data, spelled.output)
    if isinstance(data, LmdbImageDataset | WdsImageDataset):
        data.count_epochs()  # in the user's own DataLoader, each pass draws new augmentations
    if isinstance(data, WdsImageDataset):
        return data.split(rank, world_size, uneven)
    if explicit_world:
        raise ConfigError(f"{path}: rank and world_size split iterable (WebDataset) datasets; this dataset is "
                          "map-style: give your DataLoader a DistributedSampler, or use fastdata.loader")
    return data


def _sample_output(path: str | os.PathLike[str], data: Any, output: OutputOptions) -> None:
    """`fastdata.dataset(output=...)`: the dataset's images in that dtype and normalisation, or a ConfigError
    saying why the output does not apply. The pipeline is told the format too: a recipe's RandomErasing value is
    in the units of the images delivered (as the loader's workers are told)."""
    given = [f.name for f in dataclasses.fields(output) if getattr(output, f.name) not in (None, False)]
    if isinstance(data, TextDataset):
        if given:
            raise ConfigError(f"{', '.join(given)}: for image datasets only; {path} holds text")
        return
    made = data.output
    if given:
        if output.channels_last:
            raise ConfigError("channels_last applies to batches on a device (fastdata.loader(..., device=)); "
                              "fastdata.dataset gives one CPU image at a time")
        made = ImageOptions(dtype=output.dtype, mean=output.mean, std=output.std).output_format()
        if made.floating and data.pipeline.preset is None:
            raise ConfigError(f"dtype={output.dtype} applies to augment='train'/'val'; with augment=None or a "
                              "transform of your own the images are uint8 (a transform normalises its own output: "
                              "A.Normalize, v2.Normalize)")
    data.pipeline.recipe.check_output(made)
    data.pipeline.configure(dataclasses.replace(data.pipeline.config, delivered=made))
    data.output = made


def loader(
    path: str | os.PathLike[str] | list[str | os.PathLike[str]],
    batch_size: int = 256,
    augment: Any = "train",
    image_size: int | tuple[int, int] | None = None,
    shuffle: bool = True,
    num_workers: int | str | None = None,
    seed: int = 0,
    drop_last: bool = False,
    *,
    pin_memory: bool | None = None,
    prefetch_factor: int | str = 2,
    persistent_workers: bool | None = None,
    multiprocessing_context: Any = None,
    on_error: str = "raise",
    timeout: float = 0,
    rank: int | None = None,
    world_size: int | None = None,
    uneven: str = "pad",
    remote: RemoteOptions | None = None,
    device: torch.device | str | None = None,
    decode: str | DeviceDecodeOptions = "auto",
    output: OutputOptions | None = None,
    text: TextOptions | None = None,
    masks: bool = False,
    metadata: bool = False,
    tune_dir: str | os.PathLike[str] | None = None,
    weights: list[float] | None = None,
    mixing: MixOptions | None = None,
    **keywords: Any,
) -> ImageLoader | TextLoader:
    """A tuned loader over a converted dataset, yielding `(images, labels)` like an ImageFolder DataLoader.

    Image classification batches are uint8 `[B, 3, H, W]` (or what `output=OutputOptions(...)` asks for) and int64
    labels (multi-label datasets: multi-hot float32 `[B, C]`). Detection datasets yield `(images, targets)`
    (targets a list of dicts: `boxes` xyxy, `labels`, `iscrowd`, `area`, `annotation_ids`, `image_id`, `masks`
    with `masks=True`; docs/detection.md), semantic segmentation datasets `(images, masks)` (docs/segmentation.md),
    image-text pairs `{"images", "captions"}` (docs/pairs.md), and text datasets dicts of int64 tensors: packed
    blocks of tokens, or padded rows as `text=TextOptions(...)` asks (docs/text.md). A list of paths is a weighted
    mixture (docs/mixing.md).

    Defaults: one worker per available core, pinned memory when CUDA is available, whole batches decoded inside
    workers (JPEGs at the smallest DCT scale the crop allows), persistent workers for training only. Each sample's
    randomness is seeded from (seed, epoch, sample): the same seed gives the same batches for any `num_workers`.
    Every rank gets its own part of each epoch and yields the same number of batches; `loader.state_dict()` /
    `load_state_dict()` resume exactly (docs/distributed.md). `on_error="skip"` lists undecodable samples in
    `loader.skipped`; a worker that dies raises WorkerError naming it and its batch.

    With `device` batches arrive on that device; `decode="device"` decodes whole JPEG batches there on a feeder
    thread beside the training step (docs/gpu.md; `loader.device_fallbacks`, `device_rejected`, `device_errors`
    count what it did not decode).

    Args:
        path: the converted dataset: an LMDB directory, a WebDataset directory, or the http(s):// or s3:// URL of
            a WebDataset directory (shards verified against the manifest as they stream in); or a list of local
            ones, mixed by `weights`.
        batch_size: samples (images, or text rows) per batch.
        augment: "train" (torchvision's RandomResizedCrop + horizontal flip), "val" (Resize(int(image_size /
            0.875)) + CenterCrop), a preset object (`fastdata.presets.RandomResizedCrop(size, scale, ratio)`,
            `ResizeCenterCrop(size)`; detection and segmentation: `ScaleJitterCrop`, `ResizeLongerPad`), a list
            of a crop and the recipe presets that follow it (`[RandomResizedCrop(224), TrivialAugmentWide()]`),
            None (whole images), an albumentations or torchvision transform, or a callable on an HWC uint8 RGB
            array (such a transform sets its own size and output).
        image_size: the side, or (height, width), of the images "train" and "val" produce (default 224;
            detection and segmentation: the canvas, default 640).
        shuffle: reshuffle every epoch from `(seed, epoch)`; False keeps the dataset's stored order.
        num_workers: worker processes building batches (None: one per available core, at most 16; 0: in this
            process; "auto": the `fastdata tune` result stored for this dataset, machine and options, see
            `loader.tuned`; without one, the default with a warning naming why).
        seed: the seed of the epochs' order and of the augmentations.
        drop_last: leave out the last, short batch of each epoch (of each rank's part).
        pin_memory: hand batches over in pinned memory (None: when CUDA is available).
        prefetch_factor: batches each worker prepares ahead ("auto": the `fastdata tune` result).
        persistent_workers: keep the workers alive between passes (None: yes for "train" or a transform of your
            own, no for "val" or None, so that an evaluation loader holds no processes while training runs).
        multiprocessing_context: the workers' start method ("fork", "spawn", "forkserver"; None: the platform's).
        on_error: "raise" stops at an undecodable sample, naming the dataset and its key; "skip" leaves it out of
            its batch and lists it in `loader.skipped`.
        timeout: seconds a worker may take for one batch before WorkerError (0: no limit).
        rank: this process's rank (None: torch.distributed's when initialised, else 0).
        world_size: the number of ranks (None: torch.distributed's when initialised, else 1).
        uneven: when the samples do not divide between the ranks: "pad" repeats the first samples of the
            epoch's order (as DistributedSampler does), "drop" leaves the last ones out.
        remote: remote datasets: a `fastdata.options.RemoteOptions(cache_dir, cache_max_bytes, storage_options)`:
            a folder that keeps the verified shards, shared by the processes of a node; its bound ("20GB");
            options for the fsspec file system. None: no cache.
        device: the device batches arrive on (e.g. "cuda"); None leaves them on the CPU, as the workers made them.
        decode: "auto" (what `fastdata tune` measured; else "worker"), "worker" (decode in the workers),
            "device" (decode whole JPEG batches on `device`), or a `fastdata.options.DeviceDecodeOptions` (the
            device path with its decoder's options).
        output: images: a `fastdata.options.OutputOptions(dtype, mean, std, channels_last)`: a floating dtype
            gives batches normalised as `(x / 255 - mean) / std` (ImageNet's mean and std by default), made in
            the workers (or on `device`); `channels_last` with `device`. None: uint8 batches.
        text: text datasets: a `fastdata.options.TextOptions(seq_len, packing, max_length, bucketing, eos_token,
            boundaries, mask_cross_document)`: packed blocks of `seq_len` tokens (default 1024), best-fit rows
            (`packing="best-fit"`), or one document per row of at most `max_length` tokens (`packing=False`);
            image-text pairs: `max_length` tokens per caption.
        masks: detection datasets: add each target's instance masks, uint8 `[N, H, W]` (needs pycocotools).
        metadata: image datasets: each batch also carries a list, one dict per sample, of its key and its stored
            metadata: `(images, labels, metadata)`.
        tune_dir: where "auto" also looks for `fastdata tune` results (default `~/.cache/fastdata/tune`; a
            `tune.json` inside the dataset's directory is read first).
        weights: with a list of paths: one number per dataset (None: equal); every batch holds each dataset's
            share, rounded; 0 leaves a dataset out.
        mixing: a mixture's epoch and labels: a `fastdata.options.MixOptions(samples_per_epoch, epoch_end,
            exhausted, classes)` (docs/mixing.md).
        **keywords: deprecated flat spellings of the option objects' fields, e.g. `max_length=` for
            `text=TextOptions(max_length=...)`: each warns with its replacement (docs/reference/deprecations.md).
    """
    spec = LoaderSpec.asked(
        path, keywords, augment=augment, image_size=image_size, output=output, text=text, remote=remote,
        mixing=mixing, weights=weights, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, seed=seed,
        drop_last=drop_last, pin_memory=pin_memory, prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers, multiprocessing_context=multiprocessing_context, on_error=on_error,
        timeout=timeout, rank=rank, world_size=world_size, uneven=uneven, device=device, decode=decode, masks=masks,
        metadata=metadata, tune_dir=tune_dir)
    return build(resolve(spec))
