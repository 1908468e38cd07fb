"""The presets against torchvision's transforms run by hand on the same pictures (decoded by PIL, as
torchvision's ImageFolder decodes them), on the worker path and on the device path (device="cpu"):
`"val"` is `Resize(int(size / 0.875)) + CenterCrop(size)` (antialiased), `"train"` is `resized_crop` of the crop
box it drew + flip, square and rectangular, within interpolation tolerance (the worker path decodes JPEGs at
reduced DCT scales and resizes bilinearly after halving; torchvision filters the full image).

Photo-like pictures (builders.images.photo_like: textures, gradients, hard edges) of every shape in PHOTO_SHAPES,
stored as JPEG and as PNG. Measured when written, val preset, worst of JPEG/PNG and of the two paths
(median / mean / p99 / max grey levels): 32 px 1 / 2.1 / 13 / 43, 64 px 1 / 1.7 / 10 / 34, 100 px
1 / 1.6 / 13 / 59, 224 px 0 / 0.4 / 3 / 12, (48, 80) 1 / 1.6 / 12 / 43, (100, 64) 1 / 1.5 / 12 / 56 (the
maxima are at the hard edges, where bilinear after DCT scaling and torchvision's antialiased filter differ
most). The crop box of fastdata before it followed torchvision's arithmetic (shorter side * 0.875, centred at
a fractional offset) gave 2 / 4.3 / 29 / 87, 4 / 7.0 / 51 / 126, 2 / 2.4 / 14 / 95, 1 / 2.1 / 14 / 69.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from builders.images import rgb_of_file
from torchvision.transforms.v2 import functional as F

import fastdata
from fastdata.order.epoch import sample_rng
from fastdata.presets import RandomResizedCrop

#: (median, mean, p99) bounds on the absolute difference in grey levels, per output size
VAL_TOLERANCE = {32: (1, 2.6, 16), 64: (1, 2.0, 12), 100: (1, 1.9, 14), 224: (0, 0.6, 5)}


def reference_images(tree, keys) -> list[torch.Tensor]:
    """The stored pictures as torchvision's ImageFolder sees them (PIL convert("RGB")), CHW uint8."""
    return [torch.from_numpy(rgb_of_file(tree.path(key)).copy()).permute(2, 0, 1) for key in keys]


def preset_batch(path, augment, image_size, decode, seed=0, **options) -> torch.Tensor:
    """The whole dataset in stored order as one batch of the loader (worker or device path); `image_size` None for
    a preset object (it holds its size)."""
    device = {"device": "cpu"} if decode == "device" else {}
    size = {} if image_size is None else {"image_size": image_size}
    loader = fastdata.loader(path, batch_size=100, augment=augment, shuffle=False, num_workers=0, seed=seed,
                             decode=decode, **size, **device, **options)
    images, _ = next(iter(loader))
    return images


def differences(ours: torch.Tensor, theirs: list[torch.Tensor], keys: list[str]) -> dict[str, np.ndarray]:
    """Absolute differences per codec (the tree's classes: jpeg, png)."""
    found: dict[str, list[np.ndarray]] = {}
    for image, reference, key in zip(ours, theirs, keys, strict=True):
        assert image.shape == reference.shape, key
        found.setdefault(key.split("/")[0], []).append((image.int() - reference.int()).abs().flatten().numpy())
    return {codec: np.concatenate(parts) for codec, parts in found.items()}


def assert_within(diffs: dict[str, np.ndarray], bounds: tuple[float, float, float], what: str) -> None:
    median, mean, p99 = bounds
    for codec, diff in diffs.items():
        got = (float(np.median(diff)), float(diff.mean()), float(np.percentile(diff, 99)))
        assert got[0] <= median and got[1] <= mean and got[2] <= p99, (what, codec, got)


@pytest.mark.parametrize("decode", ["worker", "device"])
@pytest.mark.parametrize("size", list(VAL_TOLERANCE))
def test_val_is_torchvisions_resize_then_center_crop(photo_lmdb, photo_tree, decode, size):
    keys = [key for key, _ in fastdata.dataset(photo_lmdb).samples]
    ours = preset_batch(photo_lmdb, "val", size, decode)
    theirs = [F.center_crop(F.resize(image, [int(size / 0.875)], antialias=True), [size, size])
              for image in reference_images(photo_tree, keys)]
    assert ours.shape == (len(keys), 3, size, size)
    assert_within(differences(ours, theirs, keys), VAL_TOLERANCE[size], f"val {size} px, {decode} path")


@pytest.mark.parametrize("decode", ["worker", "device"])
@pytest.mark.parametrize("size", [(48, 80), (100, 64)])
def test_rectangular_val_resizes_to_cover_then_crops_the_centre(photo_lmdb, photo_tree, decode, size):
    """(height, width): resized keeping the aspect to the smallest size that covers (int(h / 0.875),
    int(w / 0.875)) (the deciding side exactly that, the other truncated as torchvision's Resize truncates),
    then CenterCrop((h, w))."""
    out_h, out_w = size
    cover_h, cover_w = int(out_h / 0.875), int(out_w / 0.875)
    keys = [key for key, _ in fastdata.dataset(photo_lmdb).samples]
    theirs = []
    for image in reference_images(photo_tree, keys):
        height, width = image.shape[-2:]
        if cover_h / height >= cover_w / width:
            resized = [cover_h, int(cover_h * width / height)]
        else:
            resized = [int(cover_w * height / width), cover_w]
        theirs.append(F.center_crop(F.resize(image, resized, antialias=True), [out_h, out_w]))
    ours = preset_batch(photo_lmdb, "val", size, decode)
    assert ours.shape == (len(keys), 3, out_h, out_w)
    assert_within(differences(ours, theirs, keys), (1, 2.0, 14), f"val {size}, {decode} path")


#: RandomResizedCrop's scale and ratio given (a narrow band of areas, wide crops only) or left to their defaults
NARROW = {"scale": (0.25, 0.5), "ratio": (1.0, 2.0)}


@pytest.mark.parametrize("decode", ["worker", "device"])
@pytest.mark.parametrize(("size", "crop"), [(64, {}), ((48, 80), {}), ((100, 64), {}), ((48, 80), NARROW)])
def test_train_is_torchvisions_resized_crop_of_its_box_then_flip(photo_lmdb, photo_tree, decode, size, crop):
    """RandomResizedCrop(size, scale, ratio) semantics, rectangles included: the box drawn for each sample (from
    its seeded RNG, whole pixels as torchvision draws them; its area share within `scale` and its aspect within
    `ratio`) resized to `size` as torchvision's resized_crop does, mirrored when the flip was drawn."""
    ds = fastdata.dataset(photo_lmdb, RandomResizedCrop(size, **crop), seed=4)
    keys = [key for key, _ in ds.samples]
    out_h, out_w = (size, size) if isinstance(size, int) else size
    scale, ratio = crop.get("scale", (0.08, 1.0)), crop.get("ratio", (3 / 4, 4 / 3))
    theirs, flips = [], 0
    for index, image in enumerate(reference_images(photo_tree, keys)):
        height, width = image.shape[-2:]
        p = ds.pipeline.preset.params(width, height, sample_rng(4, 0, index))
        assert p.left == int(p.left) and p.width == int(p.width)  # whole pixels, as torchvision's get_params
        if p.width < width and p.height < height:  # drawn, not the central fallback
            share, aspect = p.width * p.height / (width * height), p.width / p.height
            assert scale[0] * 0.9 <= share <= scale[1] * 1.1 and ratio[0] * 0.9 <= aspect <= ratio[1] * 1.1, keys[index]
        crop_image = F.resized_crop(image, int(p.top), int(p.left), int(p.height), int(p.width), [out_h, out_w],
                                    antialias=True)
        theirs.append(F.horizontal_flip(crop_image) if p.flip else crop_image)
        flips += p.flip
    assert 0 < flips < len(keys)
    ours = preset_batch(photo_lmdb, RandomResizedCrop(size, **crop), None, decode, seed=4)
    assert ours.shape == (len(keys), 3, out_h, out_w)
    assert_within(differences(ours, theirs, keys), (1, 2.6, 16), f"train {size} {crop}, {decode} path")
