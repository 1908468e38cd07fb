"""Augmentation presets as objects, the public names to import them by (`from fastdata.presets import ...`), so
that user code never names the modules that implement them.

- `RandomResizedCrop(size=224, scale=None, ratio=None)`: classification training, torchvision's
  RandomResizedCrop + horizontal flip; what `augment="train"` is (with `image_size`, `scale`, `ratio`).
- `ResizeCenterCrop(size=224)`: classification evaluation, Resize(int(size / 0.875)) + CenterCrop(size); what
  `augment="val"` is.

Recipes (after the crop, in a list: `augment=[RandomResizedCrop(224), TrivialAugmentWide(), RandomErasing(p=0.25),
RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)])]`, torchvision's order; docs/images.md):

- `TrivialAugmentWide()`, `RandAugment(num_ops=2, magnitude=9)`, `AutoAugment()` (ImageNet policy):
  torchvision's augmentation policies, on each crop in the workers;
- `RandomErasing(p=0.5, scale, ratio, value=0)`: torchvision's, `value` in the delivered batches' units;
- `MixUp(alpha=1.0, num_classes=None)`, `CutMix(alpha=1.0, num_classes=None)`, `RandomChoice([...], p=None)`:
  torchvision v2's batch transforms, on each batch (labels become float `[B, num_classes]` rows).

- `ScaleJitterCrop(size, scale_range=(0.1, 2.0), flip_p=0.5, iou_crop=False)`: detection and segmentation
  training, torchvision's ScaleJitter + a window of at most size x size + flip (with `iou_crop`, RandomIoUCrop
  first); what `augment="train"` is for those datasets.
- `ResizeLongerPad(size)`: detection and segmentation evaluation, the longer side resized to `size`, padded;
  what `augment="val"` is for them.
"""

from __future__ import annotations

from fastdata.image.detection_presets import ResizeLongerPad, ScaleJitterCrop
from fastdata.image.recipes.erasing import RandomErasing
from fastdata.image.recipes.mixing import CutMix, MixUp, RandomChoice
from fastdata.image.recipes.policies import AutoAugment, RandAugment, TrivialAugmentWide
from fastdata.loader.options import RandomResizedCrop, ResizeCenterCrop

__all__ = ["AutoAugment", "CutMix", "MixUp", "RandAugment", "RandomChoice", "RandomErasing", "RandomResizedCrop",
           "ResizeCenterCrop", "ResizeLongerPad", "ScaleJitterCrop", "TrivialAugmentWide"]
