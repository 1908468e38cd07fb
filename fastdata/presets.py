"""Augmentation presets as objects, the public names to import them by (`from fastdata.presets import ...`), so
that user code never names the modules that implement them.

- `RandomResizedCrop(size=224, scale=None, ratio=None)`: classification training, torchvision's
  RandomResizedCrop + horizontal flip; what `augment="train"` is (with `image_size`, `scale`, `ratio`).
- `ResizeCenterCrop(size=224)`: classification evaluation, Resize(int(size / 0.875)) + CenterCrop(size); what
  `augment="val"` is.

- `ScaleJitterCrop(size, scale_range=(0.1, 2.0), flip_p=0.5, iou_crop=False)`: detection and segmentation
  training, torchvision's ScaleJitter + a window of at most size x size + flip (with `iou_crop`, RandomIoUCrop
  first); what `augment="train"` is for those datasets.
- `ResizeLongerPad(size)`: detection and segmentation evaluation, the longer side resized to `size`, padded;
  what `augment="val"` is for them.
"""

from __future__ import annotations

from fastdata.image.detection_presets import ResizeLongerPad, ScaleJitterCrop
from fastdata.loader.options import RandomResizedCrop, ResizeCenterCrop

__all__ = ["RandomResizedCrop", "ResizeCenterCrop", "ResizeLongerPad", "ScaleJitterCrop"]
