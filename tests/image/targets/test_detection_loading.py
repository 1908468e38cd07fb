"""Detection loading (`fastdata.loader` / `fastdata.dataset` over `fastdata convert coco`): boxes and masks follow
the pixels' geometry exactly as torchvision.transforms.v2 moves them, a drawn rectangle stays inside its box,
and every image's target travels with it through workers, shuffling, resumption, ranks and skipped images."""

from __future__ import annotations

import sys
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from builders.coco import RECT_BACKGROUND_RED, rect_image_id, rect_number_of, write_coco
from builders.damaged import corrupt_copy
from builders.runs import assert_one_line_error
from contracts import check_resumes, clone, same

import fastdata
from fastdata import FastdataDeprecationWarning
from fastdata.errors import ConfigError, CorruptSampleError
from fastdata.image.detection_presets import iou_crop
from fastdata.order.epoch import sample_rng
from fastdata.presets import ResizeLongerPad, ScaleJitterCrop

pytest.importorskip("pycocotools")
v2 = pytest.importorskip("torchvision.transforms.v2")
from torch.utils.data import IterableDataset  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

SIZE = 32


# ------------------------------------------------------------------------------ geometry against torchvision


def _torchvision_reference(image, target, placement, canvas, first=None):
    """What transforms.v2 makes of (image, target) with the same geometry: the IoU crop `first` (left, top, width,
    height) if given, ScaleJitter's resize to the scaled size, FixedSizeCrop's window, a horizontal flip of the
    placed part, padding to the canvas at the right and bottom; boxes clamped and those without area dropped
    (SanitizeBoundingBoxes with min_size=0 keeps exactly those)."""
    crop, (out_h, out_w) = placement.crop, placement.size
    height, width = image.shape[1:]
    boxes = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=(height, width))
    masks = tv_tensors.Mask(target["masks"])
    left0, top0 = 0, 0
    if first is not None:
        left0, top0, width, height = (int(v) for v in first)
        boxes, masks = F.crop(boxes, top0, left0, height, width), F.crop(masks, top0, left0, height, width)
    sx, sy = crop.width / out_w, crop.height / out_h  # source pixels per scaled pixel
    new_w, new_h = round(width / sx), round(height / sy)
    left, top = round((crop.left - left0) / sx), round((crop.top - top0) / sy)
    boxes = F.resize(boxes, [new_h, new_w])
    masks = F.resize(masks, [new_h, new_w], interpolation=InterpolationMode.NEAREST_EXACT)
    boxes, masks = F.crop(boxes, top, left, out_h, out_w), F.crop(masks, top, left, out_h, out_w)
    if crop.flip:
        boxes, masks = F.horizontal_flip(boxes), F.horizontal_flip(masks)
    padding = [0, 0, canvas - out_w, canvas - out_h]
    boxes, masks = F.pad(boxes, padding), F.pad(masks, padding)
    boxes = F.clamp_bounding_boxes(boxes)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    return boxes.as_subclass(torch.Tensor)[keep], masks.as_subclass(torch.Tensor)[keep], keep


@pytest.mark.parametrize("preset", ["train", "val", "iou"])
def test_boxes_and_masks_equal_torchvision_for_the_same_geometry(coco_lmdb, preset):
    """For the crop, scale and flip each sample draws, boxes equal transforms.v2's within 0.5 px (in fact to float
    rounding) and masks equal v2's NEAREST_EXACT resize exactly: both sample each output pixel's centre. (v2's
    default NEAREST samples at the pixel's top-left corner, torch's legacy 'nearest', which moves a mask by up to
    half a source pixel against its box; fastdata keeps masks on the same geometry as the boxes and pixels.)"""
    augment = {"train": "train", "val": "val", "iou": ScaleJitterCrop(SIZE, (0.3, 2.0), iou_crop=True)}[preset]
    whole = fastdata.dataset(coco_lmdb, masks=True)
    compared, flips = 0, []
    for seed in range(6):
        options = {"image_size": SIZE} if isinstance(augment, str) else {}
        data = fastdata.dataset(coco_lmdb, augment=augment, seed=seed, masks=True, **options)
        for index in range(len(whole)):
            image, target = whole[index]
            placement = data.pipeline.preset.place(image.shape[2], image.shape[1], sample_rng(seed, 0, index),
                                                   target["boxes"].numpy())
            out, got = data[index]
            assert out.shape == (3, SIZE, SIZE)
            first = None
            if preset == "iou":
                first = iou_crop(image.shape[2], image.shape[1], target["boxes"].numpy().astype(np.float64),
                                 sample_rng(seed, 0, index))
            boxes, masks, keep = _torchvision_reference(image, target, placement, SIZE, first)
            assert torch.equal(got["labels"], target["labels"][keep])
            assert torch.equal(got["iscrowd"], target["iscrowd"][keep])
            assert torch.equal(got["annotation_ids"], target["annotation_ids"][keep])
            assert got["boxes"].shape == boxes.shape and got["boxes"].dtype == torch.float32
            assert torch.allclose(got["boxes"], boxes, atol=0.5)
            assert torch.allclose(got["boxes"], boxes, atol=1e-3)
            assert got["masks"].dtype == torch.uint8 and torch.equal(got["masks"], masks)
            scale = (placement.width / placement.crop.width) * (placement.height / placement.crop.height)
            assert torch.allclose(got["area"], target["area"][keep] * scale, rtol=1e-5)
            compared += len(boxes)
            flips.append(placement.crop.flip)
    assert compared > 20
    assert (0 < sum(flips) < len(flips)) == (preset != "val")  # train flips some samples (p=0.5), val none


def test_val_resizes_the_longer_side_and_pads(rect_lmdb):
    data = fastdata.dataset(rect_lmdb, augment="val", image_size=SIZE)
    whole = fastdata.dataset(rect_lmdb)
    for index in (0, 1, 5):
        image, target = whole[index]
        height, width = image.shape[1:]
        out, got = data[index]
        placed = ResizeLongerPad(SIZE).place(width, height)
        assert max(placed.size) == SIZE and placed.size == (int(height * SIZE / max(height, width)),
                                                            int(width * SIZE / max(height, width)))
        assert out[:, placed.height:].eq(0).all() and out[:, :, placed.width:].eq(0).all()
        assert out[:, : placed.height, : placed.width].gt(0).any(dim=0).all()  # no pixel of the image is black
        expected = target["boxes"] * torch.tensor([placed.width / width, placed.height / height] * 2)
        assert torch.allclose(got["boxes"], expected, atol=1e-4)


# ------------------------------------------------------------------------------ pixels inside their boxes


def _red(images: torch.Tensor) -> torch.Tensor:
    """bool [..., H, W]: clearly the rectangle's red (blends with the blue background are not)."""
    r, g, b = images.int().unbind(-3)
    return (r > 200) & (g < 60) & (b < 60)


def _number_from_pixels(image: torch.Tensor) -> int:
    """The source image's list position, from its background's green."""
    r, g, b = image.int()
    background = (b > 150) & (r < RECT_BACKGROUND_RED + 30)
    return rect_number_of(float(g[background].float().median()))


def _check_inside(image: torch.Tensor, target: dict, where: str) -> bool:
    """The red pixels of `image` lie inside its rectangle's box (label 0), 1 px allowed for resampling; returns
    whether any red pixel is there."""
    red = _red(image)
    ys, xs = torch.nonzero(red, as_tuple=True)
    if not len(xs):
        return False
    rect_boxes = target["boxes"][target["labels"] == 0]
    assert len(rect_boxes) == 1, f"{where}: red pixels but no rectangle box"
    x0, y0, x1, y1 = rect_boxes[0].tolist()
    # pixel (x, y) covers [x, x + 1) x [y, y + 1)
    assert xs.min() >= x0 - 1 and xs.max() + 1 <= x1 + 1, f"{where}: red columns {xs.min()}..{xs.max()} vs box {x0, x1}"
    assert ys.min() >= y0 - 1 and ys.max() + 1 <= y1 + 1, f"{where}: red rows {ys.min()}..{ys.max()} vs box {y0, y1}"
    return True


@pytest.mark.parametrize("augment", ["train", "iou"])
def test_a_drawn_rectangle_stays_inside_its_box(rects, augment):
    """Over many seeds (crops, scales, flips, JPEGs decoded by region at reduced DCT scale and PNGs), the red
    rectangle's output pixels lie inside its transformed box."""
    preset = "train" if augment == "train" else ScaleJitterCrop(SIZE, iou_crop=True)
    seen = 0
    for seed in range(8):
        options = {"image_size": SIZE} if isinstance(preset, str) else {}
        ld = fastdata.loader(rects, batch_size=5, augment=preset, num_workers=0, seed=seed, **options)
        for images, targets in ld:
            for image, target in zip(images, targets, strict=True):
                seen += _check_inside(image, target, f"seed {seed}, image {target['image_id']}")
    assert seen > 50


# ------------------------------------------------------------------------------ loader contracts


def _check_batches_match_targets(batches) -> list[int]:
    """Each image's target is its own (the background's green names the image); returns the image ids in order."""
    ids = []
    for images, targets in batches:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE, SIZE) and len(targets) == len(images)
        for image, target in zip(images, targets, strict=True):
            assert rect_image_id(_number_from_pixels(image)) == target["image_id"]
            assert target["boxes"].dtype == torch.float32 and target["labels"].dtype == torch.int64
            assert len(target["boxes"]) == len(target["labels"]) == len(target["iscrowd"]) == len(target["area"])
            ids.append(target["image_id"])
    return ids


@pytest.mark.parametrize("workers", [0, 2])
def test_every_image_brings_its_own_target(rects, workers):
    ld = fastdata.loader(rects, batch_size=4, image_size=SIZE, num_workers=workers, seed=3, masks=True)
    reference = fastdata.loader(rects, batch_size=4, image_size=SIZE, num_workers=0, seed=3, masks=True)
    for _ in range(2):  # two epochs: reshuffled
        batches = [clone(b) for b in ld]
        ids = _check_batches_match_targets(batches)
        assert sorted(ids) == sorted(rect_image_id(n) for n in range(23))
        assert same(batches, [clone(b) for b in reference])
    assert ids != sorted(ids)  # shuffled
    for _, targets in batches:
        for target in targets:
            assert target["masks"].shape == (len(target["boxes"]), SIZE, SIZE) and target["masks"].dtype == torch.uint8


def test_resumes_exactly_in_the_middle_of_an_epoch(rects):
    def make(workers):
        return fastdata.loader(rects, batch_size=4, image_size=SIZE, num_workers=workers, seed=5, masks=True)

    check_resumes(make, lambda n: [1, n - 2], workers=2, resume_workers=0)


def test_two_ranks_share_every_epoch(rects):
    seen = []
    for rank in range(2):
        ld = fastdata.loader(rects, batch_size=4, image_size=SIZE, num_workers=0, rank=rank, world_size=2)
        ids = _check_batches_match_targets(list(ld))
        assert len(ld) == 3
        seen += ids
    assert sorted(set(seen)) == sorted(rect_image_id(n) for n in range(23)) and len(seen) == 24  # one padded


def test_a_skipped_image_drops_its_target(rect_lmdb, tmp_path):
    bad, key = corrupt_copy(rect_lmdb, tmp_path, 4, b"not an image")
    with pytest.raises(CorruptSampleError, match=key):
        list(fastdata.loader(bad, batch_size=4, image_size=SIZE, num_workers=0))
    ld = fastdata.loader(bad, batch_size=4, image_size=SIZE, num_workers=2, on_error="skip")
    ids = _check_batches_match_targets(list(ld))
    assert len(ids) == 22 and rect_image_id(4) not in ids
    assert [k for k, _ in ld.skipped] == [key]


def test_masks_are_refused_where_none_are_stored(tmp_path):
    root = tmp_path / "src"
    source = write_coco(root, _without_segmentation())
    fastdata.convert_coco(
        source.annotations, source.images, tmp_path / "boxes.lmdb", fastdata.CocoOptions(workers=1, progress=False)
    )
    with pytest.raises(ConfigError, match="holds no masks"):
        fastdata.loader(tmp_path / "boxes.lmdb", image_size=SIZE, masks=True, num_workers=0)


def _without_segmentation():
    from builders.coco import coco_dict

    return coco_dict(masks=False)


def test_refusals_are_one_line(rect_lmdb, capsys):
    for options, needle in (({"decode": "device", "device": "cpu"}, "detection datasets decode in the workers"),
                            ({"augment": lambda image: image}, "augment for a detection dataset must be"),
                            ({"augment": "val", "scale": (0.5, 2.0)}, "scale is the train preset's")):
        old = pytest.warns(FastdataDeprecationWarning) if "scale" in options else nullcontext()  # (the old keyword)
        with pytest.raises(ConfigError, match=needle) as raised, old:
            fastdata.loader(rect_lmdb, num_workers=0, **options)
        assert_one_line_error(str(raised.value), needle)


@pytest.mark.parametrize("workers", [0, 2])
def test_augment_none_gives_whole_images_in_their_stored_geometry(rect_lmdb, workers):
    """`augment=None`: a list of uint8 [3, H, W] images, each as stored (the pixels `fastdata.dataset` gives), with
    its target in those pixels: the input torchvision's detection models take, and one training step of Faster
    R-CNN runs on it."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    loader = fastdata.loader(rect_lmdb, augment=None, batch_size=3, num_workers=workers, shuffle=False)
    plain = fastdata.dataset(rect_lmdb)
    seen = 0
    for images, targets in loader:
        assert isinstance(images, list) and len(images) == len(targets)
        for image, target in zip(images, targets, strict=True):
            stored, stored_target = plain[seen]
            assert image.dtype == torch.uint8 and torch.equal(image, stored)
            assert torch.equal(target["boxes"], stored_target["boxes"])
            height, width = image.shape[-2:]
            assert (target["boxes"][:, 2] <= width).all() and (target["boxes"][:, 3] <= height).all()
            seen += 1
    assert seen == len(plain)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None,
                                                  num_classes=len(loader.classes) + 1)
    model.train()
    images, targets = next(iter(loader))
    losses = model([image.float() / 255 for image in images],
                   [{**t, "labels": t["labels"] + 1} for t in targets])
    assert all(torch.isfinite(loss) for loss in losses.values())


@pytest.mark.parametrize("workers", [0, 2])
def test_augment_none_gives_each_image_its_masks_in_its_stored_geometry(rects, workers):
    """`masks=True` with `augment=None` (what Mask R-CNN takes): each target's masks are its own image's uint8
    `[N, H, W]` in that image's stored size (images of different sizes in one batch, an image without
    annotations among them), equal to the plain dataset's; one training step of Mask R-CNN runs on a batch."""
    from torchvision.models.detection import maskrcnn_resnet50_fpn

    loader = fastdata.loader(rects, augment=None, batch_size=4, num_workers=workers, shuffle=False, masks=True)
    whole = fastdata.dataset(rects, masks=True)
    plain = list(whole) if isinstance(whole, IterableDataset) else [whole[i] for i in range(len(whole))]
    seen, sizes = 0, set()
    for images, targets in loader:
        for image, target in zip(images, targets, strict=True):
            stored, stored_target = plain[seen]
            height, width = image.shape[-2:]
            sizes.add((height, width))
            assert torch.equal(image, stored)
            assert target["masks"].dtype == torch.uint8
            assert target["masks"].shape == (len(target["boxes"]), height, width)
            assert torch.equal(target["masks"], stored_target["masks"])
            seen += 1
    assert seen == len(plain) and len(sizes) > 1
    assert any(len(target["boxes"]) == 0 for _, target in plain)  # the image without annotations came through
    model = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=len(loader.classes) + 1,
                                  min_size=64, max_size=96)
    model.train()
    images, targets = next(iter(loader))
    losses = model([image.float() / 255 for image in images],
                   [{**t, "labels": t["labels"] + 1} for t in targets])
    assert "loss_mask" in losses and all(torch.isfinite(loss) for loss in losses.values())


def test_masks_without_pycocotools_are_refused_when_the_loader_is_made(rect_lmdb, monkeypatch):
    """masks=True needs pycocotools to decode the stored RLE: without it, the loader (and the dataset) is refused
    where it is made, with the install command, not at its first sample."""
    monkeypatch.setitem(sys.modules, "pycocotools", None)  # `import pycocotools` raises ImportError
    monkeypatch.setitem(sys.modules, "pycocotools.mask", None)
    for make in (lambda: fastdata.loader(rect_lmdb, image_size=SIZE, masks=True, num_workers=0),
                 lambda: fastdata.dataset(rect_lmdb, masks=True)):
        with pytest.raises(ConfigError, match=r"pycocotools: pip install 'fastdata\[coco\]'"):
            make()
    assert next(iter(fastdata.loader(rect_lmdb, image_size=SIZE, num_workers=0)))  # without masks, no need


def test_a_target_for_an_image_of_another_size_is_named(rect_lmdb, tmp_path):
    """A stored target whose image size is not the image's: an error naming the sample, or a counted skip."""
    from dataclasses import replace

    from builders.damaged import rewritten_target_copy

    from fastdata.formats.targets import decode_detection, encode_detection

    def wider(stored: bytes) -> bytes:
        record = decode_detection(stored, "test")
        return encode_detection(replace(record, width=record.width + 1))

    bad = tmp_path / "missized.lmdb"
    key = rewritten_target_copy(rect_lmdb, bad, 2, wider)
    with pytest.raises(CorruptSampleError, match=f"{key}.*is for a .* image, but the image is"):
        list(fastdata.loader(bad, batch_size=4, image_size=SIZE, num_workers=0))
    ld = fastdata.loader(bad, batch_size=4, image_size=SIZE, num_workers=0, on_error="skip")
    assert len(_check_batches_match_targets(list(ld))) == 22 and [k for k, _ in ld.skipped] == [key]


# ------------------------------------------------------------------------------ custom transforms


def test_albumentations_with_bbox_params_moves_the_targets(rect_lmdb):
    """Pad to 96 x 96 at the top-left, crop x 10..90 (which drops the corner box at x 2..8, with its label and
    mask), flip: the rectangle's box, label and mask follow."""
    A = pytest.importorskip("albumentations")
    transform = A.Compose([A.PadIfNeeded(96, 96, position="top_left", border_mode=0), A.Crop(10, 0, 90, 90),
                           A.HorizontalFlip(p=1.0)],
                          bbox_params=A.BboxParams(format="pascal_voc", label_fields=["classes"]))
    whole = fastdata.dataset(rect_lmdb, masks=True)
    data = fastdata.dataset(rect_lmdb, augment=transform, masks=True)
    for index in (0, 3):
        image, target = whole[index]
        height, width = image.shape[1:]
        out, got = data[index]
        assert out.shape == (3, 90, 80)
        rect = target["labels"] == 0
        expected = target["boxes"][rect][:, [2, 1, 0, 3]] * torch.tensor([-1, 1, -1, 1]) + torch.tensor([90, 0] * 2)
        assert torch.allclose(got["boxes"], expected, atol=1e-4)
        assert torch.equal(got["labels"], target["labels"][rect])
        assert torch.equal(got["annotation_ids"], target["annotation_ids"][rect])
        padded = torch.zeros((int(rect.sum()), 96, 96), dtype=torch.uint8)
        padded[:, :height, :width] = target["masks"][rect]
        assert torch.equal(got["masks"], padded[:, :90, 10:90].flip(-1))
        assert _check_inside(out, got, f"image {index}")
    corner = A.Compose([A.Crop(0, 0, 10, 10)], bbox_params=A.BboxParams(format="pascal_voc", label_fields=["c"]))
    _, got = fastdata.dataset(rect_lmdb, augment=corner)[0]
    _, target = whole[0]
    assert torch.equal(got["labels"], target["labels"][target["labels"] == 1])  # the rectangle's row dropped first
    assert torch.allclose(got["boxes"], target["boxes"][target["labels"] == 1])
    ld = fastdata.loader(rect_lmdb, batch_size=4, augment=transform, num_workers=0, masks=True)
    assert sum(len(t) for _, t in ld) == 23


def test_torchvision_v2_transforms_move_the_targets(rect_lmdb):
    transform = v2.Compose([v2.RandomHorizontalFlip(p=1.0), v2.Resize((40, 40)), v2.SanitizeBoundingBoxes()])
    whole = fastdata.dataset(rect_lmdb)
    data = fastdata.dataset(rect_lmdb, augment=transform)
    image, target = whole[1]
    out, got = data[1]
    height, width = image.shape[1:]
    boxes = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=(height, width))
    expected = F.resize(F.horizontal_flip(boxes), [40, 40]).as_subclass(torch.Tensor)
    assert out.shape == (3, 40, 40) and torch.allclose(got["boxes"], expected, atol=1e-4)
    assert torch.equal(got["labels"], target["labels"])
