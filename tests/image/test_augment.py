"""augment: the train/val presets' crop parameters, the JPEG reduce factor, and the pixels (apply_crop)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastdata.errors import ConfigError
from fastdata.image.augment import RandomResizedCropFlip, ResizeCenterCrop, apply_crop, make_preset, wrap_custom
from fastdata.image.geometry import CropParams, reduce_factor

SIZES = [(67, 45), (21, 69), (33, 33), (400, 31), (31, 400), (1, 1), (640, 480)]


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_random_resized_crop_stays_inside_the_image(width, height):
    preset = RandomResizedCropFlip(16)
    rng = np.random.default_rng(0)
    flips = 0
    for _ in range(1500):
        p = preset.params(width, height, rng)
        assert p.width > 0 and p.height > 0
        assert p.left >= 0 and p.top >= 0
        assert p.left + p.width <= width and p.top + p.height <= height
        flips += p.flip
    assert 0.43 < flips / 1500 < 0.57


@pytest.mark.parametrize(
    ("scale", "ratio"), [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.25, 0.5), (0.5, 2.0)), ((0.3, 0.6), (1.0, 1.0))]
)
def test_random_resized_crop_respects_scale_and_ratio(scale, ratio):
    width, height = 640, 480  # large enough that rounding to whole pixels is below 1 %
    preset = RandomResizedCropFlip(32, scale=scale, ratio=ratio)
    rng = np.random.default_rng(1)
    fallbacks = 0
    areas = []
    for _ in range(1500):
        p = preset.params(width, height, rng)
        assert p.left + p.width <= width and p.top + p.height <= height
        area = p.width * p.height / (width * height)
        aspect = p.width / p.height
        in_bounds = (scale[0] * 0.98 <= area <= scale[1] * 1.02
                     and ratio[0] * 0.98 <= aspect <= ratio[1] * 1.02)
        if not in_bounds:  # torchvision's fallback: the central crop of the image at the nearest ratio
            fallbacks += 1
            assert (p.width == width or p.height == height), p
            assert abs(p.left - (width - p.width) // 2) <= 1 and abs(p.top - (height - p.height) // 2) <= 1
        areas.append(area)
    assert fallbacks < 1500 * 0.2
    # the area is drawn uniformly within the scale bounds
    if scale == (0.08, 1.0):
        assert np.mean(areas) == pytest.approx((0.08 + 1.0) / 2 * 0.9, rel=0.15)


def test_random_resized_crop_is_a_function_of_the_rng():
    preset = RandomResizedCropFlip(24)
    a = [preset.params(67, 45, np.random.default_rng(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    draws = {preset.params(67, 45, np.random.default_rng(s)) for s in range(50)}
    assert len(draws) > 40


@pytest.mark.parametrize(("width", "height"), [(67, 45), (21, 69), (64, 64), (401, 300), (300, 401), (97, 1000)])
@pytest.mark.parametrize("size", [16, 32, 64, 100, 224])
def test_center_crop_box_is_torchvisions_resize_then_center_crop(width, height, size):
    """The val box is the source region that torchvision's Resize(int(size / 0.875)) + CenterCrop(size) keeps:
    the resized size from torchvision's own resize, the crop's anchor from its own center_crop (of an image
    whose pixels are their index), mapped back to source pixels."""
    import torch
    from torchvision.transforms.v2 import functional as F

    preset = ResizeCenterCrop(size)
    new_h, new_w = F.resize(torch.zeros(1, height, width), [int(size / 0.875)], antialias=False).shape[-2:]
    assert preset.resized_size(width, height) == (new_h, new_w)
    index = torch.arange(new_h * new_w, dtype=torch.float64).view(1, new_h, new_w)
    top, left = divmod(int(F.center_crop(index, [size, size])[0, 0, 0]), new_w)
    p = preset.params(width, height)
    sx, sy = width / new_w, height / new_h
    assert (p.left, p.top, p.width, p.height) == pytest.approx((left * sx, top * sy, size * sx, size * sy))
    assert p.flip is False
    assert ResizeCenterCrop(size).params(width, height, np.random.default_rng(3)) == p


@pytest.mark.parametrize(("width", "height"), [(67, 45), (21, 69), (401, 300), (300, 401), (64, 64)])
@pytest.mark.parametrize("size", [(16, 32), (100, 64), (224, 224)])
def test_rectangular_center_crop_covers_the_enlarged_size_keeping_the_aspect(width, height, size):
    """(height, width): resized keeping the aspect to the smallest size covering (int(h / 0.875),
    int(w / 0.875)) (one side exactly that, the other truncated as torchvision truncates), then the centre
    (h, w) of that; a square (s, s) is the int size s."""
    out_h, out_w = size
    preset = ResizeCenterCrop(size)
    assert preset.out_size == size
    cover_h, cover_w = int(out_h / 0.875), int(out_w / 0.875)
    new_h, new_w = preset.resized_size(width, height)
    assert new_h >= cover_h and new_w >= cover_w and (new_h == cover_h or new_w == cover_w)
    assert abs(new_w / new_h - width / height) <= max(width / height / new_h, 1 / new_w) * 1.01  # aspect kept
    p = preset.params(width, height)
    assert p.width == pytest.approx(out_w * width / new_w) and p.height == pytest.approx(out_h * height / new_h)
    assert abs(p.left + p.width / 2 - width / 2) <= width / new_w / 2 + 1e-9  # centred within half a pixel
    assert abs(p.top + p.height / 2 - height / 2) <= height / new_h / 2 + 1e-9
    if out_h == out_w:
        assert preset == ResizeCenterCrop(out_h) and preset.size == out_h


def test_presets_take_rectangles_scale_and_ratio_and_check_them():
    train = make_preset("train", (24, 40), scale=(0.3, 0.9), ratio=[0.5, 2])
    assert train == RandomResizedCropFlip((24, 40), scale=(0.3, 0.9), ratio=(0.5, 2.0))
    assert train.out_size == (24, 40) and train.scale == (0.3, 0.9) and train.ratio == (0.5, 2.0)
    assert repr(make_preset("train", (16, 16))) == repr(make_preset("train", 16)) == \
        "RandomResizedCropFlip(size=16, scale=(0.08, 1.0), ratio=(0.75, 1.3333333333333333), flip_p=0.5)"
    assert make_preset("val").out_size == make_preset("train").out_size == (224, 224)
    for bad in [dict(scale=(0.5, 0.2)), dict(scale=(0, 1)), dict(scale=(0.5, 1.5)), dict(scale=0.5),
                dict(ratio=(2, 1)), dict(ratio=(-1, 1)), dict(ratio=("a", 1))]:
        with pytest.raises(ConfigError, match=r"scale|ratio"):
            make_preset("train", 32, **bad)
    with pytest.raises(ConfigError, match=r"scale and ratio .* augment='train'"):
        make_preset("val", 32, scale=(0.5, 1))
    for bad in [0, (0, 4), (4, 5, 6), 2.5, "32", True]:
        with pytest.raises(ConfigError, match="image_size"):
            make_preset("train", bad)


@pytest.mark.parametrize(
    ("width", "height", "size", "factor"),
    [(300, 200, 24, 8), (300, 200, 25, 8), (300, 200, 26, 4), (300, 200, 50, 4), (300, 200, 51, 2),
     (300, 200, 100, 2), (300, 200, 101, 1), (200, 300, 26, 4), (16, 16, 16, 1), (15.9, 400, 2, 4)],
)
def test_reduce_factor_examples(width, height, size, factor):
    assert reduce_factor(CropParams(0, 0, width, height), size) == factor


def test_reduce_factor_is_the_largest_that_keeps_both_sides():
    rng = np.random.default_rng(2)
    for _ in range(500):
        width, height = rng.uniform(1, 600, size=2)
        size = int(rng.integers(1, 120))
        got = reduce_factor(CropParams(3, 5, width, height), size)
        ok = [f for f in (1, 2, 4, 8) if width / f >= size and height / f >= size]
        assert got == (max(ok) if ok else 1)


def _quadrants(width: int = 40, height: int = 30) -> np.ndarray:
    image = np.zeros((height, width, 3), np.uint8)
    image[: height // 2, : width // 2] = (255, 0, 0)
    image[: height // 2, width // 2:] = (0, 255, 0)
    image[height // 2:, : width // 2] = (0, 0, 255)
    image[height // 2:, width // 2:] = (255, 255, 0)
    return image


def test_apply_crop_shape_dtype_and_content():
    image = _quadrants()
    out = np.zeros((8, 8, 3), np.uint8)
    apply_crop(image, CropParams(0, 0, 20, 15), out)  # the top-left quadrant only
    assert out.dtype == np.uint8 and out.shape == (8, 8, 3)
    assert (out == (255, 0, 0)).all()
    apply_crop(image, CropParams(20, 15, 20, 15), out)
    assert (out == (255, 255, 0)).all()
    big = np.zeros((24, 24, 3), np.uint8)
    apply_crop(image, CropParams(0, 0, 40, 30), big)  # upscale-ish of the whole image keeps the layout
    assert tuple(big[0, 0]) == (255, 0, 0) and tuple(big[0, -1]) == (0, 255, 0)
    assert tuple(big[-1, 0]) == (0, 0, 255) and tuple(big[-1, -1]) == (255, 255, 0)


@pytest.mark.parametrize(
    "params", [CropParams(0, 0, 40, 30), CropParams(3, 2, 29, 21), CropParams(10.5, 4.25, 17, 17)]
)
def test_apply_crop_flip_mirrors(params):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
    plain = np.zeros((12, 12, 3), np.uint8)
    mirrored = np.zeros((12, 12, 3), np.uint8)
    apply_crop(image, params, plain)
    apply_crop(image, CropParams(params.left, params.top, params.width, params.height, flip=True), mirrored)
    assert np.array_equal(mirrored, plain[:, ::-1])
    assert not np.array_equal(mirrored, plain)


def test_apply_crop_scale_maps_source_coordinates():
    image = _quadrants(80, 60)
    half = image[::2, ::2].copy()  # the same picture decoded at 1/2 scale
    out = np.zeros((6, 6, 3), np.uint8)
    apply_crop(half, CropParams(40, 30, 40, 30), out, scale=2.0)  # bottom-right quadrant in source pixels
    assert (out == (255, 255, 0)).all()


def test_presets_by_name():
    assert make_preset("train", 32) == RandomResizedCropFlip(32)
    assert make_preset("val", 32) == ResizeCenterCrop(32)
    with pytest.raises(ConfigError, match="preset"):
        make_preset("test", 32)
    with pytest.raises(ConfigError):
        make_preset("train", 0)
    with pytest.raises(ConfigError):
        wrap_custom(42)


def test_wrap_custom_plain_callable():
    fn = wrap_custom(lambda image: image[::-1])
    image = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    assert np.array_equal(fn(image, 123), image[::-1])


def test_wrap_custom_albumentations_is_seeded():
    import albumentations as A

    fn = wrap_custom(A.RandomCrop(8, 8))
    image = np.random.default_rng(0).integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
    assert np.array_equal(fn(image, 5), fn(image, 5))
    assert len({fn(image, seed).tobytes() for seed in range(20)}) > 10
    assert fn(image, 1).shape == (8, 8, 3)
    assert not math.isnan(float(fn(image, 1).mean()))


def _ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    values = np.sort(np.concatenate([a, b]))
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


@pytest.mark.parametrize(("width", "height"), [(500, 375), (375, 500), (224, 224), (1000, 180)])
def test_random_resized_crop_distribution_matches_torchvision(width, height):
    """Crop area, aspect, position and the central fallback are distributed as torchvision's RandomResizedCrop
    draws them (two-sample KS tests, 20,000 draws each: a gap above 0.025 has p < 1e-5 if they are equal)."""
    import torch
    from torchvision.transforms import RandomResizedCrop

    draws = 20_000
    preset = RandomResizedCropFlip(224)
    rng = np.random.default_rng(width * height)
    ours = np.array([[p.left, p.top, p.width, p.height] for p in
                     (preset.params(width, height, rng) for _ in range(draws))], dtype=np.float64)
    torch.manual_seed(width + height)
    image = torch.empty(3, height, width, dtype=torch.uint8)
    theirs = np.array([[j, i, w, h] for i, j, h, w in
                       (RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(draws))],
                      dtype=np.float64)

    def features(boxes: np.ndarray) -> dict[str, np.ndarray]:
        left, top, w, h = boxes.T
        return {"area": w * h / (width * height), "log-aspect": np.log(w / h),
                "centre-x": (left + w / 2) / width, "centre-y": (top + h / 2) / height}

    mine, reference = features(ours), features(theirs)
    for name in mine:
        assert _ks_statistic(mine[name], reference[name]) < 0.025, name
    full = (ours[:, 2] == width) | (ours[:, 3] == height)
    full_ref = (theirs[:, 2] == width) | (theirs[:, 3] == height)
    assert abs(full.mean() - full_ref.mean()) < 0.015  # how often the crop spans a whole side (the fallback)


@pytest.mark.parametrize(("box", "size"), [((0, 0, 1000, 800), 64), ((13.5, 7.25, 901, 653), 100),
                                           ((3, 5, 480, 90), 224), ((100, 10, 333, 777), 32)])
def test_large_shrinks_match_an_antialiased_resize(box, size):
    """Shrinks of 2x and more (PNGs, JPEGs beyond the DCT scales) halve by pixel pairs until below 2x, then
    warp: against torchvision's antialiased resized_crop on a smooth picture, within interpolation tolerance."""
    import torch
    from torchvision.transforms.v2 import functional as F

    from fastdata.image.augment import crop_resize_flip

    y, x = np.mgrid[0:800, 0:1000].astype(np.float64)
    image = np.stack([127 + 100 * np.sin(x / 37 + y / 53), 127 + 100 * np.cos(x / 29 - y / 41),
                      (x + y) / 1800 * 255], axis=-1).round().astype(np.uint8)
    for flip in (False, True):
        out = np.empty((size, size, 3), np.uint8)
        crop_resize_flip(image, box, out, flip)
        left, top, width, height = box
        reference = F.resized_crop(torch.from_numpy(image).permute(2, 0, 1), round(top), round(left), round(height),
                                   round(width), [size, size], antialias=True).permute(1, 2, 0).numpy()
        if flip:
            reference = reference[:, ::-1]
        diff = np.abs(out.astype(np.int16) - reference.astype(np.int16))
        assert diff.mean() < 1.5 and np.percentile(diff, 99) <= 6, (box, size, diff.mean(), diff.max())


def test_large_shrinks_do_not_alias():
    """A one-pixel checkerboard shrunk 2x to 8x is flat grey; bilinear sampling alone would give back black and
    white (it reads two of the four pixels under each output pixel)."""
    from fastdata.image.augment import crop_resize_flip

    board = (np.indices((480, 640)).sum(axis=0) % 2 * 255).astype(np.uint8)
    image = np.repeat(board[:, :, None], 3, axis=2)
    for factor in (2, 3, 4.5, 8):
        out = np.empty((int(480 / factor), int(480 / factor), 3), np.uint8)
        crop_resize_flip(image, (0.0, 0.0, out.shape[1] * factor, out.shape[0] * factor), out, False)
        assert np.abs(out.astype(int) - 127.5).max() <= 4, (factor, out.min(), out.max())
