"""The device path's one batched crop-resize-flip: every image of a batch, whatever its size, in a number of kernel
launches that depends on the largest shrink factor of the batch, never on how many images it holds.

Resampling is torchvision's `resized_crop(..., antialias=True)` (Pillow's bilinear filter: a triangle whose radius
is the shrink factor, so downscaling averages every pixel under the output pixel; plain bilinear when enlarging),
applied to the pixels of the crop box's covering pixels, with sub-pixel box edges (the "val" preset's boxes are
fractional). It is separable, so a batch is resized in two gathers:

1. the decoded images (CHW uint8, any sizes) are concatenated into one flat buffer;
2. vertical pass: for each output row, the K source rows it reads (each a window of the flat buffer starting at the
   crop's left edge, as wide as the widest crop of the batch) are gathered and summed with their weights, K
   `index_select` + `addcmul_` launches in all;
3. horizontal pass: the same along each row, K `gather` + `addcmul_`; a flip only mirrors the columns' taps.

A window wider than its image's crop reads pixels of the next row (or image); their columns get no weight in the
horizontal pass, so they never reach the output. The result is float32 in 0..255, rounded by the caller.
The same code runs on the CPU (tests, CI) and on CUDA (where it queues on the current stream and never waits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class CropBatch:
    """Where each decoded image's crop is, on the host: what the kernel's sizes and launch count depend on.

    `boxes` float64 [n, 4]: left, top, width, height of the crop in the decoded image's pixels (fractional edges
    allowed); `shapes` int64 [n, 2]: each decoded image's (height, width); `flips` bool [n]."""

    boxes: np.ndarray
    shapes: np.ndarray
    flips: np.ndarray


def cover(boxes: np.ndarray, shapes: np.ndarray) -> np.ndarray:
    """Each box's covering whole pixels (x0, y0, x1, y1) inside its image: never empty, never outside
    (fastdata.image.augment.pixel_box with cover=True, for a whole batch)."""
    left, top, width, height = boxes.T
    image_h, image_w = shapes[:, 0], shapes[:, 1]
    x0 = np.clip(np.floor(left), 0, image_w - 1)
    y0 = np.clip(np.floor(top), 0, image_h - 1)
    x1 = np.minimum(np.maximum(np.ceil(left + width), x0 + 1), image_w)
    y1 = np.minimum(np.maximum(np.ceil(top + height), y0 + 1), image_h)
    return np.stack([x0, y0, x1, y1], axis=1).astype(np.int64)


def taps_needed(boxes: np.ndarray, size: tuple[int, int]) -> int:
    """K, the taps per output pixel for the batch's largest shrink (Pillow's kernel size for a triangle of radius
    max(shrink, 1): 2 * ceil(radius) + 1)."""
    if not len(boxes):
        return 1
    shrink = max(float((boxes[:, 3] / size[0]).max()), float((boxes[:, 2] / size[1]).max()), 1.0)
    return 2 * math.ceil(shrink) + 1


def _axis_taps(start: torch.Tensor, length: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, out: int, k: int,
               flip: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Source indices and weights [n, out, k] along one axis: output pixel i of image b samples the box
    [start, start + length) at centre start + (i + 0.5) * scale (mirrored when `flip`), with a triangle of radius
    max(scale, 1), over the pixels [lo, hi) only (the crop's covering pixels), weights summing to 1 (Pillow's
    arithmetic: first tap int(centre - radius + 0.5), weight of pixel x tri((x + 0.5 - centre) / radius))."""
    device = start.device
    scale = (length / out)[:, None, None]  # [n, 1, 1]
    radius = scale.clamp(min=1.0)
    i = torch.arange(out, device=device, dtype=torch.float64)[None, :, None]  # [1, out, 1]
    if flip is not None:
        i = torch.where(flip[:, None, None], out - 1 - i, i)
    centre = start[:, None, None] + (i + 0.5) * scale
    first = torch.floor(centre - radius + 0.5).clamp(min=lo[:, None, None].double())
    index = first + torch.arange(k, device=device, dtype=torch.float64)[None, None, :]  # [n, out, k]
    weight = (1 - ((index + 0.5 - centre) / radius).abs()).clamp(min=0.0)
    weight = torch.where(index < hi[:, None, None].double(), weight, torch.zeros((), dtype=weight.dtype,
                                                                                 device=device))
    weight = weight / weight.sum(-1, keepdim=True).clamp(min=1e-12)
    index = torch.minimum(index, hi[:, None, None].double() - 1)  # taps past the end: weight 0, any valid index
    return index.long(), weight.float()


def crop_resize_flip(images: list[torch.Tensor], crops: CropBatch, size: tuple[int, int]) -> torch.Tensor:
    """Crop, resize (antialiased) and flip a batch of CHW uint8 RGB images of any sizes, all on one device, into
    one float32 [n, 3, H, W] tensor in 0..255 (not rounded). `crops` says where each crop is (host arrays, so that
    the launch count and buffer sizes are known without asking the device); their per-image numbers reach the
    device in one non-blocking copy (`device_params`)."""
    n = len(images)
    out_h, out_w = size
    if n == 0:
        return torch.empty((0, 3, out_h, out_w), dtype=torch.float32)
    device = images[0].device
    channels = images[0].shape[0]
    covered = cover(crops.boxes, crops.shapes)
    window = int((covered[:, 2] - covered[:, 0]).max())  # the widest crop: every row's gathered window
    k = taps_needed(crops.boxes, size)
    params = device_params(crops, covered, device)
    left, top, width, height = params[:, 0], params[:, 1], params[:, 2], params[:, 3]
    x0, y0, x1, y1 = params[:, 4], params[:, 5], params[:, 6], params[:, 7]
    image_h, image_w, base = params[:, 8], params[:, 9], params[:, 10]
    flips = params[:, 11] > 0.5

    flat = torch.cat([*(image.reshape(-1) for image in images), images[0].new_zeros(window)])
    windows = flat.as_strided((flat.numel() - window + 1, window), (1, 1))  # row o: flat[o:o + window]

    rows, row_weights = _axis_taps(top, height, y0, y1, out_h, k)  # [n, out_h, k]
    plane = (image_h * image_w)[:, None, None, None]
    channel = torch.arange(channels, device=device, dtype=torch.float64)[None, :, None, None]
    # flat offset of each (image, channel, output row, tap)'s window: [n, C, out_h, k]
    starts = (base[:, None, None, None] + channel * plane + rows[:, None].double() * image_w[:, None, None, None]
              + x0[:, None, None, None]).long()
    vertical = torch.zeros((n, channels, out_h, window), dtype=torch.float32, device=device)
    for tap in range(k):
        gathered = windows.index_select(0, starts[..., tap].reshape(-1)).view(n, channels, out_h, window)
        vertical.addcmul_(gathered, row_weights[:, None, :, tap, None])

    columns, column_weights = _axis_taps(left, width, x0, x1, out_w, k, flips)  # [n, out_w, k]
    columns = columns - x0.long()[:, None, None]  # into the window
    vertical = vertical.view(n, channels * out_h, window)
    out = torch.zeros((n, channels * out_h, out_w), dtype=torch.float32, device=device)
    for tap in range(k):
        index = columns[:, None, :, tap].expand(n, channels * out_h, out_w)
        out.addcmul_(vertical.gather(2, index), column_weights[:, None, :, tap])
    return out.view(n, channels, out_h, out_w)


def host_params(crops: CropBatch, covered: np.ndarray) -> np.ndarray:
    """The kernel's per-image numbers as one float64 [n, 12] host array: box (4), covering pixels (4), decoded
    height and width, the image's offset in the flat buffer (3 planes each), flip."""
    n = len(crops.boxes)
    sizes = crops.shapes[:, 0] * crops.shapes[:, 1] * 3
    base = np.zeros(n, np.int64)
    np.cumsum(sizes[:-1], out=base[1:])
    return np.concatenate([crops.boxes, covered, crops.shapes, base[:, None], crops.flips[:, None]], axis=1,
                          dtype=np.float64)


def device_params(crops: CropBatch, covered: np.ndarray, device: torch.device) -> torch.Tensor:
    """`host_params` on `device`: through pinned memory and a non-blocking copy on CUDA (the host does not wait)."""
    host = torch.from_numpy(host_params(crops, covered))
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
