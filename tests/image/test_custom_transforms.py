"""The transforms users already have, as `augment`: albumentations pipelines (ending in `Normalize` and/or
`ToTensorV2` included), torchvision transforms.v2 (on CHW uint8 tensors) and v1 (on PIL images), plain callables.
Each loader batch is compared, dtype, shape and values, with the same pipeline run by hand on the same decoded
images (`fastdata.dataset(path)[i]`, augment=None). The presets' own options (`image_size`, `scale`, `ratio`,
`mean`, `std`, and `dtype` on the CPU path) are refused with such a transform, which sets its own size and
dtype."""

from __future__ import annotations

import contextlib

import albumentations as A
import numpy as np
import pytest
import torch
import torchvision.transforms as T
from albumentations.pytorch import ToTensorV2
from PIL import Image
from torchvision.transforms import v2

import fastdata
from fastdata.deprecations import FastdataDeprecationWarning
from fastdata.errors import ConfigError
from fastdata.order.epoch import sample_seed

CROP = 64  # the photo tree's smallest side is 97
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def decoded(path) -> list[np.ndarray]:
    """The dataset's images as fastdata decodes them (RGB, HWC uint8), in stored order."""
    ds = fastdata.dataset(path)
    return [ds[i][0].permute(1, 2, 0).numpy() for i in range(len(ds))]


def one_batch(path, augment, **options) -> torch.Tensor:
    """The whole dataset in stored order as one loader batch."""
    loader = fastdata.loader(path, batch_size=100, augment=augment, shuffle=False, num_workers=0, **options)
    images, _ = next(iter(loader))
    return images


def album_by_hand(transform):
    return lambda image: transform(image=image)["image"]


def hwc_to_chw(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)


#: name -> (transform, the same transform by hand: decoded HWC uint8 array -> CHW tensor, expected dtype)
PIPELINES = {
    "albumentations Normalize + ToTensorV2": (
        A.Compose([A.CenterCrop(CROP, CROP), A.Normalize(), ToTensorV2()]), None, torch.float32),
    "albumentations Normalize (HWC float array)": (
        A.Compose([A.CenterCrop(CROP, CROP), A.Normalize(mean=MEAN, std=STD)]), "hwc", torch.float32),
    "albumentations ToTensorV2 (uint8)": (A.Compose([A.CenterCrop(CROP, CROP), ToTensorV2()]), None, torch.uint8),
    "albumentations transform alone": (A.CenterCrop(CROP, CROP), "hwc", torch.uint8),
    "torchvision v2": (
        v2.Compose([v2.CenterCrop(CROP), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]),
        "v2", torch.float32),
    "torchvision v2 to float16": (v2.Compose([v2.CenterCrop(CROP), v2.ToDtype(torch.float16, scale=True)]), "v2",
                                  torch.float16),
    "torchvision v1 (PIL)": (T.Compose([T.CenterCrop(CROP), T.ToTensor(), T.Normalize(MEAN, STD)]), "v1",
                             torch.float32),
    "plain callable, float HWC": (lambda image: image[:CROP, :CROP].astype(np.float32) / 255, "hwc", torch.float32),
}


def by_hand(name: str, image: np.ndarray) -> torch.Tensor:
    transform, kind, _ = PIPELINES[name]
    if kind is None:  # albumentations ending in ToTensorV2: a CHW tensor
        return transform(image=image)["image"]
    if kind == "hwc":
        result = transform(image=image)["image"] if isinstance(transform, A.BasicTransform | A.BaseCompose) \
            else transform(image)
        return hwc_to_chw(result)
    if kind == "v2":
        return transform(torch.from_numpy(image).permute(2, 0, 1).contiguous())
    return transform(Image.fromarray(image))


#: every pipeline in the main process, two of them in a worker too (batches of floats in shared memory)
CASES = [(name, 0) for name in PIPELINES] + [("albumentations Normalize + ToTensorV2", 1),
                                              ("torchvision v2 to float16", 1)]


@pytest.mark.parametrize(("name", "num_workers"), CASES)
def test_a_transform_gives_what_it_gives_by_hand(photo_lmdb, name, num_workers):
    transform, _, dtype = PIPELINES[name]
    images = decoded(photo_lmdb)
    expected = torch.stack([by_hand(name, image) for image in images])
    loader = fastdata.loader(photo_lmdb, batch_size=5, augment=transform, shuffle=False, num_workers=num_workers)
    batches = [batch.clone() for batch, _ in loader]
    assert all(batch.dtype == dtype and batch.shape[1:] == (3, CROP, CROP) for batch in batches)
    assert expected.dtype == dtype
    assert torch.equal(torch.cat(batches), expected)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_random_torchvision_pipeline_draws_from_the_samples_seed(photo_lmdb, num_workers):
    """A v2 pipeline that draws from torch's RNG gives, for sample i of epoch e, what it gives by hand with
    torch seeded from (seed, e, i), in the main process and in a worker alike."""
    transform = v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()])
    expected = []
    for index, image in enumerate(decoded(photo_lmdb)):
        torch.manual_seed(sample_seed(5, 1, index))
        expected.append(transform(torch.from_numpy(image).permute(2, 0, 1).contiguous()))
    loader = fastdata.loader(photo_lmdb, batch_size=5, augment=transform, shuffle=False, num_workers=num_workers,
                             seed=5)
    loader.set_epoch(1)
    assert torch.equal(torch.cat([images for images, _ in loader]), torch.stack(expected))


def test_with_a_device_a_transforms_uint8_batches_are_normalised_and_its_floats_cast(photo_lmdb):
    """dtype= with device=: the uint8 batches of a transform are normalised there (mean/std: ImageNet's), as
    torchvision's ToDtype(scale=True) + Normalize would; a transform's own floats are only cast."""
    crop = A.CenterCrop(CROP, CROP)
    uint8 = one_batch(photo_lmdb, crop)
    floats = one_batch(photo_lmdb, crop, device="cpu", output=fastdata.OutputOptions(dtype=torch.float32))
    reference = v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])(v2.ToDtype(torch.float32, scale=True)(uint8))
    assert floats.dtype == torch.float32
    torch.testing.assert_close(floats, reference)
    normalised = PIPELINES["albumentations Normalize + ToTensorV2"][0]
    half = one_batch(photo_lmdb, normalised, device="cpu", output=fastdata.OutputOptions(dtype=torch.float16))
    assert half.dtype == torch.float16 and torch.equal(half, one_batch(photo_lmdb, normalised).half())


CUSTOM = {"albumentations": A.CenterCrop(CROP, CROP), "torchvision": v2.CenterCrop(CROP),
          "callable": lambda image: image[:CROP, :CROP], "None": None}


@pytest.mark.parametrize("augment", list(CUSTOM))
@pytest.mark.parametrize(("option", "value"), [("image_size", 32), ("image_size", (32, 48)), ("scale", (0.5, 1)),
                                               ("ratio", (1, 2))])
def test_preset_geometry_with_a_custom_transform_is_refused(photo_lmdb, augment, option, value):
    """A transform of one's own (or None: whole images) sets its own size and crop: the presets' geometry is
    refused with it, never silently ignored, by the loader and by the dataset alike."""
    deprecated = option in ("scale", "ratio")  # the old flat spelling of the crop preset's own options
    for open_it in (fastdata.loader, fastdata.dataset):
        with (pytest.warns(FastdataDeprecationWarning) if deprecated else contextlib.nullcontext()), \
                pytest.raises(ConfigError, match=rf"^{option} applies to augment='train'/'val' only; .*leave it out$"):
            open_it(photo_lmdb, augment=CUSTOM[augment], **{option: value})


@pytest.mark.parametrize(("options", "message"), [
    ({"dtype": torch.float32}, r"^dtype=torch.float32: a custom transform sets its batches' dtype itself"),
    ({"dtype": torch.float32, "mean": MEAN}, r"^mean and std apply to augment='train'/'val'"),
    ({"dtype": torch.float32, "std": STD, "device": "cpu"}, r"^mean and std apply to augment='train'/'val'")])
def test_normalisation_options_with_a_custom_transform_are_refused(photo_lmdb, options, message):
    """On the CPU path a transform makes its batches' dtype itself (A.Normalize, ToTensorV2, v2.ToDtype); mean
    and std belong to the presets' (or the device's) normalisation of uint8 batches."""
    with pytest.raises(ConfigError, match=message):
        device = {"device": options.pop("device")} if "device" in options else {}
        fastdata.loader(photo_lmdb, augment=A.CenterCrop(CROP, CROP), num_workers=0,
                        output=fastdata.OutputOptions(**options), **device)
