"""The recipes' operations against torchvision's own, on the same uint8 crops: every operation of
TrivialAugmentWide / RandAugment / AutoAugment at every magnitude bin and sign, applied by torchvision's
`_apply_image_or_video_transform` (the very dispatch its policies use) and by `fastdata.image.recipes.ops`.

Stated tolerances (docs/images.md's table; benchmarks/recipe_agreement.py records it at 224 px): the colour
operations give torchvision's pixels exactly; of the geometric ones (TranslateX/Y are whole-pixel shifts, exact),
ShearX/Y and Rotate at nearest (torchvision's default) take a neighbouring source pixel where the source coordinate
lies within a rounding step of a half pixel (OpenCV's warp rounds it in 1/1024 steps, half up; torch's grid in
float32, half to even), which are rare but can fill whole rows: a rotation by 45 + k 90 degrees puts a diagonal on
them, a shear of 0.2 (RandAugment's bin 20) every fifth row. Measured over TrivialAugmentWide's bins: at most 0.4%
of the pixels at 224 px, 2.1% at 64 px (mean difference 0.03 and 0.23 grey levels); over RandAugment's: 10.5% for
its shear of 0.2, below 0.6% otherwise; at bilinear (torchvision's reference recipes) at most 0.9% of the pixels
differ, by one grey level.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from builders.images import photo_like
from torchvision.transforms import v2
from torchvision.transforms.v2.functional._color import _blend

from fastdata.image.recipes.ops import OPERATIONS, OpContext, contrast_lut
from fastdata.image.recipes.policies import _RAND_OPS, _STANDARD, _WIDE, magnitudes

GEOMETRIC = ("ShearX", "ShearY", "Rotate")
#: share of pixels that may differ, mean and largest grey-level difference, of ShearX/Y and Rotate (64 and 48 x 80
#: px) over TrivialAugmentWide's bins; "ties": at RandAugment's, whose shear of 0.2 puts every fifth row on ties
GEOMETRIC_TOLERANCE = {"nearest": (0.025, 0.3, 255), "ties": (0.11, 1.5, 255), "bilinear": (0.012, 0.012, 1)}
SIZES = [(64, 64), (48, 80)]


def crops(size: tuple[int, int]) -> list[np.ndarray]:
    """A photo-like crop (HWC uint8: textures, edges and gradients), and one with a flat channel."""
    photo = photo_like(1, size[1], size[0]).copy()
    flat = photo_like(2, size[1], size[0]).copy()
    flat[..., 2] = 77  # AutoContrast's and Equalize's one-level channel
    return [photo, flat]


def reference(policy: v2.Transform, image: np.ndarray, name: str, magnitude: float, interpolation: str,
              fill=None) -> np.ndarray:
    chw = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    fill_arg = policy._fill if fill is None else {v2.Transform: None, torch.Tensor: list(fill)}
    mode = v2.InterpolationMode(interpolation)
    done = policy._apply_image_or_video_transform(chw, name, magnitude, interpolation=mode, fill=fill_arg)
    return done.permute(1, 2, 0).numpy()


def ours(image: np.ndarray, name: str, magnitude: float, interpolation: str = "nearest", bgr: bool = False,
         fill=(0.0, 0.0, 0.0)) -> np.ndarray:
    done = np.ascontiguousarray(image[..., ::-1]) if bgr else image.copy()
    OPERATIONS[name](done, magnitude, OpContext(bgr, interpolation, fill))
    return done[..., ::-1] if bgr else done


def bins(wide: bool, name: str, size: tuple[int, int]) -> list[float]:
    """Every signed magnitude of `name` in the policy's space (31 bins)."""
    values = magnitudes(wide, name, 31, *size) or (0.0,)
    signed = (_WIDE if wide else _STANDARD)[name][1]
    return sorted({v * s for v in values for s in ((1, -1) if signed else (1,))})


def check(got: np.ndarray, want: np.ndarray, name: str, tolerance: str, what: str) -> None:
    diff = np.abs(got.astype(int) - want.astype(int))
    if name not in GEOMETRIC:
        assert not diff.any(), f"{what}: {int((diff > 0).sum())} pixels differ, by up to {diff.max()}"
        return
    share, mean, largest = GEOMETRIC_TOLERANCE[tolerance]
    assert (diff > 0).mean() <= share and diff.mean() <= mean and diff.max() <= largest, \
        (what, (diff > 0).mean(), diff.mean(), diff.max())


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", [*_WIDE, "Invert"])
def test_every_operation_at_every_magnitude_is_torchvisions(name, size):
    wide = name in _WIDE
    policy = v2.TrivialAugmentWide() if wide else v2.AutoAugment()
    for image in crops(size):
        for magnitude in bins(wide, name, size):
            want = reference(policy, image, name, magnitude, "nearest")
            check(ours(image, name, magnitude), want, name, "nearest", f"{name} {magnitude:g} at {size}")
            check(ours(image, name, magnitude, bgr=True), want, name, "nearest", f"{name} {magnitude:g}, BGR")


@pytest.mark.parametrize("name", [*GEOMETRIC, "TranslateX", "TranslateY"])
def test_geometric_operations_bilinear_and_filled(name):
    """torchvision's reference recipes use bilinear interpolation; `fill` colours what comes from outside."""
    policy = v2.RandAugment()
    for image in crops((64, 64))[:1]:
        for magnitude in bins(False, name, (64, 64))[::5]:
            want = reference(policy, image, name, magnitude, "bilinear")
            check(ours(image, name, magnitude, "bilinear"), want, name, "bilinear", f"{name} {magnitude:g}")
            filled = reference(policy, image, name, magnitude, "nearest", fill=(10, 200, 30))
            got = ours(image, name, magnitude, fill=(10.0, 200.0, 30.0))
            check(got, filled, name, "ties", f"{name} {magnitude:g} filled")
            check(ours(image, name, magnitude, bgr=True, fill=(10.0, 200.0, 30.0)), filled, name, "ties", "BGR")


def test_the_spaces_are_torchvisions():
    """Operation lists, magnitude bins and signs: the same as torchvision's `_AUGMENTATION_SPACE`s."""
    cases = [(True, v2.TrivialAugmentWide._AUGMENTATION_SPACE, list(_WIDE)),
             (False, v2.RandAugment._AUGMENTATION_SPACE, list(_RAND_OPS)),
             (False, v2.AutoAugment._AUGMENTATION_SPACE, [n for n in _STANDARD if n != "Identity"])]
    for wide, space, names in cases:
        assert list(space) == names
        for name, (make, signed) in space.items():
            for bins_, height, width in ((31, 224, 224), (10, 160, 200)):
                want = make(bins_, height, width)
                got = magnitudes(wide, name, bins_, height, width)
                assert (got is None) == (want is None), name
                if want is not None:
                    assert got == tuple(float(v) for v in want), name
            assert (_WIDE if wide else _STANDARD)[name][1] == signed, name


def test_contrast_table_is_torchvisions_for_any_mean():
    """Contrast is a table over the 256 levels once the grey mean is known: checked for many means and every
    factor, against torchvision on one-pixel-high ramps whose grey mean is the given one."""
    rng = np.random.default_rng(0)
    for factor in [1.0 + v for v in bins(True, "Contrast", (1, 1))]:
        for mean in rng.uniform(0, 255, 20).astype(np.float32):
            levels = torch.arange(256, dtype=torch.uint8).view(1, 1, 256)
            want = _blend(levels, torch.full((1, 1, 1), float(mean)), factor)  # torchvision's adjust_contrast blend
            assert np.array_equal(contrast_lut(factor, float(mean)), want.numpy().ravel())


def test_a_context_kept_across_operations_and_sizes_gives_a_fresh_ones_pixels():
    """The operations compute in scratch arrays kept in the context (one per worker thread, over every sample and
    epoch size): every operation at a few magnitudes, in turn on crops of other sizes and channel orders with one
    context, gives what it gives with a fresh context each time."""
    kept = OpContext()
    rng = np.random.default_rng(5)
    for size in [(64, 64), (48, 80), (3, 2), (64, 64)]:
        for image in crops(size) if min(size) > 8 else [rng.integers(0, 256, (*size, 3), dtype=np.uint8)]:
            for name in OPERATIONS:
                for magnitude in bins(name in _WIDE, name, size)[::7]:
                    for bgr in (False, True):
                        kept.bgr = bgr
                        got, want = image.copy(), image.copy()
                        OPERATIONS[name](got, magnitude, kept)
                        OPERATIONS[name](want, magnitude, OpContext(bgr))
                        assert np.array_equal(got, want), (name, magnitude, size, bgr)


def test_erasing_a_colour_fills_exactly_its_rectangle():
    """A colour (three levels, written with cv2.rectangle) and one level (written as bytes) erase the drawn
    rectangle, every pixel of it and no other."""
    from fastdata.image.output import OutputFormat
    from fastdata.image.recipes.erasing import RandomErasing

    image = photo_like(3, 40, 30).copy()
    for value, bgr in [((10, 20, 30), False), ((10, 20, 30), True), ((7, 7, 7), False)]:
        erasing = RandomErasing(p=1.0, value=value)
        for seed in range(30):
            box = erasing.box(np.random.default_rng(seed), *image.shape[:2])
            got = image.copy()
            erasing.apply(got, np.random.default_rng(seed), value, OutputFormat(), bgr)
            want = image.copy()
            if box is not None:
                top, left, h, w = box
                want[top:top + h, left:left + w] = value[::-1] if bgr else value
            assert np.array_equal(got, want), (value, bgr, seed, box)


def test_the_policies_tables_are_made_before_the_workers_fork(photos):
    """Building the loader works out the tables of every magnitude (workers forked from it have them)."""
    import fastdata
    from fastdata.image.recipes import ops
    from fastdata.presets import RandomResizedCrop, TrivialAugmentWide

    ops.brightness_lut.cache_clear()
    ops.solarize_first.cache_clear()
    fastdata.loader(photos[0], batch_size=4, augment=[RandomResizedCrop(24), TrivialAugmentWide()], num_workers=0)
    assert ops.brightness_lut.cache_info().currsize == 60  # 31 bins, both signs, less the magnitude 0
    assert ops.solarize_first.cache_info().currsize == 31


@pytest.mark.parametrize("name", ["Brightness", "Color", "Contrast", "Sharpness"])
def test_blends_at_the_extreme_levels_are_torchvisions(name):
    """The blends skip their clamp where the weight keeps them between two images' levels: on a crop of mostly
    0 and 255 (where a rounding past the range would show) every magnitude still gives torchvision's pixels."""
    rng = np.random.default_rng(7)
    image = rng.choice(np.array([0, 1, 254, 255, 128], np.uint8), size=(40, 48, 3), p=[0.3, 0.1, 0.1, 0.4, 0.1])
    policy = v2.TrivialAugmentWide()
    for magnitude in bins(True, name, (40, 48)):
        want = reference(policy, image, name, magnitude, "nearest")
        check(ours(image, name, magnitude), want, name, "nearest", f"{name} {magnitude:g}")
        check(ours(image, name, magnitude, bgr=True), want, name, "nearest", f"{name} {magnitude:g}, BGR")


def test_equalize_is_torchvisions_on_few_levels_and_tiny_crops():
    """Equalize's table (Pillow's, in torchvision): crops of one pixel up, channels of one, two or a few levels
    (a step of 0, of 1, and a highest level holding most pixels) and full ones, in both channel orders."""
    rng = np.random.default_rng(11)
    policy = v2.TrivialAugmentWide()
    for size in [(1, 1), (1, 2), (2, 3), (5, 5), (16, 17), (40, 33)]:
        images = [rng.integers(0, 256, (*size, 3), dtype=np.uint8),
                  rng.choice(np.array([3, 200], np.uint8), size=(*size, 3)),
                  rng.choice(np.array([0, 9, 77, 255], np.uint8), size=(*size, 3), p=[0.05, 0.05, 0.1, 0.8]),
                  rng.integers(100, 104, (*size, 3), dtype=np.uint8)]
        for image in images:
            want = reference(policy, image, "Equalize", 0.0, "nearest")
            check(ours(image, "Equalize", 0.0), want, "Equalize", "nearest", f"Equalize at {size}")
            check(ours(image, "Equalize", 0.0, bgr=True), want, "Equalize", "nearest", f"Equalize at {size}, BGR")
