"""Detection presets: each sample's geometry as the crop box the region decoder already takes (`CropParams`: left,
top, width, height in source pixels, and a flip) plus the size that crop is resized to (`Placement`); that part is
placed at the top-left of a fixed canvas and the rest is padded with 0, so batches stack. Drawn from the image
size (and, for the IoU-safe crop, the stored boxes) before anything is decoded, so only the crop is decoded.

- `ScaleJitterCrop` ("train"): torchvision's `ScaleJitter(target_size=canvas, scale_range)` (the image resized by
  r = uniform(scale_range) * min(canvas_h / h, canvas_w / w), sides truncated to whole pixels), then a random
  window of at most the canvas (`FixedSizeCrop`: the scaled image when it is smaller), then a horizontal flip with
  probability `flip_p`; with `iou_crop=True` first torchvision's `RandomIoUCrop` (a random crop whose IoU with some
  box is at least a drawn minimum) of the source image.
- `ResizeLongerPad` ("val"): the whole image resized, keeping its aspect, until it touches the canvas (a square
  canvas: its longer side becomes the side), sides truncated to whole pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.errors import ConfigError
from fastdata.image.geometry import CropParams, ImageSize, bounds, output_size, stable_size

#: The canvas side when `image_size` is not given to a detection preset.
DEFAULT_DETECTION_SIZE = 640
#: "train"'s default range of the scale jitter factor (torchvision's ScaleJitter default is (0.1, 2.0), the
#: large-scale-jitter recipe; (0.5, 2.0) is a milder choice, given with `scale=`).
DEFAULT_SCALE_RANGE = (0.1, 2.0)
#: RandomIoUCrop's minimum IoU choices (1.0: no crop), scale and aspect ranges, tries per choice.
IOU_OPTIONS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
IOU_SCALE = (0.3, 1.0)
IOU_ASPECT = (0.5, 2.0)
IOU_TRIALS = 40
IOU_DRAWS = 10  # choices drawn at most (torchvision draws until a crop is found; here: then no crop)


@dataclass(frozen=True)
class Placement:
    """One sample's detection geometry: the crop (source pixels, flip) resized to `height` x `width` at the
    canvas' top-left."""

    crop: CropParams
    height: int
    width: int

    @property
    def size(self) -> tuple[int, int]:
        return self.height, self.width


def _canvas(size: ImageSize) -> tuple[int, int]:
    return output_size(size)


@dataclass(frozen=True)
class ScaleJitterCrop:
    """Detection "train": scale jitter + a canvas-sized random window + horizontal flip (module docstring)."""

    size: ImageSize
    scale_range: tuple[float, float] = DEFAULT_SCALE_RANGE
    flip_p: float = 0.5
    iou_crop: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", stable_size(self.size))
        object.__setattr__(self, "scale_range", bounds("scale", self.scale_range))

    @property
    def out_size(self) -> tuple[int, int]:
        """(height, width) of the canvas."""
        return _canvas(self.size)

    def place(self, width: int, height: int, rng: np.random.Generator, boxes: np.ndarray | None = None
              ) -> Placement:
        left0, top0, src_w, src_h = 0.0, 0.0, float(width), float(height)
        if self.iou_crop and boxes is not None and len(boxes):
            left0, top0, src_w, src_h = iou_crop(width, height, np.asarray(boxes, np.float64), rng)
        canvas_h, canvas_w = self.out_size
        r = rng.uniform(*self.scale_range) * min(canvas_h / src_h, canvas_w / src_w)
        new_w, new_h = max(1, int(src_w * r)), max(1, int(src_h * r))
        crop_w, crop_h = min(canvas_w, new_w), min(canvas_h, new_h)
        left = int(rng.integers(0, new_w - crop_w + 1))
        top = int(rng.integers(0, new_h - crop_h + 1))
        sx, sy = src_w / new_w, src_h / new_h  # source pixels per scaled pixel
        flip = bool(rng.random() < self.flip_p)
        return Placement(CropParams(left0 + left * sx, top0 + top * sy, crop_w * sx, crop_h * sy, flip),
                         crop_h, crop_w)


@dataclass(frozen=True)
class ResizeLongerPad:
    """Detection "val": the whole image, aspect kept, resized until it touches the canvas (module docstring)."""

    size: ImageSize

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", stable_size(self.size))

    @property
    def out_size(self) -> tuple[int, int]:
        """(height, width) of the canvas."""
        return _canvas(self.size)

    def place(self, width: int, height: int, rng: np.random.Generator | None = None,
              boxes: np.ndarray | None = None) -> Placement:
        canvas_h, canvas_w = self.out_size
        if height * canvas_w >= width * canvas_h:  # the height touches first
            new_h, new_w = canvas_h, max(1, width * canvas_h // height)
        else:
            new_h, new_w = max(1, height * canvas_w // width), canvas_w
        return Placement(CropParams(0.0, 0.0, float(width), float(height), False), new_h, new_w)


DetectionPreset = ScaleJitterCrop | ResizeLongerPad


def iou_crop(width: int, height: int, boxes: np.ndarray, rng: np.random.Generator
             ) -> tuple[float, float, float, float]:
    """torchvision's RandomIoUCrop, drawn from `rng`: (left, top, width, height) of a crop of the image holding the
    centre of some box whose IoU with the crop is at least a minimum drawn from IOU_OPTIONS; the whole image when
    1.0 is drawn or no crop is found."""
    centres_x, centres_y = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    box_area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    for _ in range(IOU_DRAWS):
        minimum = IOU_OPTIONS[int(rng.integers(0, len(IOU_OPTIONS)))]
        if minimum >= 1.0:
            break
        for _ in range(IOU_TRIALS):
            scales = IOU_SCALE[0] + (IOU_SCALE[1] - IOU_SCALE[0]) * rng.random(2)
            new_w, new_h = int(width * scales[0]), int(height * scales[1])
            if new_h == 0 or not IOU_ASPECT[0] <= new_w / new_h <= IOU_ASPECT[1]:
                continue
            offsets = rng.random(2)
            left, top = int((width - new_w) * offsets[0]), int((height - new_h) * offsets[1])
            right, bottom = left + new_w, top + new_h
            if left == right or top == bottom:
                continue
            inside = (left < centres_x) & (centres_x < right) & (top < centres_y) & (centres_y < bottom)
            if not inside.any():
                continue
            inter_w = np.clip(np.minimum(boxes[inside, 2], right) - np.maximum(boxes[inside, 0], left), 0, None)
            inter_h = np.clip(np.minimum(boxes[inside, 3], bottom) - np.maximum(boxes[inside, 1], top), 0, None)
            inter = inter_w * inter_h
            iou = inter / (box_area[inside] + new_w * new_h - inter)
            if iou.max() < minimum:
                continue
            return float(left), float(top), float(new_w), float(new_h)
    return 0.0, 0.0, float(width), float(height)


def make_detection_preset(augment: Any, image_size: Any = None, scale: Any = None, ratio: Any = None
                          ) -> DetectionPreset:
    """The detection preset for `augment` ("train", "val", or a preset object given as is) with canvas `image_size`
    (None: DEFAULT_DETECTION_SIZE) and, for "train", the scale jitter range `scale` (None: DEFAULT_SCALE_RANGE)."""
    if ratio is not None:
        raise ConfigError("ratio is RandomResizedCrop's (classification); detection presets keep the aspect: leave "
                          "it out")
    if isinstance(augment, ScaleJitterCrop | ResizeLongerPad):
        if image_size is not None or scale is not None:
            raise ConfigError(f"image_size and scale are set in the preset object {augment!r}: leave them out")
        return augment
    size = DEFAULT_DETECTION_SIZE if image_size is None else image_size
    if augment == "train":
        return ScaleJitterCrop(size, DEFAULT_SCALE_RANGE if scale is None else scale)
    if augment == "val":
        if scale is not None:
            raise ConfigError("scale is the train preset's scale jitter range; augment='val' resizes the whole image")
        return ResizeLongerPad(size)
    raise ConfigError(f"unknown augment preset {augment!r} for a detection dataset: use 'train', 'val', "
                      "ScaleJitterCrop(...) / ResizeLongerPad(...), or an albumentations Compose with bbox_params")


def scale_area(area: np.ndarray, params: CropParams, out_h: int, out_w: int) -> np.ndarray:
    """A stored `area` (source pixels) in the output's pixels: times the crop's scale along x and y."""
    return (np.asarray(area, np.float64) * (out_w / params.width) * (out_h / params.height)).astype(np.float32)


def is_detection_preset(augment: Any) -> bool:
    return isinstance(augment, ScaleJitterCrop | ResizeLongerPad)

