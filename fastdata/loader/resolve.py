"""The second of `fastdata.loader`'s three steps: `resolve`, where every "auto" of a `LoaderSpec` is settled, in
one place, into a `Resolved` plan that holds no choice left to make.

What is settled, and from what:
- `rank`, `world_size` (None): torch.distributed's when it is initialised, else 0 of 1;
- `num_workers` (None): one per available core, at most 16; ("auto"): the stored `fastdata tune` result;
- `prefetch_factor` ("auto"): the tune result, else 2;
- `pin_memory` (None): whether CUDA is available;
- `persistent_workers` (None): yes for training (augment="train" or a transform), no for "val" or None;
- `decode` ("auto"): the tune result's placement, else the one measured fastest with this loader's workers when it
  delivers on a CUDA device, else the workers; a dataset or transform the device path does not take decodes in the
  workers ("worker" / "device" after this step, or the user's `DeviceDecodeOptions`);
- `device` (None with decode="device"): "cuda" where torch sees a GPU.
A mixture's workers and prefetch are settled here too ("auto" takes the defaults: tune results are per dataset);
its sources are opened by its loader, whose `ImageLoader` settles their decode placement ("auto": the workers).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from fastdata.config import AUTO, LoaderOptions
from fastdata.image.datasets import LmdbImageDataset, WdsImageDataset
from fastdata.image.device.auto import device_for, placement
from fastdata.image.device.options import DeviceDecodeOptions
from fastdata.image.loader import ImageOptions
from fastdata.loader.opened import open_dataset
from fastdata.loader.spec import LoaderSpec
from fastdata.loader.tuning import (
    Tuned,
    dataset_root,
    default_workers,
    loader_key,
    measured_decode,
    resolve_auto,
    tune_files,
)
from fastdata.order.ranks import check_uneven, resolve_world
from fastdata.text.dataset import TextDataset


@dataclass(frozen=True)
class Resolved:
    """A loader with every choice made: the `spec` it came from, its opened dataset (`data`; None for a mixture,
    whose loader opens its sources), the common `options` (workers, prefetch, pinning, persistence, rank and world
    settled), for an image dataset the `image` options (decode placement and device settled; None otherwise), and
    what "auto" chose from a tune result (`tuned`; None when nothing asked to be tuned)."""

    spec: LoaderSpec
    data: LmdbImageDataset | WdsImageDataset | TextDataset | None
    options: LoaderOptions
    image: ImageOptions | None = None
    tuned: Tuned | None = None


def default_persistent_workers(augment: Any) -> bool:
    """What `persistent_workers=None` means: keep the workers alive between passes for training (augment="train" or
    a transform of your own: pass after pass, the start-up saved each epoch), not for evaluation (augment="val" or
    None): such a loader makes one short pass between training epochs, and persistent workers would hold their
    memory through every training epoch in between."""
    return not (augment is None or (isinstance(augment, str) and augment == "val"))


def resolve(spec: LoaderSpec) -> Resolved:
    """Settle every "auto" of `spec` (see the module's docstring), opening its dataset (all but a mixture's)."""
    rank, world_size = resolve_world(spec.rank, spec.world_size)
    options = LoaderOptions(
        batch_size=spec.batch_size, shuffle=spec.shuffle, seed=spec.seed, drop_last=spec.drop_last,
        num_workers=spec.num_workers if isinstance(spec.num_workers, int) else default_workers(),  # None, "auto"
        pin_memory=torch.cuda.is_available() if spec.pin_memory is None else spec.pin_memory,
        prefetch_factor=spec.prefetch_factor if isinstance(spec.prefetch_factor, int) else 2,  # "auto"
        persistent_workers=(default_persistent_workers(spec.augment) if spec.persistent_workers is None
                            else spec.persistent_workers),
        multiprocessing_context=spec.multiprocessing_context, timeout=spec.timeout,
        rank=rank, world_size=world_size, uneven=check_uneven(spec.uneven))
    if spec.is_mixture:
        if spec.asks_tuning:
            warnings.warn(f"num_workers/prefetch_factor='auto' over a mixture: `fastdata tune` results are per "
                          f"dataset, so the defaults are used ({options.num_workers} "
                          f"worker{'s' * (options.num_workers != 1)}, prefetch "
                          f"{options.prefetch_factor}); pass numbers to choose", stacklevel=3)
        return Resolved(spec, None, options)
    assert not isinstance(spec.path, tuple)
    data = open_dataset(spec.path, spec.augment, image_size=spec.image_size, seed=spec.seed, on_error=spec.on_error,
                        remote=spec.remote, scale=spec.scale, ratio=spec.ratio, max_length=spec.text.max_length,
                        masks=spec.masks, metadata=spec.metadata, recipe=spec.recipe)
    spec.check_preset(getattr(data, "target_kind", None))
    decode: str | DeviceDecodeOptions = spec.decode
    asked = "device" if isinstance(decode, DeviceDecodeOptions) else decode
    tuned = None
    if spec.asks_tuning:
        tuned = _tuned(data, spec, options, asked)
        options = dataclasses.replace(options, num_workers=tuned.num_workers, prefetch_factor=tuned.prefetch_factor)
        if asked == "auto" and tuned.decode is not None:
            decode = "worker" if tuned.decode == "device" and _recipe_per_sample(data) else tuned.decode
    elif asked == "auto" and spec.device is not None and isinstance(data, (LmdbImageDataset, WdsImageDataset)) \
            and not _recipe_per_sample(data):
        decode = _measured_decode(data, spec, options) or AUTO
    if not isinstance(data, (LmdbImageDataset, WdsImageDataset)):
        return Resolved(spec, data, options, None, tuned)  # (image options given over text: refused at build)
    image = ImageOptions(**{**spec.image_fields(), "decode": decode})
    pipeline = data.pipeline
    where = placement(image.placement, data.target_kind, pipeline.preset, pipeline.recipe.per_sample)
    image = dataclasses.replace(image, decode=image.decode if where == image.placement else where,
                                device=device_for(where, image.device))
    return Resolved(spec, data, options, image, tuned)


def _recipe_per_sample(data: Any) -> bool:
    """Whether `data`'s images get a recipe's per-sample presets, which run in the workers (so "auto" decodes
    there)."""
    pipeline = getattr(data, "pipeline", None)
    return pipeline is not None and bool(pipeline.recipe.per_sample)


def _measured_decode(data: Any, spec: LoaderSpec, options: LoaderOptions) -> str | None:
    """The decode placement `fastdata tune` measured fastest for this loader (with its num_workers), if it was
    measured."""
    key, _ = loader_key(data, options.batch_size, spec.augment, spec.output.dtype, spec.device, options.world_size)
    files = tune_files(dataset_root(data), key.dataset, spec.tune_dir) if key is not None else []
    return measured_decode(key, files, options.num_workers)


def _tuned(data: Any, spec: LoaderSpec, options: LoaderOptions, decode: str) -> Tuned:
    """num_workers / prefetch_factor (and the decode placement) for a loader that asked for "auto"."""
    key, why_not = loader_key(data, options.batch_size, spec.augment, spec.output.dtype, spec.device,
                              options.world_size)
    files = tune_files(dataset_root(data), key.dataset, spec.tune_dir) if key is not None else []
    return resolve_auto(key, files, spec.num_workers, spec.prefetch_factor, decode, str(spec.path), why_not)
