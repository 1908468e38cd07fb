"""Box and mask geometry for detection targets: the same crop box (left, top, width, height in source pixels), output
size and flip that the pixels get (`fastdata.image.augment.crop_resize_flip`), applied to xyxy boxes and to 0/1
instance masks. Pure numpy, no IO.

A source point x maps to x' = (x - left) * out_w / width (mirrored: out_w - x'), y likewise: the continuous map
whose pixel centres the image warp samples, so a box drawn around an object's pixels stays around them."""

from __future__ import annotations

import functools

import numpy as np

from fastdata.image.geometry import CropParams


def map_boxes(boxes: np.ndarray, params: CropParams, out_h: int, out_w: int) -> np.ndarray:
    """xyxy `boxes` [N, 4] in source pixels -> the same boxes in the output's pixels (float32), clipped to the
    out_h x out_w output (boxes with no area left are not removed here: see `nonempty`)."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    sx, sy = out_w / params.width, out_h / params.height
    x0, x1 = (boxes[:, 0] - params.left) * sx, (boxes[:, 2] - params.left) * sx
    y0, y1 = (boxes[:, 1] - params.top) * sy, (boxes[:, 3] - params.top) * sy
    if params.flip:
        x0, x1 = out_w - x1, out_w - x0
    mapped = np.stack([x0, y0, x1, y1], axis=1)
    np.clip(mapped[:, 0::2], 0, out_w, out=mapped[:, 0::2])
    np.clip(mapped[:, 1::2], 0, out_h, out=mapped[:, 1::2])
    return mapped.astype(np.float32)


def nonempty(boxes: np.ndarray) -> np.ndarray:
    """bool [N]: the xyxy boxes with some area (x1 > x0 and y1 > y0)."""
    return (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])


def box_areas(boxes: np.ndarray) -> np.ndarray:
    """float64 [N]: the areas of xyxy boxes."""
    return (boxes[:, 2] - boxes[:, 0]).astype(np.float64) * (boxes[:, 3] - boxes[:, 1])


def nearest_indices(start: float, length: float, out: int, size: int, flip: bool = False) -> np.ndarray:
    """The source pixel each of `out` output pixels takes, nearest to its centre: floor(start + (i + 0.5) *
    length / out), clipped to 0..size-1 (reversed when `flip`): torch's "nearest-exact" (torchvision's
    InterpolationMode.NEAREST_EXACT) after cropping. When the crop is a whole-pixel window of the whole image
    resized (the presets' scale jitter window, "val"'s resize), the indices are torch's own for that resize
    (`_torch_nearest_exact`), so that a centre landing exactly on a source pixel's edge takes the side torch's
    float32 arithmetic gives it; otherwise (e.g. after an IoU crop) exact arithmetic decides."""
    step = length / out  # source pixels per output pixel
    first, whole = start / step, size / step  # the window's offset and the image's size, in output pixels
    window, resized = round(first), round(whole)
    if abs(first - window) < 1e-6 * max(1.0, first) and abs(whole - resized) < 1e-6 * whole \
            and window >= 0 and window + out <= resized:
        index = _torch_nearest_exact(size, resized)[window: window + out]
    else:
        # + 1e-9: a centre that lands exactly on a source pixel's edge takes the pixel after it, as exact
        # arithmetic does, however the float sum rounds
        index = np.floor(start + (np.arange(out) + 0.5) * step + 1e-9).astype(np.int64)
        np.clip(index, 0, size - 1, out=index)
    return index[::-1] if flip else index


@functools.lru_cache(maxsize=4096)
def _torch_nearest_exact(size: int, resized: int) -> np.ndarray:
    """The source index of each pixel of a `size`-pixel line resized to `resized` by torch's "nearest-exact"
    (read-only; computed by torch itself, whose float32 index arithmetic decides exact ties)."""
    import torch

    line = torch.arange(size, dtype=torch.float32).view(1, 1, size)
    index = torch.nn.functional.interpolate(line, size=resized, mode="nearest-exact").view(-1).numpy()
    index = index.astype(np.int64)
    index.flags.writeable = False
    return index


def map_masks(masks: np.ndarray, params: CropParams, out_h: int, out_w: int, canvas: tuple[int, int] | None = None,
              fill: int = 0) -> np.ndarray:
    """Masks [N, H, W] (source pixels; 0/1 instance masks, or label maps of class ids) -> [N, out_h, out_w] of
    their dtype by the crop `params`, nearest neighbour (`nearest_indices`), mirrored if `params.flip`; with
    `canvas` (height, width) placed at its top-left and the rest filled with `fill` (detection: 0; semantic
    segmentation: the ignore index)."""
    count, height, width = masks.shape
    rows = nearest_indices(params.top, params.height, out_h, height)
    cols = nearest_indices(params.left, params.width, out_w, width, params.flip)
    full_h, full_w = canvas if canvas is not None else (out_h, out_w)
    out = np.full((count, full_h, full_w), fill, masks.dtype)
    if count:
        out[:, :out_h, :out_w] = masks[:, rows[:, None], cols[None, :]]
    return out
