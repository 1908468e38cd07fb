"""Augmentation presets as objects, the public names to import them by (`from fastdata.presets import ...`), so
that user code never names the modules that implement them.

- `ScaleJitterCrop(size, scale_range=(0.1, 2.0), flip_p=0.5, iou_crop=False)`: detection and segmentation
  training, torchvision's ScaleJitter + a window of at most size x size + flip (with `iou_crop`, RandomIoUCrop
  first); what `augment="train"` is for those datasets.
- `ResizeLongerPad(size)`: detection and segmentation evaluation, the longer side resized to `size`, padded;
  what `augment="val"` is for them.
"""

from __future__ import annotations

from fastdata.image.detection_presets import ResizeLongerPad, ScaleJitterCrop

__all__ = ["ResizeLongerPad", "ScaleJitterCrop"]
