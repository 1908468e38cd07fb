"""Semantic segmentation loading (`fastdata.loader` / `fastdata.dataset` over `fastdata convert list --mask-column`):
masks follow the pixels' geometry exactly as torchvision.transforms.v2 moves a `tv_tensors.Mask` (NEAREST_EXACT,
padding filled with the ignore index), a drawn rectangle's pixels fall where its class is, and every image's mask
travels with it through workers, shuffling, resumption, ranks and skipped images."""

from __future__ import annotations

import pytest
import torch
from builders.coco import RECT_BACKGROUND_RED, rect_number_of
from builders.damaged import corrupt_copy
from builders.runs import assert_one_line_error
from builders.segmentation import SEG_BACKGROUND0, SEG_RECT_CLASS, build_segmentation_list
from contracts import check_resumes, clone, same

import fastdata
from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.order.epoch import sample_rng
from fastdata.presets import ResizeLongerPad, ScaleJitterCrop

v2 = pytest.importorskip("torchvision.transforms.v2")
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

SIZE = 32
IGNORE = 255  # the conversions' default ignore index
COUNT = 23  # samples of the segmentation rectangles


# ------------------------------------------------------------------------------ geometry against torchvision


def _torchvision_mask(mask: torch.Tensor, placement, canvas: int, ignore: int) -> torch.Tensor:
    """What transforms.v2 makes of a label map with the same geometry: ScaleJitter's resize to the scaled size
    (NEAREST_EXACT), FixedSizeCrop's window, a horizontal flip of the placed part, padding to the canvas at the
    right and bottom filled with the ignore index."""
    crop, (out_h, out_w) = placement.crop, placement.size
    height, width = mask.shape
    sx, sy = crop.width / out_w, crop.height / out_h  # source pixels per scaled pixel
    new_w, new_h = round(width / sx), round(height / sy)
    left, top = round(crop.left / sx), round(crop.top / sy)
    out = F.resize(tv_tensors.Mask(mask[None]), [new_h, new_w], interpolation=InterpolationMode.NEAREST_EXACT)
    out = F.crop(out, top, left, out_h, out_w)
    if crop.flip:
        out = F.horizontal_flip(out)
    return F.pad(out, [0, 0, canvas - out_w, canvas - out_h], fill=ignore).as_subclass(torch.Tensor)[0]


def _compare_with_torchvision(path, augment: str, dtype: torch.dtype, seeds: int = 4) -> list[bool]:
    """ds[i] with `augment` against `_torchvision_mask` for every sample and seed; returns the flips drawn."""
    whole = fastdata.dataset(path)
    flips = []
    for seed in range(seeds):
        data = fastdata.dataset(path, augment=augment, image_size=SIZE, seed=seed)
        for index in range(len(whole)):
            image, mask = whole[index]
            placement = data.pipeline.preset.place(image.shape[2], image.shape[1], sample_rng(seed, 0, index))
            out, got = data[index]
            assert out.shape == (3, SIZE, SIZE) and got.shape == (SIZE, SIZE) and got.dtype == dtype
            assert torch.equal(got, _torchvision_mask(mask, placement, SIZE, IGNORE)), (seed, index)
            flips.append(placement.crop.flip)
    return flips


@pytest.mark.parametrize("augment", ["train", "val"])
def test_masks_equal_torchvision_nearest_exact_for_the_same_geometry(seg_rect_lmdb, augment):
    """For the crop, scale and flip each sample draws, the mask equals v2's NEAREST_EXACT resize + crop + flip +
    pad (with the ignore index) of a tv_tensors.Mask exactly."""
    flips = _compare_with_torchvision(seg_rect_lmdb, augment, torch.uint8)
    assert (0 < sum(flips) < len(flips)) == (augment == "train")  # train flips some samples (p=0.5), val none


def test_sixteen_bit_label_maps_load_as_int64_through_the_same_geometry(tmp_path):
    listed, _ = build_segmentation_list(tmp_path / "src", wide=True)
    out = tmp_path / "wide.lmdb"
    fastdata.convert_list(listed, out, fastdata.FileListOptions(mask_column="mask", workers=1, progress=False))
    _compare_with_torchvision(out, "train", torch.int64, seeds=2)
    _, masks = next(iter(fastdata.loader(out, batch_size=4, image_size=SIZE, num_workers=0)))
    assert masks.dtype == torch.int64 and masks.shape == (4, SIZE, SIZE) and int(masks[masks != IGNORE].max()) > 255


def test_val_resizes_the_longer_side_and_pads_masks_with_the_ignore_index(seg_rect_lmdb):
    whole = fastdata.dataset(seg_rect_lmdb)
    data = fastdata.dataset(seg_rect_lmdb, augment="val", image_size=SIZE)
    for index in (0, 1, 5):
        image, _ = whole[index]
        height, width = image.shape[1:]
        out, mask = data[index]
        placed = ResizeLongerPad(SIZE).place(width, height)
        assert max(placed.size) == SIZE
        assert out[:, placed.height:].eq(0).all() and out[:, :, placed.width:].eq(0).all()
        assert mask[placed.height:].eq(IGNORE).all() and mask[:, placed.width:].eq(IGNORE).all()
        assert mask[: placed.height, : placed.width].ne(IGNORE).all()  # the source maps hold no ignore index


# ------------------------------------------------------------------------------ pixels where their class is


def _red(images: torch.Tensor) -> torch.Tensor:
    """bool [..., H, W]: clearly the rectangle's red (blends with the blue background are not)."""
    r, g, b = images.int().unbind(-3)
    return (r > 200) & (g < 60) & (b < 60)


def _near(region: torch.Tensor) -> torch.Tensor:
    """`region` [H, W] grown by one pixel in every direction (3 x 3 max pool)."""
    return torch.nn.functional.max_pool2d(region[None, None].float(), 3, 1, 1)[0, 0].bool()


def _check_aligned(image: torch.Tensor, mask: torch.Tensor, where: str) -> int:
    """The red pixels of `image` lie where `mask` says SEG_RECT_CLASS (1 px allowed for resampling), the
    rectangle's class lies on red (or, shrunk to a pixel or two, on red blended with the background: a red channel
    well above the background's), and the padding is black exactly where the mask holds the ignore index; returns
    the number of red pixels."""
    red, rect = _red(image), mask == SEG_RECT_CLASS
    reddish = image[0].int() > RECT_BACKGROUND_RED + 60
    assert not (red & ~_near(rect)).any(), f"{where}: red pixels outside the mask's rectangle"
    assert not (rect & ~_near(reddish)).any(), f"{where}: the mask's rectangle off the red pixels"
    assert torch.equal(mask == IGNORE, image.eq(0).all(dim=0)), f"{where}: padding and ignore index differ"
    return int(red.sum())


def test_a_drawn_rectangle_falls_where_the_mask_says_its_class(seg_rects):
    """Over many seeds (crops, scales, flips, JPEGs decoded by region at reduced DCT scale and PNGs), the red
    rectangle's output pixels lie on the mask's rectangle class, and the mask's padding is the image's."""
    seen = 0
    for seed in range(6):
        ld = fastdata.loader(seg_rects, batch_size=5, image_size=SIZE, num_workers=0, seed=seed)
        for number, (images, masks) in enumerate(ld):
            assert masks.shape == (len(images), SIZE, SIZE) and masks.dtype == torch.uint8
            for row, (image, mask) in enumerate(zip(images, masks, strict=True)):
                seen += _check_aligned(image, mask, f"seed {seed}, batch {number}, row {row}")
    assert seen > 500


# ------------------------------------------------------------------------------ loader contracts


def _number_from_pixels(image: torch.Tensor) -> int:
    """The source picture's list position, from its background's green."""
    r, g, b = image.int()
    background = (b > 150) & (r < RECT_BACKGROUND_RED + 30)
    return rect_number_of(float(g[background].float().median()))


def _number_from_mask(mask: torch.Tensor) -> int:
    """The source picture's list position, from its label map's background class."""
    background = mask[(mask != SEG_RECT_CLASS) & (mask != IGNORE)]
    return int(background.mode().values) - SEG_BACKGROUND0


def _check_masks_match_images(batches) -> list[int]:
    """Each image's mask is its own; returns the pictures' list positions in order."""
    numbers = []
    for images, masks in batches:
        assert images.shape[1:] == (3, SIZE, SIZE) and masks.shape == (len(images), SIZE, SIZE)
        for image, mask in zip(images, masks, strict=True):
            number = _number_from_mask(mask)
            assert _number_from_pixels(image) == number
            numbers.append(number)
    return numbers


def _loader(path, workers: int, **options):
    return fastdata.loader(path, batch_size=4, augment=ScaleJitterCrop(SIZE, scale_range=(0.5, 2.0)),
                           num_workers=workers, **options)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_image_brings_its_own_mask(seg_rects, workers):
    ld, reference = _loader(seg_rects, workers, seed=3), _loader(seg_rects, 0, seed=3)
    for _ in range(2):  # two epochs: reshuffled
        batches = [clone(b) for b in ld]
        numbers = _check_masks_match_images(batches)
        assert sorted(numbers) == list(range(COUNT))
        assert same(batches, [clone(b) for b in reference])
    assert numbers != sorted(numbers)  # shuffled


def test_the_loader_gives_what_ds_i_gives(seg_rect_lmdb):
    data = fastdata.dataset(seg_rect_lmdb, augment="train", image_size=SIZE, seed=2)
    images, masks = next(iter(fastdata.loader(seg_rect_lmdb, batch_size=4, image_size=SIZE, num_workers=0,
                                              shuffle=False, seed=2)))
    for index in range(4):
        image, mask = data[index]
        assert torch.equal(images[index], image) and torch.equal(masks[index], mask)


def test_resumes_exactly_in_the_middle_of_an_epoch(seg_rects):
    check_resumes(lambda workers: _loader(seg_rects, workers, seed=5), lambda n: [1, n - 2], workers=2,
                  resume_workers=0)


def test_two_ranks_share_every_epoch(seg_rects):
    seen = []
    for rank in range(2):
        ld = _loader(seg_rects, 0, rank=rank, world_size=2)
        seen += _check_masks_match_images(list(ld))
        assert len(ld) == 3
    assert sorted(set(seen)) == list(range(COUNT)) and len(seen) == 24  # one padded


def test_a_skipped_image_drops_its_mask(seg_rect_lmdb, tmp_path):
    bad, key = corrupt_copy(seg_rect_lmdb, tmp_path, 4, b"not an image")
    with pytest.raises(CorruptSampleError, match=key):
        list(_loader(bad, 0))
    ld = _loader(bad, 2, on_error="skip")
    numbers = _check_masks_match_images(list(ld))
    assert len(numbers) == COUNT - 1 and 4 not in numbers
    assert [k for k, _ in ld.skipped] == [key]


def test_a_damaged_label_map_is_named_or_skipped(seg_rect_lmdb, tmp_path):
    from builders.damaged import rewritten_target_copy

    bad = tmp_path / "damaged.lmdb"
    key = rewritten_target_copy(seg_rect_lmdb, bad, 2, lambda _stored: b"\xff\xd8\xff not a label map")
    with pytest.raises(CorruptSampleError, match=f"{key}.*stored label map is a JPEG"):
        list(_loader(bad, 0))
    ld = _loader(bad, 0, on_error="skip")
    numbers = _check_masks_match_images(list(ld))
    assert len(numbers) == COUNT - 1 and [k for k, _ in ld.skipped] == [key]


def test_refusals_are_one_line(seg_rect_lmdb):
    for options, needle in (({"decode": "device", "device": "cpu"}, "segmentation datasets decode in the workers"),
                            ({"augment": lambda image: image}, "augment for a segmentation dataset must be"),
                            ({"masks": True}, "masks=True applies to detection")):
        with pytest.raises(ConfigError, match=needle) as raised:
            fastdata.loader(seg_rect_lmdb, num_workers=0, **options)
        assert_one_line_error(str(raised.value), needle)


# ------------------------------------------------------------------------------ custom transforms


def test_albumentations_moves_the_mask_with_the_image(seg_rect_lmdb):
    """Pad to 96 x 96 at the top-left (the mask with the ignore index), crop x 10..90, flip: the mask follows."""
    A = pytest.importorskip("albumentations")
    transform = A.Compose([A.PadIfNeeded(96, 96, position="top_left", border_mode=0, fill_mask=IGNORE),
                           A.Crop(10, 0, 90, 90), A.HorizontalFlip(p=1.0)])
    whole = fastdata.dataset(seg_rect_lmdb)
    data = fastdata.dataset(seg_rect_lmdb, augment=transform)
    for index in (0, 3):
        _, mask = whole[index]
        out, got = data[index]
        assert out.shape == (3, 90, 80) and got.dtype == torch.uint8
        padded = torch.full((96, 96), IGNORE, dtype=torch.uint8)
        padded[: mask.shape[0], : mask.shape[1]] = mask
        assert torch.equal(got, padded[:90, 10:90].flip(-1))
        assert _check_aligned_custom(out, got)
    ld = fastdata.loader(seg_rect_lmdb, batch_size=4, augment=transform, num_workers=0)
    assert sum(len(m) for _, m in ld) == COUNT


def _check_aligned_custom(image: torch.Tensor, mask: torch.Tensor) -> bool:
    red, rect = _red(image), mask == SEG_RECT_CLASS
    return bool(red.any()) and not (red & ~_near(rect)).any()


def test_torchvision_v2_transforms_move_the_mask_with_the_image(seg_rect_lmdb):
    transform = v2.Compose([v2.RandomHorizontalFlip(p=1.0), v2.Resize((40, 40))])
    whole = fastdata.dataset(seg_rect_lmdb)
    data = fastdata.dataset(seg_rect_lmdb, augment=transform)
    _, mask = whole[1]
    out, got = data[1]
    expected = F.resize(F.horizontal_flip(tv_tensors.Mask(mask[None])), [40, 40]).as_subclass(torch.Tensor)[0]
    assert out.shape == (3, 40, 40) and got.dtype == torch.uint8 and torch.equal(got, expected)
    assert _check_aligned_custom(out, got)
