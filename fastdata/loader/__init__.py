"""Composition root for reading: `dataset()` and `loader()` over a converted dataset."""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from fastdata.config import AUTO, LoaderOptions, available_cores, check_int, check_int_or_auto
from fastdata.errors import ConfigError, NotADatasetError
from fastdata.formats.manifest import read_manifest
from fastdata.formats.registry import storage
from fastdata.formats.remote import RemoteOptions, is_url
from fastdata.image.datasets import LmdbImageDataset, WdsImageDataset
from fastdata.image.detection_presets import is_detection_preset
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.geometry import output_size
from fastdata.image.loader import ImageLoader, ImageOptions
from fastdata.image.recipes.recipe import Recipe
from fastdata.loader.mixing import mixed_loader
from fastdata.loader.options import MixOptions, OutputOptions, resolve_spelling
from fastdata.loader.tuning import Tuned, dataset_root, loader_key, measured_decode, resolve_auto, tune_files
from fastdata.order.mixing import check_weights as plan_weights
from fastdata.order.ranks import check_uneven, resolve_world
from fastdata.text.dataset import TextDataset
from fastdata.text.loader import TextLoader, TextOptions, text_loader


def dataset(path: str | os.PathLike[str], augment: Any = None, *,
            image_size: int | tuple[int, int] | None = None, seed: int = 0, on_error: str = "raise",
            remote: RemoteOptions | None = None, rank: int | None = None, world_size: int | None = None,
            uneven: str = "pad", metadata: bool = False, max_length: int | None = None, masks: bool = False,
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
    dataset stores token ids `{"caption", "input_ids", "attention_mask"}` (int64 `[max_length]`, default 77).
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
    the manifest as they stream in; `cache_dir` keeps them, bounded by `cache_max_bytes`; `storage_options`
    go to fsspec).

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
        max_length: image-text pairs stored with token ids: tokens per caption row (default 77, CLIP's): longer
            captions truncated keeping the tokenizer's closing special tokens, shorter ones padded.
        masks: detection datasets: add each target's instance masks, uint8 `[N, H, W]` decoded from their COCO RLE
            (needs pycocotools).
        output: images: a `fastdata.options.OutputOptions(dtype, mean, std)` with a floating dtype gives each image as
            the loader's batches hold it, normalised `(x / 255 - mean) / std`, instead of uint8 (with
            augment="train"/"val", whose images are uint8; a transform of your own normalises its own output).
        **keywords: the older spellings, still taken: `cache_dir`, `cache_max_bytes`, `storage_options` (the
            fields of `remote`), the fields of `output` (`dtype`, `mean`, `std`), and `scale`, `ratio` ("train":
            RandomResizedCrop's ranges of the crop's area and aspect, as `fastdata.presets.RandomResizedCrop(size,
            scale, ratio)` sets them; detection and segmentation: `scale` is the scale jitter's range, as
            `ScaleJitterCrop(size, scale_range)`).
    """
    if isinstance(path, (list, tuple)):
        raise ConfigError("fastdata.dataset opens one dataset; for a weighted mixture of several use "
                          "fastdata.mix(paths, weights=...) (docs/mixing.md)")
    spelled = resolve_spelling("dataset", keywords, ("remote", "augment", "output"), remote=remote, augment=augment,
                               image_size=image_size, output=output)
    augment, image_size, scale, ratio = spelled.augment, spelled.image_size, spelled.scale, spelled.ratio
    if spelled.recipe is not None and spelled.recipe.batch is not None:
        raise ConfigError(f"{spelled.recipe.batch!r} mixes whole batches: use fastdata.loader, or apply torchvision's "
                          "MixUp / CutMix to your DataLoader's batches")
    explicit_world = rank is not None or world_size is not None
    rank, world_size = resolve_world(rank, world_size)
    check_uneven(uneven)
    data = _open_dataset(path, augment, image_size=image_size, seed=seed, on_error=on_error,
                         remote=spelled.remote, scale=scale, ratio=ratio, metadata=metadata, max_length=max_length,
                         masks=masks, recipe=spelled.recipe)
    spelled.check_preset(path, getattr(data, "target_kind", None))
    if isinstance(data, TextDataset):
        _refuse_image_options(path, _augment_given(augment, None, image_size, scale, ratio))
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
    saying why the output does not apply."""
    given = [f.name for f in dataclasses.fields(output) if getattr(output, f.name) not in (None, False)]
    if not given:
        return
    if isinstance(data, TextDataset):
        raise ConfigError(f"{', '.join(given)}: for image datasets only; {path} holds text")
    if output.channels_last:
        raise ConfigError("channels_last applies to batches on a device (fastdata.loader(..., device=)); "
                          "fastdata.dataset gives one CPU image at a time")
    made = ImageOptions(dtype=output.dtype, mean=output.mean, std=output.std).output_format()
    if made.floating and data.pipeline.preset is None:
        raise ConfigError(f"dtype={output.dtype} applies to augment='train'/'val'; with augment=None or a transform "
                          "of your own the images are uint8 (a transform normalises its own output: A.Normalize, "
                          "v2.Normalize)")
    data.output = made


def _open_dataset(path: str | os.PathLike[str], augment: Any = None, *, image_size: Any = None, seed: int = 0,
                  on_error: str = "raise", remote: RemoteOptions | None = None, scale: Any = None,
                  ratio: Any = None, metadata: bool = False, max_length: int | None = None, masks: bool = False,
                  recipe: Recipe | None = None) -> LmdbImageDataset | WdsImageDataset | TextDataset:
    """The dataset at `path`, whole (the loader splits epochs between ranks itself)."""
    if image_size is not None:
        output_size(image_size)  # ConfigError naming what was given
    check_int("seed", seed, minimum=0)
    if augment is not None and not isinstance(augment, str) and not callable(augment) \
            and not is_detection_preset(augment):
        raise ConfigError(f"augment must be None, 'train', 'val', an albumentations or torchvision transform or a "
                          f"callable on an HWC uint8 array, got {augment!r} ({type(augment).__name__})")
    remote = remote or RemoteOptions()
    extra = {"scale": scale, "ratio": ratio, "max_length": max_length, "recipe": recipe or None}
    if is_url(path):
        store = remote.shards(str(path))
        return WdsImageDataset(store.url, store.manifest, augment=augment, image_size=image_size, seed=seed,
                               on_error=on_error, store=store, metadata=metadata, masks=masks, **extra)
    if remote.given:
        raise ConfigError(f"cache_dir, cache_max_bytes and storage_options apply to remote URLs; {path} is local")
    root = Path(path)
    manifest = read_manifest(root)
    if manifest.kind == "text":
        if recipe:
            raise ConfigError(f"{path}: {recipe.describe()} augment images; this dataset holds text")
        if metadata or masks:
            raise ConfigError(f"{path}: {'metadata' if metadata else 'masks'}=True applies to image datasets; this one "
                              "holds text")
        return TextDataset(root, manifest)
    if manifest.kind != "image":
        raise NotADatasetError(f"{root}: holds a {manifest.kind!r} dataset, not images")
    cls = LmdbImageDataset if storage("image", manifest.format, root).random_access else WdsImageDataset
    return cls(root, manifest, augment=augment, image_size=image_size, seed=seed, on_error=on_error,
               metadata=metadata, masks=masks, **extra)


def _augment_given(augment: Any, default: Any, image_size: Any, scale: Any, ratio: Any) -> list[str]:
    """The names of the augmentation options set (`augment` when it is neither its `default` nor None, which
    asks for no augmentation and so fits text as well)."""
    given = {"augment": augment is not None and not (isinstance(augment, str) and augment == default),
             "image_size": image_size is not None, "scale": scale is not None, "ratio": ratio is not None}
    return [name for name, is_given in given.items() if is_given]


def _refuse_image_options(path: str | os.PathLike[str], given: list[str]) -> None:
    if given:
        raise ConfigError(f"{', '.join(given)}: for image datasets only; {path} holds text")


def default_persistent_workers(augment: Any) -> bool:
    """What `persistent_workers=None` means: keep the workers alive between passes for training (augment="train" or
    a transform of your own: pass after pass, the start-up saved each epoch), not for evaluation (augment="val" or
    None): such a loader makes one short pass between training epochs, and persistent workers would hold their
    memory through every training epoch in between."""
    return not (augment is None or (isinstance(augment, str) and augment == "val"))


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

    `augment="train"`: torchvision's RandomResizedCrop(image_size, scale, ratio) + horizontal flip; `"val"`:
    torchvision's Resize(int(image_size / 0.875)) + CenterCrop(image_size). `image_size` is a side or (height,
    width), 224 when not given; `scale` and `ratio` default to torchvision's (0.08, 1) and (3/4, 4/3). Batches
    are uint8 [B, 3, H, W]; with a floating `dtype` (torch.float32, bfloat16, float16), normalised floats
    `(x / 255 - mean) / std` (`mean`/`std`: three numbers in 0..1 units, ImageNet's by default), made in the
    workers (or on `device`). `augment` may also be an albumentations transform (HWC uint8 array in; one ending
    in `A.Normalize` and/or `ToTensorV2` gives float32 batches), a torchvision transform (transforms.v2: a uint8
    CHW tensor in; v1: a PIL image), a callable on an HWC uint8 array, or None (whole images); such a transform
    sets its own size, so `image_size`, `scale`, `ratio`, `mean`, `std` (and `dtype` without `device`) are
    refused with it. Each sample's randomness is seeded from (seed, epoch, sample).

    Defaults: one worker per available core, pinned memory when CUDA is available, whole batches decoded inside
    workers (JPEGs at the smallest DCT scale the crop allows), and persistent workers for training
    (`persistent_workers=None`: kept between passes with augment="train" or your own transform, started afresh
    for each pass with augment="val" or None, so that an evaluation loader holds no processes while training runs;
    pass True or False to choose).
    `on_error="skip"` drops undecodable samples from their batch and lists them in `loader.skipped`.
    A worker that dies (OOM killer) raises WorkerError naming the worker and the batch it was loading; with
    `timeout` > 0, so does one that takes longer than `timeout` seconds for a batch.

    With `device` (e.g. "cuda"), batches arrive on that device, as uint8 or, with a floating `dtype`, normalised
    there (`channels_last` on request). `decode="device"` has the workers ship only the
    JPEGs' compressed bytes and crop parameters (other images are decoded in the workers); a feeder thread beside
    the training step decodes each batch on the device (nvImageCodec where installed, else torchvision's nvjpeg)
    and crops, resizes and flips it in one batched operation into preallocated slots (docs/gpu.md);
    `decode=fastdata.DeviceDecodeOptions(...)` is the device path with the decoder's options. `loader.device_fallbacks`,
    `loader.device_rejected` and `loader.device_errors` count what the device did not decode. `"worker"` decodes
    in the workers; `"auto"` takes the placement `fastdata tune` measured fastest for this dataset, machine, GPU
    and options, and the workers when nothing was measured.

    Distributed: each rank gets its own part of every epoch and every rank yields the same number of batches;
    `rank` and `world_size` come from torch.distributed when it is initialised, or are given. `uneven="pad"`
    repeats the first samples of the epoch's order to even it out (as DistributedSampler does), `"drop"`
    leaves its last `n % world_size` samples out. `loader.state_dict()` / `load_state_dict()` resume exactly.

    `path` may be the http(s):// or s3:// URL of a converted WebDataset directory: shards stream through
    fsspec (`storage_options` go to the file system), are checked against the manifest's sha256 before use,
    and are kept in `cache_dir` (at most `cache_max_bytes`, e.g. "20GB") when it is given.

    Detection datasets (`fastdata convert coco`) yield `(images, targets)`: images uint8 `[B, 3, S, S]` (S =
    `image_size`, default 640), each image at the canvas' top-left, padded with 0; targets a list of B dicts
    (`boxes` float32 `[N, 4]` xyxy in the canvas' pixels, `labels`, `iscrowd`, `annotation_ids` int64 `[N]`,
    `area` float32 `[N]`, `image_id`, with `masks=True` `masks` uint8 `[N, S, S]`). There `augment="train"` is
    torchvision's ScaleJitter (`scale`: its range, default (0.1, 2)) + a window of at most S x S + flip, `"val"`
    resizes the longer side to S; boxes and masks follow the pixels' exact geometry (docs/detection.md).
    albumentations with `bbox_params` and torchvision v2 transforms are accepted; `decode="device"` and
    `augment=None` are refused.

    Semantic segmentation datasets (`fastdata convert list --mask-column`) yield `(images, masks)`: images as for
    detection (the same presets and canvas), masks `[B, S, S]` of class ids (uint8; int64 for 16-bit label maps)
    sampled nearest-centre with the pixels' exact geometry, the canvas' padding set to the dataset's ignore index
    (default 255; docs/segmentation.md). albumentations (`image=`, `mask=`) and torchvision v2 transforms
    (`tv_tensors.Image`, `tv_tensors.Mask`) are accepted; `decode="device"` is refused.

    Text datasets yield dicts of int64 tensors instead: packed blocks of `seq_len` tokens (default 1024;
    `{"input_ids", "labels"}`, labels shifted by one), with `packing="best-fit"` rows of `seq_len` tokens holding
    whole documents, padded (`{"input_ids", "attention_mask", "labels"}`), or with `packing=False` one document
    per row truncated to `max_length` (`{"input_ids", "attention_mask", "labels"}`, optional length `bucketing`);
    `eos_token` overrides the end-of-text token that follows each document; `boundaries=True` adds
    `position_ids`, `cu_seqlens` and `max_seqlen` to packed rows (docs/text.md). These apply to text only, and the
    image options (anything but augment's default "train") are refused for text.

    Args:
        path: the converted dataset: an LMDB directory (`OUT.lmdb`), a WebDataset directory, or the
            http(s):// or s3:// URL of a WebDataset directory; or a list of local ones, mixed by `weights`
            (docs/mixing.md).
        batch_size: samples (images, or text rows) per batch.
        augment: "train" (torchvision's RandomResizedCrop + horizontal flip), "val" (torchvision's
            Resize(int(image_size / 0.875)) + CenterCrop(image_size)), None (whole images, which must then share
            one size to be batched), an albumentations transform (ending in `Normalize` / `ToTensorV2` gives
            float32 batches), a torchvision transform (v2: uint8 CHW tensor in; v1: PIL image in), or a callable
            on an HWC uint8 RGB array; each sample's randomness is seeded from `(seed, epoch, sample)`. Detection
            and segmentation datasets: "train" (scale jitter + window + flip), "val" (longer side), a
            `fastdata.presets.ScaleJitterCrop` / `ResizeLongerPad` preset, an albumentations transform
            (detection: a Compose with `bbox_params`) or a torchvision v2 transform.
        image_size: the side, or (height, width), of the images "train" and "val" produce (default 224; detection
            and segmentation: the canvas, default 640); refused with a transform of your own, which sets its own
            size.
        shuffle: reshuffle every epoch from `(seed, epoch)`; False keeps the dataset's stored order.
        num_workers: worker processes building batches (None: one per available core, at most 16; 0: in this
            process; "auto": the `fastdata tune` result stored for this dataset, machine and options, see
            `loader.tuned`; without one, the default with a warning naming why).
        seed: the seed of the epochs' order and of the augmentations; the same seed gives the same batches for
            any `num_workers`.
        drop_last: leave out the last, short batch of each epoch (of each rank's part).
        pin_memory: hand batches over in pinned memory (None: when CUDA is available).
        prefetch_factor: batches each worker prepares ahead ("auto": the `fastdata tune` result, as for
            `num_workers`).
        persistent_workers: keep the workers alive between passes (None: yes for "train" or a transform of
            your own, no for "val" or None, so that an evaluation loader holds no processes while training runs).
        multiprocessing_context: the workers' start method ("fork", "spawn", "forkserver"; None: the platform's).
        on_error: "raise" stops at an undecodable sample, naming the dataset and its key; "skip" leaves it out of
            its batch and lists it in `loader.skipped`.
        timeout: seconds a worker may take for one batch before WorkerError (0: no limit).
        rank: this process's rank (None: torch.distributed's when initialised, else 0).
        world_size: the number of ranks (None: torch.distributed's when initialised, else 1).
        uneven: when the samples do not divide between the ranks: "pad" repeats the first samples of the
            epoch's order, "drop" leaves the last ones out.
        remote: remote datasets: a `fastdata.options.RemoteOptions(cache_dir, cache_max_bytes, storage_options)`:
            a folder that keeps the verified shards, shared by the processes of a node; its bound, in bytes or as
            "20GB"; options for the fsspec file system (credentials, endpoint, ...). None: no cache.
        device: the device batches arrive on (e.g. "cuda"); None leaves them on the CPU, as the workers made them.
        decode: "auto" (what `fastdata tune` measured; else "worker"), "worker" (decode in the workers),
            "device" (decode whole JPEG batches on `device`), or a `fastdata.DeviceDecodeOptions` (the device path with
            its decoder's options).
        output: images: a `fastdata.options.OutputOptions(dtype, mean, std, channels_last)`: a floating dtype
            (torch.float32, bfloat16, float16) gives batches normalised as `(x / 255 - mean) / std` (`mean`,
            `std` in 0..1 units, ImageNet's by default), made in the workers (or on `device`); `channels_last`
            with `device`. None: uint8 batches.
        text: text datasets: a `fastdata.options.TextOptions(seq_len, packing, max_length, bucketing,
            eos_token, boundaries, mask_cross_document)`: packed blocks of `seq_len` tokens (default 1024), with
            `packing="best-fit"` rows of `seq_len` tokens holding whole documents (best-fit decreasing, padded),
            or with `packing=False` one document per row of at most `max_length` tokens (default 1024),
            optionally length-`bucketing`; `eos_token` overrides the conversion's end-of-text token;
            `boundaries=True` adds each packed row's document starts (`position_ids`, `cu_seqlens`,
            `max_seqlen`); `mask_cross_document=True` sets the labels at end-of-text tokens to -100. Image-text
            pairs: `max_length` tokens per caption.
        masks: detection datasets: add each target's instance masks, uint8 `[N, H, W]` in its image's pixels (a
            preset's canvas; with augment=None each image's stored size), decoded from their COCO RLE with
            pycocotools (needed: refused here without it), mapped by nearest neighbour.
        metadata: image datasets: each batch also carries a list, one dict per sample in batch order, of its key
            (`"key"`) and its stored metadata (the source's other columns): `(images, labels, metadata)`,
            `(images, targets, metadata)` for detection, a `"metadata"` entry for image-text pairs.
        tune_dir: where "auto" also looks for `fastdata tune` results (default `~/.cache/fastdata/tune`; a
            `tune.json` inside the dataset's directory is read first).
        weights: with a list of paths (a mixture, docs/mixing.md): one number per dataset (None: equal); every
            batch holds each dataset's share, rounded; 0 leaves a dataset out.
        mixing: a mixture's epoch and labels, a `fastdata.options.MixOptions(samples_per_epoch, epoch_end,
            exhausted, classes)`: its length in samples, all ranks together (None: `epoch_end` decides); it ends
            when the "first" (default) or the "last" dataset has given all its samples; a dataset that runs out
            before is "cycle"d (reshuffled, restarted) or "stop"ped (left out, the other weights renormalised);
            `classes`: how the datasets' class lists make one label space ("auto", "by_name", "per_dataset":
            docs/mixing.md).
        **keywords: the older spellings, still taken: the fields of `output` (`dtype`, `mean`, `std`,
            `channels_last`), `text` (`seq_len`, `packing`, `max_length`, `bucketing`, `eos_token`, `boundaries`,
            `mask_cross_document`), `remote`
            (`cache_dir`, `cache_max_bytes`, `storage_options`) and `mixing` (`samples_per_epoch`, `epoch_end`,
            `exhausted`), and `scale`, `ratio` ("train": RandomResizedCrop's ranges of the crop's area, default
            (0.08, 1), and aspect, default (3/4, 4/3), as `fastdata.presets.RandomResizedCrop` sets them;
            detection and segmentation: `scale` is the scale jitter's range, default (0.1, 2)).
    """
    spelled = resolve_spelling("loader", keywords, ("output", "text", "remote", "mixing", "augment"), output=output,
                               text=text, remote=remote, mixing=mixing, augment=augment, image_size=image_size)
    augment, image_size, scale, ratio = spelled.augment, spelled.image_size, spelled.scale, spelled.ratio
    out, text, remote = spelled.output, spelled.text, spelled.remote
    mix = spelled.mixing
    rank, world_size = resolve_world(rank, world_size)
    auto = [None if num_workers is None else check_int_or_auto("num_workers", num_workers, 0),
            check_int_or_auto("prefetch_factor", prefetch_factor, 1)]
    if tune_dir is not None and AUTO not in auto:
        raise ConfigError("tune_dir applies to num_workers='auto' or prefetch_factor='auto'")
    options = LoaderOptions(
        batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
        num_workers=auto[0] if isinstance(auto[0], int) else min(available_cores(), 16),  # None or "auto"
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        prefetch_factor=auto[1] if isinstance(auto[1], int) else 2,  # "auto"
        persistent_workers=default_persistent_workers(augment) if persistent_workers is None else persistent_workers,
        multiprocessing_context=multiprocessing_context, timeout=timeout,
        rank=rank, world_size=world_size, uneven=check_uneven(uneven))
    image_options = dict(device=device, decode=decode, dtype=out.dtype, channels_last=out.channels_last,
                         mean=out.mean, std=out.std)
    if isinstance(decode, DeviceDecodeOptions):  # the device path, with its decoder's options
        image_options.update(decode="device", device_decode=decode)
        decode = "device"
    if isinstance(path, (list, tuple)) and len(path) == 1 and mix.samples_per_epoch is None:
        plan_weights(weights, 1)  # one positive number (or None): the plain loader over that dataset
        path, weights, mix = path[0], None, MixOptions()
    if isinstance(path, (list, tuple)):  # a weighted mixture (fastdata.loader.mixing)
        if AUTO in auto:
            warnings.warn(f"num_workers/prefetch_factor='auto' over a mixture: `fastdata tune` results are per "
                          f"dataset, so the defaults are used ({options.num_workers} "
                          f"worker{'s' * (options.num_workers != 1)}, prefetch "
                          f"{options.prefetch_factor}); pass numbers to choose", stacklevel=2)
        if metadata:
            raise ConfigError("metadata=True applies to one dataset's loader; a mixture's batches do not carry it")
        if spelled.recipe:
            raise ConfigError("a recipe (presets after the crop in an augment list) applies to one dataset's "
                              "loader; a mixture takes the crop alone")
        mixed = mixed_loader(path, weights, options, text, image_options, augment=augment, image_size=image_size,
                             on_error=on_error, scale=scale, ratio=ratio, masks=masks, mixing=mix)
        mixed.tuned = None
        return mixed
    if weights is not None or mix != MixOptions():
        raise ConfigError("weights, samples_per_epoch, epoch_end, exhausted and classes apply to a mixture: pass a "
                          "list of dataset paths")
    data = _open_dataset(path, augment, image_size=image_size, seed=seed, on_error=on_error, remote=remote,
                         scale=scale, ratio=ratio, max_length=text.max_length, masks=masks, metadata=metadata,
                         recipe=spelled.recipe)
    spelled.check_preset(path, getattr(data, "target_kind", None))
    tuned = None
    if AUTO in auto:
        tuned = _tuned(data, path, options, auto, image_options, augment, tune_dir)
        options = dataclasses.replace(options, num_workers=tuned.num_workers, prefetch_factor=tuned.prefetch_factor)
        image_options["decode"] = tuned.decode or decode
        if image_options["decode"] == "device" and decode == "auto" and _recipe_per_sample(data):
            image_options["decode"] = "worker"
    elif decode == "auto" and image_options["device"] is not None and getattr(data, "pipeline", None) is not None \
            and not _recipe_per_sample(data):
        image_options["decode"] = _measured_decode(data, options, image_options, augment, tune_dir) or "auto"
    if not isinstance(data, (LmdbImageDataset, WdsImageDataset)):
        _refuse_image_options(path, _augment_given(augment, "train", image_size, scale, ratio)
                              + ImageOptions.given_in(image_options))
        built: ImageLoader | TextLoader = text_loader(data, options, text)
    else:
        text_only = [name for name in text.given() if not (data.pairs and name == "max_length")]
        if text_only:
            raise ConfigError(f"{', '.join(text_only)}: for text datasets only; {path} holds images")
        built = ImageLoader(data, options, ImageOptions(**image_options))
    built.tuned = tuned  # what "auto" chose and where it came from (None: nothing was asked to be tuned)
    return built


def _recipe_per_sample(data: Any) -> bool:
    """Whether `data`'s images get a recipe's per-sample presets, which run in the workers (so "auto" decodes
    there)."""
    pipeline = getattr(data, "pipeline", None)
    return pipeline is not None and bool(pipeline.recipe.per_sample)


def _measured_decode(data: Any, options: LoaderOptions, image_options: dict[str, Any], augment: Any,
                     tune_dir: Any) -> str | None:
    """The decode placement `fastdata tune` measured fastest for this loader (with its num_workers), if it was
    measured."""
    key, _ = loader_key(data, options.batch_size, augment, image_options["dtype"], image_options["device"],
                        options.world_size)
    files = tune_files(dataset_root(data), key.dataset, tune_dir) if key is not None else []
    return measured_decode(key, files, options.num_workers)


def _tuned(data: Any, path: Any, options: LoaderOptions, auto: list[Any], image_options: dict[str, Any],
           augment: Any, tune_dir: Any) -> Tuned:
    """num_workers / prefetch_factor (and the decode placement) for a loader that asked for "auto"."""
    key, why_not = loader_key(data, options.batch_size, augment, image_options["dtype"], image_options["device"],
                              options.world_size)
    files = tune_files(dataset_root(data), key.dataset, tune_dir) if key is not None else []
    return resolve_auto(key, files, auto[0], auto[1], image_options["decode"], str(path), why_not)
