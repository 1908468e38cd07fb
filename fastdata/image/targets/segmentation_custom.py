"""Custom transforms over semantic segmentation samples: albumentations (called with `image=` and `mask=`, as its
segmentation examples do) or a torchvision transforms.v2 transform (called with a `tv_tensors.Image` and a
`tv_tensors.Mask`, which v2 transforms with nearest interpolation and pads with 0 unless told otherwise). The
transform's mask comes back as the dataset's mask dtype; any other callable cannot say what it did to the mask,
and is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastdata.errors import ConfigError
from fastdata.image.augment import SeededGlobalRngs, albumentations_compose, torchvision_convention
from fastdata.image.targets.segmentation import as_mask

SegmentationTransform = Callable[[np.ndarray, np.ndarray, int], tuple[Any, torch.Tensor]]

ACCEPTED = ("augment for a segmentation dataset must be 'train', 'val', a preset (ScaleJitterCrop, "
            "ResizeLongerPad), an albumentations transform (called with image= and mask=) or a torchvision "
            "transforms.v2 transform (called with tv_tensors.Image and tv_tensors.Mask)")


def wrap_segmentation_custom(transform: Any, dtype: torch.dtype) -> SegmentationTransform:
    """`fn(hwc_uint8_rgb, label_map, sample_seed) -> (image result, mask of dtype)`; ConfigError (one line, saying
    what is accepted) for any other transform."""
    compose = albumentations_compose(transform)
    if compose is not None:

        def run_album(image: np.ndarray, ids: np.ndarray, seed: int) -> tuple[Any, torch.Tensor]:
            compose.set_random_seed(seed)
            out = compose(image=image, mask=ids)  # uint8 or uint16 ids: both OpenCV dtypes
            return out["image"], as_mask(out["mask"], dtype)

        return run_album
    if torchvision_convention(transform) == "v2":
        def run_v2(image: np.ndarray, ids: np.ndarray, seed: int) -> tuple[Any, torch.Tensor]:
            from torchvision import tv_tensors

            chw = tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1).contiguous())
            mask = tv_tensors.Mask(as_mask(ids, dtype))
            with SeededGlobalRngs(seed):
                result, out = transform(chw, mask)
            return result, as_mask(out, dtype)

        return run_v2
    raise ConfigError(ACCEPTED + f"; got {type(transform).__name__}")
